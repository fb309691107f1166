"""Vectors in kernels (docs/api.md, Vectors and matrices): literals, types, indexing, swizzles,
element-wise arithmetic and broadcasting, methods, qd.math, funcs, unpacking, static loops,
checked against numpy on fresh random inputs, on every arch of the suite."""
import numpy as np
import pytest

import qdc as qd

from module_util import compile_error_of


def vecs(rng, n, k=3, lo=-1.0, hi=1.0):
    return (rng.random((n, k)) * (hi - lo) + lo).astype(np.float32)


def test_literals_types_and_elementwise_operators(arch, rng):
    n = 37
    a = qd.Vector.field(3, qd.f32, shape=n)
    b = qd.field(qd.math.vec3, shape=n)
    out = qd.Vector.field(3, qd.f32, shape=(8, n))

    @qd.kernel
    def ops(s: qd.f32):
        for i in a:
            u, v = a[i], b[i]
            out[0, i] = u + v
            out[1, i] = u - v * s
            out[2, i] = u * v / (v + 3.0)
            out[3, i] = -u + qd.Vector([1.0, 2.0, 3.0])
            out[4, i] = (u + 2.0) ** 2 + (v + 2.0) ** s
            out[5, i] = (u * 10.0) // 3.0 + (v * 10.0) % 3.0
            out[6, i] = qd.math.vec3(s, 2, i) + qd.math.vec3(1)
            out[7, i] = 2.0 - u

    av, bv = vecs(rng, n), vecs(rng, n)
    a.from_numpy(av)
    b.from_numpy(bv)
    s = np.float32(rng.random() + 0.5)
    ops(float(s))
    got = out.to_numpy()
    idx = np.arange(n, dtype=np.float32)
    want = [av + bv, av - bv * s, av * bv / (bv + 3), -av + [1, 2, 3], (av + 2) ** 2 + (bv + 2) ** s,
            np.floor_divide(av * 10, 3) + np.mod(bv * 10, 3),
            np.stack([np.full(n, s), np.full(n, 2.0), idx], 1) + 1, 2 - av]
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[k], w, rtol=2e-5, atol=2e-5, err_msg=f"row {k}")


