"""f64 sin, cos, tan, asin, acos, atan, atan2, tanh, exp, log and pow as algorithms over an
interface of basic operations, for the targets that have no math library to call: the SPIR-V
target (GLSL.std.450 computes these for 16- and 32-bit floats only; spirv/math64.py emits them)
and the CPU target's inline, vectorisable math (llvm/inline_math.py).

The algorithms and coefficients are fdlibm's (Sun Microsystems, 1993; as in FreeBSD's and
musl's libm before their table-driven exp/log/pow): minimax polynomials on a reduced argument,
each within 1 ulp where the argument reduction is exact. They are written branch-free (every
case is computed and the right one selected), against a small set of operations `ops` that
spirv/math64.py implements by emitting SPIR-V (`SpirvOps`) and llvm/inline_math.py as LLVM IR
(`LlvmOps`); tests/f64_math_numpy_ops.py
implements the same operations on numpy arrays, so the algorithms are checked against mpmath
on millions of arguments without a GPU, and the emitted code against numpy on the device.

They need IEEE double arithmetic: correctly rounded +, -, *, /, sqrt, no contraction into FMA
(every float operation here is decorated NoContraction, fast_math or not: the error-free
transformations depend on it), and integer access to the bits (Int64).

sin, cos and tan reduce x by multiples of pi/2 (Cody-Waite): pi/2 is split into four 23-bit
parts and a fifth full one, so that n * part is exact for n < 2^30; for 2^30 <= |x| < 2^53 (a
branch) n is split in two such halves and the partial sums compensated twice: the reduced
argument is exact to ~2^-110 everywhere below 2^53, and the results within an ulp. From 2^53
on (doubles are even integers there) sin, cos and tan give NaN: Payne-Hanek reduction, with
a table of 2/pi's bits, would give numpy's values; it is not done.
"""
from __future__ import annotations

import math
import struct



def from_words(high: int, low: int = 0) -> float:
    """The double whose bits are `high` (sign, exponent, top 20 fraction bits) and `low`."""
    return struct.unpack("<d", struct.pack("<Q", (high << 32) | low))[0]


# ---- constants (fdlibm's, with their sources: k_sin.c, k_cos.c, k_tan.c, e_exp.c, e_log.c,
# s_expm1.c, s_atan.c, e_asin.c, e_acos.c, e_atan2.c, e_pow.c) -------------------------------
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # LN2_HI has 32 bits
INV_LN2 = 1.44269504088896338700e+00
EXP_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
         -1.65339022054652515390e-06, 4.13813679705723846039e-08)
EXP_OVERFLOW, EXP_UNDERFLOW = 709.782712893383973096, -745.13321910194110842
LOG_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
          2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
          1.479819860511658591e-01)
EXPM1_Q = (-3.33333333333331316428e-02, 1.58730158725481460165e-03, -7.93650757867487942473e-05,
           4.00821782732936239552e-06, -2.01099218183624371326e-07)
SIN_S = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
         2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
COS_C = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
         -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)
TAN_T = (3.33333333333334091986e-01, 1.33333333333201242699e-01, 5.39682539762260521377e-02,
         2.18694882948595424599e-02, 8.86323982359930005737e-03, 3.59207910759131235356e-03,
         1.45620945432529025516e-03, 5.88041240820264096874e-04, 2.46463134818469906812e-04,
         7.81794442939557092300e-05, 7.14072491382608190305e-05, -1.85586374855275456654e-05,
         2.59073051863633712884e-05)
PIO4_HI, PIO4_LO = 7.85398163397448278999e-01, 3.06161699786838301793e-17
PIO2_HI, PIO2_LO = 1.57079632679489655800e+00, 6.12323399573676603587e-17
PI, PI_LO = 3.1415926535897931160e+00, 1.2246467991473531772e-16
INV_PIO2 = 6.36619772367581382433e-01
# pi/2 = sum of these: four parts of 23 significant bits (n * part is exact for n < 2^30) and
# the rest rounded to a double (mpmath: truncate pi/2 to 23 bits, repeat on the remainder).
PIO2_PARTS = (float.fromhex("0x1.921fb40000000p+0"), float.fromhex("0x1.4442d00000000p-24"),
              float.fromhex("0x1.8469880000000p-48"), float.fromhex("0x1.8cc5140000000p-72"),
              float.fromhex("0x1.80dc1cd129025p-95"))
TRIG_LIMIT = 2.0 ** 53  # from here on sin, cos and tan give NaN
ATAN_HI = (4.63647609000806093515e-01, 7.85398163397448278999e-01, 9.82793723247329054082e-01,
           1.57079632679489655800e+00)
ATAN_LO = (2.26987774529616870924e-17, 3.06161699786838301793e-17, 1.39033110312309984516e-17,
           6.12323399573676603587e-17)
ATAN_T = (3.33333333333329318027e-01, -1.99999999998764832476e-01, 1.42857142725034663711e-01,
          -1.11111104054623557880e-01, 9.09088713343650656196e-02, -7.69187620504482999495e-02,
          6.66107313738753120669e-02, -5.83357013379057348645e-02, 4.97687799461593236017e-02,
          -3.65315727442169155270e-02, 1.62858201153657823623e-02)
