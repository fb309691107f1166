"""Fields and ndarrays of vectors and matrices: host access (numpy arrays with the element's shape
as trailing axes), struct-for over field indices, ndarray parameters, atomics on elements and whole
vectors, reverse-mode gradients (Tape, dynamic loops with a vector carried), and ahead of time."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd

from autodiff_util import check_against_central_diff
from tolerance_util import assert_close_f32


def test_host_access_follows_quadrants(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=(4, 5), needs_grad=True)
    m = qd.Matrix.field(2, 3, qd.i32, shape=6)
    assert x.shape == (4, 5) and x.element_shape == (3,) and x.to_numpy().shape == (4, 5, 3)
    assert x.grad.shape == (4, 5) and x.grad.to_numpy().shape == (4, 5, 3)
    assert m.to_numpy().shape == (6, 2, 3) and m.dtype == qd.i32
    xv = rng.random((4, 5, 3)).astype(np.float32)
    x.from_numpy(xv)
    np.testing.assert_array_equal(x[1, 2], xv[1, 2])
    assert isinstance(x[1, 2], qd.Matrix) and x[1, 2].shape == (3,)  # a qd.Matrix, as in Quadrants
    x[3, 4] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(x.to_numpy()[3, 4], [1, 2, 3])
    m[5] = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(m[5], np.arange(6).reshape(2, 3))
    m.fill(7)
    assert (m.to_numpy() == 7).all()
    with pytest.raises(ValueError, match=r"expected \(6, 2, 3\)"):
        m.from_numpy(np.zeros((6, 3, 2), np.int32))
    with pytest.raises(TypeError):
        m[0] = [1, 2]


def test_struct_for_iterates_field_indices(arch):
    x = qd.Vector.field(2, qd.i32, shape=(3, 4))
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def fill():
        for i, j in x:
            x[i, j] = qd.Vector([i, j])
            count[None] += 1

    fill()
    assert count[None] == 12
    i, j = np.indices((3, 4))
    np.testing.assert_array_equal(x.to_numpy(), np.stack([i, j], -1))


def test_ndarray_parameters_of_vectors(arch, rng):
    @qd.kernel
    def step(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), v: qd.types.NDArray[qd.math.vec3, 1],
             f: qd.types.ndarray(dtype=qd.types.matrix(3, 3, qd.f32), ndim=1), dt: qd.f32):
        for i in p:
            v[i] += f[i] @ p[i] * dt
            p[i] = p[i] + v[i] * dt

    n = 17
    p0, v0 = rng.random((n, 3)).astype(np.float32), rng.random((n, 3)).astype(np.float32)
    f0 = (rng.random((n, 3, 3)) - 0.5).astype(np.float32)
    dt = 0.1
    v1 = v0 + np.einsum("kij,kj->ki", f0, p0) * np.float32(dt)
    p1 = p0 + v1 * np.float32(dt)
    p, v = p0.copy(), v0.copy()
    step(p, v, f0, dt)  # numpy arrays with the element's shape as trailing axes
    assert_close_f32(v, v1, rtol=1e-5)
    assert_close_f32(p, p1, rtol=1e-5)
    pn, vn, fn = qd.ndarray(qd.math.vec3, shape=n), qd.Vector.ndarray(3, qd.f32, n), qd.Matrix.ndarray(3, 3, qd.f32, n)
    assert pn.shape == (n,) and pn.to_numpy().shape == (n, 3)
    pn.from_numpy(p0); vn.from_numpy(v0); fn.from_numpy(f0)
    step(pn, vn, fn, dt)
    assert_close_f32(pn.to_numpy(), p1, rtol=1e-5)
    assert_close_f32(vn[3], v1[3], rtol=1e-5)
    with pytest.raises(ValueError, match="ndim"):
        step(p0[:, 0].copy(), v, f0, dt)
    with pytest.raises(ValueError, match=r"element's axes \(3,\), got an array of shape \(17, 4\)"):
        step(np.zeros((n, 4), np.float32), v, f0, dt)
    with pytest.raises(ValueError, match=r"element's axes \(3, 3\), got an array of shape \(17, 2, 2\)"):
        step(p, v, qd.Matrix.ndarray(2, 2, qd.f32, n), dt)


def test_atomics_on_elements_and_whole_vectors(arch, rng):
    n = 300
    src = qd.Vector.field(2, qd.f32, shape=n)
    idx = qd.field(qd.i32, shape=n)
    acc = qd.Vector.field(2, qd.f32, shape=4)
    comp = qd.field(qd.f32, shape=4)
    old_sum = qd.Vector.field(2, qd.f32, shape=())
    local = qd.Vector.field(2, qd.f32, shape=())
    icount = qd.Vector.field(2, qd.i32, shape=4)

    @qd.kernel
    def scatter():
        total = qd.Vector([0.0, 0.0])
        for i in src:
            acc[idx[i]] += src[i]                      # component-wise atomic add
            old = qd.atomic_add(old_sum[None], src[i])  # returns the old vector
            comp[idx[i]] += old.x * 0.0 + src[i][1]
            acc[idx[i]][0] -= 0.5
            icount[idx[i]] += qd.Vector([1, 2])
            total += src[i] * 2.0                       # a kernel-scope vector reduction
        local[None] = total

    sv = rng.random((n, 2)).astype(np.float32)
    iv = rng.integers(0, 4, n).astype(np.int32)
    src.from_numpy(sv)
    idx.from_numpy(iv)
    scatter()
    want = np.zeros((4, 2))
    np.add.at(want, iv, sv.astype(np.float64))
    np.add.at(want[:, 0], iv, -0.5)
    # x - 0.5 per element: a bin's total can end near 0, with the rounding of all its terms
    bin_terms = np.bincount(iv, weights=sv[:, 0] + 0.5, minlength=4).max()
    assert_close_f32(acc.to_numpy(), want, rtol=1e-4, scale=bin_terms, ulps=16)
    w1 = np.zeros(4)
    np.add.at(w1, iv, sv[:, 1].astype(np.float64))
    np.testing.assert_allclose(comp.to_numpy(), w1, rtol=1e-4)
    np.testing.assert_allclose(old_sum[None], sv.sum(0), rtol=1e-4)
    np.testing.assert_allclose(local[None], 2 * sv.sum(0), rtol=1e-4)
    np.testing.assert_array_equal(icount.to_numpy(), np.bincount(iv, minlength=4)[:, None] * [1, 2])


def test_gradient_through_vector_and_matrix_operations(arch, rng):
    n = 6
    x = qd.Vector.field(3, qd.f64, shape=n, needs_grad=True)
    m = qd.Matrix.field(3, 3, qd.f64, shape=n, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            v = x[i]
            a = m[i]
            w = a @ v + v.cross(qd.Vector([0.3, -0.2, 0.5]))
            u = w.normalized() * a.determinant() + a.inverse().transpose() @ v
            loss[None] += u.dot(v) + (w * w * w).sum() + (a @ a).trace() * 0.1 + v.norm()  # f64: no sin on SPIR-V

    x.from_numpy(rng.random((n, 3)) - 0.5)
    m.from_numpy(rng.random((n, 3, 3)) - 0.5 + np.eye(3) * 2)
    check_against_central_diff(energy, loss, [x, m], rtol=1e-5, atol=1e-8)  # f64; the differences' own error ~1e-7


def test_tape_and_a_vector_carried_through_a_dynamic_loop(arch, rng):
    n = 5
    x = qd.Vector.field(2, qd.f32, shape=n, needs_grad=True)
    y = qd.Vector.field(2, qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    steps = qd.field(qd.i32, shape=())

    @qd.kernel
    def advance():
        for i in x:
            v = x[i]
            r = qd.Matrix([[0.8, -0.6], [0.6, 0.8]])
            for _ in range(steps[None]):  # one adstack per component of v
                v = r @ v + qd.sin(v) * 0.1
            y[i] = v

    @qd.kernel
    def reduce():
        for i in y:
            loss[None] += y[i].norm_sqr()

    xv = (rng.random((n, 2)) - 0.5).astype(np.float32)
    x.from_numpy(xv)
    steps[None] = 6
    with qd.ad.Tape(loss=loss):
        advance()
        reduce()
    got = x.grad.to_numpy()

    def forward(x0):
        v = x0.copy()
        rot = np.array([[0.8, -0.6], [0.6, 0.8]])
        for _ in range(6):
            v = v @ rot.T + np.sin(v) * 0.1
        return (v ** 2).sum()

    x64, h = xv.astype(np.float64), 1e-6
    want = np.zeros_like(x64)
    for idx in np.ndindex(*x64.shape):
        d = np.zeros_like(x64)
        d[idx] = h
        want[idx] = (forward(x64 + d) - forward(x64 - d)) / (2 * h)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


AOT_MODULE = '''
import qdc as qd

pos = qd.Vector.field(3, qd.f32, shape=8, needs_grad=True)
frame = qd.Matrix.field(3, 3, qd.f32, shape=())
energy = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def transform(vel: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), dt: qd.f32):
    for i in pos:
        pos[i] = frame[None] @ pos[i] + vel[i] * dt


@qd.kernel
def total():
    for i in pos:
        energy[None] += pos[i].norm_sqr()
'''

AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

mod = load(sys.argv[1], "vecmod")
rng = np.random.default_rng(int(sys.argv[2]))
p = rng.random((8, 3)).astype(np.float32)
f = (rng.random((3, 3)) - 0.5).astype(np.float32)
v = rng.random((8, 3)).astype(np.float32)
assert mod.pos.shape == (8,) and mod.pos.to_numpy().shape == (8, 3)
mod.pos.from_numpy(p)
mod.frame[None] = f
mod.transform(v, 0.5)
want = p @ f.T + v * np.float32(0.5)
assert np.allclose(mod.pos.to_numpy(), want, rtol=1e-5), "transform"
assert np.allclose(mod.pos[3], want[3], rtol=1e-5), "element"
mod.total()
mod.energy.grad[None] = 1.0
mod.total.grad()
assert np.allclose(mod.pos.grad.to_numpy(), 2 * want, rtol=1e-5), "grad"
try:
    mod.transform(np.zeros((8, 4), np.float32), 0.5)
    raise AssertionError("a (8, 4) array was accepted for an ndarray of vec3")
except ValueError as e:
    assert "element's axes (3,)" in str(e), str(e)
assert mod.pos.grad.to_numpy().shape == (8, 3)
assert "qdc.compiler" not in sys.modules and "llvmlite" not in sys.modules, "the compiler was imported"
print("ok")
'''


def test_vector_fields_and_ndarrays_ahead_of_time(tmp_path):
    src = tmp_path / "kernels"
    src.mkdir()
    (src / "vecmod.py").write_text(textwrap.dedent(AOT_MODULE), encoding="utf-8")
    cache = tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(src), "--cache", str(cache)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), str(cache), "7"], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout


def test_forward_mode_through_vector_fields(arch, rng):
    x = qd.Vector.field(2, qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    assert x.dual.shape == (4,) and x.dual.to_numpy().shape == (4, 2)

    @qd.kernel
    def energy():
        for i in x:
            m = qd.Matrix([[2.0, 0.5], [0.5, 1.0]])
            y[None] += x[i].dot(m @ x[i])

    xs = rng.random((4, 2)).astype(np.float32)
    x.from_numpy(xs)
    seed = rng.random((4, 2)).astype(np.float32)
    with qd.ad.FwdMode(loss=y, param=x, seed=seed.ravel().tolist()):
        energy()
    m = np.array([[2.0, 0.5], [0.5, 1.0]])
    np.testing.assert_allclose(y.dual[None], (2 * xs @ m * seed).sum(), rtol=1e-5)


def test_gradient_of_an_ndarray_of_vectors(arch, rng):
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):
        for i in p:
            loss[None] += p[i].norm_sqr() * (i + 1)

    a = qd.ndarray(qd.math.vec3, shape=5, needs_grad=True)
    assert a.grad.shape == (5,) and a.grad.to_numpy().shape == (5, 3)
    xs = rng.random((5, 3)).astype(np.float32)
    a.from_numpy(xs)
    energy(a)
    loss.grad[None] = 1.0
    energy.grad(a)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * xs * np.arange(1, 6)[:, None], rtol=1e-5)
