"""Transcendental functions as LLVM IR the loop vectoriser can widen, for the CPU (a call to
the C math library's scalar functions keeps a loop scalar, and llvmlite gives no way to point
LLVM at a vector math library).

Each function is defined in the kernel's module on first use, `internal` and `alwaysinline`:
inlined into the loop body, it is plain arithmetic, integer bit operations and selects (every
case computed, the right one selected), which LLVM widens to `<8 x float>` and the like. The
exceptions are branches around costly or skippable work in sin, cos and tan (no reduction up
to pi/4, the long one only for huge arguments; `LlvmOps.branch`): their sides are plain
arithmetic, which the vectoriser if-converts into selects, while scalar code (a loop-carried
chain, which no vectoriser widens) takes the short side only.

- f64: fdlibm's algorithms as compiler/targets/fdlibm.py writes them against a small set
  of operations (`Float64Math`); `LlvmOps` implements those operations as LLVM IR. Within an
  ulp of the correctly rounded result, as there; sin, cos and tan give NaN from |x| >= 2^53
  (where Payne-Hanek reduction would be needed).
- f32: computed in double and rounded once. sin, cos and tan use FreeBSD's float kernels
  (__kernel_sindf, __kernel_cosdf, __kernel_tandf: double polynomials for float results)
  after a reduction by pi/2 that is exact for every float: Cody-Waite with a 25-bit part of
  pi/2 below 2^28, and above it x * 2/pi summed from 24-bit pieces of 2/pi, each product exact
  (`Float32Math._reduce_large`). exp and tanh use a short exp (a Taylor polynomial good to
  2^-37, no division); pow is that exp of y log|x| (fdlibm's log) with C's special cases;
  log, atan, atan2, asin, acos are the f64 functions on the widened arguments.

No floating-point operation here carries fast-math flags (the error-free transformations need
IEEE rounding and no contraction); a fast_math kernel gets the same functions.
"""
from __future__ import annotations

import math

from llvmlite import ir as ll

from ..fdlibm import LN2_HI, LN2_LO, Float64Math

F32, F64 = ll.FloatType(), ll.DoubleType()
I1, I32, I64 = ll.IntType(1), ll.IntType(32), ll.IntType(64)
OPS = ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "pow", "atan2")
ARITY = {"pow": 2, "atan2": 2}
TWO_52 = 2.0 ** 52
FLOAT32_OWN = ("sin", "cos", "tan", "exp", "tanh", "pow")  # the rest: the f64 functions, rounded

# FreeBSD's float kernels (k_sinf.c, k_cosf.c, k_tanf.c): |sin(x)/x - s(x)| < 2^-37.5,
# |cos(x) - c(x)| < 2^-34.1 for |x| <= pi/4; the tan polynomial is good to 2^-30.7 there.
SINF_S = tuple(float.fromhex(h) for h in ("-0x15555554cbac77.0p-55", "0x111110896efbb2.0p-59",
                                          "-0x1a00f9e2cae774.0p-65", "0x16cd878c3b46a7.0p-71"))
COSF_C = tuple(float.fromhex(h) for h in ("-0x1ffffffd0c5e81.0p-54", "0x155553e1053a42.0p-57",
                                          "-0x16c087e80f1e27.0p-62", "0x199342e0ee5069.0p-68"))
TANF_T = tuple(float.fromhex(h) for h in ("0x15554d3418c99f.0p-54", "0x1112fd38999f72.0p-55",
                                          "0x1b54c91d865afe.0p-57", "0x191df3908c33ce.0p-58",
                                          "0x185dadfcecf44e.0p-61", "0x1362b9bf971bcd.0p-59"))
# e_rem_pio2f.c: pi/2 = PIO2_25 + PIO2_25T, PIO2_25 of 25 bits: n * PIO2_25 is exact for n < 2^28.
PIO2_25, PIO2_25T = 1.57079631090164184570e+00, 1.58932547735281966916e-08
INV_PIO2 = 6.36619772367581382433e-01
F32_MEDIUM_LIMIT = 2.0 ** 28
ROUNDING_SHIFT = 1.5 * 2.0 ** 52
# 2/pi in 24-bit pieces (k_rem_pio2.c's ipio2): 2/pi = sum(piece_j * 2^(-24 (j + 1))). A float
# has 24 significant bits, so its product with a piece is exact in double; nine pieces reach
# 2^-71 below the units of x * 2/pi for every float up to the largest.
TWO_OVER_PI_24 = (0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041,
                  0xFE5163)


