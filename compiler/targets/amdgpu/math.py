"""Math for AMDGPU without ROCm's device libraries (ockl/ocml are not available to qdc).

LLVM's AMDGPU backend lowers sqrt, floor, ceil, rint and fabs of both widths, and sin, cos,
exp, log and pow of f32 (hardware v_sin/v_exp/v_log with the backend's range handling); every
other call it meets would be a libcall it cannot make (it stops compiling). So:
- intrinsics: sqrt, floor, ceil, round (rint), abs; f32 sin, cos, exp, log, pow;
- own code (this module): f32 tan, asin, acos, atan, atan2, tanh; every f64 function but the
  five portable ones. f64 exp/log/sin/cos are own range reductions and polynomials (Cody-Waite
  reduction for sin/cos: accurate to a few ulp for |x| up to ~1e5, degrading beyond); the
  rest are built from them: tan = sin/cos, atan by two argument reductions and its series,
  atan2/asin/acos from atan, tanh from a series expm1 near 0 and exp elsewhere, f64 pow =
  exp(y log|x|) with C's special cases (relative error grows with |y log x|, ~1e-14 for
  results within 1e±30).

`math_library(names, data_layout, triple)` is an LLVM module defining the own functions named
(`OWN[op](bits)`), which the AMDGPU code generator links into each kernel's module, as the
CUDA target links libdevice. The same module builds for the host, which is how the tests
compare these functions with numpy.
"""
from __future__ import annotations

import math

from llvmlite import ir as ll

I1, I32, I64 = ll.IntType(1), ll.IntType(32), ll.IntType(64)
INTRINSIC_F32 = ("sin", "cos", "exp", "log", "pow")
OWN_OPS = ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "pow", "atan2")


def own_name(op: str, bits: int) -> str:
    return f"__qdc_amdgcn_{op}_f{bits}"


def function_name(op: str, bits: int) -> str:
    """The function a kernel calls for `op` on `bits`-wide floats: an intrinsic or own code."""
    if bits == 32 and op in INTRINSIC_F32:
        return f"llvm.{op}.f32"
    return own_name(op, bits)


def _series_terms(bits: int, f64_terms: int, f32_terms: int) -> int:
    return f64_terms if bits == 64 else f32_terms


