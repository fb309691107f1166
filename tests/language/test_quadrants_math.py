"""Quadrants' math names: `qd.math.isnan isinf popcnt clz ffs` (element-wise, on the unsigned
pattern of 32- and 64-bit integers), `qd.outer`, `qd.svd` (2x2 and 3x3: U and V rotations, S
diagonal and descending, the last singular value negative when det(A) < 0, rank-deficient
matrices included, and its gradient against float64 central differences) and
`qd.static_assert`. Checked against numpy and Python's integers."""
import numpy as np
import pytest

import qdc as qd


def _popcnt(v, width):
    return bin(int(v) & ((1 << width) - 1)).count("1")


def _clz(v, width):
    return width - (int(v) & ((1 << width) - 1)).bit_length()


def _ffs(v, width):
    bits = int(v) & ((1 << width) - 1)
    return (bits & -bits).bit_length()


def test_bit_counts_and_float_tests(arch, rng):
    @qd.kernel
    def k(x: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.types.ndarray(dtype=qd.i32, ndim=1),
          b: qd.types.ndarray(dtype=qd.u64, ndim=1), out: qd.types.ndarray(dtype=qd.i32, ndim=2)):
        for i in x:
            out[i, 0] = qd.math.isnan(x[i])
            out[i, 1] = qd.math.isinf(x[i])
            out[i, 2] = qd.math.popcnt(a[i])
            out[i, 3] = qd.math.clz(a[i])
            out[i, 4] = qd.math.ffs(a[i])
            out[i, 5] = qd.math.popcnt(b[i])
            out[i, 6] = qd.math.clz(b[i])
            out[i, 7] = qd.math.ffs(b[i])
            v = qd.math.popcnt(qd.Vector([a[i], a[i] >> 1]))
            out[i, 8] = v[0] - v[1]

    n = 16
    x = rng.standard_normal(n).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -np.nan]
    a = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
    a[:3] = [0, -1, -2**31]
    b = rng.integers(0, 2**64, n, dtype=np.uint64)
    b[:3] = [0, 2**64 - 1, 1 << 63]
    out = np.zeros((n, 9), np.int32)
    k(x, a, b, out)
    for i in range(n):
        want = [np.isnan(x[i]), np.isinf(x[i]), _popcnt(a[i], 32), _clz(a[i], 32), _ffs(a[i], 32),
                _popcnt(b[i], 64), _clz(b[i], 64), _ffs(b[i], 64), _popcnt(a[i], 32) - _popcnt(a[i] >> 1, 32)]
        assert list(out[i]) == [int(w) for w in want], (i, a[i], b[i])
    assert qd.math.popcnt(np.int32(-1)) == 32 and qd.math.clz(np.uint64(1)) == 63 and qd.math.ffs(12) == 3


def test_outer_and_static_assert(arch, rng):
    out = qd.Matrix.field(3, 2, qd.f32, shape=())
    N = 3

    @qd.kernel
    def k(a: qd.types.vector(3, qd.f32), b: qd.types.vector(2, qd.f32)):
        qd.static_assert(N == 3, "three rows")
        out[None] = qd.outer(a, b)

    a, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    k(a, b)
    np.testing.assert_allclose(out[None].to_numpy(), np.outer(a, b), rtol=1e-6)

    @qd.kernel
    def bad():
        qd.static_assert(N == 4, "the cone needs four rows")

    with pytest.raises(qd.QdcCompileError, match="static assertion failed: the cone needs four rows"):
        bad()


def _check_svd(A, U, S, V, tol):
    np.testing.assert_allclose(U @ S @ V.T, A, atol=tol * max(1.0, np.abs(A).max()))
    for R in (U, V):
        np.testing.assert_allclose(R.T @ R, np.eye(len(A)), atol=tol)
        assert abs(np.linalg.det(R) - 1) < tol
    sig = np.diag(S)
    np.testing.assert_allclose(S, np.diag(sig), atol=0)
    assert all(abs(sig[i]) >= abs(sig[i + 1]) - tol for i in range(len(sig) - 1))
    np.testing.assert_allclose(np.abs(sig), np.linalg.svd(A, compute_uv=False), atol=tol * max(1.0, np.abs(A).max()))
    assert np.sign(np.prod(sig)) == np.sign(np.linalg.det(A)) or abs(np.linalg.det(A)) < tol


