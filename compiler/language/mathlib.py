"""`qd.math`: vector/matrix types and GLSL-style functions, as in Quadrants.

In Python scope the functions compute with numpy; inside kernels the front end recognises
them by identity (compiler/frontend/vectors.py) and lowers them to scalar operations.
"""
from __future__ import annotations

import math as _math

import numpy as np

from qdc.runtime.contract import types as T

from .lang import acos, asin, atan, atan2, ceil, cos, exp, floor, log, pow, round, rsqrt, sin, sqrt, tan, tanh  # noqa: F401,A004
from .bitops import clz, ffs, isinf, isnan, popcnt  # noqa: F401  (qd.math.isnan, ...)
from .matrix import MatrixType

pi = _math.pi
e = _math.e
inf = _math.inf
nan = _math.nan

vec2, vec3, vec4 = (MatrixType((n,), None, "fp", f"vec{n}") for n in (2, 3, 4))
ivec2, ivec3, ivec4 = (MatrixType((n,), None, "ip", f"ivec{n}") for n in (2, 3, 4))
uvec2, uvec3, uvec4 = (MatrixType((n,), T.u32, "ip", f"uvec{n}") for n in (2, 3, 4))
mat2, mat3, mat4 = (MatrixType((n, n), None, "fp", f"mat{n}") for n in (2, 3, 4))


def dot(x, y):
    """Dot product of two vectors."""
    return np.dot(np.asarray(x), np.asarray(y))


def cross(x, y):
    """Cross product (a scalar for 2-vectors)."""
    return np.cross(np.asarray(x), np.asarray(y))


def length(x):
    """Euclidean length of a vector."""
    return np.sqrt(np.dot(np.asarray(x), np.asarray(x)))


def normalize(v):
    """`v / length(v)`."""
    return np.asarray(v) / length(v)


def clamp(x, xmin, xmax):
    """`min(max(x, xmin), xmax)`, element-wise."""
    return np.minimum(np.maximum(x, xmin), xmax)


def mix(x, y, a):
    """`x * (1 - a) + y * a`, element-wise."""
    return np.asarray(x) * (1 - np.asarray(a)) + np.asarray(y) * a


def sign(x):
    """1 for positive, -1 for negative, 0 for zero, element-wise."""
    return np.sign(x)


def fract(x):
    """`x - floor(x)`, element-wise."""
    return np.asarray(x) - np.floor(x)


def step(edge, x):
    """1.0 where `x >= edge`, else 0.0, element-wise."""
    return (np.asarray(x) >= edge).astype(np.float64)


def distance(x, y):
    """Euclidean distance between two points."""
    return length(np.asarray(x) - np.asarray(y))


def reflect(x, n):
    """`x` reflected about the plane of unit normal `n`: `x - 2 dot(x, n) n`."""
    return np.asarray(x) - 2 * dot(x, n) * np.asarray(n)


def radians(x):
    """Degrees to radians, element-wise."""
    return np.asarray(x) * (pi / 180)


def degrees(x):
    """Radians to degrees, element-wise."""
    return np.asarray(x) * (180 / pi)


def determinant(m):
    """Determinant of a square matrix (up to 4x4 in kernels)."""
    return np.linalg.det(m)


def inverse(mat):
    """Inverse of a square matrix (up to 4x4 in kernels)."""
    return np.linalg.inv(mat)


def smoothstep(edge0, edge1, x):
    """Hermite interpolation between 0 at `edge0` and 1 at `edge1`, element-wise."""
    t = clamp((np.asarray(x) - edge0) / (edge1 - edge0), 0.0, 1.0)
    return t * t * (3 - 2 * t)
