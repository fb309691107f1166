"""LLVM's options by kernel size (compiler/targets/cpu/codegen.py): a module with a function
above SLP_LARGEST_FUNCTION instructions is optimised without the SLP vectoriser (optnone entry
functions do not count), and computes the same; a module whose functions are all at most
SMALL_MODULE_LARGEST_FUNCTION instructions is built without non-trivial loop unswitching and
loop strength reduction, LLVM's defaults restored after it, and computes the same."""
from __future__ import annotations

import re
import uuid

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir as ll

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cpu import codegen

SOURCE = '''
import qdc as qd

F = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def polynomial(x: F, out: F):
    for i in range(x.shape[0]):
        v = x[i]
        acc = 0.0 * {salt}  # each build its own source, so that no cache entry serves it
        for k in qd.static(range(12)):
            acc = acc * v + (k + 1.0)
        out[i] = acc
'''
_OPTIMISE, _LARGEST_FUNCTION = codegen.optimise, codegen.largest_function


def _build_and_run(tmp_path, monkeypatch, limit: int, x: np.ndarray) -> tuple[list, np.ndarray]:
    """polynomial(x), compiled afresh (a module of its own) with SLP_LARGEST_FUNCTION = limit:
    the result and what compile_kernel passed (the largest function's size, then `slp`)."""
    seen = []

    def optimise(module, *args, slp=True, **kwargs):
        seen.append(slp)
        return _OPTIMISE(module, *args, slp=slp, **kwargs)

    def largest_function(module):
        seen.append(_LARGEST_FUNCTION(module))
        return seen[-1]
    monkeypatch.setattr(codegen, "SLP_LARGEST_FUNCTION", limit)
    monkeypatch.setattr(codegen, "optimise", optimise)
    monkeypatch.setattr(codegen, "largest_function", largest_function)
    path = tmp_path / f"by_size_{uuid.uuid4().hex[:8]}.py"
    path.write_text(SOURCE.format(salt=limit))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(path.stem)
    out = np.zeros_like(x)
    module.polynomial(x, out)
    qd.sync()
    return seen, out


def test_slp_by_function_size(tmp_path, monkeypatch, rng):
    qd.init(arch=qd.cpu)
    x = rng.uniform(-1.0, 1.0, 257 + int(rng.integers(0, 64))).astype(np.float32)
    with_slp, small = _build_and_run(tmp_path, monkeypatch, 10**9, x)
    without_slp, large = _build_and_run(tmp_path, monkeypatch, 10, x)
    assert with_slp[-1] is True and without_slp[-1] is False
    assert without_slp[0] > 10  # the task body's instructions
    np.testing.assert_array_equal(large, small)
    want = np.zeros_like(x, dtype=np.float64)
    for k in range(12):
        want = want * x + (k + 1.0)
    np.testing.assert_allclose(small, want, rtol=1e-5, atol=1e-5)


def test_largest_function_leaves_out_optnone_functions():
    module = ll.Module()
    for name, size, optnone in (("big_entry", 40, True), ("body", 7, False)):
        fn = ll.Function(module, ll.FunctionType(ll.VoidType(), []), name)
        if optnone:
            fn.attributes.add("noinline")
            fn.attributes.add("optnone")
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        slot = b.alloca(ll.IntType(32))
        for _ in range(size - 2):
            b.store(ll.Constant(ll.IntType(32), 1), slot)
        b.ret_void()
    assert codegen.largest_function(module) == 7


F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _either_side(a: F1, b: F1, flag: qd.i32):
    """A branch on a value the loop does not change: LLVM's non-trivial unswitching would copy
    the loop for each side."""
    for i in range(a.shape[0]):
        if flag > 0:
            b[i] = a[i] * 2.0 + 1.0
        else:
            b[i] = a[i] - 3.0


@qd.kernel
def _accumulate(a: F1, b: F1):
    """Atomics: the loop is copied for `alone`, whose plain read-modify-writes vectorise."""
    for i in range(a.shape[0]):
        b[i] += 2.0 * a[i]


