"""The CUDA target (compiler side): PTX on any machine, assembled by ptxas in CI.

- a representative set of kernels (saxpy, ndrange stencil, reductions, control flow, math,
  every dtype, atomics, temporaries across tasks, a dynamic-loop gradient with adstacks)
  compiles to PTX for sm_70 and sm_90, each module assembled by `ptxas` from the
  `nvidia-cuda-nvcc` package when it is installed (skipped, saying so, when not); CUDA 13's
  ptxas no longer assembles for sm_70 GPUs, so sm_70 PTX is assembled for the oldest GPU it
  knows (sm_75), as the driver JIT-compiles it on a newer GPU;
- one ptx_kernel entry per task, grid-stride loops indexed by the global thread id in 64
  bits, math from libdevice and never the host's libm, native float atomic adds;
- `cuda_arch` is validated and enters the cache key; `qdc build --arch cuda` and
  `qdc inspect --ptx` work on a machine without a GPU.
"""
from __future__ import annotations

import re

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit
from qdc.runtime.contract.errors import QdcCompileError
from backend_util import build_and_list, refused_build_option

GPUS = ("sm_70", "sm_90")
N = 64
F32_1D = qd.types.ndarray(qd.f32, ndim=1)


def _ptxas_gpu(cuda_arch: str) -> str:
    """The GPU ptxas assembles `cuda_arch` PTX for (skips, saying why, when it cannot)."""
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    gpu = toolkit.assembling_gpu(cuda_arch)
    if gpu is None:
        pytest.skip(f"the installed ptxas assembles none of the GPUs that run {cuda_arch} PTX")
    return gpu


