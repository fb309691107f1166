"""Acceptance tests of docs/api.md's Vectors and matrices, in kernels: element-wise operators and
broadcasting, `@`, the methods, qd.math, atomics on elements and whole vectors, vectors through
@qd.func and kernel returns; fresh random inputs checked against numpy on every arch of the suite."""
import numpy as np
import pytest

import qdc as qd

from test_acceptance_vectors import rand
from tolerance_util import assert_close_f32


# ---- element-wise operators and broadcasting --------------------------------------------------

def test_elementwise_operators_and_scalar_broadcasting(arch, rng):
    n = 20
    a = qd.Vector.field(3, qd.f32, shape=n)
    b = qd.Vector.field(3, qd.f32, shape=n)
    out = qd.Vector.field(3, qd.f32, shape=(10, n))

    @qd.kernel
    def run(s: qd.f32):
        for i in a:
            u, v = a[i], b[i]
            out[0, i] = u + v
            out[1, i] = u - v
            out[2, i] = u * v
            out[3, i] = u / v
            out[4, i] = u ** 2.0
            out[5, i] = u // v
            out[6, i] = s * u
            out[7, i] = u / s - 1.0
            out[8, i] = s ** u
            out[9, i] = qd.sqrt(v) + qd.sin(u)

    av = rand(rng, n, 3, lo=0.5, hi=4.0)
    bv = rand(rng, n, 3, lo=0.5, hi=2.0)
    a.from_numpy(av)
    b.from_numpy(bv)
    s = np.float32(rng.random() + 0.5)
    run(float(s))
    got = out.to_numpy()
    want = [av + bv, av - bv, av * bv, av / bv, av ** 2, np.floor(av / bv), s * av, av / s - 1, s ** av,
            np.sqrt(bv) + np.sin(av)]
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6, err_msg=f"op {k}")


