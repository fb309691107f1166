"""Acceptance tests of docs/api.md's vectors and matrices with autodiff and ahead of
time): gradients through vector and matrix operations, dynamic loops carrying vectors (Tape),
forward mode, and a vector module built by `qdc build` and loaded without the compiler; checked
against analytic derivatives and float64 central differences on fresh random inputs."""
import subprocess
import sys
import textwrap

import numpy as np

import qdc as qd

from test_acceptance_vectors import rand
from test_acceptance_vectors_ops import reflect_about
from tolerance_util import assert_close_f32


# ---- gradients --------------------------------------------------------------------------------

def central_diff(f, x0, h=1e-6):
    """d f / d x0 (f: float64 array -> float) by central differences."""
    g = np.zeros_like(x0)
    for idx in np.ndindex(*x0.shape):
        d = np.zeros_like(x0)
        d[idx] = h
        g[idx] = (f(x0 + d) - f(x0 - d)) / (2 * h)
    return g


def test_gradient_of_vector_methods_against_central_differences(arch, rng):
    n = 6
    a = qd.Vector.field(3, qd.f32, shape=n, needs_grad=True)
    b = qd.Vector.field(3, qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in a:
            u, v = a[i], b[i]
            c = u.cross(v)
            loss[None] += c.norm() + u.normalized().dot(v) + (u.outer_product(v) @ u).sum() + qd.math.length(v) ** 3

    def ref(av, bv):
        c = np.cross(av, bv)
        un = av / np.linalg.norm(av, axis=1, keepdims=True)
        outer_u = np.einsum("ia,ib,ib->ia", av, bv, av)
        return (np.linalg.norm(c, axis=1) + (un * bv).sum(1) + outer_u.sum(1)
                + np.linalg.norm(bv, axis=1) ** 3).sum()

    av, bv = rand(rng, n, 3, lo=0.3, hi=1.0), rand(rng, n, 3, lo=-1.0, hi=-0.3)
    a.from_numpy(av)
    b.from_numpy(bv)
    with qd.ad.Tape(loss=loss):
        energy()
    a64, b64 = av.astype(np.float64), bv.astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(a64, b64), rtol=1e-5, atol=1e-4)  # terms may cancel
    np.testing.assert_allclose(a.grad.to_numpy(), central_diff(lambda x: ref(x, b64), a64), rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(b.grad.to_numpy(), central_diff(lambda x: ref(a64, x), b64), rtol=2e-3, atol=2e-4)


def test_gradient_of_determinant_and_inverse_is_analytic(arch, rng):
    m = qd.Matrix.field(3, 3, qd.f32, shape=(), needs_grad=True)
    w = qd.Matrix.field(3, 3, qd.f32, shape=())
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        a = m[None]
        loss[None] += a.determinant() + (a.inverse() * w[None]).sum()

    mv = (rand(rng, 3, 3) + 2 * np.eye(3)).astype(np.float32)
    wv = rand(rng, 3, 3)
    m[None] = mv
    w[None] = wv
    with qd.ad.Tape(loss=loss):
        energy()
    m64 = mv.astype(np.float64)
    inv = np.linalg.inv(m64)
    # d det/dM = det(M) M^-T; d <W, M^-1>/dM = -M^-T W M^-T
    want = np.linalg.det(m64) * inv.T - inv.T @ wv @ inv.T
    np.testing.assert_allclose(m.grad.to_numpy(), want, rtol=1e-3, atol=1e-4)


def test_tape_through_vector_local_carried_by_a_dynamic_loop(arch, rng):
    n = 8
    x = qd.Vector.field(2, qd.f32, shape=n, needs_grad=True)
    steps = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def simulate(theta: qd.f32):
        for i in x:
            p = x[i]
            rot = qd.math.mat2([[qd.cos(theta), -qd.sin(theta)], [qd.sin(theta), qd.cos(theta)]])
            for _ in range(steps[None]):  # trip count known only at launch: adstack per component
                p = rot @ p * 0.9 + qd.math.vec2(qd.sin(p.y), 0.05) * 0.1
            loss[None] += p.dot(p)

    def ref(xv, theta, k):
        c, s = np.cos(theta), np.sin(theta)
        r = np.array([[c, -s], [s, c]])
        p = xv.copy()
        for _ in range(k):
            extra = np.stack([np.sin(p[:, 1]), np.full(len(p), 0.05)], 1)
            p = p @ r.T * 0.9 + extra * 0.1
        return (p * p).sum()

    xv = rand(rng, n, 2)
    k = int(rng.integers(5, 15))
    theta = float(np.float32(rng.random()))
    x.from_numpy(xv)
    steps[None] = k
    with qd.ad.Tape(loss=loss):
        simulate(theta)
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(x64, theta, k), rtol=1e-4, atol=1e-4)  # terms may cancel
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(lambda z: ref(z, theta, k), x64), rtol=2e-3, atol=1e-4)


