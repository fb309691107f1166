"""Scalar values in SPIR-V: constants, arithmetic, comparisons, conversions and math, with the
same semantics as the LLVM lowering (compiler/targets/llvm/llvm_arith.py): Python's floor
division and modulo, division by zero giving 0 for integers, shifts masked to the width,
saturating float -> int conversion, round half to even, numpy's pow for negative bases. f64
transcendental functions, which GLSL.std.450 lacks, are qdc's own (math64.py).

A mixin of the task lowering (lowering.py), which provides `fb` (the FunctionBuilder), `m` (the
module), `ty(DataType)` and `v(stmt)`.
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T

from ... import ir
from .. import base
from ..fdlibm import Float64Math
from .math64 import SpirvOps
from .powers import IntegerPower
from .spec import GLSL, GLSL_NO_FLOAT64, Decoration, Op

_UNARY_GLSL = {"sin": GLSL.Sin, "cos": GLSL.Cos, "tan": GLSL.Tan, "asin": GLSL.Asin, "acos": GLSL.Acos,
               "atan": GLSL.Atan, "tanh": GLSL.Tanh, "exp": GLSL.Exp, "log": GLSL.Log, "sqrt": GLSL.Sqrt,
               "rsqrt": GLSL.InverseSqrt, "floor": GLSL.Floor, "ceil": GLSL.Ceil, "round": GLSL.RoundEven,
               "abs": GLSL.FAbs}
_FLOAT_ARITH = {"add": Op.FAdd, "sub": Op.FSub, "mul": Op.FMul, "truediv": Op.FDiv}
_CONTRACTIBLE = frozenset((Op.FAdd, Op.FSub, Op.FMul, Op.FDiv, Op.FNegate))
_INT_ARITH = {"add": Op.IAdd, "sub": Op.ISub, "mul": Op.IMul, "bit_and": Op.BitwiseAnd,
              "bit_or": Op.BitwiseOr, "bit_xor": Op.BitwiseXor}
_FLOAT_CMP = {"lt": Op.FOrdLessThan, "le": Op.FOrdLessThanEqual, "gt": Op.FOrdGreaterThan,
              "ge": Op.FOrdGreaterThanEqual, "eq": Op.FOrdEqual, "ne": Op.FUnordNotEqual}
_SIGNED_CMP = {"lt": Op.SLessThan, "le": Op.SLessThanEqual, "gt": Op.SGreaterThan, "ge": Op.SGreaterThanEqual,
               "eq": Op.IEqual, "ne": Op.INotEqual}
_UNSIGNED_CMP = {"lt": Op.ULessThan, "le": Op.ULessThanEqual, "gt": Op.UGreaterThan,
                 "ge": Op.UGreaterThanEqual, "eq": Op.IEqual, "ne": Op.INotEqual}


class ValueLowering:
    # ---- helpers --------------------------------------------------------------------------------
    def c(self, t: T.DataType, value) -> int:
        return self.m.const(self.ty(t), value)

    def op(self, opcode: int, t: T.DataType, *operands) -> int:
        result = self.fb.emit(opcode, self.ty(t), *operands)
        if opcode in _CONTRACTIBLE and not self.fast_math:
            # Drivers fuse a*b+c into an FMA unless told not to (NVIDIA does): results would
            # differ from the CPU's in the last bit, and `x*y - x*y` would not be 0.
            self.m.decorate(result, Decoration.NoContraction)
        return result

    def boolean(self, opcode: int, *operands) -> int:
        return self.fb.emit(opcode, self.m.bool(), *operands)

    def select(self, t: T.DataType, cond: int, a: int, b: int) -> int:
        return self.fb.emit(Op.Select, self.ty(t), cond, a, b)

    def glsl(self, t: T.DataType, number: int, *args) -> int:
        return self.fb.ext(self.ty(t), number, *args)

    # ---- statements -----------------------------------------------------------------------------
    def s_Const(self, s):
        return self.c(s.type, s.value)

    def s_Select(self, s):
        return self.select(s.type, self.v(s.cond), self.v(s.a), self.v(s.b))

    def s_Cast(self, s):
        return self.convert(self.v(s.x), s.x.type, s.type)

    def s_Unary(self, s):
        x, t, op = self.v(s.x), s.type, s.op
        if op == "neg":
            return self.op(Op.FNegate if t.is_float else Op.SNegate, t, x)
        if op in ("not", "bit_not") and t is T.u1:
            return self.boolean(Op.LogicalNot, x)
        if op == "bit_not":
            return self.op(Op.Not, t, x)
        if op == "abs" and not t.is_float:
            return x if t.kind != "int" else self.glsl(t, GLSL.SAbs, x)
        if not t.is_float:
            raise base.Unsupported(f"no SPIR-V lowering of '{op}' on {t.name}")
        return self.float_math(op, t, x)

    def float_math(self, op: str, t: T.DataType, *args) -> int:
        """A GLSL.std.450 function of float `args`; f16 is computed in f32 (as on the CPU)."""
        number = GLSL.Pow if op == "pow" else GLSL.Atan2 if op == "atan2" else _UNARY_GLSL[op]
        if t is T.f16:
            wide = [self.op(Op.FConvert, T.f32, a) for a in args]
            return self.op(Op.FConvert, T.f16, self.float_math(op, T.f32, *wide))
        if t.bits == 64 and number in GLSL_NO_FLOAT64:
            if not self.caps.int64:
                raise base.Unsupported(f"'{op}' of f64 on target '{self.arch}' needs Int64, which it does not "
                                       f"have (the f64 math reads the bits of its operands): cast to f32")
            return Float64Math(SpirvOps(self))(op, *args)
        if op == "pow":
            return self.float_pow(t, *args)
        return self.glsl(t, number, *args)

    def float_pow(self, t, x, y) -> int:
        """C's pow (numpy's): GLSL's Pow is undefined for x < 0 and for x == 0 with y <= 0."""
        zero, one = self.c(t, 0.0), self.c(t, 1.0)
        r = self.glsl(t, GLSL.Pow, self.glsl(t, GLSL.FAbs, x), y)
        y_int = self.boolean(Op.FOrdEqual, self.glsl(t, GLSL.Floor, y), y)
        half = self.op(Op.FMul, t, y, self.c(t, 0.5))
        y_odd = self.boolean(Op.LogicalAnd, y_int,
                             self.boolean(Op.FUnordNotEqual, self.glsl(t, GLSL.Floor, half), half))
        negative = self.boolean(Op.FOrdLessThan, x, zero)
        r = self.select(t, self.boolean(Op.LogicalAnd, negative, y_odd), self.op(Op.FNegate, t, r), r)
        r = self.select(t, self.boolean(Op.LogicalAnd, negative, self.boolean(Op.LogicalNot, y_int)),
                        self.c(t, math.nan), r)
        at_zero = self.select(t, self.boolean(Op.FOrdGreaterThan, y, zero), zero,
                              self.select(t, self.boolean(Op.FOrdLessThan, y, zero), self.c(t, math.inf), one))
        r = self.select(t, self.boolean(Op.FOrdEqual, x, zero), at_zero, r)
        return self.select(t, self.boolean(Op.FOrdEqual, y, zero), one, r)

    def s_Binary(self, s):
        x, y, t, op = self.v(s.a), self.v(s.b), s.a.type, s.op
        if t is T.u1:
            return self.bool_binary(op, x, y)
        if op in _FLOAT_CMP:
            table = _FLOAT_CMP if t.is_float else _SIGNED_CMP if t.kind == "int" else _UNSIGNED_CMP
            return self.boolean(table[op], x, y)
        if t.is_float:
            if op == "pow":
                power = self.integer_power(t, x, s.b)
                if power is not None:
                    return power
            return self.float_binary(op, x, y, t)
        return self.int_binary(op, x, y, t)

    def integer_power(self, t: T.DataType, x: int, exponent) -> int | None:
        """`x ** exponent` by repeated squaring (powers.py) where the exponent is an integer: a
        constant of integral value (unrolled) or an integer converted to float (a loop over its
        bits; the integer itself is used, so beyond 2^24 (f32) an odd exponent stays odd).
        None for any other exponent, which takes C's pow."""
        if isinstance(exponent, ir.Const):
            k = exponent.value
            if isinstance(k, (int, float)) and math.isfinite(k) and k == int(k) and abs(k) < 2 ** 64:
                return IntegerPower(self).constant(t, x, int(k))
            return None
        if isinstance(exponent, ir.Cast) and not exponent.x.type.is_float:
            n = exponent.x
            return IntegerPower(self).runtime(t, x, self.v(n), n.type)
        return None

    def bool_binary(self, op, x, y) -> int:
        logical = {"bit_and": Op.LogicalAnd, "min": Op.LogicalAnd, "mul": Op.LogicalAnd, "bit_or": Op.LogicalOr,
                   "max": Op.LogicalOr, "bit_xor": Op.LogicalNotEqual, "eq": Op.LogicalEqual,
                   "ne": Op.LogicalNotEqual}
        if op in logical:
            return self.boolean(logical[op], x, y)
        # anything else on booleans: computed on 0/1 as i32, as the LLVM lowering's i1 does
        wide_x, wide_y = (self.convert(v, T.u1, T.i32) for v in (x, y))
        r = self.int_binary(op, wide_x, wide_y, T.i32) if op not in _SIGNED_CMP else \
            self.boolean(_UNSIGNED_CMP[op], wide_x, wide_y)
        return r if op in _SIGNED_CMP else self.convert(r, T.i32, T.u1)

    def float_binary(self, op, x, y, t) -> int:
        if op in _FLOAT_ARITH:
            return self.op(_FLOAT_ARITH[op], t, x, y)
        if op in ("min", "max"):
            return self.glsl(t, GLSL.NMin if op == "min" else GLSL.NMax, x, y)
        if op in ("pow", "atan2"):
            return self.float_math(op, t, x, y)
        if op in ("floordiv", "mod"):
            return self.float_divmod(x, y, t)[op == "mod"]
        raise base.Unsupported(f"no SPIR-V lowering of float operator '{op}'")

    def float_divmod(self, x, y, t):
        """(x // y, x % y) as Python computes them for floats (see llvm_arith.py, float_divmod)."""
        zero, one = self.c(t, 0.0), self.c(t, 1.0)
        signed_zero_of_y = self.select(t, self.boolean(Op.FOrdLessThan, y, zero), self.c(t, -0.0), zero)
        mod = self.op(Op.FRem, t, x, y)
        div = self.op(Op.FDiv, t, self.op(Op.FSub, t, x, mod), y)
        adjust = self.boolean(Op.LogicalAnd, self.boolean(Op.FUnordNotEqual, mod, zero),
                              self.boolean(Op.LogicalNotEqual, self.boolean(Op.FOrdLessThan, y, zero),
                                           self.boolean(Op.FOrdLessThan, mod, zero)))
        mod_adj = self.select(t, adjust, self.op(Op.FAdd, t, mod, y), mod)
        div = self.select(t, adjust, self.op(Op.FSub, t, div, one), div)
        mod = self.select(t, self.boolean(Op.FOrdEqual, mod, zero), signed_zero_of_y, mod_adj)
        floor = self.glsl(t, GLSL.Floor, div)
        quot = self.select(t, self.boolean(Op.FOrdGreaterThan, self.op(Op.FSub, t, div, floor), self.c(t, 0.5)),
                           self.op(Op.FAdd, t, floor, one), floor)
        ratio = self.op(Op.FDiv, t, x, y)
        sign_of_ratio = self.select(t, self.boolean(Op.FOrdLessThan, ratio, zero), self.c(t, -0.0), zero)
        quot = self.select(t, self.boolean(Op.FOrdEqual, div, zero), sign_of_ratio, quot)
        quot = self.select(t, self.boolean(Op.FOrdEqual, y, zero), ratio, quot)
        return quot, mod

    def int_binary(self, op, x, y, t) -> int:
        signed = t.kind == "int"
        if op in _INT_ARITH:
            return self.op(_INT_ARITH[op], t, x, y)
        if op in ("shl", "shr"):
            amount = self.op(Op.BitwiseAnd, t, y, self.c(t, t.bits - 1))
            opcode = Op.ShiftLeftLogical if op == "shl" else Op.ShiftRightArithmetic if signed else \
                Op.ShiftRightLogical
            return self.op(opcode, t, x, amount)
        if op in ("min", "max"):
            number = {("min", True): GLSL.SMin, ("min", False): GLSL.UMin, ("max", True): GLSL.SMax,
                      ("max", False): GLSL.UMax}[op, signed]
            return self.glsl(t, number, x, y)
        if op in ("floordiv", "mod"):
            return self.int_divmod(op, x, y, t)
        if op == "pow":
            return self.int_pow(x, y, t)
        raise base.Unsupported(f"no SPIR-V lowering of integer operator '{op}'")

    def int_divmod(self, op, x, y, t) -> int:
        """Python's // and % on integers; division by zero gives 0, INT_MIN // -1 wraps."""
        zero, one = self.c(t, 0), self.c(t, 1)
        y_zero = self.boolean(Op.IEqual, y, zero)
        safe_y = self.select(t, y_zero, one, y)
        if t.kind == "int":
            overflow = self.boolean(Op.LogicalAnd, self.boolean(Op.IEqual, y, self.c(t, -1)),
                                    self.boolean(Op.IEqual, x, self.c(t, -(1 << (t.bits - 1)))))
            safe_y = self.select(t, overflow, one, safe_y)
            # r = x - q*y rather than OpSRem: NVIDIA's driver gave remainders of the wrong sign
            # for negative operands (floor division off by one), lavapipe did not.
            q = self.op(Op.SDiv, t, x, safe_y)
            r = self.op(Op.ISub, t, x, self.op(Op.IMul, t, q, safe_y))
            adjust = self.boolean(Op.LogicalAnd, self.boolean(Op.INotEqual, r, zero),
                                  self.boolean(Op.LogicalNotEqual, self.boolean(Op.SLessThan, r, zero),
                                               self.boolean(Op.SLessThan, safe_y, zero)))
            if op == "floordiv":
                out = self.select(t, overflow, x, self.select(t, adjust, self.op(Op.ISub, t, q, one), q))
            else:
                out = self.select(t, overflow, zero, self.select(t, adjust, self.op(Op.IAdd, t, r, safe_y), r))
        else:
            out = self.op(Op.UDiv if op == "floordiv" else Op.UMod, t, x, safe_y)
        return self.select(t, y_zero, zero, out)

    def int_pow(self, x, y, t) -> int:
        """Exponentiation by squaring; a negative exponent truncates toward zero like Python's
        int(x ** -k): only |x| == 1 survives (llvm_arith.py, ipow_fn)."""
        fb, ty = self.fb, self.ty(t)
        result, base_var, exp_var = (fb.local_variable(ty) for _ in range(3))
        for var, value in ((result, self.c(t, 1)), (base_var, x), (exp_var, y)):
            fb.emit_void(Op.Store, var, value)

        def more(_):
            e = fb.emit(Op.Load, ty, exp_var)
            return self.boolean(Op.SGreaterThan if t.kind == "int" else Op.INotEqual, e, self.c(t, 0))

        def step():
            r, b, e = (fb.emit(Op.Load, ty, var) for var in (result, base_var, exp_var))
            odd = self.boolean(Op.INotEqual, self.op(Op.BitwiseAnd, t, e, self.c(t, 1)), self.c(t, 0))
            fb.emit_void(Op.Store, result, self.select(t, odd, self.op(Op.IMul, t, r, b), r))
            fb.emit_void(Op.Store, exp_var, self.op(Op.ShiftRightLogical, t, e, self.c(t, 1)))
            fb.emit_void(Op.Store, base_var, self.op(Op.IMul, t, b, b))

        self.structured_loop(more, step)
        r = fb.emit(Op.Load, ty, result)
        if t.kind != "int":
            return r
        sign = self.select(t, self.boolean(Op.INotEqual, self.op(Op.BitwiseAnd, t, y, self.c(t, 1)), self.c(t, 0)),
                           self.c(t, -1), self.c(t, 1))
        inverse = self.select(t, self.boolean(Op.IEqual, x, self.c(t, 1)), self.c(t, 1),
                              self.select(t, self.boolean(Op.IEqual, x, self.c(t, -1)), sign, self.c(t, 0)))
        return self.select(t, self.boolean(Op.SLessThan, y, self.c(t, 0)), inverse, r)

    # ---- conversions ----------------------------------------------------------------------------
    def convert(self, v: int, src: T.DataType, dst: T.DataType) -> int:
        """C conversions, except float -> int saturates (NaN gives 0), as on the CPU."""
        if src is dst:
            return v
        if dst is T.u1:
            if src.is_float:
                return self.boolean(Op.FUnordNotEqual, v, self.c(src, 0.0))
            return self.boolean(Op.INotEqual, v, self.c(src, 0))
        if src is T.u1:
            return self.select(dst, v, self.c(dst, 1), self.c(dst, 0))
        if src.is_float and dst.is_float:
            return self.op(Op.FConvert, dst, v)
        if src.is_float:
            return self.float_to_int(v, src, dst)
        if dst.is_float:
            return self.op(Op.ConvertSToF if src.kind == "int" else Op.ConvertUToF, dst, v)
        if dst.bits != src.bits:
            same_sign = T.by_name(("i" if src.kind == "int" else "u") + str(dst.bits))
            v = self.op(Op.SConvert if src.kind == "int" else Op.UConvert, same_sign, v)
            src = same_sign
        return v if src is dst else self.op(Op.Bitcast, dst, v)

    def float_to_int(self, v: int, src: T.DataType, dst: T.DataType) -> int:
        signed = dst.kind == "int"
        low = -float(2 ** (dst.bits - 1)) if signed else 0.0
        high = float(2 ** (dst.bits - 1)) if signed else float(2 ** dst.bits)
        if src is T.f16 and high > 65504.0:  # beyond f16's range: compare in f32
            v, src = self.op(Op.FConvert, T.f32, v), T.f32
        too_low = self.boolean(Op.FOrdLessThan, v, self.c(src, low))
        too_high = self.boolean(Op.FOrdGreaterThanEqual, v, self.c(src, high))
        in_range = self.boolean(Op.LogicalNot, self.boolean(Op.LogicalOr, self.boolean(Op.IsNan, v),
                                                            self.boolean(Op.LogicalOr, too_low, too_high)))
        safe = self.select(src, in_range, v, self.c(src, 0.0))
        r = self.op(Op.ConvertFToS if signed else Op.ConvertFToU, dst, safe)
        r = self.select(dst, too_low, self.c(dst, int(low)), r)
        return self.select(dst, too_high, self.c(dst, (1 << (dst.bits - (1 if signed else 0))) - 1), r)