def test_integer_vectors_floor_divide_and_power(arch, rng):
    a = qd.field(qd.math.ivec3, shape=16)
    out = qd.field(qd.math.ivec3, shape=(3, 16))

    @qd.kernel
    def run():
        for i in a:
            out[0, i] = a[i] // 3
            out[1, i] = a[i] ** 2
            out[2, i] = a[i] % 4 + qd.math.ivec3(1, 2, 3)

    av = rng.integers(-50, 50, (16, 3)).astype(np.int32)
    a.from_numpy(av)
    run()
    got = out.to_numpy()
    np.testing.assert_array_equal(got[0], av // 3)
    np.testing.assert_array_equal(got[1], av ** 2)
    np.testing.assert_array_equal(got[2], av % 4 + [1, 2, 3])


def test_matrix_elementwise_and_broadcasting(arch, rng):
    a = qd.Matrix.field(2, 3, qd.f32, shape=())
    b = qd.Matrix.field(2, 3, qd.f32, shape=())
    out = qd.Matrix.field(2, 3, qd.f32, shape=4)

    @qd.kernel
    def run():
        out[0] = a[None] * b[None]
        out[1] = a[None] + 1.0
        out[2] = 2.0 / b[None]
        out[3] = -a[None] ** 2

    av, bv = rand(rng, 2, 3), rand(rng, 2, 3, lo=0.5, hi=1.5)
    a[None] = av
    b[None] = bv
    run()
    got = out.to_numpy()
    np.testing.assert_allclose(got[0], av * bv, rtol=1e-6)
    np.testing.assert_allclose(got[1], av + 1, rtol=1e-6)
    np.testing.assert_allclose(got[2], 2 / bv, rtol=1e-6)
    np.testing.assert_allclose(got[3], -av ** 2, rtol=1e-6)


# ---- @ and methods ----------------------------------------------------------------------------

def test_matmul_matrix_vector_and_matrix_matrix(arch, rng):
    a = qd.Matrix.field(3, 2, qd.f32, shape=())
    b = qd.Matrix.field(2, 4, qd.f32, shape=())
    x = qd.Vector.field(2, qd.f32, shape=())
    ab = qd.Matrix.field(3, 4, qd.f32, shape=())
    ax = qd.Vector.field(3, qd.f32, shape=())
    xx = qd.field(qd.f32, shape=())

    @qd.kernel
    def run():
        ab[None] = a[None] @ b[None]
        ax[None] = a[None] @ x[None]
        xx[None] = x[None] @ x[None]

    av, bv, xv = rand(rng, 3, 2), rand(rng, 2, 4), rand(rng, 2)
    a[None], b[None], x[None] = av, bv, xv
    run()
    np.testing.assert_allclose(ab.to_numpy(), av @ bv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ax.to_numpy(), av @ xv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xx[None], xv @ xv, rtol=1e-5)


def test_vector_methods(arch, rng):
    a = qd.Vector.field(3, qd.f32, shape=12)
    b = qd.Vector.field(3, qd.f32, shape=12)
    scal = qd.field(qd.f32, shape=(6, 12))
    cross = qd.Vector.field(3, qd.f32, shape=12)
    unit = qd.Vector.field(3, qd.f32, shape=12)
    outer = qd.Matrix.field(3, 3, qd.f32, shape=12)

    @qd.kernel
    def run():
        for i in a:
            u, v = a[i], b[i]
            scal[0, i] = u.dot(v)
            scal[1, i] = u.norm()
            scal[2, i] = u.norm_sqr()
            scal[3, i] = u.sum()
            scal[4, i] = u.max()
            scal[5, i] = u.min()
            cross[i] = u.cross(v)
            unit[i] = u.normalized()
            outer[i] = u.outer_product(v)

    av, bv = rand(rng, 12, 3), rand(rng, 12, 3)
    a.from_numpy(av)
    b.from_numpy(bv)
    run()
    s = scal.to_numpy()
    np.testing.assert_allclose(s[0], (av * bv).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s[1], np.linalg.norm(av, axis=1), rtol=1e-5)
    np.testing.assert_allclose(s[2], (av * av).sum(1), rtol=1e-5)
    np.testing.assert_allclose(s[3], av.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(s[4], av.max(1))
    np.testing.assert_array_equal(s[5], av.min(1))
    np.testing.assert_allclose(cross.to_numpy(), np.cross(av, bv), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(unit.to_numpy(), av / np.linalg.norm(av, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(outer.to_numpy(), np.einsum("ia,ib->iab", av, bv), rtol=1e-6)


def test_cross_of_2d_vectors_is_a_scalar(arch, rng):
    a = qd.Vector.field(2, qd.f32, shape=5)
    out = qd.field(qd.f32, shape=5)

    @qd.kernel
    def run():
        for i in a:
            out[i] = a[i].cross(qd.Vector([1.0, 2.0]))

    av = rand(rng, 5, 2)
    a.from_numpy(av)
    run()
    np.testing.assert_allclose(out.to_numpy(), av[:, 0] * 2 - av[:, 1], rtol=1e-6)


def test_matrix_methods(arch, rng):
    m = qd.Matrix.field(3, 3, qd.f32, shape=())
    r = qd.Matrix.field(2, 3, qd.f32, shape=())
    rt = qd.Matrix.field(3, 2, qd.f32, shape=())
    out = qd.field(qd.f32, shape=5)

    @qd.kernel
    def run():
        rt[None] = r[None].transpose()
        out[0] = m[None].trace()
        out[1] = m[None].sum()
        out[2] = m[None].max()
        out[3] = m[None].min()
        out[4] = m[None].norm()

    mv, rv = rand(rng, 3, 3), rand(rng, 2, 3)
    m[None], r[None] = mv, rv
    run()
    np.testing.assert_array_equal(rt.to_numpy(), rv.T)
    got = out.to_numpy()
    np.testing.assert_allclose(got[:2], [np.trace(mv), mv.sum()], rtol=1e-5, atol=1e-6)
    assert got[2] == mv.max() and got[3] == mv.min()
    np.testing.assert_allclose(got[4], np.linalg.norm(mv), rtol=1e-5)


def test_any_all_and_norm_inv_as_in_quadrants(arch, rng):
    a = qd.Matrix.field(2, 2, qd.i32, shape=())
    flags = qd.field(qd.i32, shape=2)
    x = qd.Vector.field(3, qd.f32, shape=4, needs_grad=True)
    inv = qd.field(qd.f32, shape=4)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def func():
        flags[0] = any(a[None])
        flags[1] = all(a[None])

    @qd.kernel
    def norms():
        for i in x:
            inv[i] = x[i].norm_inv()
            loss[None] += x[i].norm_inv()

    for i in range(2):
        for j in range(2):
            a[None] = [[i, j], [j, i]]
            func()
            assert flags[0] == int(i or j) and flags[1] == int(i and j), (i, j)
    xv = rand(rng, 4, 3, lo=0.2, hi=1.0)
    x.from_numpy(xv)
    with qd.ad.Tape(loss=loss):
        norms()
    r = np.linalg.norm(xv.astype(np.float64), axis=1)
    np.testing.assert_allclose(inv.to_numpy(), 1 / r, rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), -xv / r[:, None] ** 3, rtol=1e-4)


def test_matrix_rows_and_cols_from_vectors(arch, rng):
    m = qd.Matrix.field(3, 3, qd.f32, shape=4)
    src = qd.Vector.field(3, qd.f32, shape=3)

    @qd.kernel
    def fill():
        for i in m:
            a, b, c = src[0], src[1], src[2]
            if i == 0:
                m[i] = qd.Matrix.rows([a, b, c])
            elif i == 1:
                m[i] = qd.Matrix.cols([a, b, c])
            elif i == 2:
                m[i] = qd.Matrix.rows([[1.0, 4.0, 7.0], [2.0, 5.0, 8.0], [3.0, 6.0, 9.0]])
            else:
                m[i] = qd.Matrix.cols([[1.0, 4.0, 7.0], [2.0, 5.0, 8.0], [3.0, 6.0, 9.0]])

    sv = rand(rng, 3, 3)
    src.from_numpy(sv)
    fill()
    got = m.to_numpy()
    lit = np.array([[1, 4, 7], [2, 5, 8], [3, 6, 9]], np.float32)
    np.testing.assert_array_equal(got[0], sv)
    np.testing.assert_array_equal(got[1], sv.T)
    np.testing.assert_array_equal(got[2], lit)
    np.testing.assert_array_equal(got[3], lit.T)
    np.testing.assert_array_equal(qd.Matrix.rows([sv[0], sv[1]]), sv[:2])
    np.testing.assert_array_equal(qd.Matrix.cols([sv[0], sv[1]]), sv[:2].T)


def test_matrix_and_vector_factories_as_in_quadrants(arch):
    a = qd.Vector.field(3, qd.i32, shape=3)
    b = qd.Matrix.field(2, 2, qd.f32, shape=3)
    c = qd.Matrix.field(2, 3, qd.f32, shape=2)
    d = qd.Vector.field(4, qd.f32, shape=2)

    @qd.kernel
    def fill(s: qd.f32):
        b[0] = qd.Matrix.identity(qd.f32, 2)
        b[1] = qd.Matrix.diag(dim=2, val=s)
        b[2] = qd.Matrix.diag(2, 1.5)
        c[0] = qd.Matrix.zero(qd.f32, 2, 3)
        c[1] = qd.Matrix.one(qd.f32, 2, 3) * s
        d[0] = qd.Vector.zero(qd.f32, 4) + 1.0
        d[1] = qd.Vector.one(qd.f32, 4) * 2.0
        for i in qd.static(range(3)):
            a[i] = qd.Vector.unit(3, i)

    fill(0.75)
    np.testing.assert_array_equal(a.to_numpy(), np.eye(3))
    np.testing.assert_array_equal(b.to_numpy(), [np.eye(2), 0.75 * np.eye(2), 1.5 * np.eye(2)])
    np.testing.assert_array_equal(c.to_numpy(), [np.zeros((2, 3)), np.full((2, 3), 0.75)])
    np.testing.assert_array_equal(d.to_numpy(), [np.ones(4), np.full(4, 2.0)])
    np.testing.assert_array_equal(qd.Vector.unit(3, 1), [0, 1, 0])
    np.testing.assert_array_equal(qd.Matrix.one(qd.f32, 2), [1, 1])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_determinant_and_inverse_up_to_4x4(arch, rng, n):
    m = qd.Matrix.field(n, n, qd.f32, shape=8)
    det = qd.field(qd.f32, shape=8)
    inv = qd.Matrix.field(n, n, qd.f32, shape=8)

    @qd.kernel
    def run():
        for i in m:
            det[i] = m[i].determinant()
            inv[i] = m[i].inverse()

    mv = (rand(rng, 8, n, n) + 2 * np.eye(n, dtype=np.float32)).astype(np.float32)  # well conditioned
    m.from_numpy(mv)
    run()
    m64 = mv.astype(np.float64)
    # a determinant sums products of up to n entries: its f32 error scales with their size
    assert_close_f32(det.to_numpy(), np.linalg.det(m64), rtol=1e-4, scale=np.max(np.prod(np.abs(m64).sum(-1), -1)))
    np.testing.assert_allclose(inv.to_numpy(), np.linalg.inv(m64), rtol=1e-4, atol=1e-5)


def test_determinant_and_inverse_in_f64(arch, rng):
    m = qd.Matrix.field(4, 4, qd.f64, shape=3)
    det = qd.field(qd.f64, shape=3)
    inv = qd.Matrix.field(4, 4, qd.f64, shape=3)

    @qd.kernel
    def run():
        for i in m:
            det[i] = m[i].determinant()
            inv[i] = m[i].inverse()

    mv = rng.random((3, 4, 4)) + 2 * np.eye(4)
    m.from_numpy(mv)
    run()
    np.testing.assert_allclose(det.to_numpy(), np.linalg.det(mv), rtol=1e-12)
    np.testing.assert_allclose(inv.to_numpy(), np.linalg.inv(mv), rtol=1e-10, atol=1e-12)


# ---- qd.math ----------------------------------------------------------------------------------

def test_qd_math_functions(arch, rng):
    n = 24
    a = qd.Vector.field(3, qd.f32, shape=n)
    b = qd.Vector.field(3, qd.f32, shape=n)
    t = qd.field(qd.f32, shape=n)
    vout = qd.Vector.field(3, qd.f32, shape=(8, n))
    sout = qd.field(qd.f32, shape=(2, n))

    @qd.kernel
    def run():
        for i in a:
            u, v, s = a[i], b[i], t[i]
            sout[0, i] = qd.math.dot(u, v)
            sout[1, i] = qd.math.length(u)
            vout[0, i] = qd.math.cross(u, v)
            vout[1, i] = qd.math.normalize(u)
            vout[2, i] = qd.math.clamp(u, -0.5, 0.5)
            vout[3, i] = qd.math.mix(u, v, s)
            vout[4, i] = qd.math.sign(u)
            vout[5, i] = qd.math.fract(u * 3.0)
            vout[6, i] = qd.math.step(v, u)
            vout[7, i] = qd.math.smoothstep(-0.5, 0.5, u)

    av, bv, tv = rand(rng, n, 3), rand(rng, n, 3), rand(rng, n, lo=0, hi=1)
    av[0, 0] = 0.0  # sign(0) == 0
    a.from_numpy(av)
    b.from_numpy(bv)
    t.from_numpy(tv)
    run()
    s, v = sout.to_numpy(), vout.to_numpy()
    np.testing.assert_allclose(s[0], (av * bv).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s[1], np.linalg.norm(av, axis=1), rtol=1e-5)
    np.testing.assert_allclose(v[0], np.cross(av, bv), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v[1], av / np.linalg.norm(av, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(v[2], np.clip(av, -0.5, 0.5))
    np.testing.assert_allclose(v[3], av * (1 - tv[:, None]) + bv * tv[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(v[4], np.sign(av))
    x3 = av * np.float32(3)
    np.testing.assert_allclose(v[5], x3 - np.floor(x3), atol=1e-6)
    np.testing.assert_array_equal(v[6], (av >= bv).astype(np.float32))
    c = np.clip((av + 0.5) / 1.0, 0, 1)
    np.testing.assert_allclose(v[7], c * c * (3 - 2 * c), rtol=1e-5, atol=1e-6)


def test_qd_math_on_scalars(arch, rng):
    x = qd.field(qd.f32, shape=16)
    out = qd.field(qd.f32, shape=(5, 16))

    @qd.kernel
    def run():
        for i in x:
            v = x[i]
            out[0, i] = qd.math.clamp(v, 0.0, 1.0)
            out[1, i] = qd.math.mix(1.0, 3.0, v)
            out[2, i] = qd.math.sign(v)
            out[3, i] = qd.math.fract(v)
            out[4, i] = qd.math.step(0.25, v)

    xv = rand(rng, 16, lo=-2, hi=2)
    x.from_numpy(xv)
    run()
    got = out.to_numpy()
    np.testing.assert_array_equal(got[0], np.clip(xv, 0, 1))
    np.testing.assert_allclose(got[1], 1 + 2 * xv, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], np.sign(xv))
    np.testing.assert_allclose(got[3], xv - np.floor(xv), atol=1e-6)
    np.testing.assert_array_equal(got[4], (xv >= 0.25).astype(np.float32))


# ---- atomics ----------------------------------------------------------------------------------

def test_atomics_on_whole_vectors_and_elements(arch, rng):
    n = 200
    src = qd.Vector.field(3, qd.f32, shape=n)
    total = qd.Vector.field(3, qd.f32, shape=())
    bins = qd.Vector.field(3, qd.f32, shape=4)
    first = qd.field(qd.f32, shape=())
    ctr = qd.field(qd.math.ivec2, shape=())

    @qd.kernel
    def run():
        for i in src:
            total[None] += src[i]
            bins[i % 4] -= src[i] * 2.0
            first[None] += src[i][0]
            ctr[None][1] += 1
            qd.atomic_add(ctr[None][0], 2)

    sv = rand(rng, n, 3)
    src.from_numpy(sv)
    run()
    s64 = sv.astype(np.float64)
    np.testing.assert_allclose(total.to_numpy(), s64.sum(0), rtol=1e-4, atol=1e-5)
    want_bins = np.stack([-2 * s64[k::4].sum(0) for k in range(4)])
    np.testing.assert_allclose(bins.to_numpy(), want_bins, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(first[None], s64[:, 0].sum(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(ctr[None], [2 * n, n])


def test_atomic_add_on_vector_ndarray(arch, rng):
    @qd.kernel
    def scatter(idx: qd.types.ndarray(dtype=qd.i32, ndim=1), v: qd.types.ndarray(dtype=qd.math.vec2, ndim=1),
                acc: qd.types.ndarray(dtype=qd.math.vec2, ndim=1)):
        for i in idx:
            acc[idx[i]] += v[i]

    idx = rng.integers(0, 5, 64).astype(np.int32)
    v = rand(rng, 64, 2)
    acc = np.zeros((5, 2), np.float32)
    scatter(idx, v, acc)
    want = np.zeros((5, 2))
    np.add.at(want, idx, v.astype(np.float64))
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5)


def test_atomic_functions_on_whole_vectors_return_old_values(arch, rng):
    n = 64
    src = qd.Vector.field(2, qd.i32, shape=n)
    hi = qd.Vector.field(2, qd.i32, shape=())
    lo = qd.Vector.field(2, qd.i32, shape=())
    acc = qd.Vector.field(2, qd.i32, shape=n)
    old = qd.Vector.field(2, qd.i32, shape=n)

    @qd.kernel
    def run():
        for i in src:
            qd.atomic_max(hi[None], src[i])
            qd.atomic_min(lo[None], src[i])
            old[i] = qd.atomic_add(acc[i], src[i])

    sv = rng.integers(-1000, 1000, (n, 2)).astype(np.int32)
    src.from_numpy(sv)
    lo[None] = [1 << 30, 1 << 30]
    hi[None] = [-(1 << 30), -(1 << 30)]
    start = rng.integers(-5, 5, (n, 2)).astype(np.int32)
    acc.from_numpy(start)
    run()
    np.testing.assert_array_equal(hi[None], sv.max(0))
    np.testing.assert_array_equal(lo[None], sv.min(0))
    np.testing.assert_array_equal(old.to_numpy(), start)
    np.testing.assert_array_equal(acc.to_numpy(), start + sv)


# ---- funcs, returns ---------------------------------------------------------------------------

@qd.func
def reflect_about(v, n):
    return v - 2.0 * v.dot(n) * n


@qd.func
def rotate2(v: qd.math.vec2, angle: qd.f32) -> qd.math.vec2:
    c, s = qd.cos(angle), qd.sin(angle)
    return qd.math.mat2([[c, -s], [s, c]]) @ v


def test_vectors_through_func_arguments_and_returns(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=10)
    n = qd.Vector.field(3, qd.f32, shape=10)
    p = qd.Vector.field(2, qd.f32, shape=10)

    @qd.kernel
    def run(angle: qd.f32):
        for i in v:
            v[i] = reflect_about(v[i], n[i].normalized())
            p[i] = rotate2(p[i], angle)

    vv, nv, pv = rand(rng, 10, 3), rand(rng, 10, 3), rand(rng, 10, 2)
    v.from_numpy(vv)
    n.from_numpy(nv)
    p.from_numpy(pv)
    ang = float(np.float32(rng.random() * 3))
    run(ang)
    nn = nv / np.linalg.norm(nv, axis=1, keepdims=True)
    np.testing.assert_allclose(v.to_numpy(), vv - 2 * (vv * nn).sum(1, keepdims=True) * nn, rtol=1e-5, atol=1e-5)
    c, s = np.cos(ang), np.sin(ang)
    np.testing.assert_allclose(p.to_numpy(), pv @ np.array([[c, -s], [s, c]]).T, rtol=1e-5, atol=1e-5)


def test_kernel_returns_vector_and_matrix(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=40)

    @qd.kernel
    def centroid() -> qd.math.vec3:
        c = qd.Vector([0.0, 0.0, 0.0])
        for i in x:
            c += x[i]
        return c / 40.0

    @qd.kernel
    def frame(a: qd.f32) -> qd.types.matrix(2, 2, qd.f32):
        return qd.Matrix([[a, 1.0], [2.0, a * a]])

    @qd.kernel
    def both(a: qd.f32) -> tuple[qd.math.vec2, qd.f32]:
        return qd.math.vec2(a, -a), a * 3.0

    xv = rand(rng, 40, 3)
    x.from_numpy(xv)
    got = centroid()
    assert isinstance(got, np.ndarray) and got.shape == (3,)
    np.testing.assert_allclose(got, xv.astype(np.float64).mean(0), rtol=1e-4, atol=1e-6)
    m = frame(1.5)
    assert m.shape == (2, 2)
    np.testing.assert_array_equal(m, [[1.5, 1.0], [2.0, 2.25]])
    v, s = both(2.0)
    np.testing.assert_array_equal(v, [2.0, -2.0])
    assert s == 6.0


def test_augmented_assignment_on_swizzles_and_elements(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=5)
    m = qd.Matrix.field(2, 2, qd.f32, shape=5)

    @qd.kernel
    def run(k: qd.i32):
        for i in v:
            v[i].x += 1.0
            v[i] *= 2.0
            m[i][0, 1] -= 3.0
            w = v[i]
            for j in range(k):  # run-time index into a vector local
                w[j] = w[j] * j
            v[i] = w

    vv, mv = rand(rng, 5, 3), rand(rng, 5, 2, 2)
    v.from_numpy(vv)
    m.from_numpy(mv)
    run(3)
    want = vv.copy()
    want[:, 0] += 1
    want *= 2
    want *= np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(v.to_numpy(), want, rtol=1e-6)
    mv[:, 0, 1] -= 3
    np.testing.assert_allclose(m.to_numpy(), mv, rtol=1e-6)


def test_vector_kernel_parameter(arch, rng):
    out = qd.Vector.field(3, qd.f32, shape=4)

    @qd.kernel
    def fill(v: qd.math.vec3, s: qd.f32):
        for i in out:
            out[i] = v * s + i

    v = rand(rng, 3)
    fill(v, 2.0)
    np.testing.assert_allclose(out.to_numpy(), v * 2 + np.arange(4)[:, None], rtol=1e-6)