def test_tape_grad_check_on_a_vector_field(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            loss[None] += qd.sin(x[i]).dot(x[i]) + x[i].norm_sqr() * 0.5

    xv = rand(rng, 5, 3)
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss, grad_check=[x]):
        energy()
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(x.grad.to_numpy(), np.sin(x64) + x64 * np.cos(x64) + x64, rtol=1e-4, atol=1e-5)


def test_kernel_grad_of_a_matrix_ndarray(arch, rng):
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy(f: qd.types.ndarray(dtype=qd.math.mat2, ndim=1)):
        for i in f:
            loss[None] += (f[i].transpose() @ f[i]).trace()

    a = qd.ndarray(qd.math.mat2, shape=7, needs_grad=True)
    fv = rand(rng, 7, 2, 2)
    a.from_numpy(fv)
    energy(a)
    loss.grad[None] = 1.0
    energy.grad(a)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * fv, rtol=1e-5)


def test_forward_mode_through_a_vector_field(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def energy():
        for i in x:
            y[None] += x[i].norm()

    xv = rand(rng, 4, 3)
    x.from_numpy(xv)
    seed = rand(rng, 4, 3)
    with qd.ad.FwdMode(loss=y, param=x, seed=seed.ravel().tolist()):
        energy()
    x64 = xv.astype(np.float64)
    terms = x64 / np.linalg.norm(x64, axis=1, keepdims=True) * seed
    assert_close_f32(y.dual[None], terms.sum(), rtol=1e-4, scale=np.abs(terms).sum())


# ---- qd.math, matrices and atomics ---------------------------------------------------------------------------

def test_gradient_of_qd_math_functions(arch, rng):
    n = 10
    x = qd.Vector.field(3, qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            u = x[i]
            a = qd.math.clamp(u, -0.6, 0.6)
            b = qd.math.mix(u, u * u, 0.3)
            c = qd.math.smoothstep(-1.0, 1.0, u)
            loss[None] += a.sum() + b.dot(c) + qd.math.length(qd.math.normalize(u) + u)

    def ref(u):
        a = np.clip(u, -0.6, 0.6)
        b = u * 0.7 + u * u * 0.3
        t = np.clip((u + 1) / 2, 0, 1)
        c = t * t * (3 - 2 * t)
        nu = u / np.linalg.norm(u, axis=1, keepdims=True)
        return a.sum() + (b * c).sum() + np.linalg.norm(nu + u, axis=1).sum()

    xv = rand(rng, n, 3, lo=-0.9, hi=0.9)
    xv[np.abs(np.abs(xv) - 0.6) < 0.02] = 0.3  # keep away from clamp's kinks
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss):
        energy()
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(x64), rtol=1e-5, atol=1e-4)  # terms may cancel
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(ref, x64), rtol=2e-3, atol=2e-4)


def test_matrix_local_carried_by_a_dynamic_loop_gradient(arch, rng):
    a = qd.Matrix.field(2, 2, qd.f32, shape=3, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def power():
        for i in a:
            p = qd.Matrix([[1.0, 0.0], [0.0, 1.0]])
            for _ in range(n[None]):  # a matrix carried by a dynamic loop: one adstack per entry
                p = p @ a[i]
            loss[None] += p.sum() + p.trace() * 0.5

    av = (rand(rng, 3, 2, 2) * 0.8).astype(np.float32)
    k = int(rng.integers(3, 7))
    a.from_numpy(av)
    n[None] = k

    def ref(m):
        p = np.linalg.matrix_power(m, k)
        return p.sum() + 0.5 * np.trace(p, axis1=1, axis2=2).sum()

    with qd.ad.Tape(loss=loss):
        power()
    a64 = av.astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(a64), rtol=1e-5, atol=1e-4)  # terms may cancel
    want = central_diff(ref, a64)
    np.testing.assert_allclose(a.grad.to_numpy(), want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_f64_vector_gradient_is_exact(arch, rng):
    x = qd.Vector.field(3, qd.f64, shape=4, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            loss[None] += x[i].norm() * x[i].x

    xv = rng.random((4, 3)) + 0.1
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss):
        energy()
    r = np.linalg.norm(xv, axis=1, keepdims=True)
    want = xv * xv[:, :1] / r
    want[:, 0] += r[:, 0]
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-12)


