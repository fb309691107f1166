"""`qd.atomic_mul(dst, v)`: `dst *= v` as one indivisible update, returning the old value, as
the other atomics. No backend has a multiplying atomic: it is a compare-and-swap loop on the
element's bits (LLVM `cmpxchg`, SPIR-V `OpAtomicCompareExchange`), and a product into one
address from a parallel loop becomes a thread-local product combined by one atomic per chunk.
Checked against numpy on random factors chosen so that floats neither overflow nor underflow
and integer products wrap exactly as numpy's do (odd factors: the product never becomes 0)."""
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.commands.inspect import inspect_ir
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit
from qdc.compiler.targets.spirv import tools as spirv_tools

from module_util import compile_error_of

DTYPES = {"f32": (qd.f32, np.float32), "f64": (qd.f64, np.float64), "i32": (qd.i32, np.int32),
          "i64": (qd.i64, np.int64), "u32": (qd.u32, np.uint32), "i8": (qd.i8, np.int8),
          "u16": (qd.u16, np.uint16)}


def factors(rng, npdt, n: int) -> np.ndarray:
    kind = np.dtype(npdt).kind
    if kind == "f":  # products of n factors in [0.99, 1.01] stay near 1
        return rng.uniform(0.99, 1.01, n).astype(npdt)
    odd = 2 * rng.integers(0, 4, n) + 1
    return (odd * rng.choice([-1, 1], n)).astype(npdt) if kind == "i" else odd.astype(npdt)


def assert_product(got, factors_, npdt):
    want = np.prod(factors_, dtype=npdt)
    if np.dtype(npdt).kind == "f":
        # the order of the factors is unspecified: each rounding is within half an ulp
        tol = len(factors_) * np.finfo(npdt).eps
        np.testing.assert_allclose(got, want, rtol=tol)
    else:
        assert got == want, (got, want)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_product_of_a_parallel_loop_matches_numpy(arch, rng, name):
    dt, npdt = DTYPES[name]
    n = 3000

    @qd.kernel
    def product(a: qd.types.ndarray(dtype=dt, ndim=1), out: qd.types.ndarray(dtype=dt, ndim=1)):
        for i in range(a.shape[0]):
            qd.atomic_mul(out[0], a[i])

    a = factors(rng, npdt, n)
    out = np.ones(1, npdt)
    product(a, out)
    qd.sync()
    assert_product(out[0], a, npdt)
    product(a, out)  # multiplies what is there
    qd.sync()
    assert_product(out[0], np.concatenate([a, a]), npdt)


@pytest.mark.parametrize("name", ["f32", "i32", "u16"])
def test_old_values_form_one_chain_per_element(arch, rng, name):
    """Every update sees the value the previous one left: for each element, the old values
    with the initial value replaced by the final one are the old values times their factors."""
    dt, npdt = DTYPES[name]
    n, targets = 1000, 4  # 4 u16 elements: whole 32-bit words

    @qd.kernel
    def chained(a: qd.types.ndarray(dtype=dt, ndim=1), out: qd.types.ndarray(dtype=dt, ndim=1),
                old: qd.types.ndarray(dtype=dt, ndim=1)):
        for i in range(a.shape[0]):
            old[i] = qd.atomic_mul(out[i % 4], a[i])

    a = factors(rng, npdt, n)
    start = factors(rng, npdt, targets)
    out, old = start.copy(), np.zeros(n, npdt)
    chained(a, out, old)
    qd.sync()
    for j in range(targets):
        mine = np.arange(j, n, targets)
        assert_product(out[j], np.concatenate([[start[j]], a[mine]]), npdt)
        after = np.sort(np.asarray(old[mine] * a[mine], npdt))
        if np.dtype(npdt).kind == "f":  # the chain links exactly: old * a is what was stored
            assert sorted(np.append(old[mine], out[j]).tolist()) == sorted(np.append(after, start[j]).tolist())
        else:
            assert np.array_equal(np.sort(np.append(old[mine], out[j])), np.sort(np.append(after, start[j])))


def test_fields_vectors_locals_and_the_returned_old_value(arch, rng):
    x = qd.field(qd.f64, shape=8)
    v = qd.Vector.field(3, qd.i32, shape=())
    a = factors(rng, np.float64, 8)
    iv = factors(rng, np.int32, 3)
    x.from_numpy(a)

    @qd.kernel
    def k(s: qd.f64, m: qd.types.vector(3, qd.i32)) -> qd.f64:
        v[None] = qd.Vector([1, 1, 1])
        old = qd.atomic_mul(v[None], m)  # per component; the old vector
        v[None] += old * 0
        p = 1.0
        qd.atomic_mul(p, s)  # a local: plain multiplication
        for i in x:
            qd.atomic_mul(x[i], s)
        return p

    s = float(rng.uniform(0.5, 2.0))
    assert k(s, qd.Vector(iv.tolist())) == np.float32(s)  # p = 1.0 is an f32 local
    np.testing.assert_array_equal(x.to_numpy(), a * s)
    np.testing.assert_array_equal(v[None].to_numpy(), iv)