@pytest.fixture(scope="module")
def kernels():
    """name -> (kernel, variants): each a shape of code the suite compiles."""
    qd.init(arch=qd.cpu)
    x = qd.field(qd.f32, shape=N, needs_grad=True)
    grid = qd.field(qd.f32, shape=(16, 16))
    out = qd.field(qd.f32, shape=(16, 16))
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    x64 = qd.field(qd.f64, shape=N, needs_grad=True)
    loss64 = qd.field(qd.f64, shape=(), needs_grad=True)
    ints = qd.field(qd.i32, shape=8)
    flags = qd.field(qd.u1, shape=N)
    @qd.kernel
    def saxpy(a: qd.f32, xs: F32_1D, ys: F32_1D):
        for i in xs:
            ys[i] = a * xs[i] + ys[i]

    @qd.kernel
    def stencil():
        for i, j in qd.ndrange((1, 15), (1, 15)):
            out[i, j] = 0.25 * (grid[i - 1, j] + grid[i + 1, j] + grid[i, j - 1] + grid[i, j + 1])

    @qd.kernel
    def reductions(a: F32_1D, res: F32_1D):
        s = 0.0
        m = -1e30
        for i in a:
            s += a[i]
            qd.atomic_max(m, a[i])
            loss[None] += a[i] * a[i]
        res[0] = s
        res[1] = m

    @qd.kernel
    def control_flow(a: F32_1D, limit: qd.i32):
        for i in a:
            v = a[i]
            k = 0
            while v > 1.0:
                v = v * 0.5
                k += 1
                if k >= limit:
                    break
            if i % 2 == 0:
                a[i] = v
            else:
                continue
        qd.loop_config(serialize=True)
        for i in range(N):
            if a[i] < 0.0:
                break
            a[i] += 1.0
        qd.loop_config(block_dim=128)
        for i in range(N):
            flags[i] = a[i] > 0.5

    @qd.kernel
    def math32():
        for i in x:
            v = x[i]
            r = qd.sin(v) + qd.cos(v) + qd.tan(v) + qd.asin(v) + qd.acos(v) + qd.atan(v) + qd.tanh(v)
            r += qd.exp(v) + qd.log(v) + qd.sqrt(v) + qd.floor(v) + qd.ceil(v) + qd.round(v) + abs(v)
            r += v ** 1.5 + qd.atan2(v, 2.0) + v // 0.3 + v % 0.3 + qd.rsqrt(v) + max(v, 0.5) + min(v, 0.5)
            loss[None] += r

    @qd.kernel
    def math64():
        for i in x64:
            v = x64[i]
            r = qd.sin(v) + qd.cos(v) + qd.tan(v) + qd.asin(v) + qd.acos(v) + qd.atan(v) + qd.tanh(v)
            r += qd.exp(v) + qd.log(v) + qd.sqrt(v) + qd.floor(v) + qd.ceil(v) + qd.round(v) + abs(v)
            r += v ** 1.5 + qd.atan2(v, 2.0) + v // 0.3 + v % 0.3
            loss64[None] += r

    @qd.kernel
    def every_dtype(a: qd.i8, b: qd.i16, c: qd.i32, d: qd.i64, e: qd.u8, f: qd.u16, g: qd.u32, h: qd.u64,
                    p: qd.f16, q: qd.f32, r: qd.f64, s: qd.u1, res: qd.types.ndarray(qd.f64, ndim=1)):
        for i in range(N):
            t = qd.f64(a * 2 + i) + qd.f64(b // 3) + qd.f64(c % 7) + qd.f64(d << 2) + qd.f64(e >> 1)
            t += qd.f64(f ^ 5) + qd.f64(g | 1) + qd.f64(h & 6) + qd.f64(p * p + qd.sin(p)) + qd.f64(q) + r
            if s:
                t = -t
            res[i] = t

    @qd.kernel
    def atomics(a: F32_1D, b: qd.types.ndarray(qd.f64, ndim=1), c: qd.types.ndarray(qd.i64, ndim=1),
                h: qd.types.ndarray(qd.f16, ndim=1), u: qd.types.ndarray(qd.u32, ndim=1)):
        for i in range(N):
            qd.atomic_add(a[0], 1.5)
            qd.atomic_min(a[1], a[i])
            qd.atomic_max(a[2], a[i])
            qd.atomic_add(b[0], 2.5)
            qd.atomic_sub(b[1], 0.5)
            qd.atomic_add(c[0], i)
            qd.atomic_min(c[1], i)
            qd.atomic_and(ints[0], i)
            qd.atomic_or(ints[1], i)
            qd.atomic_xor(ints[2], i)
            qd.atomic_max(u[0], qd.u32(i))
            qd.atomic_add(h[0], qd.f16(1.0))
            flags[i] = qd.atomic_add(ints[3], 1) > 3

    @qd.kernel
    def temps_across_tasks(a: F32_1D):
        total = 0.0
        for i in a:
            total += a[i]
        mean = total / N
        for i in a:
            a[i] = a[i] - mean

    @qd.kernel
    def dynamic_loop():  # the gradient keeps v on an adstack: n is known only at launch
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            loss[None] += v

    @qd.kernel
    def dynamic_loop64():
        for i in x64:
            w = x64[i]
            j = 0
            for _ in range(n[None]):
                w = qd.tanh(w) * 0.5 + qd.f64(j)
                j += 1
            loss64[None] += w

    return {"saxpy": (saxpy, ("forward",)), "stencil": (stencil, ("forward",)),
            "reductions": (reductions, ("forward",)), "control_flow": (control_flow, ("forward",)),
            "math32": (math32, ("forward", "grad")), "math64": (math64, ("forward", "grad")),
            "every_dtype": (every_dtype, ("forward",)), "atomics": (atomics, ("forward",)),
            "temps_across_tasks": (temps_across_tasks, ("forward",)),
            "dynamic_loop": (dynamic_loop, ("forward", "grad")), "dynamic_loop64": (dynamic_loop64, ("grad",))}


CASES = [(name, variant) for name, variants in (
    ("saxpy", ("forward",)), ("stencil", ("forward",)), ("reductions", ("forward",)),
    ("control_flow", ("forward",)), ("math32", ("forward", "grad")), ("math64", ("forward", "grad")),
    ("every_dtype", ("forward",)), ("atomics", ("forward",)), ("temps_across_tasks", ("forward",)),
    ("dynamic_loop", ("forward", "grad")), ("dynamic_loop64", ("grad",))) for variant in variants]


def _compile(kernels, name: str, variant: str = "forward", **options):
    k = kernels[name][0]._primal
    return K.compile_kernel(k.fn, k.params, Options(arch="cuda", **options), arch="cuda", variant=variant)


def _ptx(compiled) -> str:
    return compiled.artifacts["ptx"].decode()


def test_the_case_list_covers_every_kernel(kernels):
    assert {(n, v) for n, (_, vs) in kernels.items() for v in vs} == set(CASES)


@pytest.mark.parametrize("name,variant", CASES)
def test_ptx_of_each_kernel_assembles_for_sm70_and_sm90(kernels, name, variant):
    for cuda_arch in GPUS:
        try:
            compiled = _compile(kernels, name, variant, cuda_arch=cuda_arch)
        except QdcCompileError as e:
            if toolkit.libdevice_path() is None and toolkit.PACKAGE in str(e):
                pytest.skip(f"the kernel does math and libdevice is not installed (pip install {toolkit.PACKAGE})")
            raise
        ptx = _ptx(compiled)
        assert re.search(rf"^\.target {cuda_arch}\b", ptx, re.M), ptx[:400]
        entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
        assert entries == [t.entry for t in compiled.meta.tasks]  # one ptx_kernel per task, no other
        assert "__nvvm_reflect" not in ptx and not re.search(r"\.extern \.func", ptx)  # all linked and resolved
        toolkit.assemble(ptx, _ptxas_gpu(cuda_arch))


def test_grid_stride_loop_over_the_global_thread_id(kernels):
    compiled = _compile(kernels, "saxpy")
    ptx = _ptx(compiled)
    for register in ("%ctaid.x", "%ntid.x", "%tid.x", "%nctaid.x"):
        assert register in ptx
    assert "mul.wide.u32" in ptx  # blockIdx.x * blockDim.x widened to 64 bits
    assert compiled.meta.tasks[0].launch == {"policy": "grid", "block_dim": 256}


def test_launch_policies_follow_loop_config_and_serial_tasks(kernels):
    meta = _compile(kernels, "control_flow").meta
    assert [t.launch["block_dim"] for t in meta.tasks] == [256, 1, 128]
    assert meta.tasks[1].serial


def test_adstack_slice_is_the_64_bit_global_thread_id(kernels):
    compiled = _compile(kernels, "dynamic_loop", "grad")
    assert compiled.meta.adstack["stacks"] and compiled.meta.adstack["layout"]
    from qdc.compiler.targets.cuda.codegen import generate_llvm
    from qdc.compiler.targets.cuda.target import TARGET
    ll = str(generate_llvm(compiled.ir, compiled.meta, "sm_70", False, TARGET))
    assert "omp_get_thread_num" not in ll
    # blockIdx.x * blockDim.x + threadIdx.x in i64, times the 8-byte granule of the interleaved
    # slices (adstack_layout.LLVM_HEAP_INTERLEAVED), as the thread's byte offset in the heap
    assert compiled.meta.adstack["layout"]["slices"] == {"interleave": 8}
    slice_offset = re.search(r'(%"[.\d]+") = add nuw i64 (%"[.\d]+"), %"[.\d]+"\n\s*(%"[.\d]+") = mul nuw i64 \1, 8\n'
                             r'\s*%"[.\d]+" = getelementptr i8, ptr %"[.\d]+", i64 \3', ll)
    assert slice_offset, ll
    product = re.search(re.escape(slice_offset.group(2)) + r' = mul nuw i64 (%"[.\d]+"), (%"[.\d]+")', ll)
    registers = {m.group(1): m.group(2) for m in re.finditer(
        r'(%"[.\d]+") = call i32 @"llvm\.nvvm\.read\.ptx\.sreg\.(\w+\.x)"', ll)}
    widened = dict(re.findall(r'(%"[.\d]+") = zext i32 (%"[.\d]+") to i64', ll))
    assert {registers[widened[product.group(1)]], registers[widened[product.group(2)]]} == {"ctaid.x", "ntid.x"}
    # granule g of the slice is g * (threads * 8) bytes further: the threads word is the ctx word
    # after the stacks' words
    threads_word = compiled.meta.adstack_threads_slot
    assert re.search(rf'(%"[.\d]+") = getelementptr i64, ptr %"[.\d]+", i64 {threads_word}\n\s*(%"[.\d]+") = load i64, '
                     rf'ptr \1\n\s*%"[.\d]+" = mul nuw i64 \2, 8', ll), ll
    assert "mul.lo.s64" in _ptx(compiled) or "mad.lo.s64" in _ptx(compiled)


def test_math_comes_from_libdevice_never_libm(kernels):
    if toolkit.libdevice_path() is None:
        pytest.skip(f"libdevice not installed (pip install {toolkit.PACKAGE})")
    ptx = _ptx(_compile(kernels, "math32"))
    libm = re.compile(r"\b(sinf|cosf|tanf|expf|logf|powf|atan2f|tanhf|sin|cos|exp|pow)\b")
    assert not libm.search(ptx), libm.search(ptx)
    assert ".extern" not in ptx  # libdevice linked in: nothing left for a loader to resolve


def test_float_atomic_adds_are_native(kernels):
    ptx = _ptx(_compile(kernels, "atomics"))
    assert re.search(r"atom(\.\w+)*\.add\.f32", ptx) and re.search(r"atom(\.\w+)*\.add\.f64", ptx)


def test_a_kernel_without_math_needs_no_toolkit(kernels, monkeypatch):
    monkeypatch.setattr(toolkit, "libdevice_bitcode", _missing_libdevice)
    assert _ptx(_compile(kernels, "saxpy"))
    with pytest.raises(QdcCompileError, match="nvidia-cuda-nvcc"):
        _compile(kernels, "math32")


def _missing_libdevice():
    raise QdcCompileError("target 'cuda' needs NVIDIA's libdevice ... pip install nvidia-cuda-nvcc")


def test_cuda_arch_is_validated_and_keys_the_cache():
    from qdc.compiler.targets import get
    with pytest.raises(ValueError, match="cuda_arch"):
        Options().update(cuda_arch="sm_7")
    with pytest.raises(ValueError, match="cuda_arch"):
        Options().update(cuda_arch="sm_80a")
    Options().update(cuda_arch="sm_90a")
    target = get("cuda")
    assert "sm_70" in target.cache_description(Options(arch="cuda"))
    assert target.cache_description(Options(arch="cuda", cuda_arch="sm_90")) != \
        target.cache_description(Options(arch="cuda"))


def test_block_dim_above_cuda_limit_is_an_error_at_the_loop():
    qd.init(arch=qd.cpu)
    a = qd.field(qd.f32, shape=8)

    @qd.kernel
    def wide():
        qd.loop_config(block_dim=2048)
        for i in a:
            a[i] = 1.0

    k = wide._primal
    with pytest.raises(QdcCompileError, match="block_dim=2048"):
        K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda")


def test_qdc_build_and_inspect_ptx_without_a_gpu(tmp_path):
    saxpy, grad = build_and_list(tmp_path, "cuda", "ptx", "--cuda-arch", "sm_90")
    assert ".target sm_90" in saxpy and ".visible .entry" in saxpy
    assert ".visible .entry" in grad, grad
    assert "cuda_arch" in refused_build_option(tmp_path, "cuda", "--cuda-arch", "sm_7")


def test_bounds_checked_code_assembles(kernels):
    compiled = _compile(kernels, "control_flow", debug=True)
    assert compiled.meta.debug_checks and "atom" in _ptx(compiled)  # the first failure wins a compare-and-swap
    toolkit.assemble(_ptx(compiled), _ptxas_gpu("sm_70"))
