"""The shared LLVM lowering is target-neutral; codegen errors are located; one adstack layout.

- compiler/targets/llvm/ names no C math function and no OpenMP symbol: a target supplies its
  math table and its thread slice index (llvm/target.py), and the code follows them;
- what the lowering cannot generate is a QdcCompileError at the statement's line;
- a target whose capabilities exclude an adstack type refuses it at the stack's variable;
- the heap layout and the overflow word are defined once (runtime/contract/adstack_layout.py),
  and a kernel's metadata records the layout its code was generated for.
"""
from __future__ import annotations

import inspect
import os
import re

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.base import Capabilities
from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.target import TARGET as CPU, CpuTarget
from qdc.compiler.targets.cpu.widen import WideChunkEnv
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
from qdc.compiler.targets.llvm import llvm_ir
from qdc.compiler.targets.llvm.target import MATH_ARITY, External, LlvmTarget
from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.contract.errors import QdcCompileError

from conftest import REPO_ROOT as ROOT
LLVM_FOLDER = os.path.join(ROOT, "compiler", "targets", "llvm")
LIBM_NAMES = ("sinf", "cosf", "tanf", "asinf", "acosf", "atanf", "atan2f", "tanhf", "expf", "logf", "powf",
              "sqrtf", "floorf", "ceilf", "fabsf", "fabs", "rintf", "roundf", "fmodf", "fmod", "sincos", "sincosf")
THREADING = re.compile(r"\bomp_\w+|\bGOMP_\w+|-lgomp|-lm\b")


def _sources(folder: str) -> dict:
    return {name: open(os.path.join(folder, name), encoding="utf-8").read() for name in sorted(os.listdir(folder))
            if name.endswith(".py")}


def test_shared_llvm_lowering_names_no_libm_or_openmp():
    # LLVM's own intrinsics are fine, and so are methods named like libm's functions (the operations
    # targets/fdlibm.py's algorithms are written against, which llvm/inline_math.py implements as IR)
    libm = re.compile(r"(?<!llvm\.)(?<!\.)(?<!def )\b(" + "|".join(LIBM_NAMES) + r")\b")
    found = [f"{name}: {m.group(0)}" for name, text in _sources(LLVM_FOLDER).items()
             for m in list(libm.finditer(text)) + list(THREADING.finditer(text))]
    assert not found, found


@pytest.fixture(scope="module", autouse=True)
def _cpu():
    qd.init(arch=qd.cpu)


x = None


def _fields():
    global x, n, loss, x64, loss64
    if x is None:
        x = qd.field(qd.f32, shape=8, needs_grad=True)
        x64 = qd.field(qd.f64, shape=8, needs_grad=True)
        n = qd.field(qd.i32, shape=())
        loss = qd.field(qd.f32, shape=(), needs_grad=True)
        loss64 = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def math_loop():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) + qd.tan(v) * 0.5 + qd.atan2(v, 2.0) + v ** 1.5 + qd.sqrt(abs(v)) + qd.floor(v)
        loss[None] += v


@qd.kernel
def f64_loop():
    for i in x64:
        w = x64[i]  # the loop-carried f64 local: the stand-in GPU target cannot store it
        for _ in range(n[None]):
            w = qd.sin(w) * 0.5 + 1.0
        loss64[None] += w


def _grad_ir(kernel):
    _fields()
    k = kernel._primal
    return K.compile_kernel(k.fn, k.params, Options(), variant="grad")


class StandInGpu(LlvmTarget):
    """What a GPU target gives the shared lowering: its own math functions (as libdevice's
    `__nv_*`) and its own slice index (a global invocation id)."""
    arch = "standin"

    def __init__(self, math_table=None):
        self.math_table = math_table if math_table is not None else {
            op: External(f"__dev_{op}_f32", f"__dev_{op}_f64") for op in MATH_ARITY}

    def emit_slice_index(self, mb, builder):
        from llvmlite import ir as ll
        return builder.call(mb.declare("__dev_invocation_id", ll.IntType(64), []), [])


def _declared(module_text: str) -> set:
    return set(re.findall(r"^declare [^@]*@\"?([\w.$]+)", module_text, re.M))


def test_math_and_thread_slice_come_from_the_target():
    compiled = _grad_ir(math_loop)
    text = str(codegen.generate_llvm(compiled.ir, compiled.meta, target=StandInGpu()))
    own = {name for name in _declared(text) if not name.startswith("llvm.")}
    # GOMP_parallel is the CPU dispatch codegen.generate_llvm wraps the tasks in; the rest is the lowering's
    assert own - {"GOMP_parallel"} == {"__dev_sin_f32", "__dev_cos_f32", "__dev_tan_f32", "__dev_atan2_f32",
                                       "__dev_pow_f32", "__dev_sqrt_f32", "__dev_abs_f32", "__dev_floor_f32",
                                       "__dev_invocation_id"}, own
    assert "omp_get_thread_num" not in text and "tanf" not in text


