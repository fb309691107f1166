"""`qd.svd(A, dt=None)`: the singular value decomposition A = U S V^T of a 2x2 or 3x3 matrix,
as Quadrants returns it: U and V rotations (determinant +1), S the diagonal matrix of the
singular values in descending order, the last one negative when det(A) < 0.

Inside kernels it is a func in the kernel language (inlined, element-wise arithmetic, so every
backend and autodiff take it): one-sided Jacobi on the columns of A, a fixed number of sweeps
(10: each sweep squares the off-diagonal error), each pair of columns turned
until orthogonal (Demmel and Veselic's rotation). The column norms are the singular values,
the normalised columns U, the accumulated rotations V; the columns are then sorted, and the
columns of a rank-deficient U completed to a rotation. In Python scope: numpy's SVD brought to
the same convention.
"""
from __future__ import annotations

import numpy as np

from qdc.runtime.contract import types as T

from .funcs import Func
from .lang import cast, sqrt, static, static_assert  # noqa: F401  (names the kernel code below resolves)
from .matrix import Matrix

_TINY = 1e-30
_SWEEPS = 10  # enough for f64; an f32 matrix converges in fewer and the rest change nothing


class _PythonScopeFunc(Func):
    """A func inlined in kernels that also runs in Python scope (with `python`)."""

    def __init__(self, fn, python):
        super().__init__(fn)
        self.python = python

    def __call__(self, *args, **kwargs):
        return self.python(*args, **kwargs)


def _svd_kernel(A, dt=None):
    n = static(len(A))
    static_assert(n == 2 or n == 3, "qd.svd() takes a 2x2 or 3x3 matrix")
    U = cast(A, dt) if static(dt is not None) else A * 1.0  # a float matrix of A's type (or dt)
    zero = U[0, 0] * 0.0  # typed constants: every local below keeps U's precision
    V = U * 0.0
    for j in static(range(n)):
        V[j, j] = zero + 1.0
    for _sweep in static(range(_SWEEPS)):
        for p, q in static(((0, 1),) if n == 2 else ((0, 1), (0, 2), (1, 2))):
            alpha = U[:, p].norm_sqr()
            beta = U[:, q].norm_sqr()
            gamma = U[:, p].dot(U[:, q])
            c = zero + 1.0
            s = zero
            if gamma != 0.0:
                zeta = (beta - alpha) / (2.0 * gamma)
                t = (1.0 if zeta >= 0.0 else -1.0) / (abs(zeta) + sqrt(1.0 + zeta * zeta))
                c = 1.0 / sqrt(1.0 + t * t)
                s = c * t
            up = U[:, p]
            uq = U[:, q]
            U[:, p] = c * up - s * uq
            U[:, q] = s * up + c * uq
            vp = V[:, p]
            vq = V[:, q]
            V[:, p] = c * vp - s * vq
            V[:, q] = s * vp + c * vq
    sig = U[0, :] * 0.0
    for j in static(range(n)):
        sig[j] = U[:, j].norm()
    for i, j in static(((0, 1),) if n == 2 else ((0, 1), (0, 2), (1, 2))):  # descending
        if sig[i] < sig[j]:
            si = sig[i]
            sig[i] = sig[j]
            sig[j] = si
            ui = U[:, i]
            U[:, i] = U[:, j]
            U[:, j] = ui
            vi = V[:, i]
            V[:, i] = V[:, j]
            V[:, j] = vi
    for j in static(range(n)):
        if sig[j] > _TINY:
            U[:, j] = U[:, j] / sig[j]
    if sig[0] <= _TINY:  # A = 0: any rotation
        U = V * 1.0
    if static(n == 2):
        if sig[1] <= _TINY:
            U[0, 1] = -U[1, 0]
            U[1, 1] = U[0, 0]
    else:
        if sig[1] <= _TINY:  # rank 1: a unit vector across the first column
            a = U[:, 0]
            w1 = a.cross(Matrix([[1.0], [0.0], [0.0]])[:, 0])
            w2 = a.cross(Matrix([[0.0], [1.0], [0.0]])[:, 0])
            U[:, 1] = (w1 if w1.norm_sqr() > w2.norm_sqr() else w2).normalized()
        if sig[2] <= _TINY:
            U[:, 2] = U[:, 0].cross(U[:, 1])
    if V.determinant() < 0.0:  # a rotation: flip the last columns of both (A unchanged)
        V[:, n - 1] = -V[:, n - 1]
        U[:, n - 1] = -U[:, n - 1]
    if U.determinant() < 0.0:  # det(A) < 0: the last singular value takes the sign
        U[:, n - 1] = -U[:, n - 1]
        sig[n - 1] = -sig[n - 1]
    S = U * 0.0
    for j in static(range(n)):
        S[j, j] = sig[j]
    return U, S, V


def _svd_python(A, dt=None):
    a = np.asarray(A.to_numpy() if hasattr(A, "to_numpy") else A, dtype=np.float64)
    if a.shape not in ((2, 2), (3, 3)):
        raise ValueError(f"qd.svd() takes a 2x2 or 3x3 matrix, got shape {a.shape}")
    u, s, vh = np.linalg.svd(a)
    v = vh.T.copy()
    n = a.shape[0]
    if np.linalg.det(v) < 0:
        v[:, n - 1] *= -1
        u[:, n - 1] *= -1
    if np.linalg.det(u) < 0:
        u[:, n - 1] *= -1
        s[n - 1] *= -1
    dtype = (dt or T.f32).np_dtype
    return Matrix(u.astype(dtype)), Matrix(np.diag(s).astype(dtype)), Matrix(v.astype(dtype))


svd = _PythonScopeFunc(_svd_kernel, _svd_python)
svd.__name__ = "svd"
