"""Acceptance tests of docs/api.md's Vectors and matrices, written from the user reference (and Quadrants'
conventions where it says "as in Quadrants") without reference to qdc's implementation: each test
is one promise, checked on fresh random inputs against numpy, analytic derivatives or float64
central differences, on every arch of the suite."""
import textwrap

import numpy as np
import pytest

import qdc as qd
from tolerance_util import assert_close_f32


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


def test_python_scope_element_writes_go_through_as_in_quadrants(arch, rng):
    m = qd.Matrix.field(2, 2, qd.f32, shape=(3,))
    v = qd.Vector.field(4, qd.i32, shape=(2, 2))
    mv = rand(rng, 3, 2, 2)
    m.from_numpy(mv)
    m[1][0, 1] = 5.0        # Quadrants: m[None][i, j] = value writes into the field
    m[2][1][0] = -2.0       # through a row of the element too
    v[1, 0][2] = 7
    v[1, 1].y = 3
    v[0, 1].w = v[1, 1].y + 1
    mv[1, 0, 1], mv[2, 1, 0] = 5.0, -2.0
    np.testing.assert_array_equal(m.to_numpy(), mv)
    want = np.zeros((2, 2, 4), np.int32)
    want[1, 0, 2], want[1, 1, 1], want[0, 1, 3] = 7, 3, 4
    np.testing.assert_array_equal(v.to_numpy(), want)
    assert v[1, 1].y == 3 and v[1, 1].x == 0
    detached = v[1, 1] + 1  # arithmetic results are plain values: writing them changes nothing
    detached[0] = 100
    np.testing.assert_array_equal(v.to_numpy(), want)
    np.testing.assert_array_equal(m[1].to_numpy(), mv[1])

    @qd.kernel
    def double():
        for i in m:
            m[i] = m[i] * 2.0

    double()  # the kernel sees the element writes
    np.testing.assert_allclose(m.to_numpy(), mv * 2, rtol=1e-6)
    g = qd.Vector.field(3, qd.f32, shape=2, needs_grad=True)
    g.grad[1][2] = 1.5
    np.testing.assert_array_equal(g.grad.to_numpy(), [[0, 0, 0], [0, 0, 1.5]])


def test_to_numpy_keep_dims(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=4)
    m = qd.Matrix.field(2, 3, qd.f32, shape=4)
    vv = rand(rng, 4, 3)
    v.from_numpy(vv)
    assert v.to_numpy(keep_dims=True).shape == (4, 3, 1)
    np.testing.assert_array_equal(v.to_numpy(keep_dims=True)[..., 0], vv)
    assert m.to_numpy(keep_dims=True).shape == (4, 2, 3)


@pytest.mark.parametrize("dtype, np_dtype", [(qd.u8, np.uint8), (qd.i16, np.int16), (qd.i64, np.int64),
                                             (qd.f16, np.float16)])
def test_vector_fields_of_narrow_and_wide_types(arch, rng, dtype, np_dtype):
    img = qd.Vector.field(3, dtype, shape=(4, 5))
    hist = qd.Vector.field(3, qd.i32, shape=())

    @qd.kernel
    def shade():
        for i, j in img:
            c = img[i, j]
            img[i, j] = c // 2 + qd.Vector([1, 2, 3])
            hist[None] += qd.cast(c, qd.i32)

    start = rng.integers(0, 100, (4, 5, 3)).astype(np_dtype)
    img.from_numpy(start)
    assert img.to_numpy().dtype == np_dtype
    shade()
    want = start // 2 + np.array([1, 2, 3], np_dtype)
    np.testing.assert_array_equal(img.to_numpy(), want)
    np.testing.assert_array_equal(hist[None], start.astype(np.int64).sum((0, 1)))


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
    for bad in (np.zeros((4, 3)), np.zeros((4, 2), np.float32), np.zeros((2, 4, 3), np.float32)):
        with pytest.raises((TypeError, ValueError)) as info:
            norms(bad, out)
        assert "norms" in str(info.value) and "'p'" in str(info.value), str(info.value)
    strided = rand(rng, 4, 6)[:, ::2]  # not contiguous: copied in
    norms(strided, out)
    np.testing.assert_allclose(out, np.linalg.norm(strided, axis=1), rtol=1e-6)
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
    assert_close_f32(out3.to_numpy(), av[:, :3] * av[:, 3:] + av[:, :3], rtol=1e-6)
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


def test_list_literals_assigned_to_vector_and_matrix_elements(arch, rng):
    m = qd.Matrix.field(2, 2, qd.i32, shape=(2, 2, 1))
    v = qd.Vector.field(2, qd.f32, shape=(2, 2, 1))
    m[1, 0, 0] = [[4, 3], [6, 7]]  # from Python too
    v[1, 0, 0] = [8, 4]
    np.testing.assert_array_equal(m.to_numpy()[1, 0, 0], [[4, 3], [6, 7]])
    np.testing.assert_array_equal(v.to_numpy()[1, 0, 0], [8, 4])

    @qd.kernel
    def func(s: qd.f32):
        m[1, 0, 0] = [[1, 2], [3, 4]]
        v[1, 0, 0] = [5, s]
        m[1, 0, 0] += [[1, 2], [3, 4]]
        v[1, 0, 0] += [5, 6]
        v[0, 1, 0] = (s, s * 2.0)

    s = float(np.float32(rng.random()))
    func(s)
    np.testing.assert_array_equal(m.to_numpy()[1, 0, 0], [[2, 4], [6, 8]])
    np.testing.assert_allclose(v.to_numpy()[1, 0, 0], [10, s + 6], rtol=1e-6)
    np.testing.assert_allclose(v.to_numpy()[0, 1, 0], [s, 2 * s], rtol=1e-6)


def test_list_of_the_wrong_shape_is_a_located_error(tmp_path):
    import importlib.util
    path = tmp_path / "bad_acc_list.py"
    path.write_text(textwrap.dedent('''
        import qdc as qd
        m = qd.Matrix.field(2, 2, qd.f32, shape=())

        @qd.kernel
        def bad():
            m[None] = [[1.0, 2.0], [3.0]]
    '''), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("bad_acc_list", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(qd.QdcCompileError, match="cannot assign a list") as info:
        module.bad()
    assert info.value.filename == str(path) and info.value.line == 7


# ---- ndarrays and types, continued ----------------------------------------------------------

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
    '''), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("bad_acc_vectors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(qd.QdcCompileError) as info:
        module.bad()
    e = info.value
    assert e.filename == str(path) and e.line == 9, str(e)
    assert message in str(e), str(e)
    assert body.split(" = ")[1][:20] in str(e), "the error shows the source line"