ASIN_P = (1.66666666666666657415e-01, -3.25565818622400915405e-01, 2.01212532134862925881e-01,
          -4.00555345006794114027e-02, 7.91534994289814532176e-04, 3.47933107596021167570e-05)
ASIN_Q = (1.0, -2.40339491173441421878e+00, 2.02094576023350569471e+00, -6.88283971605453293030e-01,
          7.70381505559019352791e-02)
POW_L = (5.99999999999994648725e-01, 4.28571428578550184252e-01, 3.33333329818377432918e-01,
         2.72728123808534006489e-01, 2.30660745775561754067e-01, 2.06975017800338417784e-01)
POW_DP_H, POW_DP_L = 5.84962487220764160156e-01, 1.35003920212974897128e-08  # log2(1.5) hi, lo
POW_LG2, POW_LG2_H, POW_LG2_L = 6.93147180559945286227e-01, 6.93147182464599609375e-01, -1.90465429995776804525e-09
POW_OVT = 8.0085662595372944372e-17  # -(1024 - log2(overflow + 0.5 ulp))
POW_CP, POW_CP_H, POW_CP_L = 9.61796693925975554329e-01, 9.61796700954437255859e-01, -7.02846165095275826516e-09
# 1/ln 2 = POW_IVLN2_H + POW_IVLN2_L, the first part of 20 bits: its product with x - 1 (at
# most 33 bits for |x - 1| < 2^-20) is exact. fdlibm's has 24 bits there, which costs up to
# ~300 ulp in pow(1 + 2e-7, -2.7e9) (mpmath: 1/ln 2 truncated to 20 bits, then the rest).
POW_IVLN2 = 1.44269504088896338700e+00
POW_IVLN2_H, POW_IVLN2_L = float.fromhex("0x1.7154600000000p+0"), float.fromhex("0x1.652b82fe1777dp-20")