def function_name(op: str, bits: int) -> str:
    return f"__qdc_vm_{op}_f{bits}"


class LlvmOps:
    """Float64Math's operations as LLVM IR at `builder`: values are f64, i32, i64 or i1.

    rint, floor and trunc are exact add-and-subtract-2^52 sequences rather than LLVM's
    intrinsics, which x86 CPUs without SSE4.1 (the portable baseline level) lower to libm calls."""

    def __init__(self, builder: ll.IRBuilder):
        self.b = builder
        self.module = builder.module

    def _intrinsic(self, name: str, ret, args):
        fn = self.module.globals.get(name)
        return fn if fn is not None else ll.Function(self.module, ll.FunctionType(ret, args), name=name)

    def _call(self, intrinsic: str, *args):
        """`intrinsic` ("llvm.sqrt") of f64 arguments."""
        return self.b.call(self._intrinsic(intrinsic + ".f64", F64, [F64] * len(args)), list(args))

    def c(self, v):
        return ll.Constant(F64, float(v))

    def ci(self, v):
        return ll.Constant(I32, int(v))

    def cl(self, v):
        return ll.Constant(I64, int(v) & (2 ** 64 - 1))

    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def fabs(self, a):
        return self._call("llvm.fabs", a)

    def sqrt(self, a):
        return self._call("llvm.sqrt", a)

    def copysign(self, a, sign):
        return self._call("llvm.copysign", a, sign)

    def rint(self, a):
        """Round half to even: |a| + 2^52 - 2^52 rounds |a| < 2^52 to an integer; from 2^52 on
        (and for inf and NaN) a is its own value."""
        m = self.fabs(a)
        rounded = self.copysign(self.sub(self.add(m, self.c(TWO_52)), self.c(TWO_52)), a)
        return self.fsel(self.lt(m, self.c(TWO_52)), rounded, a)

    def floor(self, a):
        r = self.rint(a)
        return self.fsel(self.gt(r, a), self.sub(r, self.c(1.0)), r)

    def trunc(self, a):
        return self.copysign(self.floor(self.fabs(a)), a)

    def fsel(self, cond, a, b):
        return self.b.select(cond, a, b)

    isel = fsel

    def branch(self, cond, then, otherwise):
        """An if/else whose sides compute values (phis after it), for a rare costly case: where
        LLVM widens a loop, the loop vectoriser if-converts it (both sides, selects: the sides
        are plain arithmetic); scalar code (a loop-carried chain, say) keeps the branch."""
        b = self.b
        then_block, else_block, merge = (b.function.append_basic_block(name) for name in ("then", "else", "merge"))
        b.cbranch(cond, then_block, else_block)
        sides = []
        for block, side in ((then_block, then), (else_block, otherwise)):
            b.position_at_end(block)
            values = side()
            sides.append((values, b.block))
            b.branch(merge)
        b.position_at_end(merge)
        out = []
        for (t, e) in zip(sides[0][0], sides[1][0]):
            phi = b.phi(t.type)
            phi.add_incoming(t, sides[0][1])
            phi.add_incoming(e, sides[1][1])
            out.append(phi)
        return tuple(out)

    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def le(self, a, b):
        return self.b.fcmp_ordered("<=", a, b)

    def gt(self, a, b):
        return self.b.fcmp_ordered(">", a, b)

    def ge(self, a, b):
        return self.b.fcmp_ordered(">=", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def ne(self, a, b):
        return self.b.fcmp_unordered("!=", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def and_(self, a, b):
        return self.b.and_(a, b)

    def or_(self, a, b):
        return self.b.or_(a, b)

    def not_(self, a):
        return self.b.xor(a, ll.Constant(I1, 1))

    def same(self, a, b):
        return self.b.icmp_unsigned("==", a, b)

    def iadd(self, a, b):
        return self.b.add(a, b)

    def isub(self, a, b):
        return self.b.sub(a, b)

    def iand(self, a, b):
        return self.b.and_(a, b)

    def ior(self, a, b):
        return self.b.or_(a, b)

    def ishl(self, a, n: int):
        return self.b.shl(a, self.ci(n))

    def ishr(self, a, n: int):
        return self.b.ashr(a, self.ci(n))

    def iushr(self, a, n: int):
        return self.b.lshr(a, self.ci(n))

    def ilt(self, a, b):
        return self.b.icmp_signed("<", a, b)

    def ieq(self, a, b):
        return self.b.icmp_signed("==", a, b)

    def to_i32(self, a):
        return self.b.fptosi(a, I32)

    def i32_to_f(self, a):
        return self.b.sitofp(a, F64)

    def bits(self, a):
        return self.b.bitcast(a, I64)

    def from_bits(self, a):
        return self.b.bitcast(a, F64)

    def land(self, a, b):
        return self.b.and_(a, b)

    def lor(self, a, b):
        return self.b.or_(a, b)

    def lshl(self, a, n: int):
        return self.b.shl(a, self.cl(n))

    def lshr(self, a, n: int):
        return self.b.lshr(a, self.cl(n))

    def l_from_i32(self, a):
        return self.b.sext(a, I64)

    def l_to_i32(self, a):
        return self.b.trunc(a, I32)


class Float32Math:
    """sin, cos, tan, exp, tanh and pow of float arguments widened to double (see the module
    docstring)."""

    def __init__(self, ops: LlvmOps, math64: Float64Math):
        self.o, self.m = ops, math64

    def round_to_integer(self, v):
        """(rint(v), rint(v) mod 4 as an i32) for |v| < 2^51: v + 1.5 * 2^52 rounds v to an
        integer held in the low bits of the sum. Shorter (in latency, what a loop-carried chain
        of sin pays) than LlvmOps.rint and a float-to-integer conversion."""
        o = self.o
        shifted = o.add(v, o.c(ROUNDING_SHIFT))
        low = o.l_to_i32(o.bits(shifted))
        return o.sub(shifted, o.c(ROUNDING_SHIFT)), o.iand(low, o.ci(3))

    def reduce(self, x):
        """(r, n): x = r + n pi/2 with |r| <~ pi/4 as a double, n mod 4 as an i32; r is NaN for
        inf and NaN (the long reduction gives it)."""
        o = self.o
        return o.branch(o.lt(o.fabs(x), o.c(F32_MEDIUM_LIMIT)), lambda: self._reduce_medium(x),
                        lambda: self._reduce_large(x))

    def _reduce_medium(self, x):
        """|x| < 2^28: n < 2^28, so n * PIO2_25 is exact (FreeBSD's __rem_pio2f); x = -0
        gives r = -0."""
        o = self.o
        fn, n = self.round_to_integer(o.mul(x, o.c(INV_PIO2)))
        return o.sub(o.sub(x, o.mul(fn, o.c(PIO2_25))), o.mul(fn, o.c(PIO2_25T))), n

    def _reduce_large(self, x):
        """x * 2/pi mod 4 for |x| >= 2^28 from five exact partial products x * piece_j *
        2^(-24 (j + 1)), j from j0 on: below j0 (chosen by x's magnitude) a product is a multiple
        of 4, which leaves the result alone; past j0 + 4 the rest is below 2^-71. The first two
        products, under 2^50 with an ulp of at least 2^-46, are reduced mod 4 and summed
        exactly; the others are below 2 and added with their rounding error carried."""
        o = self.o
        ax = o.fabs(x)
        # j0 = number of leading pieces whose product with x is a multiple of 4 (ulp >= 4)
        steps = [o.ge(ax, o.c(2.0 ** (49 + 24 * i))) for i in range(len(TWO_OVER_PI_24) - 5)]

        def piece(k):
            value = o.c(TWO_OVER_PI_24[k] * 2.0 ** (-24 * (k + 1)))
            for j0, step in enumerate(steps, start=1):
                value = o.fsel(step, o.c(TWO_OVER_PI_24[j0 + k] * 2.0 ** (-24 * (j0 + k + 1))), value)
            return value

        p = [o.mul(x, piece(k)) for k in range(5)]
        t0, t1 = (o.sub(v, o.mul(o.c(4.0), o.rint(o.mul(v, o.c(0.25))))) for v in p[:2])
        s = o.add(t0, t1)  # exact
        n1 = o.rint(s)
        hi, lo = self.m.two_sum(o.sub(s, n1), p[2])
        lo = o.add(lo, o.add(p[3], p[4]))
        n2 = o.rint(hi)
        f = o.add(o.sub(hi, n2), lo)
        return o.mul(f, o.c(math.pi / 2)), self.round_to_integer(o.add(n1, n2))[1]

    def k_sin(self, x):
        o = self.o
        s1, s2, s3, s4 = (o.c(v) for v in SINF_S)
        z = o.mul(x, x)
        w = o.mul(z, z)
        r = o.add(s3, o.mul(z, s4))
        s = o.mul(z, x)
        return o.add(o.add(x, o.mul(s, o.add(s1, o.mul(z, s2)))), o.mul(o.mul(s, w), r))

    def k_cos(self, x):
        o = self.o
        c0, c1, c2, c3 = (o.c(v) for v in COSF_C)
        z = o.mul(x, x)
        w = o.mul(z, z)
        r = o.add(c2, o.mul(z, c3))
        return o.add(o.add(o.add(o.c(1.0), o.mul(z, c0)), o.mul(w, c1)), o.mul(o.mul(w, z), r))

    def k_tan(self, x, odd=None):
        """tan(x), or -1/tan(x) where `odd` (an i1)."""
        o = self.o
        t0, t1, t2, t3, t4, t5 = (o.c(v) for v in TANF_T)
        z = o.mul(x, x)
        r = o.add(t4, o.mul(z, t5))
        t = o.add(t2, o.mul(z, t3))
        w = o.mul(z, z)
        s = o.mul(z, x)
        u = o.add(t0, o.mul(z, t1))
        r = o.add(o.add(x, o.mul(s, u)), o.mul(o.mul(s, w), o.add(t, o.mul(w, r))))
        return r if odd is None else o.fsel(odd, o.div(o.c(-1.0), r), r)

    def by_quadrant(self, n, on_axis, off_axis, negated_from: int):
        """`on_axis` for even n, `off_axis` for odd n, negated where (n + negated_from) & 2."""
        o = self.o
        value = o.fsel(o.ieq(o.iand(n, o.ci(1)), o.ci(1)), off_axis, on_axis)
        negate = o.ieq(o.iand(o.iadd(n, o.ci(negated_from)), o.ci(2)), o.ci(2))
        return o.fsel(negate, o.neg(value), value)

    def odd_at_zero(self, x, value):
        """x itself at +-0: the polynomials turn -0 into +0."""
        return self.o.fsel(self.o.eq(x, self.o.c(0.0)), x, value)

    def unreduced_below_pi_4(self, x, at_small, reduced):
        """`at_small()` for |x| <= pi/4, else `reduced(r, n)`: a branch, so that scalar code (a
        loop-carried chain of sin, say) skips the reduction; the vectoriser computes both."""
        o = self.o
        return o.branch(o.le(o.fabs(x), o.c(math.pi / 4)), lambda: (at_small(),),
                        lambda: (reduced(*self.reduce(x)),))[0]

    def sin(self, x):
        return self.odd_at_zero(x, self.unreduced_below_pi_4(
            x, lambda: self.k_sin(x), lambda r, n: self.by_quadrant(n, self.k_sin(r), self.k_cos(r), 0)))

    def cos(self, x):
        return self.unreduced_below_pi_4(
            x, lambda: self.k_cos(x), lambda r, n: self.by_quadrant(n, self.k_cos(r), self.k_sin(r), 1))

    def tan(self, x):
        o = self.o
        return self.odd_at_zero(x, self.unreduced_below_pi_4(
            x, lambda: self.k_tan(x),
            lambda r, n: self.k_tan(r, o.ieq(o.iand(n, o.ci(1)), o.ci(1)))))

    def exp_short(self, t):
        """e^t to 2^-37 relative (enough for a float result) for any t: e^t = 2^k e^r, |r| <=
        ln2/2, e^r by its Taylor polynomial of degree 10 (no division, unlike fdlibm's exp);
        t is clamped to [-200, 200], beyond which a float is 0 or inf all the same. NaN for NaN."""
        o, m = self.o, self.m
        tc = m.cases([(o.isnan(t), o.c(0.0)), (o.gt(t, o.c(200.0)), o.c(200.0)),
                      (o.lt(t, o.c(-200.0)), o.c(-200.0))], t)
        kf = o.rint(o.mul(tc, o.c(1 / math.log(2))))
        r = o.sub(o.sub(tc, o.mul(kf, o.c(LN2_HI))), o.mul(kf, o.c(LN2_LO)))
        e = o.mul(self.m.poly(r, [1 / math.factorial(i) for i in range(11)]), m.pow2(o.to_i32(kf)))
        return o.fsel(o.isnan(t), t, e)

    def exp(self, x):
        return self.exp_short(x)

    def tanh(self, x):
        """(e^u - 1) / (e^u + 1), u = 2|x|, sign of x: e^u - 1 by its Taylor series below 0.5
        (no cancellation), else from exp_short; u is clamped to 40 (tanh is 1 in float from 9.1)."""
        o = self.o
        u = o.fsel(o.lt(o.fabs(x), o.c(20.0)), o.mul(o.c(2.0), o.fabs(x)), o.c(40.0))
        series = o.mul(u, self.m.poly(u, [1 / math.factorial(i + 1) for i in range(12)]))
        em1 = o.fsel(o.lt(u, o.c(0.5)), series, o.sub(self.exp_short(u), o.c(1.0)))
        return o.fsel(o.isnan(x), x, o.copysign(o.div(em1, o.add(em1, o.c(2.0))), x))

    def pow(self, x, y):
        """exp(y log|x|) in double: for float arguments its error, at most |y log x| 2^-52
        relative in the exponent (2^-45 where the result is a finite float), is far below a
        float's ulp. The special cases are C's (as Float64Math.f_pow)."""
        o, m = self.o, self.m
        one, zero, inf = o.c(1.0), o.c(0.0), o.c(math.inf)
        ax, ay = o.fabs(x), o.fabs(y)
        x_negative = m.sign_bit(x)
        y_integer = o.eq(o.rint(y), y)
        half_y = o.mul(y, o.c(0.5))
        y_odd = o.and_(y_integer, o.ne(o.rint(half_y), half_y))  # a float from 2^24 on is even
        odd_negative = o.and_(x_negative, y_odd)
        y_positive = o.gt(y, zero)
        regular = o.and_(o.lt(ax, inf), o.gt(ax, zero))
        magnitude = self.exp_short(o.mul(o.fsel(o.lt(ay, inf), y, zero), m.f_log(o.fsel(regular, ax, one))))
        reciprocal = o.fsel(o.eq(ax, zero), inf, o.fsel(o.eq(ax, inf), zero, one))  # of ax in {0, inf, 1}
        return m.pow_cases(x, y, ax, ay, x_negative, y_integer, odd_negative, y_positive,
                           o.fsel(y_positive, ax, reciprocal), m.neg_if(odd_negative, magnitude))


def define(module: ll.Module, op: str, bits: int) -> ll.Function:
    """The function computing `op` on `bits`-wide floats in `module`, defined on first use."""
    name = function_name(op, bits)
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    t = F64 if bits == 64 else F32
    fn = ll.Function(module, ll.FunctionType(t, [t] * ARITY.get(op, 1)), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    ops = LlvmOps(b)
    math64 = Float64Math(ops)
    args = [a if bits == 64 else b.fpext(a, F64) for a in fn.args]
    if bits == 32 and op in FLOAT32_OWN:
        value = getattr(Float32Math(ops, math64), op)(*args)
    else:
        value = math64(op, *args)
    b.ret(value if bits == 64 else b.fptrunc(value, F32))
    return fn
