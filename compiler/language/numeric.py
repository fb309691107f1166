"""Random numbers, gradient stops, C-style integer arithmetic and type predicates:
`qd.random`, `qd.stop_grad`, `qd.raw_div`, `qd.raw_mod`, `qd.bit_shr` and
`qd.types.is_signed / is_integral / is_real / is_tensor`, as in Quadrants.

Inside kernels the front end recognises the functions by identity (`INTRINSICS`, merged into
lang.INTRINSICS) and emits IR; the type predicates are evaluated at compile time there. The
Python-scope versions below compute the same things on Python and numpy numbers.
"""
from __future__ import annotations

import math

import numpy as np

from qdc.runtime.contract import types as T

from . import matrix as _matrix

_python_rng = np.random.default_rng()


def random(dtype=float):
    """A uniform draw: in [0, 1) for a float type, over every value for an integer type.
    In kernels it is counter-based (reproducible for a `qd.init(random_seed=...)`, the same on
    every backend); in Python scope it comes from numpy's generator."""
    t = _scalar_type(dtype)
    if t is T.u1:
        raise TypeError("qd.random() needs a float or integer type, got u1")
    if t.is_float:
        return float(t.np_dtype.type(_python_rng.random()) % 1.0)
    info = np.iinfo(t.np_dtype)
    return int(_python_rng.integers(info.min, info.max, endpoint=True, dtype=t.np_dtype))


def stop_grad(x):
    """`x`, through which no gradient flows (in kernels: neither reverse nor forward mode)."""
    return x


def raw_div(x1, x2):
    """x1 / x2 as C divides: integers truncate toward zero; with a float operand, true division."""
    if _is_integer(x1) and _is_integer(x2):
        quotient = abs(int(x1)) // abs(int(x2)) if x2 else 0
        return -quotient if (x1 < 0) != (x2 < 0) else quotient
    return x1 / x2


def raw_mod(x1, x2):
    """The remainder of `raw_div`: it takes the sign of `x1` (C's %, and fmod for floats)."""
    if _is_integer(x1) and _is_integer(x2):
        return int(x1) - int(x2) * raw_div(x1, x2) if x2 else 0
    return math.fmod(x1, x2)


def bit_shr(x1, x2):
    """Logical right shift of x1 by x2 bits: zeros come in from the left, also for signed integers
    (whose bits are shifted as their unsigned type's). A Python int counts as an i32."""
    x = x1
    t = T.from_numpy(x.dtype) if isinstance(x, np.generic) else T.i32
    shifted = (int(x) & ((1 << t.bits) - 1)) >> (int(x2) & (t.bits - 1))  # the amount masked as kernels do
    if t.kind == "int" and shifted >> (t.bits - 1):
        shifted -= 1 << t.bits
    return t.np_dtype.type(shifted) if isinstance(x, np.generic) else shifted


# ---- type predicates (qd.types.*), as Quadrants names them ------------------------------

def is_signed(dtype) -> bool:
    """Whether an integer type is signed (i8 ... i64); a non-integer type is an error, as in Quadrants."""
    t = _scalar_type(dtype)
    if t.is_float:
        raise TypeError(f"is_signed() needs an integer type, got {t}")
    return t.kind == "int"


def is_integral(dtype) -> bool:
    """Whether a type is an integer type (u1 included); False for vectors and matrices."""
    return not isinstance(dtype, _matrix.MatrixType) and _scalar_type(dtype).is_integral


def is_real(dtype) -> bool:
    """Whether a type is a float type (f16, f32, f64); False for vectors and matrices."""
    return not isinstance(dtype, _matrix.MatrixType) and _scalar_type(dtype).is_float


def is_tensor(dtype) -> bool:
    """Whether a type is a vector or matrix type."""
    return isinstance(dtype, _matrix.MatrixType)


def _scalar_type(dtype) -> T.DataType:
    if isinstance(dtype, T.DataType):
        return dtype
    if isinstance(dtype, _matrix.MatrixType):
        return dtype.element_dtype(_matrix.DEFAULT_IP, _matrix.DEFAULT_FP)
    if dtype is int:
        return _matrix.DEFAULT_IP
    if dtype is float:
        return _matrix.DEFAULT_FP
    t = T.from_numpy(dtype) if isinstance(dtype, (type, np.dtype)) else None
    if t is None:
        raise TypeError(f"expected a qd type, got {dtype!r}")
    return t


def _is_integer(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


TYPE_PREDICATES = (is_signed, is_integral, is_real, is_tensor)

# What the front end emits for each (compiler/frontend/calls.py, call_intrinsic)
INTRINSICS = {random: ("random", None), stop_grad: ("stop_grad", None), raw_div: ("raw_div", None),
              raw_mod: ("raw_mod", None), bit_shr: ("bit_shr", None),
              **{p: ("compile_time", None) for p in TYPE_PREDICATES}}
