"""Acceptance tests of API.md §2 "Vectors and matrices", written from API.md (and Quadrants'
conventions where it says "as in Quadrants") without reference to qdc's implementation: each test
is one promise, checked on fresh random inputs against numpy, analytic derivatives or float64
central differences, on every arch of the suite."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd


def rand(rng, *shape, lo=-1.0, hi=1.0, dtype=np.float32):
    return (rng.random(shape) * (hi - lo) + lo).astype(dtype)


# ---- types ------------------------------------------------------------------------------------

def test_qd_math_types_have_default_element_types(arch):
    fields = {name: qd.field(getattr(qd.math, name), shape=3)
              for name in ("vec2", "vec3", "vec4", "ivec2", "ivec3", "ivec4", "uvec2", "uvec3", "uvec4",
                           "mat2", "mat3", "mat4")}
    for name, f in fields.items():
        n = int(name[-1])
        want_shape = (3, n, n) if name.startswith("mat") else (3, n)
        assert f.shape == (3,), name
        assert f.to_numpy().shape == want_shape, name
    assert fields["vec3"].dtype == qd.f32 and fields["mat4"].dtype == qd.f32
    assert fields["ivec2"].dtype == qd.i32 and fields["uvec4"].dtype == qd.u32
    assert fields["vec2"].to_numpy().dtype == np.float32
    assert fields["ivec3"].to_numpy().dtype == np.int32
    assert fields["uvec3"].to_numpy().dtype == np.uint32


def test_default_fp_f64_makes_qd_math_vectors_f64(session_cache_dir, rng):
    qd.init(arch=qd.cpu, default_fp=qd.f64, default_ip=qd.i64, cache_dir=session_cache_dir)
    try:
        v = qd.field(qd.math.vec3, shape=4)
        m = qd.field(qd.math.mat2, shape=4)
        iv = qd.field(qd.math.ivec2, shape=4)
        assert v.dtype == qd.f64 and m.dtype == qd.f64 and iv.dtype == qd.i64
        assert v.to_numpy().dtype == np.float64

        @qd.kernel
        def third():
            for i in v:
                v[i] = qd.math.vec3(1, 2, 3) / 3.0 + i
                m[i] = qd.math.mat2([[1, 0], [0, 1]]) * (1.0 / 7.0)
                iv[i] = qd.math.ivec2(i, 1 << 40)

        third()
        np.testing.assert_array_equal(v.to_numpy(), np.array([1, 2, 3]) / 3.0 + np.arange(4)[:, None])
        np.testing.assert_array_equal(m.to_numpy()[2], np.eye(2) * (1.0 / 7.0))
        np.testing.assert_array_equal(iv.to_numpy()[:, 1], 1 << 40)
    finally:
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_qd_types_vector_and_matrix_with_explicit_dtypes(arch, rng):
    V = qd.types.vector(4, qd.f64)
    M = qd.types.matrix(2, 3, qd.i32)
    a = qd.field(V, shape=5)
    b = qd.field(M, shape=5)
    assert a.dtype == qd.f64 and a.to_numpy().shape == (5, 4)
    assert b.dtype == qd.i32 and b.to_numpy().shape == (5, 2, 3)

    @qd.kernel
    def fill():
        for i in a:
            a[i] = V(i, 0.5, 1.0 / 3.0, -1)
            b[i] = M([[i, 1, 2], [3, 4, -i]])

    fill()
    want_a = np.stack([np.arange(5), np.full(5, 0.5), np.full(5, 1 / 3), np.full(5, -1.0)], 1)
    np.testing.assert_allclose(a.to_numpy(), want_a, rtol=1e-15)
    bv = b.to_numpy()
    np.testing.assert_array_equal(bv[:, 0, 0], np.arange(5))
    np.testing.assert_array_equal(bv[:, 1, 2], -np.arange(5))
    np.testing.assert_array_equal(bv[3], [[3, 1, 2], [3, 4, -3]])


# ---- fields and host access -------------------------------------------------------------------

def test_vector_and_matrix_fields_from_python(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=(4, 6), needs_grad=True)
    m = qd.Matrix.field(2, 2, qd.f64, shape=7, needs_grad=True)
    assert v.shape == (4, 6) and v.to_numpy().shape == (4, 6, 3) and v.grad.to_numpy().shape == (4, 6, 3)
    assert m.shape == (7,) and m.to_numpy().shape == (7, 2, 2) and m.grad.to_numpy().shape == (7, 2, 2)
    vv = rand(rng, 4, 6, 3)
    mv = rand(rng, 7, 2, 2, dtype=np.float64)
    v.from_numpy(vv)
    m.from_numpy(mv)
    np.testing.assert_array_equal(v.to_numpy(), vv)
    np.testing.assert_array_equal(m.to_numpy(), mv)
    np.testing.assert_array_equal(v[2, 5], vv[2, 5])
    assert v[2, 5][1] == vv[2, 5, 1]
    np.testing.assert_array_equal(m[3], mv[3])
    v[0, 0] = qd.Vector([1.5, 2.5, 3.5])
    m[6] = [[1.0, 2.0], [3.0, 4.0]]
    np.testing.assert_array_equal(v.to_numpy()[0, 0], [1.5, 2.5, 3.5])
    np.testing.assert_array_equal(m.to_numpy()[6], [[1, 2], [3, 4]])
    v.fill(0.25)
    assert (v.to_numpy() == 0.25).all()


def test_field_of_vec3_is_read_and_written_by_kernels(arch, rng):
    p = qd.field(qd.math.vec3, shape=50)
    q = qd.Vector.field(3, qd.f32, shape=50)

    @qd.kernel
    def shift(d: qd.f32):
        for i in p:
            q[i] = p[i] * 2.0 + d

    pv = rand(rng, 50, 3)
    p.from_numpy(pv)
    d = float(np.float32(rng.random()))
    shift(d)
    np.testing.assert_allclose(q.to_numpy(), pv * 2 + np.float32(d), rtol=1e-6)


# ---- ndarrays ---------------------------------------------------------------------------------

def test_ndarray_parameter_of_vec3_takes_numpy_with_trailing_axis(arch, rng):
    @qd.kernel
    def lengths(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(p.shape[0]):
            out[i] = p[i].norm()

    pv = rand(rng, 33, 3)
    out = np.zeros(33, np.float32)
    lengths(pv, out)
    np.testing.assert_allclose(out, np.linalg.norm(pv, axis=1), rtol=1e-5)


def test_ndarray_of_matrices_2d(arch, rng):
    @qd.kernel
    def mul(a: qd.types.ndarray(dtype=qd.math.mat2, ndim=2), x: qd.types.ndarray(dtype=qd.math.vec2, ndim=2)):
        for i, j in a:
            x[i, j] = a[i, j] @ x[i, j]

    av, xv = rand(rng, 3, 4, 2, 2), rand(rng, 3, 4, 2)
    want = np.einsum("ijab,ijb->ija", av, xv)
    mul(av, xv)
    np.testing.assert_allclose(xv, want, rtol=1e-5, atol=1e-6)


def test_qd_ndarray_of_vec3(arch, rng):
    a = qd.ndarray(qd.math.vec3, shape=(10,))
    assert a.shape == (10,)
    assert a.to_numpy().shape == (10, 3)
    av = rand(rng, 10, 3)
    a.from_numpy(av)

    @qd.kernel
    def flip(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):
        for i in p:
            p[i] = p[i].zyx

    flip(a)
    np.testing.assert_array_equal(a.to_numpy(), av[:, ::-1])


def test_ndarray_with_wrong_trailing_axes_is_refused(arch):
    @qd.kernel
    def touch(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):
        for i in p:
            p[i] = p[i] + 1.0

    with pytest.raises(ValueError):
        touch(np.zeros((5, 4), np.float32))
    with pytest.raises((TypeError, ValueError)):
        touch(np.zeros(5, np.float32))


def test_vector_ndarray_argument_mistakes_name_kernel_and_parameter(arch, rng):
    @qd.kernel
    def norms(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in p:
            out[i] = p[i].norm()

    out = np.zeros(4, np.float32)
    for bad in (np.zeros((4, 3)), np.zeros((4, 6), np.float32)[:, ::2], np.zeros((4, 2), np.float32),
                np.zeros((2, 4, 3), np.float32)):
        with pytest.raises((TypeError, ValueError)) as info:
            norms(bad, out)
        assert "norms" in str(info.value) and "'p'" in str(info.value), str(info.value)
    readonly = rand(rng, 4, 3)
    readonly.flags.writeable = False
    norms(readonly, out)  # only read: accepted
    np.testing.assert_allclose(out, np.linalg.norm(readonly, axis=1), rtol=1e-6)
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        norms(readonly, frozen)
    assert (frozen == 0).all()


def test_zero_dim_vector_field_and_noncontiguous_from_numpy(arch, rng):
    z = qd.Vector.field(3, qd.f32, shape=())
    x = qd.Vector.field(3, qd.f32, shape=4)
    assert z.to_numpy().shape == (3,)
    src = rand(rng, 4, 6)[:, ::2]  # a strided view
    x.from_numpy(src)
    np.testing.assert_array_equal(x.to_numpy(), src)

    @qd.kernel
    def total():
        for i in x:
            z[None] += x[i]

    total()
    np.testing.assert_allclose(z[None], src.astype(np.float64).sum(0), rtol=1e-5)
    with pytest.raises(ValueError):
        x.from_numpy(np.zeros((4, 2), np.float32))


# ---- literals, indexing, swizzles -------------------------------------------------------------

def test_literals_indexing_and_element_assignment(arch, rng):
    out = qd.field(qd.f32, shape=(9,))
    src = qd.Matrix.field(3, 3, qd.f32, shape=())

    @qd.kernel
    def run(k: qd.i32):
        v = qd.Vector([1.0, 2.0, 3.0])
        m = qd.Matrix([[1.0, 2.0], [3.0, 4.0]])
        v[1] = 20.0
        m[1, 0] = 30.0
        out[0] = v[0] + v[1] + v[2]
        out[1] = m[0, 0] + m[0, 1] * 10.0 + m[1, 0] * 100.0 + m[1, 1] * 1000.0
        out[2] = v[k]  # a run-time index
        s = src[None]
        for i in range(3):
            out[3 + i] = s[i, i]
        out[6] = src[None][2, 0]

    sv = rand(rng, 3, 3)
    src[None] = sv
    run(2)
    got = out.to_numpy()
    assert got[0] == 24 and got[1] == 1 + 20 + 3000 + 4000 and got[2] == 3
    np.testing.assert_array_equal(got[3:6], np.diag(sv))
    assert got[6] == sv[2, 0]


def test_swizzles_read_and_write(arch, rng):
    a = qd.Vector.field(4, qd.f32, shape=8)
    out2 = qd.Vector.field(2, qd.f32, shape=8)
    out3 = qd.Vector.field(3, qd.f32, shape=8)
    out4 = qd.Vector.field(4, qd.f32, shape=8)

    @qd.kernel
    def run():
        for i in a:
            v = a[i]
            out2[i] = v.yx + v.zw
            out3[i] = v.xyz * v.w + qd.Vector([v.x, v.y, v.z])
            w = v
            w.xy = qd.Vector([v.w, v.z])
            w.z = 5.0
            out4[i] = w

    av = rand(rng, 8, 4)
    a.from_numpy(av)
    run()
    np.testing.assert_allclose(out2.to_numpy(), av[:, [1, 0]] + av[:, [2, 3]], rtol=1e-6)
    np.testing.assert_allclose(out3.to_numpy(), av[:, :3] * av[:, 3:] + av[:, :3], rtol=1e-6)
    want = av.copy()
    want[:, 0], want[:, 1], want[:, 2] = av[:, 3], av[:, 2], 5.0
    np.testing.assert_array_equal(out4.to_numpy(), want)


def test_swizzle_on_field_element_assignment(arch, rng):
    a = qd.Vector.field(3, qd.f32, shape=6)

    @qd.kernel
    def run():
        for i in a:
            a[i].y = a[i].x * 2.0
            a[i][2] = 7.0

    av = rand(rng, 6, 3)
    a.from_numpy(av)
    run()
    want = av.copy()
    want[:, 1] = av[:, 0] * 2
    want[:, 2] = 7
    np.testing.assert_allclose(a.to_numpy(), want, rtol=1e-6)


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
    np.testing.assert_allclose(det.to_numpy(), np.linalg.det(m64), rtol=1e-4)
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


@pytest.mark.xfail(strict=True, reason="finding: a vector/matrix type as a kernel parameter annotation "
                                       "(Quadrants' `v: qd.math.vec3`) is refused as unsupported")
def test_vector_kernel_parameter(arch, rng):
    out = qd.Vector.field(3, qd.f32, shape=4)

    @qd.kernel
    def fill(v: qd.math.vec3, s: qd.f32):
        for i in out:
            out[i] = v * s + i

    v = rand(rng, 3)
    fill(v, 2.0)
    np.testing.assert_allclose(out.to_numpy(), v * 2 + np.arange(4)[:, None], rtol=1e-6)


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
    np.testing.assert_allclose(loss[None], ref(a64, b64), rtol=1e-5)
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
    np.testing.assert_allclose(loss[None], ref(x64, theta, k), rtol=1e-4)
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
    want = (x64 / np.linalg.norm(x64, axis=1, keepdims=True) * seed).sum()
    np.testing.assert_allclose(y.dual[None], want, rtol=1e-4)


def test_quadrants_ndarray_constructors_and_python_indexing(arch, rng):
    a = qd.Vector.ndarray(3, qd.f32, shape=5)
    b = qd.Matrix.ndarray(2, 2, qd.f32, shape=(5,))
    c = qd.ndarray(dtype=qd.math.vec3, shape=(5,), needs_grad=True)
    assert a.shape == (5,) and a.to_numpy().shape == (5, 3)
    assert b.shape == (5,) and b.to_numpy().shape == (5, 2, 2)
    assert c.grad.to_numpy().shape == (5, 3)
    av, bv = rand(rng, 5, 3), rand(rng, 5, 2, 2)
    a.from_numpy(av)
    b.from_numpy(bv)
    np.testing.assert_array_equal(a[3], av[3])
    c[1] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(c.to_numpy()[1], [1, 2, 3])

    @qd.kernel
    def apply(m: qd.types.ndarray(dtype=qd.math.mat2, ndim=1), v: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):
        for i in v:
            v[i] = qd.math.vec3(m[i] @ v[i].xy, m[i].determinant())

    apply(b, a)
    want = np.concatenate([np.einsum("iab,ib->ia", bv, av[:, :2]), np.linalg.det(bv)[:, None]], 1)
    np.testing.assert_allclose(a.to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_ndarray_of_vectors_with_omitted_ndim_follows_the_argument(arch, rng):
    @qd.kernel
    def spread(a: qd.types.ndarray(), b: qd.types.ndarray(dtype=qd.math.vec3)):
        for i in range(a.shape[0]):
            b[i] = qd.math.vec3(a[i], a[i] * 2.0, b.shape[0])

    a = rand(rng, 6)
    b = np.zeros((6, 3), np.float32)
    spread(a, b)
    np.testing.assert_allclose(b, np.stack([a, 2 * a, np.full(6, 6.0, np.float32)], 1), rtol=1e-6)


def test_mixed_int_and_float_vectors_promote(arch):
    out = qd.Vector.field(3, qd.f32, shape=())
    ints = qd.field(qd.math.ivec3, shape=())

    @qd.kernel
    def run():
        iv = qd.math.ivec3(1, 2, 3)
        out[None] = iv * 0.5 + iv / 2
        ints[None] = qd.cast(qd.math.vec3(1.7, -2.2, 3.9), qd.i32)

    run()
    np.testing.assert_array_equal(out[None], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(ints[None], [1, -2, 3])


def test_static_loops_over_components_and_f64_returns(arch, rng):
    x = qd.Vector.field(4, qd.f64, shape=9)

    @qd.kernel
    def weighted() -> qd.types.vector(2, qd.f64):
        acc = qd.Vector([0.0, 0.0], dt=qd.f64)
        for i in x:
            s = x[i][0] * 0.0  # f64: a local takes the type of its first assignment
            for k in qd.static(range(4)):
                s += x[i][k] * (k + 1)
            acc += qd.Vector([s, x[i].max()], dt=qd.f64)
        return acc

    xv = rng.random((9, 4))
    x.from_numpy(xv)
    got = weighted()
    assert got.dtype == np.float64 and got.shape == (2,)
    np.testing.assert_allclose(got, [(xv @ np.arange(1, 5)).sum(), xv.max(1).sum()], rtol=1e-13)


@pytest.mark.parametrize("body, message", [
    ("out[None] = qd.math.vec3(m5[None].determinant(), 0.0, 0.0)", "5"),
    ("out[None] = qd.math.vec3(r23[None].inverse()[0, 0], 0.0, 0.0)", "square"),
    ("out[None] = r23[None] @ out[None].xy", "@"),
    ("out[None] = qd.math.vec4(1.0, 2.0, 3.0, 4.0).cross(qd.math.vec4(1.0, 2.0, 3.0, 4.0)).xyz", "cross"),
])
def test_vector_and_matrix_misuse_is_a_located_compile_error(tmp_path, body, message):
    import importlib.util
    path = tmp_path / "bad_acc_vectors.py"
    path.write_text(textwrap.dedent(f'''
        import qdc as qd
        m5 = qd.Matrix.field(5, 5, qd.f32, shape=())
        r23 = qd.Matrix.field(2, 3, qd.f32, shape=())
        out = qd.Vector.field(3, qd.f32, shape=())

        @qd.kernel
        def bad():
            {body}
    '''))
    spec = importlib.util.spec_from_file_location("bad_acc_vectors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(qd.QdcCompileError) as info:
        module.bad()
    e = info.value
    assert e.filename == str(path) and e.line == 9, str(e)
    assert message in str(e), str(e)
    assert body.split(" = ")[1][:20] in str(e), "the error shows the source line"


# ---- more gradients ---------------------------------------------------------------------------

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
    np.testing.assert_allclose(loss[None], ref(x64), rtol=1e-5)
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
    np.testing.assert_allclose(loss[None], ref(a64), rtol=1e-5)
    np.testing.assert_allclose(a.grad.to_numpy(), central_diff(ref, a64), rtol=1e-3, atol=1e-5)


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
    np.testing.assert_allclose(loss[None], ref(x64), rtol=1e-5)
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
assert np.allclose(p, p0 + nv * np.float32(0.25), rtol=1e-5, atol=1e-6), "pos"
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
    (src / "accvec.py").write_text(textwrap.dedent(AOT_MODULE))
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(src), "--cache", cache,
                        "--arch", ",".join(archs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN)
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK no compiler" in r.stdout, (arch, r.stdout + r.stderr)