def test_a_kernel_scope_product_is_reduced_per_chunk(arch, rng):
    """`p = 1; for i in x: qd.atomic_mul(p, x[i])`: the local is shared by every iteration,
    an atomic on a kernel temporary; the chunk's partial product starts from 1."""
    n = 5000
    x = qd.field(qd.f32, shape=n)
    a = factors(rng, np.float32, n)
    x.from_numpy(a)

    @qd.kernel
    def k() -> qd.f32:
        p = 1.0
        for i in x:
            qd.atomic_mul(p, x[i])
        return p

    assert_product(np.float32(k()), a, np.float32)


def test_the_product_accumulates_locally_with_identity_one(arch):
    @qd.kernel
    def product(a: qd.types.ndarray(dtype=qd.i32, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            qd.atomic_mul(out[0], a[i])

    a = np.full(10, 3, np.int32)
    text = inspect_ir(product, a, np.ones(1, np.int32))
    assert "accumulate_mul" in text and text.count("atomic_mul") == 1, text
    assert "const 1 : i32" in text or "1 : i32" in text, text


def test_bad_targets_are_located_errors(tmp_path):
    err, path = compile_error_of(tmp_path, "mul_bool", """
        import numpy as np
        import qdc as qd
        flags = qd.field(qd.u1, shape=4)

        @qd.kernel
        def bad():
            for i in flags:
                qd.atomic_mul(flags[i], True)
        """)
    assert err.filename == str(path) and err.line == 9
    assert "atomic_mul needs a numeric target, got u1" in str(err)


def test_a_differentiated_product_is_refused_at_its_line(tmp_path):
    err, path = compile_error_of(tmp_path, "mul_grad", """
        import qdc as qd
        x = qd.field(qd.f32, shape=4, needs_grad=True)
        y = qd.field(qd.f32, shape=(), needs_grad=True)

        @qd.kernel
        def forward():
            for i in x:
                qd.atomic_mul(y[None], x[i])

        def bad():
            forward.grad()
        """)
    assert err.filename == str(path) and err.line == 9
    assert "qd.atomic_mul on 'y' cannot be differentiated" in str(err) and "forward" in str(err)


def test_a_product_into_a_field_without_gradient_differentiates_the_rest(arch):
    """atomic_mul on a field that needs no gradient is fine in a grad kernel."""
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    counter = qd.field(qd.f32, shape=())

    @qd.kernel
    def forward():
        for i in x:
            y[None] += 2.0 * x[i]
            qd.atomic_mul(counter[None], 2.0)

    counter[None] = 1.0
    forward()
    y.grad[None] = 1.0
    forward.grad()
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full(4, 2.0, np.float32))


def mul_kernels():
    @qd.kernel
    def products(f: qd.types.ndarray(dtype=qd.f32, ndim=1), d: qd.types.ndarray(dtype=qd.f64, ndim=1),
                 i: qd.types.ndarray(dtype=qd.i64, ndim=1), h: qd.types.ndarray(dtype=qd.i16, ndim=1),
                 old: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for j in range(f.shape[0]):
            old[j] = qd.atomic_mul(f[j % 7], f[j])
            qd.atomic_mul(d[0], d[j])
            qd.atomic_mul(i[0], i[j])
            qd.atomic_mul(h[j % 3], h[j])
    return products._primal


def test_ptx_of_products_assembles():
    k = mul_kernels()
    ptx = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda").artifacts["ptx"].decode()
    cas = set(re.findall(r"atom\.[a-z.]*cas\.b(\d+)", ptx))
    assert {"32", "64"} <= cas, ptx  # f32/i16 (a word of the 16-bit element) and f64/i64
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    gpu = toolkit.assembling_gpu("sm_90")
    if gpu is None:
        pytest.skip("the installed ptxas assembles none of the GPUs that run sm_90 PTX")
    toolkit.assemble(ptx, gpu)


def test_spirv_of_products_validates():
    k = mul_kernels()
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="vulkan"), arch="vulkan")
    modules = [m for name, m in compiled.artifacts.items() if name.startswith("spirv_")]
    assert modules
    for module in modules:
        assert spirv_tools.validate(module) is None


def test_metal_and_amdgpu_builds():
    """Metal: the same SPIR-V compare-and-swap loops, translated to MSL (f64 is refused there as
    every 64-bit type is); AMDGPU: LLVM's cmpxchg in code objects."""
    from qdc.compiler.targets.amdgpu import linker
    from qdc.compiler.targets.metal import msl

    @qd.kernel
    def products32(f: qd.types.ndarray(dtype=qd.f32, ndim=1), i: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for j in range(f.shape[0]):
            qd.atomic_mul(f[0], f[j])
            qd.atomic_mul(i[j % 4], i[j])

    k = products32._primal
    if msl.spirv_cross_path() is None:
        pytest.skip("spirv-cross not installed: no Metal build")
    metal = K.compile_kernel(k.fn, k.params, Options(arch="metal"), arch="metal").artifacts
    assert b"atomic_compare_exchange_weak_explicit" in metal["msl_t0"]
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ ({linker.INSTALL_HINT}): no AMDGPU build")
    k = mul_kernels()
    amdgpu = K.compile_kernel(k.fn, k.params, Options(arch="amdgpu"), arch="amdgpu").artifacts
    assert any(name.startswith("hsaco_") and blob for name, blob in amdgpu.items())
    assert b"cmpxchg" in amdgpu["ll"]