def test_vector_types_resolve_element_types(arch, rng):
    iv = qd.field(qd.math.ivec3, shape=4)
    uv = qd.field(qd.math.uvec2, shape=4)
    fv = qd.field(qd.types.vector(2, qd.f64), shape=4)
    annotated = qd.field(qd.math.mat2, shape=4)
    assert iv.dtype == qd.i32 and uv.dtype == qd.u32 and fv.dtype == qd.f64
    assert iv.shape == (4,) and iv.element_shape == (3,) and iv.to_numpy().shape == (4, 3)

    @qd.kernel
    def fill():
        for i in iv:
            iv[i] = qd.math.ivec3(i, i * 2, 7) // 2
            uv[i] = qd.math.uvec2(i, 3)
            fv[i] = qd.types.vector(2, qd.f64)(0.1, i) * 3
            m: qd.math.mat2 = qd.Matrix([[i, 1], [2, 3]])  # an annotated local converts to the type
            m[0, 1] = m[0, 1] / 4
            annotated[i] = m

    fill()
    i = np.arange(4)
    np.testing.assert_array_equal(iv.to_numpy(), np.stack([i // 2, i, np.full(4, 3)], 1))
    np.testing.assert_array_equal(uv.to_numpy(), np.stack([i, np.full(4, 3)], 1))
    np.testing.assert_allclose(fv.to_numpy(), np.stack([np.full(4, 0.3), 3.0 * i], 1), rtol=1e-15)
    want = np.zeros((4, 2, 2))
    want[:, 0, 0], want[:, 0, 1], want[:, 1] = i, 0.25, [2, 3]
    np.testing.assert_array_equal(annotated.to_numpy(), want)


def test_indexing_swizzles_and_element_assignment(arch, rng):
    n = 16
    a = qd.Vector.field(4, qd.f32, shape=n)
    out = qd.Vector.field(4, qd.f32, shape=n)
    sw = qd.Vector.field(3, qd.f32, shape=n)
    k = qd.field(qd.i32, shape=n)

    @qd.kernel
    def run():
        for i in a:
            v = a[i]
            w = v.wzyx
            w.x = v[1] * 2.0
            w[3] += 1.0
            w.yz = v.xy
            w[k[i]] = -5.0               # a run-time index into a vector local
            out[i] = w
            sw[i] = qd.Vector([v.x + v[k[i]], v.zw.sum(), v.xyz.norm_sqr()])

    av = vecs(rng, n, 4)
    ks = rng.integers(0, 4, n).astype(np.int32)
    a.from_numpy(av)
    k.from_numpy(ks)
    run()
    w = av[:, ::-1].copy()
    w[:, 0] = av[:, 1] * 2
    w[:, 3] += 1
    w[:, 1:3] = av[:, 0:2]
    w[np.arange(n), ks] = -5
    np.testing.assert_allclose(out.to_numpy(), w, rtol=1e-6)
    want = np.stack([av[:, 0] + av[np.arange(n), ks], av[:, 2] + av[:, 3], (av[:, :3] ** 2).sum(1)], 1)
    np.testing.assert_allclose(sw.to_numpy(), want, rtol=1e-5)


def test_methods_and_qd_math(arch, rng):
    n = 25
    a = qd.Vector.field(3, qd.f32, shape=n)
    b = qd.Vector.field(3, qd.f32, shape=n)
    vec_out = qd.Vector.field(3, qd.f32, shape=(9, n))
    sc = qd.field(qd.f32, shape=(9, n))
    more = qd.Vector.field(3, qd.f32, shape=(3, n))

    @qd.kernel
    def run():
        for i in a:
            u, v = a[i], b[i]
            vec_out[0, i] = u.cross(v)
            vec_out[1, i] = u.normalized()
            vec_out[2, i] = qd.math.normalize(v)
            vec_out[3, i] = qd.math.clamp(u, -0.5, 0.5)
            vec_out[4, i] = qd.math.mix(u, v, 0.25)
            vec_out[5, i] = qd.math.sign(u)
            vec_out[6, i] = qd.math.fract(u * 3.0)
            vec_out[7, i] = qd.math.step(0.1, u) + qd.math.smoothstep(-1.0, 1.0, v)
            vec_out[8, i] = qd.sin(u) + qd.exp(v) * qd.abs(u) + qd.max(u, v) - qd.min(u, 0.0)
            sc[0, i] = u.dot(v)
            sc[1, i] = qd.math.dot(u, v)
            sc[2, i] = u.norm()
            sc[3, i] = qd.math.length(v)
            sc[4, i] = u.norm_sqr()
            sc[5, i] = u.sum() + v.max() * 10.0 + v.min() * 100.0
            sc[6, i] = qd.math.cross(u.xy, v.xy)
            sc[7, i] = len(u) + u.n
            sc[8, i] = qd.math.distance(u, v)
            more[0, i] = qd.math.reflect(u, qd.math.normalize(v))
            more[1, i] = qd.math.radians(u * 90.0) + qd.math.degrees(v) * 0.001
            more[2, i] = qd.math.sqrt(qd.math.vec3(2.0)) + qd.math.cos(u)

    av, bv = vecs(rng, n), vecs(rng, n)
    a.from_numpy(av)
    b.from_numpy(bv)
    run()
    got, s = vec_out.to_numpy(), sc.to_numpy()
    norm = np.linalg.norm
    t = np.clip((bv + 1) / 2, 0, 1)
    want = [np.cross(av, bv), av / norm(av, axis=1, keepdims=True), bv / norm(bv, axis=1, keepdims=True),
            np.clip(av, -0.5, 0.5), av * 0.75 + bv * 0.25, np.sign(av), (av * 3) - np.floor(av * 3),
            (av >= 0.1) + t * t * (3 - 2 * t), np.sin(av) + np.exp(bv) * np.abs(av) + np.maximum(av, bv)
            - np.minimum(av, 0)]
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=3e-6, err_msg=f"vector row {k}")
    dot = (av * bv).sum(1)
    want_s = [dot, dot, norm(av, axis=1), norm(bv, axis=1), (av ** 2).sum(1),
              av.sum(1) + bv.max(1) * 10 + bv.min(1) * 100, av[:, 0] * bv[:, 1] - av[:, 1] * bv[:, 0],
              np.full(n, 6.0), norm(av - bv, axis=1)]
    for k, w in enumerate(want_s):
        np.testing.assert_allclose(s[k], w, rtol=1e-5, atol=3e-6, err_msg=f"scalar row {k}")
    unit = bv / norm(bv, axis=1, keepdims=True)
    want_m = [av - 2 * (av * unit).sum(1, keepdims=True) * unit, np.radians(av * 90) + np.degrees(bv) * 0.001,
              np.sqrt(2.0) + np.cos(av)]
    for k, w in enumerate(want_m):
        np.testing.assert_allclose(more.to_numpy()[k], w, rtol=1e-5, atol=3e-6, err_msg=f"qd.math row {k}")


@qd.func
def reflect(v, n):
    return v - 2.0 * v.dot(n) * n


@qd.func
def split_sign(v):
    if v.sum() > 0:
        return v, 1.0
    return -v, -1.0


def test_funcs_unpacking_and_static_loops(arch, rng):
    n = 20
    a = qd.Vector.field(3, qd.f32, shape=n)
    out = qd.Vector.field(3, qd.f32, shape=(3, n))
    sign = qd.field(qd.f32, shape=n)

    @qd.kernel
    def run():
        for i in a:
            v = a[i]
            nrm = qd.Vector([0.0, 1.0, 0.0])
            out[0, i] = reflect(v, nrm)
            w, s = split_sign(v)
            sign[i] = s
            out[1, i] = w
            x, y, z = v
            acc = qd.Vector([0.0, 0.0, 0.0])
            for k in qd.static(range(3)):
                acc[k] = v[2 - k] * (k + 1)
            out[2, i] = acc + qd.Vector([x, y, z]) * 0.0

    av = vecs(rng, n)
    a.from_numpy(av)
    run()
    r = av.copy()
    r[:, 1] *= -1
    np.testing.assert_allclose(out.to_numpy()[0], r, rtol=1e-6)
    s = np.where(av.sum(1) > 0, 1.0, -1.0)
    np.testing.assert_allclose(sign.to_numpy(), s)
    np.testing.assert_allclose(out.to_numpy()[1], av * s[:, None], rtol=1e-6)
    np.testing.assert_allclose(out.to_numpy()[2], av[:, ::-1] * [1, 2, 3], rtol=1e-6)


def test_comparisons_are_elementwise(arch, rng):
    n = 12
    a = qd.Vector.field(3, qd.f32, shape=n)
    out = qd.Vector.field(3, qd.i32, shape=n)
    anyall = qd.field(qd.i32, shape=(2, n))
    picked = qd.Vector.field(3, qd.f32, shape=n)

    @qd.kernel
    def run():
        for i in a:
            v = a[i]
            picked[i] = v * 2.0 if v.x > 0 else -1.0  # a conditional expression of vectors
            c = v > 0.0
            out[i] = c + (v <= -0.5) * 10
            anyall[0, i] = c.any()
            anyall[1, i] = c.all()

    av = vecs(rng, n)
    a.from_numpy(av)
    run()
    c = av > 0
    np.testing.assert_array_equal(out.to_numpy(), c + (av <= -0.5) * 10)
    np.testing.assert_array_equal(anyall.to_numpy(), np.stack([c.any(1), c.all(1)]))
    np.testing.assert_allclose(picked.to_numpy(), np.where(av[:, :1] > 0, av * 2, -1.0))


def test_loop_carried_vector_in_a_dynamic_loop(arch, rng):
    n = 10
    p = qd.Vector.field(2, qd.f32, shape=n)
    steps = qd.field(qd.i32, shape=())

    @qd.kernel
    def run():
        for i in p:
            v = p[i]
            for _ in range(steps[None]):
                v = qd.Vector([v.y, -v.x]) * 0.9 + 0.01
            p[i] = v

    pv = vecs(rng, n, 2)
    p.from_numpy(pv)
    steps[None] = 7
    run()
    want = pv.astype(np.float64)
    for _ in range(7):
        want = np.stack([want[:, 1], -want[:, 0]], 1) * 0.9 + 0.01
    np.testing.assert_allclose(p.to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_field_indexed_by_a_vector(arch, rng):
    grid = qd.field(qd.f32, shape=(6, 6))
    pos = qd.Vector.field(2, qd.i32, shape=9)

    @qd.kernel
    def scatter():
        for i in pos:
            for k in qd.static(range(2)):
                grid[pos[i] + qd.Vector([k, 0])] += 1.0

    pv = rng.integers(0, 5, (9, 2)).astype(np.int32)
    pos.from_numpy(pv)
    scatter()
    want = np.zeros((6, 6))
    for x, y in pv:
        want[x, y] += 1
        want[x + 1, y] += 1
    np.testing.assert_array_equal(grid.to_numpy(), want)


@pytest.mark.parametrize("source, message", [
    ("out[i] = qd.Vector([1.0, 2.0, 3.0]) + qd.Vector([1.0, 2.0])", "different shapes: (3,) and (2,)"),
    ("out[i] = a[i].xyzw", "out of range for a vector of 3"),
    ("out[i] = a[i][3] + qd.Vector([0.0, 0.0, 0.0])", "index 3 is out of range"),
    ("out[i] = a[i].dot(qd.Vector([1.0, 2.0]))", "dot() of vectors of different shapes"),
    ("out[i] = qd.math.vec3(1.0, 2.0)", "needs 3 component(s)"),
    ("out[i] = a[i].foo", "has no attribute 'foo'"),
    ("out[i] = qd.Matrix([[1.0, 2.0], [3.0, 4.0]])", "cannot assign a matrix of shape 2x2 to a vector of shape (3,)"),
    ("out[i] = 1.0 if a[i] else 2.0", "cannot be used where a scalar is needed"),
])
def test_vector_errors_are_located(source, message, tmp_path):
    e, path = compile_error_of(tmp_path, "bad_vectors", f'''
        import qdc as qd
        a = qd.Vector.field(3, qd.f32, shape=4)
        out = qd.Vector.field(3, qd.f32, shape=4)

        @qd.kernel
        def bad():
            for i in a:
                {source}
    ''')
    assert message in str(e), str(e)
    assert e.filename == str(path) and e.line == 9, str(e)