def test_cpu_target_supplies_libm_and_the_openmp_thread_number(monkeypatch):
    """math_loop's math is in a loop-carried chain: the CPU's scalar code calls the C library
    there (`chain_math_table`); elsewhere it is inline code (tests/targets/cpu/test_cpu_vector_math.py),
    and the width-W code computes it inline over the lanes (tests/targets/cpu/test_cpu_widen.py)."""
    monkeypatch.setenv(SCALAR_SWITCH, "0")
    compiled = _grad_ir(math_loop)
    text = str(codegen.generate_llvm(compiled.ir, compiled.meta, target=CPU))
    declared = _declared(text)
    assert {"tanf", "atan2f", "omp_get_thread_num", "llvm.sin.f32", "llvm.pow.f32"} <= declared, declared


def test_a_math_op_the_target_lacks_is_an_error_at_its_line():
    compiled = _grad_ir(math_loop)
    table = {op: impl for op, impl in StandInGpu().math_table.items() if op != "tan"}
    with pytest.raises(QdcCompileError) as e:
        codegen.generate_llvm(compiled.ir, compiled.meta, target=StandInGpu(table))
    lines, first = inspect.getsourcelines(math_loop._primal.fn)
    assert (e.value.filename, e.value.line) == (__file__, first + lines.index(next(s for s in lines if "qd.tan" in s)))
    assert "'tan' of 32-bit floats is not available on target 'standin'" in str(e.value)
    assert "kernel 'math_loop'" in str(e.value) and "qd.tan(v)" in str(e.value)  # the statement, its source line


@pytest.mark.parametrize("widen", ["0", "1"], ids=["scalar_code", "width_w_code"])
def test_a_code_generator_failure_is_located_not_a_traceback(monkeypatch, widen):
    monkeypatch.setenv(SCALAR_SWITCH, widen)
    compiled = _grad_ir(math_loop)

    def broken(self, s):
        raise KeyError("no such thing")
    monkeypatch.setattr(llvm_ir._Env, "s_Unary", broken)
    monkeypatch.setattr(WideChunkEnv, "s_Unary", broken)
    with pytest.raises(QdcCompileError, match="internal compiler error while generating code: KeyError") as e:
        codegen.generate_llvm(compiled.ir, compiled.meta, target=CPU)
    assert e.value.filename == __file__ and e.value.line > 0


class StandInNoF64(CpuTarget):
    """A target whose adstacks hold no f64 (SPIR-V's float heap is f32), on CPU codegen."""
    capabilities = Capabilities(float64=False, adstack_dtypes=frozenset({"f32", "i32", "u1"}))


def test_an_adstack_type_the_target_cannot_store_is_refused_at_the_variable():
    compiled = _grad_ir(f64_loop)
    with pytest.raises(QdcCompileError) as e:
        StandInNoF64().compile(compiled.ir, compiled.meta, Options())
    lines, first = inspect.getsourcelines(f64_loop._primal.fn)
    assert e.value.filename == __file__
    assert e.value.line == first + lines.index(next(s for s in lines if "w = x64[i]" in s))
    assert "f64 value of 'w'" in str(e.value) and "'cpu' stores only f32, i32, u1" in str(e.value)
    compiled32 = _grad_ir(math_loop)  # f32 stacks pass the check and compile
    assert StandInNoF64().compile(compiled32.ir, compiled32.meta, Options())["so"]


def test_overflow_word_round_trips_and_rejects_what_does_not_fit():
    for required, task, stack in [(1, 0, 0), (123456, 7, 65535), (1 << 40, 65535, 3)]:
        code = layout.encode_overflow(required, task, stack)
        assert layout.decode_overflow(code) == (min(required, layout.REQUIRED_MAX), task, stack)
    assert layout.encode_overflow(5, 1, 2) > layout.encode_overflow(4, 9, 9)  # umax keeps the largest need
    with pytest.raises(ValueError):
        layout.overflow_site(1 << 16, 0)


def test_heap_layout_is_defined_once_and_recorded_in_the_metadata():
    sources = {name: text for name, text in _sources(os.path.join(ROOT, "runtime")).items() if "adstack" in name}
    sources.update({"llvm/" + name: text for name, text in _sources(LLVM_FOLDER).items()})
    literal = re.compile(r"HEADER_BYTES\s*=\s*\d|0xFFFF|>>\s*32|<<\s*32|\+ 7\) & -8|nbytes \* \(2")
    assert not [f"{name}: {m.group(0)}" for name, text in sources.items() for m in literal.finditer(text)]
    compiled = _grad_ir(math_loop)
    CpuTarget().compile(compiled.ir, compiled.meta, Options())
    assert compiled.meta.adstack["layout"] == layout.LLVM_HEAP.record()
    assert layout.LLVM_HEAP.stack_bytes(3, 8) == 32 and layout.LLVM_HEAP.entry_bytes("f64", True) == 16
    other = dict(layout.LLVM_HEAP.record(), header_bytes=16)
    with pytest.raises(ValueError, match="another adstack heap layout"):
        layout.check_record(other, "k")
    layout.check_record(None, "k")  # written before the record existed: the LLVM heap