def test_gradient_through_whole_vector_atomic_add(arch, rng):
    src = qd.Vector.field(2, qd.f32, shape=12, needs_grad=True)
    acc = qd.Vector.field(2, qd.f32, shape=3, needs_grad=True)
    w = qd.Vector.field(2, qd.f32, shape=3)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def scatter():
        for i in src:
            acc[i % 3] += src[i] * src[i]

    @qd.kernel
    def reduce():
        for j in acc:
            loss[None] += acc[j].dot(w[j])

    sv, wv = rand(rng, 12, 2), rand(rng, 3, 2)
    src.from_numpy(sv)
    w.from_numpy(wv)
    with qd.ad.Tape(loss=loss):
        scatter()
        reduce()
    np.testing.assert_allclose(src.grad.to_numpy(), 2 * sv * wv[np.arange(12) % 3], rtol=1e-5)


def test_gradient_through_swizzle_write_and_func(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=6, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            v = x[i]
            v.xy = v.yx * v.z
            loss[None] += reflect_about(v, qd.math.vec3(0.0, 0.6, 0.8)).norm_sqr() + v.x * v.y

    def ref(u):
        v = u.copy()
        v[:, 0], v[:, 1] = u[:, 1] * u[:, 2], u[:, 0] * u[:, 2]
        nrm = np.array([0.0, 0.6, 0.8])
        r = v - 2 * (v @ nrm)[:, None] * nrm
        return (r * r).sum() + (v[:, 0] * v[:, 1]).sum()

    xv = rand(rng, 6, 3)
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss):
        energy()
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(loss[None], ref(x64), rtol=1e-5, atol=1e-4)  # terms may cancel
    np.testing.assert_allclose(x.grad.to_numpy(), central_diff(ref, x64), rtol=1e-3, atol=1e-5)


# ---- ahead of time ----------------------------------------------------------------------------

AOT_MODULE = '''
import qdc as qd

vel = qd.Vector.field(3, qd.f32, shape=16, needs_grad=True)
rot = qd.Matrix.field(3, 3, qd.f32, shape=())
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def advance(pos: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), dt: qd.f32):
    for i in vel:
        vel[i] = rot[None] @ vel[i]
        pos[i] += vel[i] * dt


@qd.kernel
def kinetic() -> qd.math.vec2:
    for i in vel:
        loss[None] += 0.5 * vel[i].norm_sqr()
    return qd.math.vec2(loss[None], vel[0].x)
'''

AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
mod = load(cache, "accvec", arch=arch)
v = (rng.random((16, 3)) - 0.5).astype(np.float32)
r = (rng.random((3, 3)) - 0.5).astype(np.float32)
p = rng.random((16, 3)).astype(np.float32)
p0 = p.copy()
mod.vel.from_numpy(v)
mod.rot[None] = r
assert mod.vel.shape == (16,) and mod.vel.to_numpy().shape == (16, 3)
mod.advance(p, 0.25)
nv = v @ r.T
assert np.allclose(mod.vel.to_numpy(), nv, rtol=1e-5, atol=1e-6), "vel"
assert np.allclose(mod.vel[5], nv[5], rtol=1e-5, atol=1e-6), "element"
mod.rot[None][1, 2] = 0.5  # an element write goes through to the loaded field, as in direct mode
r[1, 2] = 0.5
assert np.array_equal(mod.rot.to_numpy(), r), "element write"
mod.rot[None] = (rng.random((3, 3)) - 0.5).astype(np.float32)
r = mod.rot.to_numpy()
assert np.allclose(p, p0 + nv * np.float32(0.25), rtol=1e-5, atol=1e-6), "pos"
mod.advance(p, 0.0)
nv = nv @ r.T
assert np.allclose(mod.vel.to_numpy(), nv, rtol=1e-5, atol=1e-6), "vel after the new rotation"
mod.loss[None] = 0.0
got = mod.kinetic()
want = 0.5 * (nv.astype(np.float64) ** 2).sum()
assert np.allclose(got, [want, nv[0, 0]], rtol=1e-5), (got, want)
mod.loss.grad[None] = 1.0
mod.kinetic.grad()
assert np.allclose(mod.vel.grad.to_numpy(), nv, rtol=1e-5, atol=1e-6), "grad"
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK no compiler")
'''


def test_vector_module_built_ahead_of_time_and_loaded_without_the_compiler(tmp_path, rng):
    from conftest import vulkan_unavailable_reason
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    src = tmp_path / "kernels"
    src.mkdir()
    (src / "accvec.py").write_text(textwrap.dedent(AOT_MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(src), "--cache", cache,
                        "--arch", ",".join(archs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN, encoding="utf-8")
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK no compiler" in r.stdout, (arch, r.stdout + r.stderr)