@qd.kernel
def _chain(a: F1, n: qd.i32):
    """A dynamic inner loop: its task runs W iterations at a time (a width-W chunk)."""
    for i in range(a.shape[0]):
        v = a[i]
        for _ in range(n):
            v = v * 0.5 + 1.0
        a[i] = v


def _compile(monkeypatch, kernel, arrays: tuple, limit: int) -> tuple[str, list]:
    """`kernel`'s optimised LLVM IR with SMALL_MODULE_LARGEST_FUNCTION = limit, and the LLVM
    options the build set, in order."""
    calls = []
    set_option = llvm.set_option

    def recording(name, option):
        calls.append(option)
        set_option(name, option)
    monkeypatch.setattr(codegen, "SMALL_MODULE_LARGEST_FUNCTION", limit)
    monkeypatch.setattr(llvm, "set_option", recording)
    k = kernel_of(kernel)
    text = K.compile_kernel(k.fn, k.specialise(arrays)[1], Options()).artifacts["ll"].decode()
    return text, calls


def test_small_modules_are_built_without_unswitching_and_strength_reduction(monkeypatch):
    arrays = (np.zeros(4, np.float32), np.zeros(4, np.float32), 1)
    small, calls = _compile(monkeypatch, _either_side, arrays, 10**9)
    assert calls == [codegen._NO_STRENGTH_REDUCTION, codegen._NO_UNSWITCHING, *codegen._LLVM_DEFAULTS]
    assert ".us" not in small  # LLVM names the blocks of an unswitched loop's copy `<block>.us`
    large, calls = _compile(monkeypatch, _either_side, arrays, 0)
    assert calls == []
    assert ".us" in large, "LLVM's defaults no longer unswitch this loop: the test checks nothing"


def test_small_modules_with_atomics_keep_unswitching(monkeypatch):
    small, calls = _compile(monkeypatch, _accumulate, (np.zeros(4, np.float32),) * 2, 10**9)
    assert calls == [codegen._NO_STRENGTH_REDUCTION, *codegen._LLVM_DEFAULTS]
    assert ".us" in small and "atomicrmw" in small
    assert re.search(r"fadd <\d+ x float>", small), "the copy for a thread alone is not vectorised"


def test_small_modules_with_width_w_chunks_keep_strength_reduction(monkeypatch):
    _, calls = _compile(monkeypatch, _chain, (np.zeros(4, np.float32), 3), 10**9)
    assert calls == [codegen._NO_UNSWITCHING, *codegen._LLVM_DEFAULTS]


def test_strength_reduction_is_left_out_on_x86_only():
    text = 'define internal void @"t_chunk"(ptr %".1") {\nentry:\n  ret void\n}\n'
    assert codegen.small_module_options(10, text, False, "x86_64") == (codegen._NO_STRENGTH_REDUCTION,
                                                                       codegen._NO_UNSWITCHING)
    assert codegen.small_module_options(10, text, False, "aarch64") == (codegen._NO_UNSWITCHING,)
    assert codegen.small_module_options(codegen.SMALL_MODULE_LARGEST_FUNCTION + 1, text, False, "x86_64") == ()


def test_small_module_options_compute_the_same(rng):
    """Both sides of the branch, and the atomics on one thread (plain updates, `alone`) and on
    several, against numpy."""
    n = 1000 + int(rng.integers(0, 100))
    a = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    for threads in (1, 4):
        qd.init(arch=qd.cpu, cpu_max_num_threads=threads)
        for flag in (1, 0):
            b = np.zeros(n, np.float32)
            _either_side(a, b, flag)
            qd.sync()
            np.testing.assert_array_equal(b, a * np.float32(2.0) + np.float32(1.0) if flag else a - np.float32(3.0))
        b = rng.uniform(-1.0, 1.0, n).astype(np.float32)
        want = b + np.float32(2.0) * a
        _accumulate(a, b)
        qd.sync()
        np.testing.assert_array_equal(b, want)