@pytest.mark.parametrize("n", [2, 3])
def test_svd(arch, rng, n):
    m = 12
    A = rng.standard_normal((m, n, n)).astype(np.float32)
    A[1] = np.outer(rng.standard_normal(n), rng.standard_normal(n))  # rank 1
    A[2] = np.diag(np.arange(1, n + 1)[::-1])
    A[3] *= 0
    u, s, v = (qd.Matrix.ndarray(n, n, qd.f32, m) for _ in range(3))

    @qd.kernel
    def k(a: qd.types.ndarray(ndim=1), u: qd.types.ndarray(ndim=1), s: qd.types.ndarray(ndim=1),
          v: qd.types.ndarray(ndim=1)):
        for i in a:
            U, S, V = qd.svd(a[i])
            u[i], s[i], v[i] = U, S, V

    qa = qd.Matrix.ndarray(n, n, qd.f32, m)
    qa.from_numpy(A)
    k(qa, u, s, v)
    for i in range(m):
        _check_svd(A[i].astype(np.float64), u.to_numpy()[i].astype(np.float64), s.to_numpy()[i].astype(np.float64),
                   v.to_numpy()[i].astype(np.float64), 2e-5)
    U, S, V = qd.svd(qd.Matrix(A[0]))  # Python scope: the same convention
    _check_svd(A[0].astype(np.float64), U.to_numpy(), S.to_numpy(), V.to_numpy(), 1e-5)


def test_svd_gradient(rng):
    qd.init(arch=qd.cpu, default_fp=qd.f64)
    a = qd.Matrix.field(3, 3, qd.f64, shape=(), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def top_two():
        U, S, V = qd.svd(a[None])
        loss[None] += S[0, 0] + 0.5 * S[1, 1]

    A = rng.standard_normal((3, 3))
    a.from_numpy(A)
    with qd.ad.Tape(loss=loss):
        top_two()

    def f(M):
        s = np.linalg.svd(M, compute_uv=False)
        return s[0] + 0.5 * s[1]

    h = 1e-6
    want = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            e = np.zeros((3, 3))
            e[i, j] = h
            want[i, j] = (f(A + e) - f(A - e)) / (2 * h)
    np.testing.assert_allclose(a.grad.to_numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [qd.i32, qd.f32])
def test_atomic_exchange(arch, dtype):
    x = qd.field(dtype, shape=2)
    v = qd.Vector.field(2, dtype, shape=())

    @qd.kernel
    def k(olds: qd.types.ndarray(dtype=dtype, ndim=1), n: qd.i32):
        for i in range(n):
            olds[i] = qd.atomic_exchange(x[0], i + 1)
        local = 5
        old = qd.atomic_exchange(local, 7)
        x[1] = old * 10 + local
        pair = qd.atomic_exchange(v[None], qd.Vector([3, 4]))
        v[None] += pair

    x[0] = -1
    v[None] = [1, 2]
    n = 1000
    olds = np.zeros(n, dtype.np_dtype)
    k(olds, n)
    # every value went in exactly once and came out exactly once: the old values and the last one
    assert sorted([*olds.tolist(), x[0]]) == [-1, *range(1, n + 1)]
    assert x[1] == 57 and list(v[None].to_numpy()) == [4, 6]


def test_atomic_exchange_refuses_a_gradient():
    x = qd.field(qd.f32, shape=2, needs_grad=True)

    @qd.kernel
    def k():
        for i in range(2):
            qd.atomic_exchange(x[0], x[1] * 2)

    with pytest.raises(qd.QdcCompileError, match="qd.atomic_exchange on 'x' cannot be differentiated"):
        k.grad()
