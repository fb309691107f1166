"""The f64 functions of compiler/targets/fdlibm.py (fdlibm's algorithms) emitted as SPIR-V:
GLSL.std.450 computes sin, cos, tan, asin, acos, atan, atan2, tanh, exp, log and pow for 16- and
32-bit floats only. Every float operation is decorated NoContraction, fast_math or not: the
algorithms' error-free transformations depend on it.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .spec import GLSL, Decoration, Op


class SpirvOps:
    """The operations of Float64Math as SPIR-V instructions of `lowering` (a TaskLowering):
    values are ids of f64, i32, i64 or bool."""

    def __init__(self, lowering):
        self.low = lowering
        self.fb, self.m = lowering.fb, lowering.m
        self.f64, self.i32, self.i64 = (lowering.ty(t) for t in (T.f64, T.i32, T.i64))
        self.bool = self.m.bool()

    def _float(self, opcode, *operands):
        result = self.fb.emit(opcode, self.f64, *operands)
        self.m.decorate(result, Decoration.NoContraction)
        return result

    def _glsl(self, number, *operands):
        return self.fb.ext(self.f64, number, *operands)

    def _bool(self, opcode, *operands):
        return self.fb.emit(opcode, self.bool, *operands)

    def c(self, v):
        return self.m.const(self.f64, v)

    def ci(self, v):
        return self.m.const(self.i32, v)

    def cl(self, v):
        return self.m.const(self.i64, v)

    def add(self, a, b):
        return self._float(Op.FAdd, a, b)

    def sub(self, a, b):
        return self._float(Op.FSub, a, b)

    def mul(self, a, b):
        return self._float(Op.FMul, a, b)

    def div(self, a, b):
        return self._float(Op.FDiv, a, b)

    def neg(self, a):
        return self._float(Op.FNegate, a)

    def fabs(self, a):
        return self._glsl(GLSL.FAbs, a)

    def floor(self, a):
        return self._glsl(GLSL.Floor, a)

    def trunc(self, a):
        return self._glsl(GLSL.Trunc, a)

    def rint(self, a):
        return self._glsl(GLSL.RoundEven, a)

    def sqrt(self, a):
        return self._glsl(GLSL.Sqrt, a)

    def fsel(self, cond, a, b):
        return self.fb.emit(Op.Select, self.f64, cond, a, b)

    def isel(self, cond, a, b):
        return self.fb.emit(Op.Select, self.i32, cond, a, b)

    def branch(self, cond, then, otherwise):
        """An if/else: `then()` or `otherwise()` (each emits code and returns f64 values) runs,
        and the values of the side that ran come back through Function variables."""
        variables: list = []

        def run(side):
            values = side()
            if not variables:
                variables.extend(self.fb.local_variable(self.f64) for _ in values)
            for variable, value in zip(variables, values):
                self.fb.emit_void(Op.Store, variable, value)

        self.low.if_then(cond, lambda: run(then), lambda: run(otherwise))
        return tuple(self.fb.emit(Op.Load, self.f64, variable) for variable in variables)

    def lt(self, a, b):
        return self._bool(Op.FOrdLessThan, a, b)

    def le(self, a, b):
        return self._bool(Op.FOrdLessThanEqual, a, b)

    def gt(self, a, b):
        return self._bool(Op.FOrdGreaterThan, a, b)

    def ge(self, a, b):
        return self._bool(Op.FOrdGreaterThanEqual, a, b)

    def eq(self, a, b):
        return self._bool(Op.FOrdEqual, a, b)

    def ne(self, a, b):
        return self._bool(Op.FUnordNotEqual, a, b)

    def isnan(self, a):
        return self._bool(Op.IsNan, a)

    def and_(self, a, b):
        return self._bool(Op.LogicalAnd, a, b)

    def or_(self, a, b):
        return self._bool(Op.LogicalOr, a, b)

    def not_(self, a):
        return self._bool(Op.LogicalNot, a)

    def same(self, a, b):
        return self._bool(Op.LogicalEqual, a, b)

    def iadd(self, a, b):
        return self.fb.emit(Op.IAdd, self.i32, a, b)

    def isub(self, a, b):
        return self.fb.emit(Op.ISub, self.i32, a, b)

    def iand(self, a, b):
        return self.fb.emit(Op.BitwiseAnd, self.i32, a, b)

    def ior(self, a, b):
        return self.fb.emit(Op.BitwiseOr, self.i32, a, b)

    def ishl(self, a, n: int):
        return self.fb.emit(Op.ShiftLeftLogical, self.i32, a, self.ci(n))

    def ishr(self, a, n: int):
        return self.fb.emit(Op.ShiftRightArithmetic, self.i32, a, self.ci(n))

    def iushr(self, a, n: int):
        return self.fb.emit(Op.ShiftRightLogical, self.i32, a, self.ci(n))

    def ilt(self, a, b):
        return self._bool(Op.SLessThan, a, b)

    def ieq(self, a, b):
        return self._bool(Op.IEqual, a, b)

    def to_i32(self, a):
        return self.fb.emit(Op.ConvertFToS, self.i32, a)

    def i32_to_f(self, a):
        return self.fb.emit(Op.ConvertSToF, self.f64, a)

    def bits(self, a):
        return self.fb.emit(Op.Bitcast, self.i64, a)

    def from_bits(self, a):
        return self.fb.emit(Op.Bitcast, self.f64, a)

    def land(self, a, b):
        return self.fb.emit(Op.BitwiseAnd, self.i64, a, b)

    def lor(self, a, b):
        return self.fb.emit(Op.BitwiseOr, self.i64, a, b)

    def lshl(self, a, n: int):
        return self.fb.emit(Op.ShiftLeftLogical, self.i64, a, self.cl(n))

    def lshr(self, a, n: int):
        return self.fb.emit(Op.ShiftRightLogical, self.i64, a, self.cl(n))

    def l_from_i32(self, a):
        return self.fb.emit(Op.SConvert, self.i64, a)

    def l_to_i32(self, a):
        return self.fb.emit(Op.SConvert, self.i32, a)
