"""The AMDGPU target: code objects built on any machine, no GPU, no ROCm.

- every kernel shape the CUDA target's tests compile (test_cuda_target.py's `kernels`: saxpy,
  stencil, reductions, control flow, f32 and f64 math, every dtype, atomics, temporaries
  across tasks, dynamic-loop gradients with adstacks) builds a code object for each gfx
  processor of `amdgpu_targets`; each is an AMDGPU ELF holding, for every task, its kernel
  symbol, its kernel descriptor `<entry>.kd` and its `amdhsa.kernels` metadata entry (the
  note parsed in Python, code object v5); skipped, saying so, without ld.lld 16+;
- the grid-stride loop and the adstack slice read the dispatch packet and the workgroup id;
- math the backend lowers no call for (no ROCm device libraries) is the shared inline IR of
  llvm/inline_math.py, whose functions, built for the host (as the CPU target runs them),
  agree with numpy; no kernel is left calling a library;
- `amdgpu_targets` is validated and keys the cache; a missing ld.lld is a clear error;
  `qdc build --arch amdgpu` and `qdc inspect --amdgcn` work on a machine without a GPU.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.amdgpu import linker
from qdc.compiler.targets.amdgpu.target import AMDGPU_MATH, BACKEND_F32_MATH
from qdc.compiler.targets.amdgpu.arch import DEFAULT_AMDGPU_TARGETS
from qdc.compiler.targets.amdgpu.code_object import EM_AMDGPU, CodeObject
from qdc.compiler.targets.llvm import inline_math
from qdc.compiler.targets.llvm.target import Inline, PerWidth
from qdc.runtime.contract.errors import QdcCompileError
from test_cuda_target import CASES, kernels  # noqa: F401 (the fixture: the kernels the suite compiles)
from backend_util import build_and_list, refused_build_option


def _need_lld():
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})")


def _compile(kernels, name: str, variant: str = "forward", **options):
    _need_lld()
    k = kernels[name][0]._primal
    return K.compile_kernel(k.fn, k.params, Options(arch="amdgpu", **options), arch="amdgpu", variant=variant)


@pytest.mark.parametrize("name,variant", CASES)
def test_each_kernel_has_a_code_object_per_gfx_target_with_every_task(kernels, name, variant):
    compiled = _compile(kernels, name, variant)
    entries = [t.entry for t in compiled.meta.tasks]
    for gfx in DEFAULT_AMDGPU_TARGETS:
        co = CodeObject(compiled.artifacts[f"hsaco_{gfx}"])
        assert co.machine == EM_AMDGPU and co.target.startswith(f"amdgcn-amd-amdhsa--{gfx}"), co.target
        assert co.metadata["amdhsa.version"] == [1, 2]  # code object v5
        described = {k[".name"]: k for k in co.kernels}
        assert sorted(described) == sorted(entries)  # one amdgpu_kernel per task, no other
        for entry in entries:
            assert entry in co.symbols and f"{entry}.kd" in co.symbols, sorted(co.symbols)
            assert co.symbols[f"{entry}.kd"][1] == 64  # a kernel descriptor is 64 bytes
            meta = described[entry]
            assert meta[".symbol"] == f"{entry}.kd"
            assert [a[".value_kind"] for a in meta[".args"]][0] == "global_buffer"  # the ctx pointer
            assert meta[".max_flat_workgroup_size"] >= compiled.meta.tasks[entries.index(entry)].launch["block_dim"]


def test_amdgpu_targets_choose_the_code_objects_and_key_the_cache(kernels):
    from qdc.compiler.targets import get
    compiled = _compile(kernels, "saxpy", amdgpu_targets="gfx942,gfx1030")
    assert sorted(k for k in compiled.artifacts if k.startswith("hsaco_")) == ["hsaco_gfx1030", "hsaco_gfx942"]
    with pytest.raises(ValueError, match="amdgpu_targets"):
        Options().update(amdgpu_targets="gfx9000")
    with pytest.raises(ValueError, match="amdgpu_targets"):
        Options().update(amdgpu_targets="sm_90")
    Options().update(amdgpu_targets=["gfx90a", "gfx1100"])
    target = get("amdgpu")
    assert "gfx90a,gfx942,gfx1100" in target.cache_description(Options(arch="amdgpu"))
    assert target.cache_description(Options(arch="amdgpu", amdgpu_targets="gfx90a")) != \
        target.cache_description(Options(arch="amdgpu"))


def test_grid_stride_loop_reads_the_dispatch_packet(kernels):
    compiled = _compile(kernels, "saxpy")
    ll = compiled.artifacts["ll"].decode()
    for name in ("llvm.amdgcn.workgroup.id.x", "llvm.amdgcn.workitem.id.x", "llvm.amdgcn.dispatch.ptr"):
        assert name in ll
    assert "amdgpu_kernel" in ll and compiled.meta.tasks[0].launch == {"policy": "grid", "block_dim": 256}


def test_launch_policies_follow_loop_config_and_serial_tasks(kernels):
    meta = _compile(kernels, "control_flow").meta
    assert [t.launch["block_dim"] for t in meta.tasks] == [256, 1, 128]


def test_adstack_slice_is_the_global_thread_id(kernels):
    compiled = _compile(kernels, "dynamic_loop", "grad")
    assert compiled.meta.adstack["stacks"] and compiled.meta.adstack["layout"]
    from qdc.compiler.targets.amdgpu.codegen import generate_llvm
    from qdc.compiler.targets.amdgpu.target import TARGET
    text = generate_llvm(compiled.ir, compiled.meta, False, TARGET)
    assert "omp_get_thread_num" not in text
    assert text.count("llvm.amdgcn.workgroup.id.x") >= 2  # the grid index and the heap slice both use it
    assert "alloca" in text and "addrspace(5)" in text  # private memory, as the backend requires


def test_no_kernel_calls_a_library(kernels):
    """Math is intrinsics the backend lowers or own code linked in: nothing is left to resolve."""
    for name in ("math32", "math64", "dynamic_loop64"):
        variant = "grad" if name == "dynamic_loop64" else "forward"
        ll = _compile(kernels, name, variant).artifacts["ll"].decode()
        declared = [line for line in ll.splitlines() if line.startswith("declare")]
        assert all("@llvm." in line for line in declared), declared


def _implementation(op: str, bits: int):
    impl = AMDGPU_MATH[op]
    return impl.for_bits(bits) if isinstance(impl, PerWidth) else impl


INLINE = [(op, bits) for op in inline_math.OPS for bits in (32, 64) if isinstance(_implementation(op, bits), Inline)]
REFERENCE = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
             "tanh": np.tanh, "exp": np.exp, "log": np.log, "pow": np.power, "atan2": np.arctan2}
DOMAIN = {"asin": (-1, 1), "acos": (-1, 1), "tanh": (-8, 8), "exp": (-700, 700), "pow": (0, 30), "log": (1e-30, 1e30)}


@pytest.fixture(scope="module")
def host_math():
    """The inline math functions AMDGPU kernels use, built for this machine (MCJIT), by (op, bits)."""
    import llvmlite.binding as llvm
    from llvmlite import ir as ll
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = ll.Module(name="inline_math")
    module.triple = llvm.get_process_triple()
    for op, bits in INLINE:
        inline_math.define(module, op, bits).linkage = ""  # callable from here, not only inlined
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    yield {(op, bits): engine.get_function_address(inline_math.function_name(op, bits)) for op, bits in INLINE}
    del engine


def test_math_is_backend_intrinsics_else_the_shared_inline_math():
    assert {op for op, bits in INLINE if bits == 64} == set(inline_math.OPS)
    assert {op for op, bits in INLINE if bits == 32} == set(inline_math.OPS) - set(BACKEND_F32_MATH)


@pytest.mark.parametrize("op,bits", INLINE)
def test_inline_math_agrees_with_numpy(host_math, rng, op, bits):
    ct, dt = (ctypes.c_double, np.float64) if bits == 64 else (ctypes.c_float, np.float32)
    nargs = 2 if op in ("pow", "atan2") else 1
    fn = ctypes.CFUNCTYPE(ct, *[ct] * nargs)(host_math[op, bits])
    lo, hi = DOMAIN.get(op, (-30, 30))
    xs = (np.exp(rng.uniform(np.log(lo), np.log(hi), 500)) if op == "log" else rng.uniform(lo, hi, 500)).astype(dt)
    ys = rng.uniform(-10, 10, 500).astype(dt)
    got = np.array([fn(*((x, y) if nargs == 2 else (x,))) for x, y in zip(xs, ys)], np.float64)
    want = REFERENCE[op](*((xs.astype(np.float64), ys.astype(np.float64)) if nargs == 2 else (xs.astype(np.float64),)))
    eps = float(np.finfo(dt).eps)
    tolerance = (64 if op == "pow" and bits == 64 else 8) * eps  # pow = exp(y log x): error grows with |y log x|
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=8 * eps)
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, -2.0]
    with np.errstate(all="ignore"):
        for x in specials:
            for y in (specials if nargs == 2 else [None]):
                args = (x, y) if nargs == 2 else (x,)
                g, w = fn(*args), float(REFERENCE[op](*[dt(a) for a in args]))
                assert (np.isnan(g) and np.isnan(w)) or g == pytest.approx(w, rel=8 * eps, abs=8 * eps), (args, g, w)


def test_missing_lld_names_the_package(kernels, monkeypatch):
    monkeypatch.setattr(linker, "find_lld", lambda: ())
    k = kernels["saxpy"][0]._primal
    with pytest.raises(QdcCompileError, match="lld-16"):
        K.compile_kernel(k.fn, k.params, Options(arch="amdgpu"), arch="amdgpu")


def test_qdc_build_and_inspect_amdgcn_without_a_gpu(tmp_path):
    _need_lld()
    saxpy, grad = build_and_list(tmp_path, "amdgpu", "amdgcn", "--amdgpu-targets", "gfx90a,gfx1100")
    assert "; gfx1100 (hsaco_gfx1100)" in saxpy and "; gfx90a (hsaco_gfx90a)" in saxpy
    assert saxpy.count("s_endpgm") >= 2
    assert "s_endpgm" in grad, grad
    assert "amdgpu_targets" in refused_build_option(tmp_path, "amdgpu", "--amdgpu-targets", "gfx1")