class MathEmitter:
    """Defines the own functions of one float width in `module`, each on first use."""

    def __init__(self, module: ll.Module, bits: int):
        self.module, self.bits = module, bits
        self.t = ll.DoubleType() if bits == 64 else ll.FloatType()

    # ---- helpers -------------------------------------------------------------------------------
    def c(self, v: float):
        return ll.Constant(self.t, v)

    def intrinsic(self, name: str, ret, args):
        fn = self.module.globals.get(name)
        return fn if fn is not None else ll.Function(self.module, ll.FunctionType(ret, args), name=name)

    def call(self, b, name: str, *args):
        suffix = "f64" if self.bits == 64 else "f32"
        return b.call(self.intrinsic(f"llvm.{name}.{suffix}", self.t, [self.t] * len(args)), list(args))

    def fn(self, op: str):
        """The function for `op` in this width: an intrinsic (f32 primitives) or own code."""
        name = function_name(op, self.bits)
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        if name.startswith("llvm."):
            return self.intrinsic(name, self.t, [self.t] * (2 if op in ("pow", "atan2") else 1))
        arity = 2 if op in ("pow", "atan2") else 1
        f = ll.Function(self.module, ll.FunctionType(self.t, [self.t] * arity), name=name)
        f.linkage = "linkonce_odr"
        b = ll.IRBuilder(f.append_basic_block("entry"))
        b.ret(getattr(self, "emit_" + op)(b, *f.args))
        return f

    def use(self, b, op: str, *args):
        return b.call(self.fn(op), list(args))

    def horner(self, b, x, coefficients):
        """c0 + x*(c1 + x*(c2 + ...))."""
        acc = self.c(coefficients[-1])
        for k in reversed(coefficients[:-1]):
            acc = b.fadd(b.fmul(acc, x), self.c(k))
        return acc

    def is_nan(self, b, x):
        return b.fcmp_unordered("uno", x, x)

    def select_all(self, b, cases, default):
        """The value of the first (condition, value) that holds, else `default`."""
        out = default
        for cond, value in reversed(cases):
            out = b.select(cond, value, out)
        return out

    def ldexp(self, b, x, k):
        suffix = "f64" if self.bits == 64 else "f32"
        fn = self.intrinsic(f"llvm.ldexp.{suffix}.i32", self.t, [self.t, I32])
        return b.call(fn, [x, k])

    def to_int(self, b, x, ty=I32):
        suffix = "f64" if self.bits == 64 else "f32"
        fn = self.intrinsic(f"llvm.fptosi.sat.i{ty.width}.{suffix}", ty, [self.t])
        return b.call(fn, [x])

    # ---- f64 primitives (f32 ones are intrinsics) ----------------------------------------------
    def emit_exp(self, b, x):
        """e^x = 2^k e^r, k = rint(x / ln 2), |r| <= ln2 / 2, e^r by its Taylor series."""
        lo, hi = -746.0 if self.bits == 64 else -104.0, 710.0 if self.bits == 64 else 89.0
        xc = self.call(b, "maxnum", self.call(b, "minnum", x, self.c(hi)), self.c(lo))
        k = self.call(b, "rint", b.fmul(xc, self.c(1 / math.log(2))))
        r = b.fsub(b.fsub(xc, b.fmul(k, self.c(6.93147180369123816490e-01))), b.fmul(k, self.c(1.90821492927058770002e-10)))
        terms = _series_terms(self.bits, 14, 8)
        p = self.horner(b, r, [1 / math.factorial(n) for n in range(terms)])
        ki = self.to_int(b, k)
        half = b.ashr(ki, ll.Constant(I32, 1))  # two steps: neither overflows before the result does
        y = self.ldexp(b, self.ldexp(b, p, half), b.sub(ki, half))
        return self.select_all(b, [(self.is_nan(b, x), x), (b.fcmp_ordered(">", x, self.c(hi)), self.c(math.inf)),
                                   (b.fcmp_ordered("<", x, self.c(lo)), self.c(0.0))], y)

    def emit_log(self, b, x):
        """x = m 2^e, m in [sqrt(1/2), sqrt(2)): log x = e ln 2 + 2 atanh(s), s = (m-1)/(m+1)."""
        suffix = "f64" if self.bits == 64 else "f32"
        pair = ll.LiteralStructType([self.t, I32])
        frexp = self.intrinsic(f"llvm.frexp.{suffix}.i32", pair, [self.t])
        both = b.call(frexp, [x])
        m, e = b.extract_value(both, 0), b.extract_value(both, 1)
        small = b.fcmp_ordered("<", m, self.c(math.sqrt(0.5)))
        m = b.select(small, b.fmul(m, self.c(2.0)), m)
        e = b.select(small, b.sub(e, ll.Constant(I32, 1)), e)
        f = b.fsub(m, self.c(1.0))
        s = b.fdiv(f, b.fadd(f, self.c(2.0)))
        s2 = b.fmul(s, s)
        terms = _series_terms(self.bits, 13, 6)
        series = b.fmul(b.fmul(self.c(2.0), s), self.horner(b, s2, [1 / (2 * n + 1) for n in range(terms)]))
        ef = b.sitofp(e, self.t)
        y = b.fadd(b.fmul(ef, self.c(6.93147180369123816490e-01)),
                   b.fadd(series, b.fmul(ef, self.c(1.90821492927058770002e-10))))
        return self.select_all(b, [(b.fcmp_unordered("!=", x, x), x), (b.fcmp_ordered("<", x, self.c(0.0)),
                                   self.c(math.nan)), (b.fcmp_ordered("==", x, self.c(0.0)), self.c(-math.inf)),
                                   (b.fcmp_ordered("==", x, self.c(math.inf)), x)], y)

    def _quadrant(self, b, x):
        """(r, q): x = r + q pi/2 (Cody-Waite, three parts of pi/2), |r| <= pi/4, q mod 4."""
        k = self.call(b, "rint", b.fmul(x, self.c(2 / math.pi)))
        r = x
        for part in (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21):
            r = b.fsub(r, b.fmul(k, self.c(part)))
        q = b.and_(self.to_int(b, k, I64), ll.Constant(I64, 3))
        return r, q

    def _sin_cos_core(self, b, r):
        r2 = b.fmul(r, r)
        n = _series_terms(self.bits, 10, 6)
        sin = b.fmul(r, self.horner(b, r2, [(-1) ** j / math.factorial(2 * j + 1) for j in range(n)]))
        cos = self.horner(b, r2, [(-1) ** j / math.factorial(2 * j) for j in range(n)])
        return sin, cos

    def _by_quadrant(self, b, q, values):
        out = values[0]
        for i in (1, 2, 3):
            out = b.select(b.icmp_unsigned("==", q, ll.Constant(I64, i)), values[i], out)
        return out

    def emit_sin(self, b, x):
        r, q = self._quadrant(b, x)
        s, c = self._sin_cos_core(b, r)
        return self._by_quadrant(b, q, [s, c, b.fneg(s), b.fneg(c)])

    def emit_cos(self, b, x):
        r, q = self._quadrant(b, x)
        s, c = self._sin_cos_core(b, r)
        return self._by_quadrant(b, q, [c, b.fneg(s), b.fneg(c), s])

    # ---- composed (both widths) ----------------------------------------------------------------
    def emit_tan(self, b, x):
        return b.fdiv(self.use(b, "sin", x), self.use(b, "cos", x))

    def atan_unit(self, b, t):
        """atan(t) for t in [0, 1] (or NaN): reduced past tan(pi/12) by atan(t) = pi/6 +
        atan((t sqrt3 - 1) / (t + sqrt3)), then the alternating series."""
        sqrt3 = math.sqrt(3.0)
        far = b.fcmp_ordered(">", t, self.c(2 - sqrt3))
        u = b.select(far, b.fdiv(b.fsub(b.fmul(t, self.c(sqrt3)), self.c(1.0)), b.fadd(t, self.c(sqrt3))), t)
        terms = _series_terms(self.bits, 15, 7)
        series = b.fmul(u, self.horner(b, b.fmul(u, u), [(-1) ** n / (2 * n + 1) for n in range(terms)]))
        return b.fadd(b.select(far, self.c(math.pi / 6), self.c(0.0)), series)

    def emit_atan(self, b, x):
        a = self.call(b, "fabs", x)
        inverted = b.fcmp_ordered(">", a, self.c(1.0))
        r = self.atan_unit(b, b.select(inverted, b.fdiv(self.c(1.0), a), a))
        r = b.select(inverted, b.fsub(self.c(math.pi / 2), r), r)
        return self.call(b, "copysign", r, x)

    def emit_atan2(self, b, y, x):
        ax, ay = self.call(b, "fabs", x), self.call(b, "fabs", y)
        big, small = self.call(b, "maxnum", ax, ay), self.call(b, "minnum", ax, ay)
        both_inf = b.and_(b.fcmp_ordered("==", ax, self.c(math.inf)), b.fcmp_ordered("==", ay, self.c(math.inf)))
        t = self.select_all(b, [(b.fcmp_ordered("==", big, self.c(0.0)), self.c(0.0)), (both_inf, self.c(1.0))],
                            b.fdiv(small, big))
        r = self.atan_unit(b, t)
        r = b.select(b.fcmp_ordered(">", ay, ax), b.fsub(self.c(math.pi / 2), r), r)
        x_negative = b.icmp_signed("<", b.bitcast(x, ll.IntType(self.bits)), ll.Constant(ll.IntType(self.bits), 0))
        r = b.select(x_negative, b.fsub(self.c(math.pi), r), r)
        r = self.call(b, "copysign", r, y)
        return b.select(b.or_(self.is_nan(b, x), self.is_nan(b, y)), b.fadd(x, y), r)

    def _one_minus_square_root(self, b, x):
        return self.call(b, "sqrt", b.fmul(b.fsub(self.c(1.0), x), b.fadd(self.c(1.0), x)))

    def emit_asin(self, b, x):
        return self.use(b, "atan2", x, self._one_minus_square_root(b, x))

    def emit_acos(self, b, x):
        return self.use(b, "atan2", self._one_minus_square_root(b, x), x)

    def emit_tanh(self, b, x):
        """Near 0, e/(e+2) with e = expm1(2|x|) by its series; elsewhere 1 - 2/(e^{2|x|}+1)."""
        a = self.call(b, "fabs", x)
        u = b.fmul(a, self.c(2.0))
        terms = _series_terms(self.bits, 22, 12)
        expm1 = b.fmul(u, self.horner(b, u, [1 / math.factorial(n + 1) for n in range(terms)]))
        near = b.fdiv(expm1, b.fadd(expm1, self.c(2.0)))
        far = b.fsub(self.c(1.0), b.fdiv(self.c(2.0), b.fadd(self.use(b, "exp", u), self.c(1.0))))
        r = b.select(b.fcmp_ordered("<", a, self.c(0.625)), near, far)
        return self.call(b, "copysign", r, x)

    def emit_pow(self, b, x, y):
        """exp(y log|x|) with C's cases: a negative finite x needs an integer y (its parity gives
        the sign), y == 0 or x == 1 give 1, (-1)^(+-inf) is 1."""
        ax = self.call(b, "fabs", x)
        r = self.use(b, "exp", b.fmul(y, self.use(b, "log", ax)))
        integer = b.fcmp_ordered("==", self.call(b, "floor", y), y)
        half = b.fmul(y, self.c(0.5))
        odd = b.and_(integer, b.fcmp_ordered("!=", self.call(b, "floor", half), half))
        sign_bit = b.icmp_signed("<", b.bitcast(x, ll.IntType(self.bits)), ll.Constant(ll.IntType(self.bits), 0))
        r = b.select(b.and_(sign_bit, odd), b.fneg(r), r)
        negative = b.and_(b.fcmp_ordered("<", x, self.c(0.0)), b.fcmp_ordered("!=", x, self.c(-math.inf)))
        one = self.c(1.0)
        return self.select_all(b, [
            (b.fcmp_ordered("==", y, self.c(0.0)), one), (b.fcmp_ordered("==", x, one), one),
            (b.and_(b.fcmp_ordered("==", ax, one), b.fcmp_ordered("==", self.call(b, "fabs", y), self.c(math.inf))),
             one),
            (b.and_(negative, b.and_(b.xor(integer, ll.Constant(I1, 1)),
                                     b.fcmp_ordered("!=", self.call(b, "fabs", y), self.c(math.inf)))),
             self.c(math.nan))], r)


def math_library(names, data_layout: str = "", triple: str = "") -> ll.Module:
    """A module defining the own functions among `names` (and those they call)."""
    module = ll.Module(name="qdc_amdgcn_math")
    module.triple, module.data_layout = triple, data_layout
    emitters = {bits: MathEmitter(module, bits) for bits in (32, 64)}
    for name in sorted(names):
        for op in OWN_OPS:
            for bits in (32, 64):
                if name == own_name(op, bits):
                    emitters[bits].fn(op)
    return module
