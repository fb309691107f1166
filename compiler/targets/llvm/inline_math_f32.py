"""f32 sin, cos, tan, exp, log, tanh and pow computed in single precision, so that a vectorised
loop runs at the float vector width (8 lanes of AVX2 rather than the 4 of double); see
inline_math.py for how the functions are emitted, `FLOAT_OPS` for which ones are used.

Errors, in ulps of the correctly rounded result: at most 2 for sin, cos, exp and log, 3 for
tan, tanh and pow (measured over every float: sin, cos, exp, log <= 1.02, tan 2.0, tanh 1.33;
pow on random arguments 0.98); tests/targets/cpu/test_cpu_vector_math.py checks the bounds. This trades
the ~0.5 ulp of the double computation for speed. No FMA is assumed and none may be formed
(no fast-math flags): the exact steps below rely on each float operation being rounded once.

- exp: x = k ln2 + r, |r| <= ln2/2, k ln2 in two parts (the first of 9 bits, so k * part and
  x - k * part are exact); e^r by Cephes' single-precision exp polynomial; 2^k applied as two
  factors, each a normal float, so that results overflow to inf and underflow through the
  subnormals with a single rounding.
- log: x = 2^k m, m in [sqrt(2)/2, sqrt(2)) from the bits (subnormals scaled by 2^25 first);
  log m from s = f / (2 + f), f = m - 1, by the polynomial of FreeBSD's and musl's e_logf.c.
- tanh: as Cephes' single-precision tanh: an odd polynomial below 0.625 (relative accuracy
  near 0, where e^2x - 1 would cancel), 1 - 2 / (e^2|x| + 1) from there on, sign of x.
- sin, cos, tan: x = n pi/2 + hi + lo. Below TRIG_FLOAT_LIMIT by Cody-Waite in float: pi/2 in four
  parts, the first two products with n (|n| < 2^9) and both subtractions exact, the third
  product exact and its subtraction's error recovered (Fast2Sum), the fourth rounded: hi + lo
  is within ~2^-55 of x - n pi/2, enough even next to a multiple of pi/2. From there on (and
  for inf, NaN) Payne-Hanek in integers, exact for every float (`_reduce_large`). Both are
  computed for every argument (the vectoriser would if-convert a branch all the same): 2^24
  sines take 4.9 ms with the first only, 15-18 ms with both (single thread, AVX-512), where a
  Payne-Hanek in double (24-bit words of 2/pi selected by the exponent, products in double)
  took 27 ms and one from a table of 2/pi's bits by exponent (gathers) 33 ms. Then Cephes'
  single-precision sin, cos and tan polynomials on |hi| <~ pi/4, corrected for lo (tan: -1 /
  the polynomial for odd n).
- pow: e^t, t = y log|x| in double (log's polynomial evaluated in double: a float t would be
  off by up to |t| 2^-24), t reduced by ln2 in double; e^r and 2^k in float as exp.

Cephes (Stephen L. Moshier, netlib.org/cephes, single.tgz) is in the public domain; e_logf.c is
FreeBSD's (Sun's fdlibm licence: use freely with its notice).
"""
from __future__ import annotations

import math

from llvmlite import ir as ll

from ..fdlibm import LN2_HI, LN2_LO, Float64Math
from .llvm_ops import F32, F64, I32, LlvmOps

FLOAT_OPS = ("sin", "cos", "tan", "exp", "log", "tanh", "pow")  # computed in float; the other f32 ops in double
ROUNDING_SHIFT, ROUNDING_SHIFT_BITS = 1.5 * 2.0 ** 23, 0x4B400000  # v + it: rint(v) in the low bits, |v| < 2^22
DOUBLE_ROUNDING_SHIFT = 1.5 * 2.0 ** 52  # the same in double, |v| < 2^51

