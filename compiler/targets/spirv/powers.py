"""`x ** n` for a float `x` and an integer `n` in SPIR-V, by repeated squaring, as close to
the correctly rounded x^n as the CPU's pow (GLSL's Pow goes through exp2(n * log2(x)) and
loses ~1e-6 of relative accuracy on f32).

- f32 (and f16, computed in f32) on a target with Float64: squaring in f64, whose relative
  error (<= 2 * 64 * 2^-53) is far below half an f32 ulp, then one rounding to f32.
- f64, and f32 on a target without Float64: squaring in "double-word" arithmetic (a value is
  an unevaluated sum hi + lo; products are exact through Dekker's splitting, so no FMA is
  needed), about 2^-100 relative per step, then hi. Where a product or its error term leaves
  the finite range the step falls back to the plain product; results in the subnormal range
  (and, for a negative n, values whose x^|n| overflows) may be off by an ulp there.
- n < 0: 1 / x^|n| (inf for x == 0, with the sign of x^|n|); n == 0: 1, even for NaN.

The squaring order is the same for a compile-time constant exponent (unrolled) and a run-time
one (a loop over its bits), so the two give identical results.
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T

from .spec import GLSL, Decoration, Op

# Dekker's splitter 2^ceil(p/2) + 1 for a p-bit significand
_SPLITTER = {T.f32: float(2 ** 12 + 1), T.f64: float(2 ** 27 + 1)}


class IntegerPower:
    """Emits x ** n into `lowering` (a TaskLowering): `constant(t, x, k)` for a Python int k,
    `runtime(t, x, n, n_type)` for an integer id n of type n_type; x is an id of float type t."""

    def __init__(self, lowering):
        self.low, self.fb, self.m = lowering, lowering.fb, lowering.m

    # ---- entry points ------------------------------------------------------------------------
    def constant(self, t: T.DataType, x: int, k: int) -> int:
        return self._power(t, x, lambda w: self._unrolled(w, abs(k)), k < 0)

    def runtime(self, t: T.DataType, x: int, n: int, n_type: T.DataType) -> int:
        low = self.low
        wide = T.u64 if n_type.bits == 64 else T.u32
        if n_type is T.u1:
            magnitude = low.convert(n, T.u1, T.u32)
        elif n_type.kind == "int":
            signed = T.i64 if wide is T.u64 else T.i32
            # |INT_MIN| as unsigned is right: SAbs leaves INT_MIN, whose bits are 2^(bits-1)
            magnitude = low.op(Op.Bitcast, wide, low.glsl(signed, GLSL.SAbs, low.convert(n, n_type, signed)))
        else:
            magnitude = low.convert(n, n_type, wide)
        negative = low.boolean(Op.SLessThan, n, low.c(n_type, 0)) if n_type.kind == "int" else False
        return self._power(t, x, lambda w: self._looped(w, magnitude, wide), negative)

    # ---- shape ---------------------------------------------------------------------------------
    def _power(self, t: T.DataType, x: int, square_and_multiply, negative) -> int:
        """x^|n| in the working precision, inverted where `negative` (a bool id, or a Python bool)."""
        low = self.low
        if t is T.f16:
            return low.op(Op.FConvert, T.f16, self._power(T.f32, low.op(Op.FConvert, T.f32, x),
                                                          square_and_multiply, negative))
        plain = t is T.f32 and low.caps.float64
        w = T.f64 if plain else t
        value = (low.op(Op.FConvert, w, x) if plain else x, None if plain else low.c(w, 0.0))
        hi, *lo = square_and_multiply(_Words(self, w, plain, value))
        if negative is not False:
            inverse = self._div(w, hi, lo[0] if lo else None)
            hi = inverse if negative is True else low.select(w, negative, inverse, hi)
        return low.op(Op.FConvert, t, hi) if plain else hi

    def _unrolled(self, words: "_Words", k: int) -> tuple:
        result, base = words.one(), words.start
        while k:
            if k & 1:
                result = words.mul(result, base)
            k >>= 1
            if k:
                base = words.mul(base, base)
        return result

    def _looped(self, words: "_Words", magnitude: int, ut: T.DataType) -> tuple:
        low, fb = self.low, self.fb
        w = low.ty(words.t)
        result = [fb.local_variable(w) for _ in range(words.size)]
        base = [fb.local_variable(w) for _ in range(words.size)]
        left = fb.local_variable(low.ty(ut))
        for var, value in zip(result + base, words.one() + words.start):
            fb.emit_void(Op.Store, var, value)
        fb.emit_void(Op.Store, left, magnitude)

        def load(variables):
            return tuple(fb.emit(Op.Load, w, v) for v in variables)

        def more(_):
            return low.boolean(Op.INotEqual, fb.emit(Op.Load, low.ty(ut), left), low.c(ut, 0))

        def step():
            e = fb.emit(Op.Load, low.ty(ut), left)
            odd = low.boolean(Op.INotEqual, low.op(Op.BitwiseAnd, ut, e, low.c(ut, 1)), low.c(ut, 0))
            r, b = load(result), load(base)
            product = words.mul(r, b)
            for var, new, old in zip(result, product, r):
                fb.emit_void(Op.Store, var, low.select(words.t, odd, new, old))
            for var, new in zip(base, words.mul(b, b)):
                fb.emit_void(Op.Store, var, new)
            fb.emit_void(Op.Store, left, low.op(Op.ShiftRightLogical, ut, e, low.c(ut, 1)))

        low.structured_loop(more, step)
        return load(result)

    # ---- arithmetic ------------------------------------------------------------------------------
    def exact(self, opcode: int, t: T.DataType, *operands) -> int:
        """A float operation never contracted into an FMA, fast_math or not: the error-free
        transformations below depend on each operation rounding once."""
        result = self.fb.emit(opcode, self.low.ty(t), *operands)
        self.m.decorate(result, Decoration.NoContraction)
        return result

    def finite(self, t: T.DataType, v: int) -> int:
        """|v| < inf: false for infinities and NaN."""
        low = self.low
        return low.boolean(Op.FOrdLessThan, low.glsl(t, GLSL.FAbs, v), low.c(t, math.inf))

    def two_product(self, t: T.DataType, a: int, b: int) -> tuple:
        """(a*b rounded, its rounding error exactly) by Dekker's splitting."""
        mul, sub, add = (lambda x, y, op=op: self.exact(op, t, x, y) for op in (Op.FMul, Op.FSub, Op.FAdd))
        p = mul(a, b)
        a_hi, a_lo = self.split(t, a)
        b_hi, b_lo = self.split(t, b)
        err = add(add(add(sub(mul(a_hi, b_hi), p), mul(a_hi, b_lo)), mul(a_lo, b_hi)), mul(a_lo, b_lo))
        return p, err

    def split(self, t: T.DataType, a: int) -> tuple:
        c = self.exact(Op.FMul, t, self.low.c(t, _SPLITTER[t]), a)
        hi = self.exact(Op.FSub, t, c, self.exact(Op.FSub, t, c, a))
        return hi, self.exact(Op.FSub, t, a, hi)

    def _div(self, w: T.DataType, hi: int, lo: int | None) -> int:
        """1 / (hi + lo), rounded: one Newton step on 1/hi with the residual computed exactly
        (lo None: plain arithmetic, 1/hi)."""
        low = self.low
        one = low.c(w, 1.0)
        q = self.exact(Op.FDiv, w, one, hi)
        if lo is None:
            return q
        p, err = self.two_product(w, hi, q)
        residual = self.exact(Op.FSub, w, self.exact(Op.FSub, w, self.exact(Op.FSub, w, one, p), err),
                              self.exact(Op.FMul, w, lo, q))
        refined = self.exact(Op.FAdd, w, q, self.exact(Op.FMul, w, q, residual))
        # hi == 0, inf or beyond the splitter's range: the residual is not finite, 1/hi stands
        return low.select(w, self.finite(w, residual), refined, q)