class Float64Math:
    """The functions, built from `ops` (SpirvOps, or the tests' numpy twin). Values are whatever
    `ops` makes them (SPIR-V ids, numpy arrays); Python floats are constants."""

    def __init__(self, ops):
        self.o = ops

    def __call__(self, name: str, *args):
        return getattr(self, "f_" + name)(*args)

    # ---- helpers -------------------------------------------------------------------------------
    def k(self, v: float):
        return self.o.c(float(v))

    def poly(self, x, coefficients):
        """c0 + x*(c1 + x*(c2 + ...)), evaluated as fdlibm writes it."""
        o = self.o
        acc = self.k(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = o.add(self.k(c), o.mul(x, acc))
        return acc

    def cases(self, pairs, default):
        """The value of the first (condition, value) that holds, else `default`."""
        out = default
        for cond, value in reversed(pairs):
            out = self.o.fsel(cond, value, out)
        return out

    def high(self, x):
        """The high word of x's bits (i32)."""
        o = self.o
        return o.l_to_i32(o.lshr(o.bits(x), 32))

    def sign_bit(self, x):
        return self.o.ilt(self.high(x), self.o.ci(0))

    def with_high(self, x, high):
        """x with its high word replaced by `high` (i32)."""
        o = self.o
        low = o.land(o.bits(x), o.cl(0xFFFFFFFF))
        return o.from_bits(o.lor(o.lshl(o.l_from_i32(high), 32), low))

    def from_high(self, high):
        o = self.o
        return o.from_bits(o.lshl(o.l_from_i32(high), 32))

    def clear_low(self, x):
        """x with the low 32 bits of its fraction cleared: a number whose products with another
        of 21 significant bits are exact."""
        o = self.o
        return o.from_bits(o.land(o.bits(x), o.cl(-(1 << 32))))

    def pow2(self, n):
        """2^n for an i32 n in [-1022, 1023]."""
        o = self.o
        return self.from_high(o.ishl(o.iadd(n, o.ci(1023)), 20))

    def scale(self, x, n):
        """x * 2^n, rounded once, for an i32 n in [-1100, 1100] and x within [0.5, 2]: two
        factors, each a normal number (the first product is exact)."""
        o = self.o
        half = o.ishr(n, 1)
        return o.mul(o.mul(x, self.pow2(half)), self.pow2(o.isub(n, half)))

    def neg_if(self, cond, x):
        return self.o.fsel(cond, self.o.neg(x), x)

    # ---- exp, log, expm1 -------------------------------------------------------------------
    def f_exp(self, x):
        """e^x = 2^k e^r, x = k ln2 + r, |r| <= ln2/2; e^r by a rational form of a minimax
        polynomial in r^2."""
        o = self.o
        nan = o.isnan(x)
        xc = self.cases([(nan, self.k(0.0)), (o.gt(x, self.k(710.0)), self.k(710.0)),
                         (o.lt(x, self.k(-746.0)), self.k(-746.0))], x)
        kf = o.rint(o.mul(xc, self.k(INV_LN2)))
        hi = o.sub(xc, o.mul(kf, self.k(LN2_HI)))  # exact: LN2_HI has 32 bits, |k| < 2^11
        lo = o.mul(kf, self.k(LN2_LO))
        r = o.sub(hi, lo)
        rr = o.mul(r, r)
        c = o.sub(r, o.mul(rr, self.poly(rr, EXP_P)))
        y = o.add(self.k(1.0), o.add(o.sub(o.div(o.mul(r, c), o.sub(self.k(2.0), c)), lo), hi))
        result = self.scale(y, o.to_i32(kf))
        return self.cases([(nan, x), (o.gt(x, self.k(EXP_OVERFLOW)), self.k(math.inf)),
                           (o.lt(x, self.k(EXP_UNDERFLOW)), self.k(0.0))], result)

    def f_log(self, x):
        """log x = k ln2 + log m, log m = f - f^2/2 + s (f^2/2 + R(s^2)), f = m - 1, s = f/(2 + f)."""
        o = self.o
        subnormal = o.lt(x, self.k(from_words(0x00100000)))
        xs = o.fsel(subnormal, o.mul(x, self.k(2.0 ** 54)), x)
        # x = 2^k m with m in [sqrt(2)/2, sqrt(2)): add the offset to the high word and split
        hx = o.iadd(self.high(xs), o.ci(0x3FF00000 - 0x3FE6A09E))
        kk = o.iadd(o.isub(o.iushr(hx, 20), o.ci(0x3FF)), o.isel(subnormal, o.ci(-54), o.ci(0)))
        m = self.with_high(xs, o.iadd(o.iand(hx, o.ci(0x000FFFFF)), o.ci(0x3FE6A09E)))
        f = o.sub(m, self.k(1.0))
        hfsq = o.mul(o.mul(self.k(0.5), f), f)
        s = o.div(f, o.add(self.k(2.0), f))
        z = o.mul(s, s)
        w = o.mul(z, z)
        t1 = o.mul(w, self.poly(w, LOG_LG[1::2]))
        t2 = o.mul(z, self.poly(w, LOG_LG[0::2]))
        dk = o.i32_to_f(kk)
        r = o.add(o.mul(s, o.add(hfsq, o.add(t2, t1))), o.mul(dk, self.k(LN2_LO)))
        r = o.add(o.add(o.sub(r, hfsq), f), o.mul(dk, self.k(LN2_HI)))
        return self.cases([(o.isnan(x), x), (o.lt(x, self.k(0.0)), self.k(math.nan)),
                           (o.eq(x, self.k(0.0)), self.k(-math.inf)), (o.eq(x, self.k(math.inf)), x)], r)

    def expm1(self, x):
        """e^x - 1 for finite |x| <= 41 (tanh's arguments)."""
        o = self.o
        kf = o.rint(o.mul(x, self.k(INV_LN2)))
        hi = o.sub(x, o.mul(kf, self.k(LN2_HI)))
        lo = o.mul(kf, self.k(LN2_LO))
        xr = o.sub(hi, lo)
        c = o.sub(o.sub(hi, xr), lo)
        hfx = o.mul(self.k(0.5), xr)
        hxs = o.mul(xr, hfx)
        r1 = self.poly(hxs, (1.0,) + EXPM1_Q)
        t = o.sub(self.k(3.0), o.mul(r1, hfx))
        e = o.mul(hxs, o.div(o.sub(r1, t), o.sub(self.k(6.0), o.mul(xr, t))))
        at_k0 = o.sub(xr, o.sub(o.mul(xr, e), hxs))
        e = o.sub(o.sub(o.mul(xr, o.sub(e, c)), c), hxs)
        at_minus1 = o.sub(o.mul(self.k(0.5), o.sub(xr, e)), self.k(0.5))
        at_1 = o.fsel(o.lt(xr, self.k(-0.25)), o.mul(self.k(-2.0), o.sub(e, o.add(xr, self.k(0.5)))),
                      o.add(self.k(1.0), o.mul(self.k(2.0), o.sub(xr, e))))
        kk = o.to_i32(kf)
        two_k, two_minus_k = self.pow2(kk), self.pow2(o.isub(o.ci(0), kk))
        y = o.add(o.sub(xr, e), self.k(1.0))  # e^x = 2^k y
        far = o.sub(o.mul(y, two_k), self.k(1.0))
        below_20 = o.mul(o.add(o.sub(xr, e), o.sub(self.k(1.0), two_minus_k)), two_k)
        from_20 = o.mul(o.add(o.sub(xr, o.add(e, two_minus_k)), self.k(1.0)), two_k)
        return self.cases([(o.ieq(kk, o.ci(0)), at_k0), (o.ieq(kk, o.ci(-1)), at_minus1), (o.ieq(kk, o.ci(1)), at_1),
                           (o.or_(o.ilt(kk, o.ci(0)), o.ilt(o.ci(56), kk)), far),
                           (o.ilt(kk, o.ci(20)), below_20)], from_20)

    def f_tanh(self, x):
        """From expm1(+-2|x|), three forms by |x| (musl's), 1 from |x| > 20."""
        o = self.o
        ax = o.fabs(x)
        above_mid = o.ge(ax, self.k(from_words(0x3FE193EB)))  # |x| > log(3)/2
        above_low = o.ge(ax, self.k(from_words(0x3FD058AF)))  # |x| > log(5/3)/2
        bounded = o.fsel(o.le(ax, self.k(20.0)), ax, self.k(0.0))  # keeps expm1's argument in range
        t = self.expm1(o.fsel(above_low, o.add(bounded, bounded), o.mul(self.k(-2.0), bounded)))
        t_plus_2 = o.add(t, self.k(2.0))
        r = self.cases([(o.gt(ax, self.k(20.0)), self.k(1.0)),
                        (above_mid, o.sub(self.k(1.0), o.div(self.k(2.0), t_plus_2))),
                        (above_low, o.div(t, t_plus_2)),
                        (o.lt(ax, self.k(from_words(0x00100000))), ax)], o.div(o.neg(t), t_plus_2))
        return o.fsel(o.isnan(x), x, self.neg_if(self.sign_bit(x), r))

    # ---- sin, cos, tan -------------------------------------------------------------------------
    def reduce_pio2(self, x):
        """(y0, y1, n): x = n pi/2 + y0 + y1, |y0 + y1| <~ pi/4, n mod 4 as an i32 in 0..3, for a
        finite x; the long way only where |x| >= 2^30 (a branch: arguments that size are rare)."""
        o = self.o
        y0, y1, fn = o.branch(o.lt(o.fabs(x), self.k(2.0 ** 30)), lambda: self.reduce_medium(x),
                              lambda: self.reduce_large(x))
        quarter = o.mul(fn, self.k(0.25))
        n = o.to_i32(o.mul(o.sub(quarter, o.floor(quarter)), self.k(4.0)))
        return y0, y1, n

    def two_sum(self, a, b):
        """(s, e): s = a + b rounded, e its exact error (Knuth)."""
        o = self.o
        s = o.add(a, b)
        virtual = o.sub(s, a)
        return s, o.add(o.sub(a, o.sub(s, virtual)), o.sub(b, virtual))

    def reduce_medium(self, x):
        """|x| < 2^30: n < 2^30, so n * part is exact for each 23-bit part of pi/2."""
        o = self.o
        fn = o.rint(o.mul(x, self.k(INV_PIO2)))
        p1, *rest = PIO2_PARTS
        hi = o.sub(x, o.mul(fn, self.k(p1)))  # exact (Sterbenz)
        lo = self.k(0.0)
        for part in rest:  # hi + lo is x - fn * (parts so far), to ~2^-110
            hi, error = self.two_sum(hi, o.neg(o.mul(fn, self.k(part))))
            lo = o.add(lo, error)
        y0 = o.add(hi, lo)
        return y0, o.sub(lo, o.sub(y0, hi)), fn

    def reduce_large(self, x):
        """2^30 <= |x| < 2^53: n = a + b, a a multiple of 2^30 (at most 23 significant bits) and
        |b| < 2^30, so that a * part and b * part are exact; their sum is compensated twice (the
        partial sums are large before they cancel). n from x * 2/pi may be one off: corrected."""
        o = self.o
        fn = o.rint(o.mul(x, self.k(INV_PIO2)))
        a = o.mul(o.trunc(o.mul(fn, self.k(2.0 ** -30))), self.k(2.0 ** 30))
        b = o.sub(fn, a)
        p1, p2, p3, p4, p5 = (self.k(p) for p in PIO2_PARTS)
        hi = o.sub(x, o.mul(a, p1))  # exact (Sterbenz)
        lo, lo_tail = self.k(0.0), self.k(0.0)
        for term in (o.mul(b, p1), o.mul(a, p2), o.mul(b, p2), o.mul(a, p3), o.mul(b, p3), o.mul(a, p4),
                     o.mul(b, p4), o.mul(fn, p5)):
            hi, error = self.two_sum(hi, o.neg(term))
            lo, error = self.two_sum(lo, error)
            lo_tail = o.add(lo_tail, error)
        lo = o.add(lo, lo_tail)
        y0 = o.add(hi, lo)
        y1 = o.sub(lo, o.sub(y0, hi))
        d = o.rint(o.mul(y0, self.k(INV_PIO2)))  # -1, 0 or 1
        hi, error = self.two_sum(y0, o.neg(o.mul(d, p1)))
        lo = o.add(o.add(y1, error), o.neg(o.add(o.mul(d, p2), o.mul(d, p3))))
        y0 = o.add(hi, lo)
        return y0, o.sub(lo, o.sub(y0, hi)), o.add(fn, d)

    def k_sin(self, x, y):
        o = self.o
        s1, s2, s3, s4, s5, s6 = (self.k(c) for c in SIN_S)
        z = o.mul(x, x)
        w = o.mul(z, z)
        r = o.add(o.add(s2, o.mul(z, o.add(s3, o.mul(z, s4)))), o.mul(o.mul(z, w), o.add(s5, o.mul(z, s6))))
        v = o.mul(z, x)
        inner = o.sub(o.mul(z, o.sub(o.mul(self.k(0.5), y), o.mul(v, r))), y)
        return o.sub(x, o.sub(inner, o.mul(v, s1)))

    def k_cos(self, x, y):
        o = self.o
        c1, c2, c3, c4, c5, c6 = (self.k(c) for c in COS_C)
        z = o.mul(x, x)
        w = o.mul(z, z)
        r = o.add(o.mul(z, o.add(c1, o.mul(z, o.add(c2, o.mul(z, c3))))),
                  o.mul(o.mul(w, w), o.add(c4, o.mul(z, o.add(c5, o.mul(z, c6))))))
        hz = o.mul(self.k(0.5), z)
        w = o.sub(self.k(1.0), hz)
        return o.add(w, o.add(o.sub(o.sub(self.k(1.0), w), hz), o.sub(o.mul(z, r), o.mul(x, y))))

    def trig_special(self, x, reduced, at_tiny):
        """`at_tiny` below 2^-27 (sign of zero kept); NaN for inf, NaN, and from 2^53 on, where
        the reduction would give a meaningless value (see the module's docstring)."""
        o = self.o
        return self.cases([(o.not_(o.lt(o.fabs(x), self.k(TRIG_LIMIT))), self.k(math.nan)),
                           (o.lt(o.fabs(x), self.k(2.0 ** -27)), at_tiny)], reduced)

    def finite_or_zero(self, x):
        o = self.o
        return o.fsel(o.lt(o.fabs(x), self.k(math.inf)), x, self.k(0.0))

    def sin_cos_quadrants(self, x, table):
        o = self.o
        y0, y1, n = self.reduce_pio2(self.finite_or_zero(x))
        s, c = self.k_sin(y0, y1), self.k_cos(y0, y1)
        values = {"s": s, "c": c, "-s": o.neg(s), "-c": o.neg(c)}
        out = values[table[0]]
        for q in (1, 2, 3):
            out = o.fsel(o.ieq(n, o.ci(q)), values[table[q]], out)
        return out

    def f_sin(self, x):
        return self.trig_special(x, self.sin_cos_quadrants(x, ("s", "c", "-s", "-c")), x)

    def f_cos(self, x):
        return self.trig_special(x, self.sin_cos_quadrants(x, ("c", "-s", "-c", "s")), self.k(1.0))

    def f_tan(self, x):
        o = self.o
        y0, y1, n = self.reduce_pio2(self.finite_or_zero(x))
        odd = o.ieq(o.iand(n, o.ci(1)), o.ci(1))
        return self.trig_special(x, self.k_tan(y0, y1, odd), x)

    def k_tan(self, x, y, odd):
        """tan(x + y) (odd: -1/tan(x + y)), |x + y| <~ pi/4 (fdlibm's __kernel_tan)."""
        o = self.o
        t = [self.k(c) for c in TAN_T]
        big = o.ge(o.fabs(x), self.k(from_words(0x3FE59428)))  # |x| >= 0.6744
        negative = o.lt(x, self.k(0.0))
        xb, yb = self.neg_if(negative, x), self.neg_if(negative, y)
        folded = o.add(o.sub(self.k(PIO4_HI), xb), o.sub(self.k(PIO4_LO), yb))  # pi/4 - |x|
        x = o.fsel(big, folded, x)
        y = o.fsel(big, self.k(0.0), y)
        z = o.mul(x, x)
        w = o.mul(z, z)
        r = self.poly(w, TAN_T[1::2])
        v = o.mul(z, self.poly(w, TAN_T[2::2]))
        s = o.mul(z, x)
        r = o.add(o.add(y, o.mul(z, o.add(o.mul(s, o.add(r, v)), y))), o.mul(s, t[0]))
        w = o.add(x, r)
        sign = o.fsel(odd, self.k(-1.0), self.k(1.0))
        v = o.sub(sign, o.mul(self.k(2.0), o.add(x, o.sub(r, o.div(o.mul(w, w), o.add(w, sign))))))
        at_big = self.neg_if(negative, v)
        # -1/(x + r) to within an ulp: a0 + a*(1 + a0*w0 + a0*v), a0 and w0 short
        w0 = self.clear_low(w)
        v = o.sub(r, o.sub(w0, x))
        a = o.div(self.k(-1.0), w)
        a0 = self.clear_low(a)
        at_odd = o.add(a0, o.mul(a, o.add(o.add(self.k(1.0), o.mul(a0, w0)), o.mul(a0, v))))
        return self.cases([(big, at_big), (odd, at_odd)], w)

    # ---- atan, atan2, asin, acos ---------------------------------------------------------------
    def f_atan(self, x):
        o = self.o
        ax = o.fabs(x)
        ones = self.k(1.0)
        regions = [  # (|x| below, reduced argument, atan_hi, atan_lo)
            (0.6875, o.div(o.sub(o.add(ax, ax), ones), o.add(self.k(2.0), ax)), 0),
            (1.1875, o.div(o.sub(ax, ones), o.add(ax, ones)), 1),
            (2.4375, o.div(o.sub(ax, self.k(1.5)), o.add(ones, o.mul(self.k(1.5), ax))), 2)]
        reduced, hi, lo = o.div(self.k(-1.0), ax), self.k(ATAN_HI[3]), self.k(ATAN_LO[3])
        for bound, arg, index in reversed(regions):
            below = o.lt(ax, self.k(bound))
            reduced = o.fsel(below, arg, reduced)
            hi = o.fsel(below, self.k(ATAN_HI[index]), hi)
            lo = o.fsel(below, self.k(ATAN_LO[index]), lo)
        small = o.lt(ax, self.k(0.4375))
        xr = o.fsel(small, x, reduced)
        z = o.mul(xr, xr)
        w = o.mul(z, z)
        s1 = o.mul(z, self.poly(w, ATAN_T[0::2]))
        s2 = o.mul(w, self.poly(w, ATAN_T[1::2]))
        tail = o.mul(xr, o.add(s1, s2))
        at_small = o.sub(xr, tail)
        at_reduced = self.neg_if(o.lt(x, self.k(0.0)), o.sub(hi, o.sub(o.sub(tail, lo), xr)))
        return self.cases([(o.isnan(x), x), (o.lt(ax, self.k(2.0 ** -27)), x),
                           (o.ge(ax, self.k(2.0 ** 66)), self.neg_if(o.lt(x, self.k(0.0)), self.k(ATAN_HI[3]))),
                           (small, at_small)], at_reduced)

    def f_atan2(self, y, x):
        o = self.o
        y_negative, x_negative = self.sign_bit(y), self.sign_bit(x)
        ax, ay = o.fabs(x), o.fabs(y)
        inf = self.k(math.inf)
        pi = self.k(PI)
        signed_pi = self.neg_if(y_negative, pi)
        half_pi = self.neg_if(y_negative, self.k(PI / 2))
        quarter = self.neg_if(y_negative, o.fsel(x_negative, self.k(3 * PI / 4), self.k(PI / 4)))
        x_inf_y_finite = o.fsel(x_negative, signed_pi, self.neg_if(y_negative, self.k(0.0)))
        ex, ey = o.ishr(self.high(ax), 20), o.ishr(self.high(ay), 20)  # biased exponents
        z = self.f_atan(o.fabs(o.div(y, x)))
        z = o.fsel(o.and_(x_negative, o.ilt(o.iadd(ey, o.ci(64)), ex)), self.k(0.0), z)
        general = o.fsel(x_negative, o.sub(pi, o.sub(z, self.k(PI_LO))), z)
        general = self.neg_if(y_negative, general)
        return self.cases([
            (o.or_(o.isnan(x), o.isnan(y)), o.add(x, y)),
            (o.eq(y, self.k(0.0)), o.fsel(x_negative, signed_pi, y)),
            (o.eq(x, self.k(0.0)), half_pi),
            (o.eq(ax, inf), o.fsel(o.eq(ay, inf), quarter, x_inf_y_finite)),
            (o.or_(o.eq(ay, inf), o.ilt(o.iadd(ex, o.ci(64)), ey)), half_pi)], general)

    def asin_ratio(self, z):
        o = self.o
        p = o.mul(z, self.poly(z, ASIN_P))
        return o.div(p, self.poly(z, ASIN_Q))

    def f_asin(self, x):
        o = self.o
        ax = o.fabs(x)
        inner = o.lt(ax, self.k(0.5))
        z = o.fsel(inner, o.mul(x, x), o.mul(o.sub(self.k(1.0), ax), self.k(0.5)))
        r = self.asin_ratio(z)
        s = o.sqrt(z)
        near_one = o.sub(self.k(PIO2_HI), o.sub(o.mul(self.k(2.0), o.add(s, o.mul(s, r))), self.k(PIO2_LO)))
        f = self.clear_low(s)
        c = o.div(o.sub(z, o.mul(f, f)), o.add(s, f))  # f + c = sqrt(z) to twice the precision
        middle = o.sub(self.k(0.5 * PIO2_HI),
                       o.sub(o.sub(o.mul(o.mul(self.k(2.0), s), r), o.sub(self.k(PIO2_LO), o.mul(self.k(2.0), c))),
                             o.sub(self.k(0.5 * PIO2_HI), o.mul(self.k(2.0), f))))
        outer = self.neg_if(o.lt(x, self.k(0.0)),
                            o.fsel(o.ge(ax, self.k(from_words(0x3FEF3333))), near_one, middle))
        return self.cases([(o.eq(ax, self.k(1.0)), o.mul(x, self.k(PIO2_HI))),
                           (o.not_(o.lt(ax, self.k(1.0))), self.k(math.nan)),
                           (o.lt(ax, self.k(2.0 ** -26)), x),
                           (inner, o.add(x, o.mul(x, r)))], outer)

    def f_acos(self, x):
        o = self.o
        ax = o.fabs(x)
        inner = o.lt(ax, self.k(0.5))
        negative = o.lt(x, self.k(0.0))
        z = o.fsel(inner, o.mul(x, x),
                   o.mul(o.fsel(negative, o.add(self.k(1.0), x), o.sub(self.k(1.0), x)), self.k(0.5)))
        r = self.asin_ratio(z)
        s = o.sqrt(z)
        at_inner = o.sub(self.k(PIO2_HI), o.sub(x, o.sub(self.k(PIO2_LO), o.mul(x, r))))
        w = o.sub(o.mul(r, s), self.k(PIO2_LO))
        at_negative = o.mul(self.k(2.0), o.sub(self.k(PIO2_HI), o.add(s, w)))
        df = self.clear_low(s)
        c = o.div(o.sub(z, o.mul(df, df)), o.add(s, df))
        at_positive = o.mul(self.k(2.0), o.add(df, o.add(o.mul(r, s), c)))
        return self.cases([(o.eq(x, self.k(1.0)), self.k(0.0)), (o.eq(x, self.k(-1.0)), self.k(2 * PIO2_HI)),
                           (o.not_(o.lt(ax, self.k(1.0))), self.k(math.nan)),
                           (inner, at_inner), (negative, at_negative)], at_positive)

    # ---- pow ------------------------------------------------------------------------------------
    def log2_extended(self, ax):
        """log2(ax) as t1 + t2 (t1 short), to ~2^-64 relative (fdlibm's pow, first half)."""
        o = self.o
        subnormal = o.lt(ax, self.k(from_words(0x00100000)))
        axs = o.fsel(subnormal, o.mul(ax, self.k(2.0 ** 53)), ax)
        ix = self.high(axs)
        n = o.iadd(o.isub(o.ishr(ix, 20), o.ci(0x3FF)), o.isel(subnormal, o.ci(-53), o.ci(0)))
        j = o.iand(ix, o.ci(0x000FFFFF))
        ix = o.ior(j, o.ci(0x3FF00000))
        above_sqrt3 = o.not_(o.ilt(j, o.ci(0xBB67A)))
        k1 = o.and_(o.ilt(o.ci(0x3988E), j), o.not_(above_sqrt3))  # sqrt(3/2) <= m < sqrt(3)
        n = o.iadd(n, o.isel(above_sqrt3, o.ci(1), o.ci(0)))
        ix = o.isub(ix, o.isel(above_sqrt3, o.ci(0x00100000), o.ci(0)))
        m = self.with_high(axs, ix)
        bp = o.fsel(k1, self.k(1.5), self.k(1.0))
        dp_h = o.fsel(k1, self.k(POW_DP_H), self.k(0.0))
        dp_l = o.fsel(k1, self.k(POW_DP_L), self.k(0.0))
        # ss = s_h + s_l = (m - bp) / (m + bp)
        u = o.sub(m, bp)
        v = o.div(self.k(1.0), o.add(m, bp))
        ss = o.mul(u, v)
        s_h = self.clear_low(ss)
        t_h = self.from_high(o.iadd(o.iadd(o.ior(o.ishr(ix, 1), o.ci(0x20000000)), o.ci(0x00080000)),
                                    o.isel(k1, o.ci(1 << 18), o.ci(0))))
        t_l = o.sub(m, o.sub(t_h, bp))
        s_l = o.mul(v, o.sub(o.sub(u, o.mul(s_h, t_h)), o.mul(s_h, t_l)))
        s2 = o.mul(ss, ss)
        r = o.mul(o.mul(s2, s2), self.poly(s2, POW_L))
        r = o.add(r, o.mul(s_l, o.add(s_h, ss)))
        s2 = o.mul(s_h, s_h)
        t_h = self.clear_low(o.add(o.add(self.k(3.0), s2), r))
        t_l = o.sub(r, o.sub(o.sub(t_h, self.k(3.0)), s2))
        u = o.mul(s_h, t_h)
        v = o.add(o.mul(s_l, t_h), o.mul(t_l, ss))
        p_h = self.clear_low(o.add(u, v))
        p_l = o.sub(v, o.sub(p_h, u))
        z_h = o.mul(self.k(POW_CP_H), p_h)
        z_l = o.add(o.add(o.mul(self.k(POW_CP_L), p_h), o.mul(p_l, self.k(POW_CP))), dp_l)
        t = o.i32_to_f(n)
        t1 = self.clear_low(o.add(o.add(o.add(z_h, z_l), dp_h), t))
        t2 = o.sub(z_l, o.sub(o.sub(o.sub(t1, t), dp_h), z_h))
        return t1, t2

    def log2_near_one(self, ax):
        """log2(ax) as t1 + t2 for |ax - 1| <= 2^-20, by log's series."""
        o = self.o
        t = o.sub(ax, self.k(1.0))
        w = o.mul(o.mul(t, t), o.sub(self.k(0.5), o.mul(t, o.sub(self.k(0.3333333333333333333333),
                                                                     o.mul(t, self.k(0.25))))))
        u = o.mul(self.k(POW_IVLN2_H), t)
        v = o.sub(o.mul(t, self.k(POW_IVLN2_L)), o.mul(w, self.k(POW_IVLN2)))
        t1 = self.clear_low(o.add(u, v))
        return t1, o.sub(v, o.sub(t1, u))

    def exp2_extended(self, p_h, p_l):
        """2^(p_h + p_l) for p_h + p_l within [-1075, 1024] (fdlibm's pow, second half)."""
        o = self.o
        z = o.add(p_l, p_h)
        half = o.fsel(o.lt(z, self.k(0.0)), self.k(-0.5), self.k(0.5))
        nf = o.fsel(o.gt(o.fabs(z), self.k(0.5)), o.trunc(o.add(z, half)), self.k(0.0))
        p_h = o.sub(p_h, nf)
        t = self.clear_low(o.add(p_l, p_h))
        u = o.mul(t, self.k(POW_LG2_H))
        v = o.add(o.mul(o.sub(p_l, o.sub(t, p_h)), self.k(POW_LG2)), o.mul(t, self.k(POW_LG2_L)))
        z = o.add(u, v)
        w = o.sub(v, o.sub(z, u))
        t = o.mul(z, z)
        t1 = o.sub(z, o.mul(t, self.poly(t, EXP_P)))
        r = o.sub(o.div(o.mul(z, t1), o.sub(t1, self.k(2.0))), o.add(w, o.mul(z, w)))
        z = o.sub(self.k(1.0), o.sub(r, z))
        return self.scale(z, o.to_i32(nf))

    def f_pow(self, x, y):
        o = self.o
        one, zero, inf = self.k(1.0), self.k(0.0), self.k(math.inf)
        ax, ay = o.fabs(x), o.fabs(y)
        x_negative = self.sign_bit(x)
        y_integer = o.eq(o.floor(y), y)
        half_y = o.mul(y, self.k(0.5))
        y_odd = o.and_(o.and_(y_integer, o.lt(ay, self.k(2.0 ** 53))), o.ne(o.floor(half_y), half_y))
        odd_negative = o.and_(x_negative, y_odd)
        y_positive = o.gt(y, zero)
        # the main path, on finite arguments standing in for the special ones
        regular = o.and_(o.lt(ax, inf), o.gt(ax, zero))
        axr = o.fsel(regular, ax, one)
        y_huge = o.gt(ay, self.k(2.0 ** 31))
        yr = o.fsel(o.lt(ay, self.k(2.0 ** 64)), y, zero)
        t1e, t2e = self.log2_extended(axr)
        t1n, t2n = self.log2_near_one(axr)
        t1, t2 = o.fsel(y_huge, t1n, t1e), o.fsel(y_huge, t2n, t2e)
        y1 = self.clear_low(yr)
        p_l = o.add(o.mul(o.sub(yr, y1), t1), o.mul(yr, t2))
        p_h = o.mul(y1, t1)
        z = o.add(p_l, p_h)
        overflow = o.or_(o.gt(z, self.k(1024.0)),
                         o.and_(o.eq(z, self.k(1024.0)), o.gt(o.add(p_l, self.k(POW_OVT)), o.sub(z, p_h))))
        underflow = o.or_(o.lt(z, self.k(-1075.0)),
                          o.and_(o.eq(z, self.k(-1075.0)), o.le(p_l, o.sub(z, p_h))))
        in_range = o.not_(o.or_(overflow, underflow))
        magnitude = self.exp2_extended(o.fsel(in_range, p_h, zero), o.fsel(in_range, p_l, zero))
        magnitude = self.cases([(overflow, inf), (underflow, zero)], magnitude)
        # |y| > 2^31 with x not within 2^-20 of 1, or |y| >= 2^64: certain overflow or underflow
        far_from_one = o.or_(o.lt(ax, self.k(from_words(0x3FEFFFFF))), o.ge(ax, self.k(from_words(0x3FF00001))))
        certain = o.or_(o.and_(y_huge, far_from_one), o.not_(o.lt(ay, self.k(2.0 ** 64))))
        grows = o.same(o.lt(ax, one), o.lt(y, zero))
        magnitude = o.fsel(certain, o.fsel(grows, inf, zero), magnitude)
        # x in {+-0, +-inf, +-1}: |x| or 1/|x|
        special = o.fsel(y_positive, ax, o.div(one, ax))
        exact = [(o.eq(y, one), x), (o.eq(y, self.k(-1.0)), o.div(one, x)), (o.eq(y, self.k(2.0)), o.mul(x, x)),
                 (o.and_(o.eq(y, self.k(0.5)), o.not_(x_negative)), o.sqrt(x))]
        return self.pow_cases(x, y, ax, ay, x_negative, y_integer, odd_negative, y_positive, special,
                              self.neg_if(odd_negative, magnitude), exact)

    def pow_cases(self, x, y, ax, ay, x_negative, y_integer, odd_negative, y_positive, special, general,
                  exact=()):
        """C99's special cases of pow around `general` (the result for regular arguments):
        `special` is |x| or 1/|x| for x in {+-0, +-inf, +-1}, signed for odd y, NaN for a
        negative x to a non-integer power; `exact` are further (condition, value) shortcuts
        taken before them. Shared by f64 pow and the CPU's f32 pow (llvm/inline_math.py)."""
        o = self.o
        one, zero, inf = self.k(1.0), self.k(0.0), self.k(math.inf)
        at_special_x = o.fsel(o.and_(x_negative, o.and_(o.eq(ax, one), o.not_(y_integer))), self.k(math.nan),
                              self.neg_if(odd_negative, special))
        special_x = o.or_(o.or_(o.eq(ax, zero), o.eq(ax, inf)), o.eq(ax, one))
        at_infinite_y = self.cases([(o.eq(ax, one), one), (o.gt(ax, one), o.fsel(y_positive, inf, zero))],
                                   o.fsel(y_positive, zero, inf))
        return self.cases([
            (o.eq(y, zero), one), (o.eq(x, one), one),
            (o.or_(o.isnan(x), o.isnan(y)), o.add(x, y)),
            (o.eq(ay, inf), at_infinite_y),
            *exact,
            (special_x, at_special_x),
            (o.and_(x_negative, o.not_(y_integer)), self.k(math.nan))], general)