EXP_HIGH, EXP_LOW = 89.0, -104.0  # beyond: e^x rounds to inf, 0 (ln FLT_MAX = 88.72, e^-103.97 = 2^-150)
LN2_HI_9, LN2_LO_9 = 0.693359375, -2.12194440e-4  # ln 2 = sum; the first has 9 significant bits
EXPF_P = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3,
          1.9875691500e-4)  # e^r = 1 + r + r^2 P(r) (Cephes, single precision)

LOGF_LG = (float.fromhex("0xaaaaaa.0p-24"), float.fromhex("0xccce13.0p-25"), float.fromhex("0x91e9ee.0p-25"),
           float.fromhex("0xf89e26.0p-26"))  # e_logf.c: |log(1+f) - approximation| < 2^-34.24
LOGF_LN2_HI, LOGF_LN2_LO = float.fromhex("0x1.62e3p-1"), float.fromhex("0x1.2fefa2p-17")

TANHF_SMALL = 0.625
TANHF_P = (-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2,
           -5.70498872745e-3)  # tanh x = x + x^3 P(x^2) below 0.625 (Cephes, single precision)

SINF_P = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)  # sin r = r + r^3 P(r^2) (Cephes)
TANF_P = (3.33331568548e-1, 1.33387994085e-1, 5.34112807005e-2, 2.44301354525e-2, 3.11992232697e-3,
          9.38540185543e-3)  # tan r = r + r^3 P(r^2) (Cephes)
COSF_Q = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)  # cos r = 1 - r^2/2 + r^4 Q(r^2)
# pi/2 = PIO2_1 + PIO2_2 + PIO2_3 + PIO2_4 (mpmath): PIO2_1 is pi/2 truncated to 15 bits, PIO2_2
# the rest truncated to a multiple of 2^-24, PIO2_3 the next rest truncated to 15 bits, PIO2_4
# the last one rounded (within 2^-65). With |n| < 2^9, n * PIO2_1, 2 and 3 are exact.
PIO2_1, PIO2_2 = float.fromhex("0x1.921cp+0"), float.fromhex("0x1.da8p-15")
PIO2_3, PIO2_4 = float.fromhex("0x1.1108p-26"), float.fromhex("0x1.a308d4p-41")
TRIG_FLOAT_LIMIT = 800.0  # |n| <= 509 below it
LARGE_S_MIN = -14  # x = M 2^s, M < 2^24: s >= -14 from 800 on
# 2/pi in 24-bit pieces (k_rem_pio2.c's ipio2): 2/pi = sum(piece_j * 2^(-24 (j + 1))), 216 bits.
TWO_OVER_PI_24 = (0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041,
                  0xFE5163)


def _two_over_pi_bits():
    """2/pi's bits from the one of weight 2^(1 - LARGE_S_MIN) on (those before the point are 0)
    in 32-bit words, as signed i32 values: seven words reach the bit of weight 2^-208; the
    largest float (s = 104) needs them down to 2^-198 (W2's last)."""
    words = len(TWO_OVER_PI_24)
    two_over_pi = sum(w << (24 * (words - 1 - i)) for i, w in enumerate(TWO_OVER_PI_24))  # 2^-24 words units
    # bit i of 2/pi (i >= 1, weight 2^-i) is at 24 words - i; it goes to 7 * 32 - 1 - (i - (LARGE_S_MIN - 1))
    bits = two_over_pi >> (24 * words + 2 - LARGE_S_MIN - 7 * 32)
    unsigned = [bits >> (32 * (6 - k)) & (2 ** 32 - 1) for k in range(7)]
    return tuple(w - 2 ** 32 if w >= 2 ** 31 else w for w in unsigned)


TWO_OVER_PI_BITS = _two_over_pi_bits()


class FloatOps(LlvmOps):
    """LlvmOps over f32 values (i32 bits)."""

    INTEGERS_FROM = 2.0 ** 23

    def _call(self, intrinsic: str, *args):
        return self.b.call(self._intrinsic(intrinsic + ".f32", F32, [F32] * len(args)), list(args))

    def c(self, v):
        return ll.Constant(F32, float(v))

    def i32_to_f(self, a):
        return self.b.sitofp(a, F32)

    def bits(self, a):
        return self.b.bitcast(a, I32)

    def from_bits(self, a):
        return self.b.bitcast(a, F32)