class _Words:
    """A value as (hi,) in plain arithmetic or (hi, lo) in double-word arithmetic."""

    def __init__(self, power: IntegerPower, t: T.DataType, plain: bool, value: tuple):
        self.power, self.t, self.plain = power, t, plain
        self.size = 1 if plain else 2
        self.start = value[:self.size]

    def one(self) -> tuple:
        low = self.power.low
        return (low.c(self.t, 1.0),) if self.plain else (low.c(self.t, 1.0), low.c(self.t, 0.0))

    def mul(self, a: tuple, b: tuple) -> tuple:
        power, t, low = self.power, self.t, self.power.low
        if self.plain:
            return (power.exact(Op.FMul, t, a[0], b[0]),)
        p, err = power.two_product(t, a[0], b[0])
        e = power.exact(Op.FAdd, t, err, power.exact(Op.FAdd, t, power.exact(Op.FMul, t, a[0], b[1]),
                                                       power.exact(Op.FMul, t, a[1], b[0])))
        s = power.exact(Op.FAdd, t, p, e)
        lo = power.exact(Op.FSub, t, e, power.exact(Op.FSub, t, s, p))
        # A zero error keeps p itself (the sign of a zero product); a non-finite one (the
        # product or the splitting overflowed, or NaN) falls back to the plain product.
        use = low.boolean(Op.LogicalAnd, power.finite(t, e), low.boolean(Op.FUnordNotEqual, e, low.c(t, 0.0)))
        use_lo = low.boolean(Op.LogicalAnd, use, power.finite(t, lo))
        return low.select(t, use, s, p), low.select(t, use_lo, lo, low.c(t, 0.0))
