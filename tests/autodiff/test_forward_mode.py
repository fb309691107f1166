"""Forward-mode autodiff: `needs_dual`, `.dual` and `qd.ad.FwdMode` run kernels as
Jacobian-vector products, checked on random inputs against analytic derivatives, float64
central differences of a numpy model of each kernel, and the reverse-mode gradient (Jacobian
columns from forward mode, rows from reverse mode); the forward_ad variant built ahead of time
and run from a loaded module without the compiler; its PTX for the CUDA target."""
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

from autodiff_util import line_of
from tolerance_util import assert_close_f32

N = 12


def central_difference(f, x: np.ndarray, seed: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f(x + t*seed) / dt at t = 0, in float64."""
    x, seed = x.astype(np.float64), seed.astype(np.float64)
    return (np.asarray(f(x + h * seed)) - np.asarray(f(x - h * seed))) / (2 * h)


def sin_chain(v: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        v = np.sin(v) * 0.95 + 0.01
    return v


# ---- direct mode, on every arch -------------------------------------------------------------

def test_scalar_param_seeded_with_one_by_default(arch, rng):
    x = qd.field(qd.f32, shape=(), needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def cubic():
        y[None] = x[None] * x[None] * x[None] + qd.sin(x[None])

    x0 = float(rng.uniform(-1, 1))
    x[None] = x0
    with qd.ad.FwdMode(loss=y, param=x):
        cubic()
    assert y[None] == pytest.approx(x0 ** 3 + np.sin(x0), rel=1e-5)
    assert y.dual[None] == pytest.approx(3 * x0 ** 2 + np.cos(x0), rel=1e-5)
    assert x.dual[None] == 0  # the seed is cleared on exit; the output's dual stays


def test_elementwise_math_functions(arch, rng):
    x = qd.field(qd.f32, shape=N, needs_dual=True)
    z = qd.field(qd.f32, shape=N, needs_dual=True)

    @qd.kernel
    def math_fns(c: qd.f32):
        for i in x:
            v = x[i]
            z[i] = (qd.sin(v) * qd.exp(0.5 * v) + qd.log(v + 2.0) / (v + 3.0) + qd.pow(v + 1.5, 2.5)
                    + qd.tanh(c * v) - qd.sqrt(v + 1.0) + qd.cos(v) ** 2 + 1.0 / (v * v + 1.0))

    def model(v, c=0.7):
        return (np.sin(v) * np.exp(0.5 * v) + np.log(v + 2) / (v + 3) + (v + 1.5) ** 2.5 + np.tanh(c * v)
                - np.sqrt(v + 1) + np.cos(v) ** 2 + 1 / (v * v + 1))

    def derivative(v, c=0.7):
        return (np.cos(v) * np.exp(0.5 * v) + 0.5 * np.sin(v) * np.exp(0.5 * v)
                + (1 / (v + 2)) / (v + 3) - np.log(v + 2) / (v + 3) ** 2 + 2.5 * (v + 1.5) ** 1.5
                + c * (1 - np.tanh(c * v) ** 2) - 0.5 / np.sqrt(v + 1) - 2 * np.cos(v) * np.sin(v)
                - 2 * v / (v * v + 1) ** 2)

    x0 = rng.uniform(-0.5, 1.0, N).astype(np.float32)
    seed = rng.standard_normal(N)
    x.from_numpy(x0)
    with qd.ad.FwdMode(loss=z, param=x, seed=list(seed)):
        math_fns(0.7)
    got = z.dual.to_numpy()
    np.testing.assert_allclose(z.to_numpy(), model(x0.astype(np.float64)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, derivative(x0.astype(np.float64)) * seed, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, central_difference(model, x0, seed), rtol=1e-4, atol=1e-5)


def _chain_kernel(x, y, z, n):
    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(n[None]):  # trip count from a field: no adstack in forward mode
                v = qd.sin(v) * 0.95 + 0.01
            z[i] = v * v
            y[None] += v
    return chain


def test_dynamic_loop_agrees_with_differences_and_reverse_mode(arch, rng):
    x = qd.field(qd.f32, shape=N, needs_dual=True, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True, needs_grad=True)
    z = qd.field(qd.f32, shape=N, needs_dual=True)
    n = qd.field(qd.i32, shape=())
    chain = _chain_kernel(x, y, z, n)
    x0 = rng.random(N).astype(np.float32)
    x.from_numpy(x0)
    n[None] = 37
    y.fill(0)
    chain()
    y.grad[None] = 1
    chain.grad()
    gradient = x.grad.to_numpy()  # the row of the scalar loss
    for _ in range(3):
        seed = rng.standard_normal(N)
        with qd.ad.FwdMode(loss=[y, z], param=x, seed=seed):
            chain()
        jvp = y.dual[None]
        assert jvp == pytest.approx(float(gradient @ seed), rel=1e-4, abs=1e-5)
        assert jvp == pytest.approx(float(central_difference(lambda v: sin_chain(v, 37).sum(), x0, seed)), rel=1e-4,
                                    abs=1e-5)
        np.testing.assert_allclose(z.dual.to_numpy(), central_difference(lambda v: sin_chain(v, 37) ** 2, x0, seed),
                                   rtol=1e-4, atol=1e-6)


def test_jacobian_columns_equal_reverse_mode_rows(arch, rng):
    m = 5
    x = qd.field(qd.f32, shape=m, needs_dual=True, needs_grad=True)
    w = qd.field(qd.f32, shape=(m, m))
    z = qd.field(qd.f32, shape=m, needs_dual=True, needs_grad=True)

    @qd.kernel
    def mix():
        for i in z:
            s = 0.0
            for j in range(m):
                s += w[i, j] * qd.tanh(x[j] * x[i])
            z[i] = s

    x0, w0 = rng.uniform(-1, 1, m).astype(np.float32), rng.uniform(-1, 1, (m, m)).astype(np.float32)
    x.from_numpy(x0)
    w.from_numpy(w0)
    forward = np.zeros((m, m))
    for j in range(m):  # column j: the seed e_j
        with qd.ad.FwdMode(loss=z, param=x, seed=np.eye(m)[j]):
            mix()
        forward[:, j] = z.dual.to_numpy()
    reverse = np.zeros((m, m))
    for i in range(m):  # row i: z.grad = e_i
        x.grad.fill(0)
        z.grad.from_numpy(np.eye(m, dtype=np.float32)[i])
        mix.grad()
        reverse[i] = x.grad.to_numpy()

    def model(v):
        return (w0.astype(np.float64) * np.tanh(np.outer(v, v))).sum(axis=1)
    numeric = np.stack([central_difference(model, x0, e) for e in np.eye(m)], axis=1)
    np.testing.assert_allclose(forward, reverse, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(forward, numeric, rtol=1e-4, atol=1e-5)


def test_ifs_and_while_loops_carry_tangents(arch, rng):
    x = qd.field(qd.f32, shape=N, needs_dual=True)
    z = qd.field(qd.f32, shape=N, needs_dual=True)

    @qd.kernel
    def branchy():
        for i in x:
            v = x[i]
            t = 0.0
            if v > 0.5:
                t = qd.exp(v) * v
            else:
                t = qd.log(v + 1.0) - v * v
            k = 0
            while k < i % 4 + 1:
                t = t * 0.5 + qd.sqrt(qd.abs(t) + 1.0)
                k += 1
            z[i] = t

    def model(v):
        t = np.where(v > 0.5, np.exp(v) * v, np.log(v + 1) - v * v)
        for i in range(N):
            for _ in range(i % 4 + 1):
                t[i] = t[i] * 0.5 + np.sqrt(abs(t[i]) + 1)
        return t

    x0 = rng.uniform(0.05, 0.95, N).astype(np.float32)
    x0[np.abs(x0 - 0.5) < 1e-3] = 0.3  # keep clear of the branch point
    x.from_numpy(x0)
    seed = rng.standard_normal(N)
    with qd.ad.FwdMode(loss=z, param=x, seed=seed):
        branchy()
    np.testing.assert_allclose(z.dual.to_numpy(), central_difference(model, x0, seed), rtol=1e-4, atol=1e-5)


def test_kernel_scope_reduction_and_atomic_accumulation(arch, rng):
    x = qd.field(qd.f32, shape=64, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    total = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def reduce():
        s = 0.0
        for i in x:
            s += x[i] * x[i]        # a kernel-scope local: a per-thread reduction, its tangent too
            total[None] += qd.sin(x[i])
        y[None] = s

    x0 = rng.standard_normal(64).astype(np.float32)
    seed = rng.standard_normal(64)
    x.from_numpy(x0)
    with qd.ad.FwdMode(loss=[y, total], param=x, seed=seed):
        reduce()
    terms = 2 * x0.astype(np.float64) * seed  # signed: their sum can cancel to near 0
    assert_close_f32(y.dual[None], terms.sum(), rtol=1e-4, scale=np.abs(terms).sum())
    assert total.dual[None] == pytest.approx(float(np.cos(x0.astype(np.float64)) @ seed), rel=1e-4)


def test_ndarray_arguments_with_duals(arch, rng):
    @qd.kernel
    def poly(a: qd.types.ndarray(), b: qd.types.ndarray(), out: qd.types.ndarray(), s: qd.f32):
        for i in range(a.shape[0]):
            out[i] = s * a[i] * a[i] / b[i] + qd.exp(b[i])

    a = qd.ndarray(qd.f32, (N,), needs_dual=True)
    b = qd.ndarray(qd.f32, (N,), needs_dual=True)
    out = qd.ndarray(qd.f32, (N,), needs_dual=True)
    a0, b0 = rng.random(N).astype(np.float32), (rng.random(N) + 0.5).astype(np.float32)
    a.from_numpy(a0)
    b.from_numpy(b0)
    seed = rng.standard_normal(N)
    with qd.ad.FwdMode(loss=out, param=a, seed=seed):
        poly(a, b, out, 1.5)
    np.testing.assert_allclose(out.dual.to_numpy(), 3 * a0 / b0 * seed, rtol=1e-4, atol=1e-5)
    # b's dual is zero but b has one: its tangent is read; a plain numpy array has none
    with qd.ad.FwdMode(loss=out, param=b, seed=seed):
        poly(a.to_numpy(), b, out, 1.5)
    # f32, and Vulkan's exp and division are a few ulp (the terms may nearly cancel: atol)
    np.testing.assert_allclose(out.dual.to_numpy(), (-1.5 * a0 ** 2 / b0 ** 2 + np.exp(b0)) * seed, rtol=1e-4, atol=1e-5)


def test_vector_field_param_seeded_per_component(arch, rng):
    x = qd.field(qd.math.vec3, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def norms():
        for i in x:
            y[None] += x[i].norm()

    x0 = rng.random((4, 3)).astype(np.float32) + 0.1
    seed = rng.standard_normal(12)  # row-major, the components last
    x.from_numpy(x0)
    with qd.ad.FwdMode(loss=y, param=x, seed=seed):
        norms()
    unit = x0.astype(np.float64) / np.linalg.norm(x0.astype(np.float64), axis=1, keepdims=True)
    assert y.dual[None] == pytest.approx(float(unit.ravel() @ seed), rel=1e-4, abs=1e-6)


def test_outside_forward_mode_kernels_run_plain_and_fast(rng):
    x = qd.field(qd.f32, shape=N, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    z = qd.field(qd.f32, shape=N, needs_dual=True)
    n = qd.field(qd.i32, shape=())
    chain = _chain_kernel(x, y, z, n)
    x.from_numpy(rng.random(N).astype(np.float32))
    n[None] = 3
    chain()
    assert chain._primal.launches_on_its_own()
    with qd.ad.FwdMode(loss=y, param=x, seed=np.ones(N)):
        assert not chain._primal.launches_on_its_own()  # suspended: it must launch the forward_ad variant
        chain()
    dual = y.dual[None]
    assert dual != 0
    chain()
    chain()
    assert chain._primal.launches_on_its_own()
    assert y.dual[None] == dual  # plain launches leave the duals alone


def test_forward_ad_variant_from_the_cache_binds_the_duals(session_cache_dir, rng):
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def squares():
        for i in x:
            y[None] += x[i] * x[i]

    x0 = rng.random(4).astype(np.float32)
    for fresh_runtime in (False, True):  # the second compile is a cache hit: duals bound from field_refs
        if fresh_runtime:
            qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
        x.from_numpy(x0)
        with qd.ad.FwdMode(loss=y, param=x, seed=[1, 0, 1, 0]):
            squares()
        assert y.dual[None] == pytest.approx(2 * (x0[0] + x0[2]), rel=1e-5)
        assert squares._primal.compile((), "forward_ad").from_cache == fresh_runtime


def test_entering_clears_duals_and_the_seed_goes_on_exit(rng):
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def acc():
        for i in x:
            y[None] += 2.0 * x[i]

    x.from_numpy(rng.random(4).astype(np.float32))
    for _ in range(2):  # accumulating into y: its dual is zeroed on every entry
        with qd.ad.FwdMode(loss=y, param=x, seed=[0, 1, 1, 0]):
            acc()
        assert y.dual[None] == pytest.approx(4.0)
    assert np.all(x.dual.to_numpy() == 0)


# ---- errors -------------------------------------------------------------------------------------

def test_param_or_loss_without_needs_dual_is_refused():
    x = qd.field(qd.f32, shape=3)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    with pytest.raises(ValueError, match="has no dual: create it with needs_dual=True"):
        qd.ad.FwdMode(loss=y, param=x, seed=[1, 0, 0])
    with pytest.raises(ValueError, match="loss=.*has no dual"):
        qd.ad.FwdMode(loss=x, param=y)
    with pytest.raises(TypeError, match="needs a qd field or qd.ndarray"):
        qd.ad.FwdMode(loss=y, param=np.zeros(3))


def test_seed_is_required_and_checked_for_a_vector_param():
    x = qd.field(qd.f32, shape=3, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    with pytest.raises(ValueError, match="seed= must say which direction"):
        qd.ad.FwdMode(loss=y, param=x)
    with pytest.raises(ValueError, match="seed has 2 values, param .* has 3 elements"):
        qd.ad.FwdMode(loss=y, param=x, seed=[1, 0])
    with qd.ad.FwdMode(loss=y, param=x, seed=[1, 0, 0]):
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with qd.ad.FwdMode(loss=y, param=x, seed=[0, 1, 0]):
                pass


def test_non_linear_atomic_on_a_dual_is_a_compile_error():
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    m = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def biggest():
        for i in x:
            qd.atomic_max(m[None], x[i])

    with pytest.raises(qd.QdcCompileError) as info:
        with qd.ad.FwdMode(loss=m, param=x, seed=[1, 0, 0, 0]):
            biggest()
    assert info.value.line == line_of(biggest, "atomic_max") and "atomic max" in str(info.value)


def test_old_value_of_an_atomic_and_ndarray_gradients_are_compile_errors():
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def old_value():
        for i in x:
            x[i] = qd.atomic_add(y[None], x[i])

    @qd.kernel
    def reads_grad(a: qd.types.ndarray(qd.f32, ndim=1, needs_grad=True)):
        for i in x:
            y[None] += x[i] * a.grad[i]

    with qd.ad.FwdMode(loss=y, param=x, seed=[1, 0, 0, 0]):
        with pytest.raises(qd.QdcCompileError, match="old value an atomic update returns") as info:
            old_value()
        assert info.value.line == line_of(old_value, "atomic_add")
        with pytest.raises(qd.QdcCompileError, match="uses the gradient of ndarray 'a'"):
            reads_grad(qd.ndarray(qd.f32, (4,), needs_grad=True, needs_dual=True))


def test_annotated_ndarray_parameters_follow_the_argument_dual():
    @qd.kernel
    def double(a: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
        for i in a:
            out[i] = 2.0 * a[i]

    a = qd.ndarray(qd.f32, (4,), needs_dual=True)
    out = qd.ndarray(qd.f32, (4,), needs_dual=True)
    a.from_numpy(np.arange(4, dtype=np.float32))
    with qd.ad.FwdMode(loss=out, param=a, seed=[1, 1, 1, 1]):
        double(a, out)
    np.testing.assert_array_equal(out.dual.to_numpy(), [2, 2, 2, 2])


# ---- ahead of time ------------------------------------------------------------------------------

KERNEL_MODULE = """
import qdc as qd

x = qd.field(qd.f32, shape=16, needs_dual=True, needs_grad=True)
n = qd.field(qd.i32, shape=())
y = qd.field(qd.f32, shape=(), needs_dual=True, needs_grad=True)
z = qd.field(qd.f32, shape=16, needs_dual=True)
plain = qd.field(qd.f32, shape=4)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.95 + 0.01
        z[i] = v * v
        y[None] += v


@qd.kernel
def untouched(a: qd.types.ndarray(qd.f32, ndim=1), s: qd.f32):
    for i in a:
        plain[i] = a[i] * s


@qd.kernel
def weighted(w: qd.types.ndarray(qd.f32, ndim=1)):
    for i in w:
        y[None] += w[i] * x[i]
"""

RUN = """
import sys
import numpy as np
import qdc
from qdc.runtime import FwdMode, load

mod = load(sys.argv[1], "fwdk", arch="cpu")
xs = np.random.default_rng(7).random(16, dtype=np.float32)
mod.x.from_numpy(xs)
mod.n[None] = 20
mod.chain()
v, d = xs.astype(np.float64), np.ones(16)
for _ in range(20):
    d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
seed = np.random.default_rng(8).standard_normal(16)
with FwdMode(loss=[mod.y, mod.z], param=mod.x, seed=seed):
    mod.chain()
    mod.untouched(np.ones(4, np.float32), 2.0)   # no forward_ad variant: it runs as it is
assert abs(mod.y.dual[None] - d @ seed) < 1e-4 * abs(d @ seed) + 1e-6, (mod.y.dual[None], d @ seed)
assert np.allclose(mod.z.dual.to_numpy(), 2 * v * d * seed, rtol=1e-4, atol=1e-6), "wrong tangent"
assert np.all(mod.x.dual.to_numpy() == 0) and np.all(mod.plain.to_numpy() == 2)
mod.y.grad[None] = 1.0
mod.chain.grad()
assert np.allclose(mod.x.grad.to_numpy(), d, rtol=1e-4)
mod.x.dual.from_numpy(seed.astype(np.float32))   # the variant by hand, as kernel.grad
mod.y.dual[None] = 0
mod.chain.forward_ad()
assert abs(mod.y.dual[None] - d @ seed) < 1e-4 * abs(d @ seed) + 1e-6
try:
    mod.untouched.forward_ad(np.ones(4, np.float32), 1.0)
except qdc.QdcError as e:
    assert "no forward-mode variant" in str(e)
else:
    raise AssertionError("no error")
w = np.random.default_rng(9).random(16, dtype=np.float32)
with FwdMode(loss=mod.y, param=mod.x, seed=seed):
    mod.weighted(w)                              # ndarrays are built without duals ahead of time
    try:
        mod.weighted(qdc.ndarray(qdc.f32, (16,), needs_dual=True))
    except ValueError as e:
        assert "built ahead of time without a dual for 'w'" in str(e), str(e)
    else:
        raise AssertionError("an array's dual was ignored")
assert abs(mod.y.dual[None] - w @ seed) < 1e-4 * abs(w @ seed) + 1e-6
assert not any(m.startswith("qdc.compiler") or m == "llvmlite" for m in sys.modules), "compiler imported"
print("ok")
"""


def test_built_forward_ad_variant_runs_from_a_loaded_module(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "fwdk.py").write_text(textwrap.dedent(KERNEL_MODULE), encoding="utf-8")
    cache = tmp_path / "cache"
    build = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "kernels"), "--cache",
                            str(cache)], capture_output=True, text=True, timeout=300)
    out = build.stdout + build.stderr
    assert build.returncode == 0, out
    assert "built fwdk.chain.forward_ad (cpu)" in out and "untouched.forward_ad" not in out
    assert "3 kernels + 2 gradients + 2 forward-mode variants" in out
    run = subprocess.run([sys.executable, "-c", RUN, str(cache)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    verify = subprocess.run([sys.executable, "-m", "qdc.cli.main", "verify", "--cache", str(cache)],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


# ---- the CUDA target ----------------------------------------------------------------------------

def test_forward_ad_variant_generates_ptx():
    from qdc.compiler.targets.cuda import toolkit
    x = qd.field(qd.f32, shape=N, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    z = qd.field(qd.f32, shape=N, needs_dual=True)
    n = qd.field(qd.i32, shape=())
    k = _chain_kernel(x, y, z, n)._primal
    try:
        compiled = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda", variant="forward_ad")
    except qd.QdcCompileError as e:
        if toolkit.libdevice_path() is None and toolkit.PACKAGE in str(e):
            pytest.skip(f"the kernel does math and libdevice is not installed (pip install {toolkit.PACKAGE})")
        raise
    ptx = compiled.artifacts["ptx"].decode()
    assert re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M) == [t.entry for t in compiled.meta.tasks]
    assert {f.name for f in compiled.meta.fields if f.is_grad} == {f"{f.name}.dual" for f in (x, y, z)}
    assert len(re.findall(r"\b(?:atom|red)(?:\.global)?\.add\.f32", ptx)) >= 2  # y's and its tangent's
    if toolkit.ptxas_path() is not None and toolkit.assembling_gpu("sm_70") is not None:
        toolkit.assemble(ptx, toolkit.assembling_gpu("sm_70"))