class FloatMath:
    """The functions of FLOAT_OPS on f32 values (see the module docstring)."""

    def __init__(self, builder: ll.IRBuilder):
        self.o = FloatOps(builder)
        self.b = builder

    # Horner and the select chain are width-neutral (they go through self.o): fdlibm.py's own.
    k, poly, cases = Float64Math.k, Float64Math.poly, Float64Math.cases

    def round_to_integer(self, v):
        """(rint(v) as a float, as an i32) for |v| < 2^22."""
        o = self.o
        shifted = o.add(v, o.c(ROUNDING_SHIFT))
        return o.sub(shifted, o.c(ROUNDING_SHIFT)), o.isub(o.bits(shifted), o.ci(ROUNDING_SHIFT_BITS))

    def pow2(self, k):
        """2^k for an i32 k in [-126, 127]."""
        return self.o.from_bits(self.o.ishl(self.o.iadd(k, self.o.ci(127)), 23))

    # ---- exp, log, tanh ------------------------------------------------------------------------
    def exp(self, x):
        o = self.o
        xc = self.cases([(o.isnan(x), o.c(0.0)), (o.gt(x, o.c(EXP_HIGH)), o.c(EXP_HIGH)),
                         (o.lt(x, o.c(EXP_LOW)), o.c(EXP_LOW))], x)
        kf, k = self.round_to_integer(o.mul(xc, o.c(1 / math.log(2))))  # |k| <= 150
        r = o.sub(o.sub(xc, o.mul(kf, o.c(LN2_HI_9))), o.mul(kf, o.c(LN2_LO_9)))
        return o.fsel(o.isnan(x), x, self.exp_reduced(r, k))

    def exp_reduced(self, r, k):
        """e^r 2^k for |r| <~ ln2/2 and an i32 k in [-150, 128], rounded once (to inf, a
        subnormal or 0 where it has to)."""
        o = self.o
        er = o.add(o.add(o.mul(o.mul(r, r), self.poly(r, EXPF_P)), r), o.c(1.0))
        half = o.ishr(k, 1)
        return o.mul(o.mul(er, self.pow2(half)), self.pow2(o.isub(k, half)))

    def pow(self, x, y):
        """e^t, t = y log|x| in double (a float t would be off by up to |t| 2^-24, hundreds of
        ulps of the result): |x| split in float, log(1 + f) by log's polynomial evaluated in
        double (within 2^-34 relative: t within 2^-27 where the result is a finite nonzero
        float), t reduced by ln2 in double, e^r and the scaling in float. C's special cases as
        fdlibm.py's pow_cases."""
        o, b = self.o, self.b
        d = LlvmOps(b)
        m, m64 = Float64Math(o), Float64Math(d)
        one, zero, inf = o.c(1.0), o.c(0.0), o.c(math.inf)
        ax, ay = o.fabs(x), o.fabs(y)
        x_negative = o.ilt(o.bits(x), o.ci(0))
        y_integer = o.eq(o.rint(y), y)
        half_y = o.mul(y, o.c(0.5))
        y_odd = o.and_(y_integer, o.ne(o.rint(half_y), half_y))  # a float from 2^24 on is even
        odd_negative = o.and_(x_negative, y_odd)
        y_positive = o.gt(y, zero)
        regular = o.and_(o.lt(ax, inf), o.gt(ax, zero))
        k, f = self.split_exponent(o.fsel(regular, ax, one))
        fd = b.fpext(f, F64)
        log_x = self.log_of_split(d, k, fd, d.div(fd, d.add(d.c(2.0), fd)), LN2_HI, LN2_LO)
        t = d.mul(b.fpext(o.fsel(o.lt(ay, inf), y, zero), F64), log_x)
        t = m64.cases([(d.gt(t, d.c(EXP_HIGH)), d.c(EXP_HIGH)), (d.lt(t, d.c(EXP_LOW)), d.c(EXP_LOW))], t)
        shifted = d.add(d.mul(t, d.c(1 / math.log(2))), d.c(DOUBLE_ROUNDING_SHIFT))
        kf = d.sub(shifted, d.c(DOUBLE_ROUNDING_SHIFT))
        r = d.sub(d.sub(t, d.mul(kf, d.c(LN2_HI))), d.mul(kf, d.c(LN2_LO)))  # LN2_HI: 32 bits
        magnitude = self.exp_reduced(b.fptrunc(r, F32), d.l_to_i32(d.bits(shifted)))
        reciprocal = o.fsel(o.eq(ax, zero), inf, o.fsel(o.eq(ax, inf), zero, one))  # of ax in {0, inf, 1}
        return m.pow_cases(x, y, ax, ay, x_negative, y_integer, odd_negative, y_positive,
                           o.fsel(y_positive, ax, reciprocal), m.neg_if(odd_negative, magnitude))

    def split_exponent(self, x):
        """(k, f) with x = 2^k (1 + f), 1 + f in [sqrt(2)/2, sqrt(2)), k an i32, f exact, for a
        positive finite x (subnormals scaled by 2^25 first): the bits offset so that the
        exponent field counts from sqrt(2)/2, then m's fraction put under that exponent."""
        o = self.o
        subnormal = o.lt(x, o.c(2.0 ** -126))
        ix = o.iadd(o.bits(o.fsel(subnormal, o.mul(x, o.c(2.0 ** 25)), x)), o.ci(0x3F800000 - 0x3F3504F3))
        k = o.iadd(o.isub(o.ishr(ix, 23), o.ci(0x7F)), o.isel(subnormal, o.ci(-25), o.ci(0)))
        return k, o.sub(o.from_bits(o.iadd(o.iand(ix, o.ci(0x007FFFFF)), o.ci(0x3F3504F3))), o.c(1.0))

    @staticmethod
    def log_of_split(o, k, f, s, ln2_hi, ln2_lo):
        """k ln2 + log(1 + f) by e_logf.c's polynomial in s = f / (2 + f), in `o`'s arithmetic
        (float, or double for pow); ln2 = ln2_hi + ln2_lo, k ln2_hi exact."""
        z = o.mul(s, s)
        w = o.mul(z, z)
        lg1, lg2, lg3, lg4 = (o.c(v) for v in LOGF_LG)
        big_r = o.add(o.mul(z, o.add(lg1, o.mul(w, lg3))), o.mul(w, o.add(lg2, o.mul(w, lg4))))
        hfsq = o.mul(o.mul(o.c(0.5), f), f)
        dk = o.i32_to_f(k)
        v = o.add(o.mul(s, o.add(hfsq, big_r)), o.mul(dk, o.c(ln2_lo)))
        return o.add(o.add(o.sub(v, hfsq), f), o.mul(dk, o.c(ln2_hi)))

    def log(self, x):
        o = self.o
        k, f = self.split_exponent(x)
        v = self.log_of_split(o, k, f, o.div(f, o.add(o.c(2.0), f)), LOGF_LN2_HI, LOGF_LN2_LO)
        return self.cases([(o.isnan(x), x), (o.lt(x, o.c(0.0)), o.c(math.nan)),
                           (o.eq(x, o.c(0.0)), o.c(-math.inf)), (o.eq(x, o.c(math.inf)), x)], v)

    def tanh(self, x):
        o = self.o
        ax = o.fabs(x)
        z = o.mul(ax, ax)
        small = o.add(ax, o.mul(o.mul(z, ax), self.poly(z, TANHF_P)))
        large = o.sub(o.c(1.0), o.div(o.c(2.0), o.add(self.exp(o.add(ax, ax)), o.c(1.0))))  # 1 from e^2|x| = inf
        return o.copysign(o.fsel(o.lt(ax, o.c(TANHF_SMALL)), small, large), x)

    # ---- sin, cos, tan -------------------------------------------------------------------------
    def reduce(self, x):
        """(hi, lo, n): x = n pi/2 + hi + lo, |hi| <~ pi/4, n mod 4 as an i32; hi NaN for inf
        and NaN. A branch between the two reductions: a vectorised loop computes both (if-converted),
        scalar code (a loop LLVM does not widen) only the one it needs: selecting cost a
        loop-carried `v = sin(v)` chain 3.7x the time of the C library's float sine."""
        o = self.o
        small = o.lt(o.fabs(x), o.c(TRIG_FLOAT_LIMIT))
        return o.branch(small, lambda: tuple(self._reduce_float(x)), lambda: tuple(self._reduce_large(x)))

    def _reduce_float(self, x):
        o = self.o
        nf, n = self.round_to_integer(o.mul(x, o.c(2 / math.pi)))
        # multiples of 2^-24 below 1 (x is one from 2^-1 on, below it n = 0): exact
        r2 = o.sub(o.sub(x, o.mul(nf, o.c(PIO2_1))), o.mul(nf, o.c(PIO2_2)))
        t = o.mul(nf, o.c(PIO2_3))
        hi = o.sub(r2, t)
        lo = o.sub(o.sub(o.sub(r2, hi), t), o.mul(nf, o.c(PIO2_4)))  # Fast2Sum: r2's unit >= t's
        return hi, lo, o.iand(n, o.ci(3))

    def _reduce_large(self, x):
        """Payne-Hanek in integers (as ARM's optimized-routines do for float sin) for
        |x| = M 2^s, M < 2^24: |x| 2/pi mod 4 = M G mod 4, G = 2^s 2/pi mod 4, whose bits are
        2/pi's from bit s - 1 on: three 32-bit words W0, W1, W2 of them (W0 from G's two
        integer bits on), cut from TWO_OVER_PI_BITS. M G mod 4 in units of 2^-62 is
        M W0 2^32 + M W1 + floor(M W2 / 2^32) mod 2^64 (what is left out is below 2^-62); its
        top two bits, rounded, are n, the rest, signed, the fraction of pi/2 left. Each
        product is exact (32 x 32 -> 64 bits)."""
        o, b = self.o, self.b
        i64 = ll.IntType(64)
        bits = o.bits(x)
        s = o.isub(o.iand(o.iushr(bits, 23), o.ci(255)), o.ci(150))
        pos = o.isub(o.isel(o.ilt(s, o.ci(LARGE_S_MIN)), o.ci(LARGE_S_MIN), s), o.ci(LARGE_S_MIN))
        idx, shift = o.iushr(pos, 5), o.iand(pos, o.ci(31))
        steps = [b.icmp_signed(">=", idx, o.ci(j)) for j in (1, 2, 3)]

        def word(k):  # TWO_OVER_PI_BITS[idx + k]
            value = o.ci(TWO_OVER_PI_BITS[k])
            for j, step in enumerate(steps, start=1):
                value = o.isel(step, o.ci(TWO_OVER_PI_BITS[j + k]), value)
            return value

        words = [word(k) for k in range(4)]
        w0, w1, w2 = (o.ior(b.shl(words[k], shift), b.lshr(o.iushr(words[k + 1], 1), o.isub(o.ci(31), shift)))
                      for k in range(3))
        m = o.ior(o.iand(bits, o.ci(0x7FFFFF)), o.ci(0x800000))
        m64 = b.zext(m, i64)  # unsigned 32 x 32-bit products: one instruction on x86
        top = b.add(b.add(b.shl(b.zext(b.mul(m, w0), i64), ll.Constant(i64, 32)), b.mul(m64, b.zext(w1, i64))),
                    b.lshr(b.mul(m64, b.zext(w2, i64)), ll.Constant(i64, 32)))
        n = b.lshr(b.add(top, ll.Constant(i64, 1 << 61)), ll.Constant(i64, 62))
        fraction = b.sub(top, b.shl(n, ll.Constant(i64, 62)))
        r = b.fmul(b.sitofp(fraction, F64), ll.Constant(F64, math.pi / 2 * 2.0 ** -62))
        hi = b.fptrunc(r, F32)
        lo = b.fptrunc(b.fsub(r, b.fpext(hi, F64)), F32)
        negative = o.ilt(bits, o.ci(0))  # |x| reduced: -x = -n pi/2 - hi - lo
        n = o.isel(negative, o.isub(o.ci(0), b.trunc(n, I32)), b.trunc(n, I32))
        hi = o.add(o.fsel(negative, o.neg(hi), hi), o.sub(x, x))  # NaN for inf and NaN
        return hi, o.fsel(negative, o.neg(lo), lo), o.iand(n, o.ci(3))

    def k_sin(self, hi, lo, z):
        """sin(hi + lo) for z = hi^2: sin hi + lo cos hi, cos hi ~ 1 - z / 2."""
        o = self.o
        correction = o.sub(o.mul(hi, self.poly(z, SINF_P)), o.mul(o.c(0.5), lo))
        return o.add(hi, o.add(lo, o.mul(z, correction)))

    def k_cos(self, hi, lo, z):
        """cos(hi + lo) for z = hi^2: cos hi - lo sin hi, sin hi ~ hi."""
        o = self.o
        tail = o.sub(o.mul(o.mul(z, z), self.poly(z, COSF_Q)), o.mul(hi, lo))
        return o.add(o.c(1.0), o.sub(tail, o.mul(o.c(0.5), z)))

    def by_quadrant(self, n, on_axis, off_axis, negated_from: int):
        """`on_axis` for even n, `off_axis` for odd n, negated where (n + negated_from) & 2."""
        o = self.o
        value = o.fsel(o.ieq(o.iand(n, o.ci(1)), o.ci(1)), off_axis, on_axis)
        negate = o.ieq(o.iand(o.iadd(n, o.ci(negated_from)), o.ci(2)), o.ci(2))
        return o.fsel(negate, o.neg(value), value)

    def sin(self, x):
        return self.sin_reduced(x, *self.reduce(x))

    def cos(self, x):
        return self.cos_reduced(x, *self.reduce(x))

    def tan(self, x):
        return self.tan_reduced(x, *self.reduce(x))

    # The functions of x = n pi/2 + hi + lo, from its reduction.
    def sin_reduced(self, x, hi, lo, n):
        o = self.o
        z = o.mul(hi, hi)
        value = self.by_quadrant(n, self.k_sin(hi, lo, z), self.k_cos(hi, lo, z), 0)
        return o.fsel(o.eq(x, o.c(0.0)), x, value)  # -0 stays -0

    def cos_reduced(self, x, hi, lo, n):
        o = self.o
        z = o.mul(hi, hi)
        return self.by_quadrant(n, self.k_cos(hi, lo, z), self.k_sin(hi, lo, z), 1)

    def tan_reduced(self, x, hi, lo, n):
        """tan(hi + lo) = tan hi + lo (1 + tan^2 hi) for even n, -1 / that for odd n."""
        o = self.o
        z = o.mul(hi, hi)
        odd_part = o.mul(o.mul(z, hi), self.poly(z, TANF_P))
        at_hi = o.add(hi, odd_part)
        t = o.add(hi, o.add(odd_part, o.mul(lo, o.add(o.c(1.0), o.mul(at_hi, at_hi)))))
        value = o.fsel(o.ieq(o.iand(n, o.ci(1)), o.ci(1)), o.div(o.c(-1.0), t), t)
        return o.fsel(o.eq(x, o.c(0.0)), x, value)  # -0 stays -0
