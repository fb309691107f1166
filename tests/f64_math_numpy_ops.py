"""The operations compiler/targets/fdlibm.py builds its f64 functions from, on numpy
arrays: the same algorithm evaluated with the same IEEE double rounding (numpy never fuses a*b+c),
so that it can be checked against mpmath on many arguments without a device."""
from __future__ import annotations

import numpy as np

from qdc.compiler.targets.fdlibm import Float64Math


class NumpyOps:
    def c(self, v):
        return np.float64(v)

    def ci(self, v):
        return np.int32(v)

    def cl(self, v):
        return np.int64(v)

    add = staticmethod(np.add)
    sub = staticmethod(np.subtract)
    mul = staticmethod(np.multiply)
    div = staticmethod(np.divide)
    neg = staticmethod(np.negative)
    fabs = staticmethod(np.abs)
    floor = staticmethod(np.floor)
    trunc = staticmethod(np.trunc)
    rint = staticmethod(np.rint)  # half to even, as GLSL's RoundEven
    sqrt = staticmethod(np.sqrt)
    lt = staticmethod(np.less)
    le = staticmethod(np.less_equal)
    gt = staticmethod(np.greater)
    ge = staticmethod(np.greater_equal)

    @staticmethod
    def eq(a, b):
        assert np.asarray(a).dtype.kind == "f", "booleans compare with same()"
        return np.equal(a, b)

    ne = staticmethod(np.not_equal)
    isnan = staticmethod(np.isnan)
    and_ = staticmethod(np.logical_and)
    or_ = staticmethod(np.logical_or)
    not_ = staticmethod(np.logical_not)

    @staticmethod
    def same(a, b):
        assert np.asarray(a).dtype == bool and np.asarray(b).dtype == bool
        return np.equal(a, b)

    @staticmethod
    def fsel(cond, a, b):
        assert type(a) is not float and type(b) is not float, "a constant needs ops.c()"
        return np.where(cond, a, b).astype(np.float64)

    @staticmethod
    def branch(cond, then, otherwise):
        """Both sides, each value taken from the side `cond` picks."""
        return tuple(np.where(cond, t, e).astype(np.float64) for t, e in zip(then(), otherwise()))

    @staticmethod
    def isel(cond, a, b):
        return np.where(cond, a, b).astype(np.int32)

    @staticmethod
    def iadd(a, b):
        return (np.asarray(a, np.int32) + np.asarray(b, np.int32)).astype(np.int32)

    @staticmethod
    def isub(a, b):
        return (np.asarray(a, np.int32) - np.asarray(b, np.int32)).astype(np.int32)

    @staticmethod
    def iand(a, b):
        return np.bitwise_and(a, b).astype(np.int32)

    @staticmethod
    def ior(a, b):
        return np.bitwise_or(a, b).astype(np.int32)

    @staticmethod
    def ishl(a, n):
        return (np.asarray(a, np.int32).astype(np.uint32) << np.uint32(n)).astype(np.uint32).view(np.int32)

    @staticmethod
    def ishr(a, n):
        return (np.asarray(a, np.int32) >> np.int32(n)).astype(np.int32)

    @staticmethod
    def iushr(a, n):
        return (np.asarray(a, np.int32).view(np.uint32) >> np.uint32(n)).astype(np.int32)

    ilt = staticmethod(np.less)
    ieq = staticmethod(np.equal)

    @staticmethod
    def to_i32(a):
        return np.asarray(a, np.float64).astype(np.int32)

    @staticmethod
    def i32_to_f(a):
        return np.asarray(a, np.int32).astype(np.float64)

    @staticmethod
    def bits(a):
        return np.asarray(a, np.float64).view(np.int64)

    @staticmethod
    def from_bits(a):
        return np.asarray(a, np.int64).view(np.float64)

    @staticmethod
    def land(a, b):
        return np.bitwise_and(np.asarray(a, np.int64), np.int64(b))

    @staticmethod
    def lor(a, b):
        return np.bitwise_or(np.asarray(a, np.int64), np.asarray(b, np.int64))

    @staticmethod
    def lshl(a, n):
        return (np.asarray(a, np.int64).view(np.uint64) << np.uint64(n)).view(np.int64)

    @staticmethod
    def lshr(a, n):
        return (np.asarray(a, np.int64).view(np.uint64) >> np.uint64(n)).view(np.int64)

    @staticmethod
    def l_from_i32(a):
        return np.asarray(a, np.int32).astype(np.int64)

    @staticmethod
    def l_to_i32(a):
        return np.asarray(a, np.int64).astype(np.int32)


def evaluate(name: str, *args: np.ndarray) -> np.ndarray:
    """math64's `name` on float64 arrays."""
    arrays = [np.ascontiguousarray(a, np.float64).reshape(-1) for a in args]
    arrays = np.broadcast_arrays(*arrays)
    with np.errstate(all="ignore"):
        return np.asarray(Float64Math(NumpyOps())(name, *[np.array(a) for a in arrays]), np.float64)
