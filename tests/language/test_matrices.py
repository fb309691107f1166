"""Matrices in kernels: literals, `@` in every combination, transpose, trace, determinant and
inverse up to 4x4, outer products, matrix locals and elements, checked against numpy on fresh
random inputs; shape errors are located compile errors."""
import numpy as np
import pytest

import qdc as qd

from module_util import compile_error_of


def well_conditioned(rng, count, n):
    """Random n x n matrices kept away from singular (a random matrix plus n on the diagonal)."""
    return (rng.random((count, n, n)) - 0.5 + np.eye(n) * n).astype(np.float32)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_determinant_and_inverse(arch, rng, n):
    count = 9
    m = qd.Matrix.field(n, n, qd.f32, shape=count)
    inv = qd.Matrix.field(n, n, qd.f32, shape=count)
    det = qd.field(qd.f32, shape=count)
    tr = qd.field(qd.f32, shape=count)

    @qd.kernel
    def run():
        for i in m:
            a = m[i]
            inv[i] = a.inverse() * 0.5 + qd.math.inverse(a) * 0.5
            det[i] = a.determinant() * 0.5 + qd.math.determinant(a) * 0.5
            tr[i] = a.trace()

    mv = well_conditioned(rng, count, n)
    m.from_numpy(mv)
    run()
    np.testing.assert_allclose(det.to_numpy(), np.linalg.det(mv.astype(np.float64)), rtol=2e-5)
    np.testing.assert_allclose(inv.to_numpy(), np.linalg.inv(mv.astype(np.float64)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tr.to_numpy(), np.trace(mv, axis1=1, axis2=2), rtol=1e-6)


def test_matmul_in_every_combination(arch, rng):
    count = 11
    a = qd.Matrix.field(2, 3, qd.f32, shape=count)
    b = qd.Matrix.field(3, 2, qd.f32, shape=count)
    v3 = qd.Vector.field(3, qd.f32, shape=count)
    v2 = qd.Vector.field(2, qd.f32, shape=count)
    mm = qd.Matrix.field(2, 2, qd.f32, shape=count)
    mv = qd.Vector.field(2, qd.f32, shape=count)
    vm = qd.Vector.field(3, qd.f32, shape=count)
    outer = qd.Matrix.field(2, 3, qd.f32, shape=count)
    at = qd.Matrix.field(3, 2, qd.f32, shape=count)
    vv = qd.field(qd.f32, shape=count)

    @qd.kernel
    def run():
        for i in a:
            A, B = a[i], b[i]
            mm[i] = A @ B
            mv[i] = A @ v3[i]
            vm[i] = v2[i] @ A
            vv[i] = v3[i] @ v3[i]
            outer[i] = v2[i].outer_product(v3[i])
            at[i] = A.transpose() * 2.0 + B

    av = (rng.random((count, 2, 3)) - 0.5).astype(np.float32)
    bv = (rng.random((count, 3, 2)) - 0.5).astype(np.float32)
    x3 = (rng.random((count, 3)) - 0.5).astype(np.float32)
    x2 = (rng.random((count, 2)) - 0.5).astype(np.float32)
    a.from_numpy(av); b.from_numpy(bv); v3.from_numpy(x3); v2.from_numpy(x2)
    run()
    tol = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mm.to_numpy(), av @ bv, **tol)
    np.testing.assert_allclose(mv.to_numpy(), np.einsum("kij,kj->ki", av, x3), **tol)
    np.testing.assert_allclose(vm.to_numpy(), np.einsum("ki,kij->kj", x2, av), **tol)
    np.testing.assert_allclose(vv.to_numpy(), (x3 * x3).sum(1), **tol)
    np.testing.assert_allclose(outer.to_numpy(), x2[:, :, None] * x3[:, None, :], **tol)
    np.testing.assert_allclose(at.to_numpy(), av.transpose(0, 2, 1) * 2 + bv, **tol)


