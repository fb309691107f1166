"""Quadrants' floating-point tests and bit counts: `qd.math.isnan`, `isinf`, `popcnt`, `clz`,
`ffs`, element-wise on vectors.

Inside kernels the front end lowers them to arithmetic every target has (frontend/bit_calls.py):
`isnan(x)` is `x != x`, `isinf(x)` is `|x| == inf` (both, as in Quadrants, assumed away by
`fast_math`, which lets the backend take every value finite), and the bit counts work on the
argument's unsigned bit pattern of its own width, returning an i32: `popcnt` the set bits,
`clz` the leading zeros (`clz(0)` is the width), `ffs` the 1-based position of the lowest set
bit (`ffs(0) == 0`, CUDA's `__ffs`). In Python scope they compute with numpy; a Python int is
taken as an i32 when it fits one, else an i64 (the type a literal takes in a kernel).
"""
from __future__ import annotations

import numpy as np


def isnan(x):
    """Whether `x` is NaN, element-wise."""
    return np.isnan(x)


def isinf(x):
    """Whether `x` is +inf or -inf, element-wise."""
    return np.isinf(x)


def _bits(x) -> tuple[int, int]:
    """(unsigned bit pattern, width) of an integer scalar."""
    if isinstance(x, np.integer):
        width = x.dtype.itemsize * 8
        return int(x) & ((1 << width) - 1), width
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    width = 32 if -(1 << 31) <= x < (1 << 31) else 64
    return x & ((1 << width) - 1), width


def _elementwise(fn, x):
    if isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "to_numpy"):
        arr = x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)
        return np.vectorize(lambda v: fn(arr.dtype.type(v)), otypes=[np.int32])(arr)
    return fn(x)


def popcnt(x):
    """The number of set bits of integer `x` (its unsigned pattern), element-wise; an i32."""
    return _elementwise(lambda v: np.int32(bin(_bits(v)[0]).count("1")), x)


def clz(x):
    """The leading zero bits of integer `x` at its width (`clz(0)` is the width), element-wise."""
    def count(v):
        bits, width = _bits(v)
        return np.int32(width - bits.bit_length())
    return _elementwise(count, x)


def ffs(x):
    """The 1-based position of the lowest set bit of integer `x` (0 for 0), element-wise."""
    def find(v):
        bits, _ = _bits(v)
        return np.int32((bits & -bits).bit_length())
    return _elementwise(find, x)


FUNCTIONS = (isnan, isinf, popcnt, clz, ffs)
# What the front end emits for each (compiler/frontend/bit_calls.py)
INTRINSICS = {f: (f.__name__, None) for f in FUNCTIONS}
