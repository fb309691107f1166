"""Kernel-scope `qd.math.isnan`, `isinf`, `popcnt`, `clz`, `ffs` (compiler/language/bitops.py),
element-wise on vectors, built from comparisons, masks, shifts and multiplications every target
has. The bit counts work on the unsigned type of the argument's width:

- popcnt: the SWAR sum (pairs, nibbles, bytes, then a multiply adds the bytes into the top one);
- clz: the bits below the highest set one are smeared down (x | x >> 1 | x >> 2 ...), whose
  popcnt is the number of significant bits;
- ffs: x & -x isolates the lowest set bit, and popcnt(that - 1) + 1 is its position.
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T

from ..language import bitops
from .values import is_runtime

_M1 = 0x5555555555555555
_M2 = 0x3333333333333333
_M4 = 0x0F0F0F0F0F0F0F0F
_H01 = 0x0101010101010101


def _elementwise_call(python_fn, lowered):
    def handler(fe, node, name):
        def one(x):
            if not is_runtime(x):
                try:
                    return python_fn(x.item() if hasattr(x, "item") else x)
                except TypeError as e:
                    fe.error(f"{name}(): {e}", node.args[0])
            return lowered(fe, x, node, name)
        return fe.elementwise(one, fe.call_args(node, 1, 1, name), node.args)
    return handler


def _isnan(fe, x, node, name):
    if not x.type.is_float:
        return fe.values.const(False, T.u1)  # an integer is never NaN
    return fe.values.binary("ne", x, x)


def _isinf(fe, x, node, name):
    if not x.type.is_float:
        return fe.values.const(False, T.u1)
    return fe.values.binary("eq", fe.values.unary("abs", x), fe.values.const(math.inf, x.type))


def _unsigned(fe, x, node, name):
    """`x` as the unsigned integer of its width; a located error for a float."""
    t = x.type
    if t.is_float:
        fe.error(f"{name}() needs an integer, got {t}", node.args[0])
    if t is T.u1:
        t, x = T.i32, fe.values.cast(x, T.i32)
    unsigned = t if t.kind == "uint" else T.by_name("u" + t.name[1:])
    return fe.values.cast(x, unsigned)


def _popcount(fe, u):
    """The set bits of unsigned `u`, an i32."""
    t, v = u.type, fe.values
    width = t.bits
    mask = (1 << width) - 1

    def c(k):
        return v.const(k & mask, t)

    def shr(a, n):
        return v.shift("shr", a, n)
    u = v.binary("sub", u, v.binary("bit_and", shr(u, 1), c(_M1)))
    u = v.binary("add", v.binary("bit_and", u, c(_M2)), v.binary("bit_and", shr(u, 2), c(_M2)))
    u = v.binary("bit_and", v.binary("add", u, shr(u, 4)), c(_M4))
    if width >= 16:
        u = shr(v.binary("mul", u, c(_H01)), width - 8)
    return v.cast(u, T.i32)


def _popcnt(fe, x, node, name):
    return _popcount(fe, _unsigned(fe, x, node, name))


def _clz(fe, x, node, name):
    u = _unsigned(fe, x, node, name)
    shift = 1
    while shift < u.type.bits:
        u = fe.values.binary("bit_or", u, fe.values.shift("shr", u, shift))
        shift *= 2
    return fe.values.binary("sub", fe.values.const(u.type.bits, T.i32), _popcount(fe, u))


def _ffs(fe, x, node, name):
    u = _unsigned(fe, x, node, name)
    v, t = fe.values, u.type
    lowest = v.binary("bit_and", u, v.binary("add", v.unary("bit_not", u), v.const(1, t)))
    position = v.binary("add", _popcount(fe, v.binary("sub", lowest, v.const(1, t))), v.const(1, T.i32))
    return v.select(v.binary("eq", u, v.const(0, t)), v.const(0, T.i32), position)


BIT_CALLS = {"isnan": _elementwise_call(bitops.isnan, _isnan), "isinf": _elementwise_call(bitops.isinf, _isinf),
             "popcnt": _elementwise_call(bitops.popcnt, _popcnt), "clz": _elementwise_call(bitops.clz, _clz),
             "ffs": _elementwise_call(bitops.ffs, _ffs)}