def test_matrix_literals_locals_and_elements(arch, rng):
    count = 8
    m = qd.Matrix.field(2, 2, qd.f32, shape=count)
    out = qd.Matrix.field(2, 2, qd.f32, shape=(4, count))
    sums = qd.field(qd.f32, shape=count)

    @qd.kernel
    def run(s: qd.f32):
        for i in m:
            a = m[i]
            r = qd.Matrix([[1.0, s], [0.0, 1.0]])
            r[1, 0] = a[0, 1]
            r[0, 0] += a[1, 1] * 2.0
            out[0, i] = r @ a
            out[1, i] = qd.Matrix.identity(qd.f32, 2) * s + qd.math.mat2(1.0)
            row0, row1 = a
            out[2, i] = qd.Matrix([row1, row0])
            acc = 0.0
            for p in qd.static(range(2)):
                for q in qd.static(range(2)):
                    acc += a[p, q] * (p * 2 + q)
            sums[i] = acc
            out[3, i] = qd.Matrix.diag(2, s) - a.T

    mv = (rng.random((count, 2, 2)) - 0.5).astype(np.float32)
    m.from_numpy(mv)
    s = np.float32(rng.random())
    run(float(s))
    got = out.to_numpy()
    r = np.broadcast_to(np.array([[1, s], [0, 1]], np.float32), mv.shape).copy()
    r[:, 1, 0] = mv[:, 0, 1]
    r[:, 0, 0] += mv[:, 1, 1] * 2
    np.testing.assert_allclose(got[0], r @ mv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], np.broadcast_to(np.eye(2) * s + 1, mv.shape), rtol=1e-6)
    np.testing.assert_allclose(got[2], mv[:, ::-1, :], rtol=1e-6)
    np.testing.assert_allclose(sums.to_numpy(), (mv * np.array([[0, 1], [2, 3]])).sum((1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[3], np.eye(2) * s - mv.transpose(0, 2, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body, message", [
    ("out[i] = (m[i] @ qd.Vector([1.0, 2.0])).sum()", "'@' needs the inner dimensions to agree: 3x3 @ (2,)"),
    ("out[i] = big[i].inverse().sum()", "inverse is supported up to 4x4, got 5x5"),
    ("out[i] = big[i].determinant()", "determinant is supported up to 4x4"),
    ("out[i] = qd.Matrix([[1.0, 2.0]]).inverse().sum()", "inverse needs a square matrix"),
    ("out[i] = (m[i] @ 2.0).sum()", "both operands of '@' must be vectors or matrices"),
    ("out[i] = m[i][k].sum()", "a matrix row can only be selected with a compile-time index"),
    ("out[i] = (m[i] + qd.Matrix([[1.0, 2.0], [3.0, 4.0]])).sum()", "different shapes: 3x3 and 2x2"),
    ("m[i][k] = 1.0", "a matrix row can only be selected with a compile-time index"),
])
def test_matrix_errors_are_located(tmp_path, body, message):
    e, path = compile_error_of(tmp_path, "bad_matrices", f'''
        import qdc as qd
        m = qd.Matrix.field(3, 3, qd.f32, shape=4)
        big = qd.Matrix.field(5, 5, qd.f32, shape=4)
        out = qd.field(qd.f32, shape=4)

        @qd.kernel
        def bad(k: qd.i32):
            for i in m:
                {body}
    ''', 1)
    assert message in str(e), str(e)
    assert e.filename == str(path) and e.line == 10, str(e)


def test_matrix_constructors_take_quadrants_keywords(arch):
    """`dt=` and `n=` by keyword, as Quadrants names them (Genesis: `qd.Matrix.identity(dt=qd.f32, n=3)`)."""
    out = qd.Matrix.field(3, 3, qd.f32, shape=4)

    @qd.kernel
    def k():
        out[0] = qd.Matrix.identity(dt=qd.f32, n=3)
        out[1] = qd.Matrix.zero(dt=qd.f32, n=3, m=3) + qd.Matrix.one(dt=qd.f32, n=3, m=3) * 2.0
        out[2][0, 0] = qd.Vector.unit(3, 1, dt=qd.f32)[1] + qd.Vector.zero(dt=qd.f32, n=3)[0]
        out[3][0, 0] = qd.Vector.one(dt=qd.f32, n=3).sum()

    k()
    got = out.to_numpy()
    np.testing.assert_array_equal(got[0], np.eye(3))
    np.testing.assert_array_equal(got[1], np.full((3, 3), 2.0))
    assert got[2][0, 0] == 1.0 and got[3][0, 0] == 3.0
    np.testing.assert_array_equal(qd.Matrix.identity(dt=qd.f64, n=2).to_numpy(), np.eye(2))
