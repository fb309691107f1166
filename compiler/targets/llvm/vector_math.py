"""Transcendental functions as branch-free LLVM IR, for the CPU: the loop vectoriser widens a
loop that calls them (a call to the C math library's scalar functions keeps a loop scalar, and
llvmlite gives no way to point LLVM at a vector math library).

Each function is defined in the kernel's module on first use, `internal` and `alwaysinline`:
inlined into the loop body, it is plain arithmetic, integer bit operations and selects (every
case computed, the right one selected), which LLVM widens to `<8 x float>` and the like.

- f64: fdlibm's algorithms as compiler/targets/spirv/math64.py writes them against a small set
  of operations (`Float64Math`); `LlvmOps` implements those operations as LLVM IR. Within an
  ulp of the correctly rounded result, as there; sin, cos and tan give NaN from |x| >= 2^53
  (where Payne-Hanek reduction would be needed).
- f32: computed in double and rounded once. sin, cos and tan use FreeBSD's float kernels
  (__kernel_sindf, __kernel_cosdf, __kernel_tandf: double polynomials for float results)
  after a reduction by pi/2 that is exact for every float: Cody-Waite with a 25-bit part of
  pi/2 below 2^28, and above it x * 2/pi summed from 24-bit pieces of 2/pi, each product exact
  and reduced mod 4 (`_reduce_large_f32`). exp, log, tanh, pow, atan, atan2, asin, acos are
  the f64 functions on the widened argument.

No floating-point operation here carries fast-math flags (the error-free transformations need
IEEE rounding and no contraction); a fast_math kernel gets the same functions.
"""
from __future__ import annotations

import math

from llvmlite import ir as ll

from ..spirv.math64 import Float64Math

F32, F64 = ll.FloatType(), ll.DoubleType()
I1, I32, I64 = ll.IntType(1), ll.IntType(32), ll.IntType(64)
OPS = ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "pow", "atan2")
ARITY = {"pow": 2, "atan2": 2}
TWO_52 = 2.0 ** 52

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
# 2/pi in 24-bit pieces (k_rem_pio2.c's ipio2): 2/pi = sum(piece_j * 2^(-24 (j + 1))). A float
# has 24 significant bits, so its product with a piece is exact in double; from 2^28 up to the
# largest float, eight pieces leave at least 2^-80 of 2/pi's fraction bits beyond x's scale.
TWO_OVER_PI_24 = (0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041)


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
        """Both sides computed, each value selected: a branch would keep the loop scalar."""
        return tuple(self.fsel(cond, t, e) for t, e in zip(then(), otherwise()))

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


class Float32Trig:
    """sin, cos and tan of a float argument widened to double (see the module docstring)."""

    def __init__(self, ops: LlvmOps, math64: Float64Math):
        self.o, self.m = ops, math64

    def horner(self, x, coefficients):
        o = self.o
        acc = o.c(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = o.add(o.c(c), o.mul(x, acc))
        return acc

    def reduce(self, x):
        """(r, n): x = r + n pi/2 with |r| <~ pi/4 as a double, n mod 4 as an i32, for a finite x."""
        o = self.o
        medium = o.lt(o.fabs(x), o.c(F32_MEDIUM_LIMIT))
        fn = o.rint(o.mul(x, o.c(INV_PIO2)))
        r_medium = o.sub(o.sub(x, o.mul(fn, o.c(PIO2_25))), o.mul(fn, o.c(PIO2_25T)))
        r_large, n_large = self._reduce_large(x)
        r = o.fsel(medium, r_medium, r_large)
        n = o.fsel(medium, fn, n_large)
        quarter = o.mul(n, o.c(0.25))
        return r, o.to_i32(o.mul(o.sub(quarter, o.floor(quarter)), o.c(4.0)))

    def _reduce_large(self, x):
        """x * 2/pi mod 4 from its exact partial products x * piece_j * 2^(-24 (j + 1)): each
        is reduced mod 4 exactly (p - 4 rint(p / 4)), and the reduced terms summed with their
        rounding errors carried (Knuth's two-sum), so that a fraction close to a multiple of
        pi/2 keeps its digits."""
        o = self.o
        hi, lo = o.c(0.0), o.c(0.0)
        for j, piece in enumerate(TWO_OVER_PI_24):
            p = o.mul(x, o.c(piece * 2.0 ** (-24 * (j + 1))))
            t = o.sub(p, o.mul(o.c(4.0), o.rint(o.mul(p, o.c(0.25)))))
            hi, error = self.m.two_sum(hi, t)
            lo = o.add(lo, error)
        n = o.rint(hi)
        f = o.add(o.sub(hi, n), lo)  # hi - n is exact
        return o.mul(f, o.c(math.pi / 2)), n

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

    def k_tan(self, x, odd):
        """tan(x), or -1/tan(x) where `odd`."""
        o = self.o
        t0, t1, t2, t3, t4, t5 = (o.c(v) for v in TANF_T)
        z = o.mul(x, x)
        r = o.add(t4, o.mul(z, t5))
        t = o.add(t2, o.mul(z, t3))
        w = o.mul(z, z)
        s = o.mul(z, x)
        u = o.add(t0, o.mul(z, t1))
        r = o.add(o.add(x, o.mul(s, u)), o.mul(o.mul(s, w), o.add(t, o.mul(w, r))))
        return o.fsel(odd, o.div(o.c(-1.0), r), r)

    def by_quadrant(self, n, values):
        o = self.o
        out = values[0]
        for q in (1, 2, 3):
            out = o.fsel(o.ieq(n, o.ci(q)), values[q], out)
        return out

    def finite_case(self, x, value):
        """NaN for inf and NaN arguments (their reduction was done on 0)."""
        o = self.o
        return o.fsel(o.lt(o.fabs(x), o.c(math.inf)), value, o.c(math.nan))

    def sin(self, x):
        o = self.o
        r, n = self.reduce(self.m.finite_or_zero(x))
        s, c = self.k_sin(r), self.k_cos(r)
        return self.finite_case(x, self.by_quadrant(n, [s, c, o.neg(s), o.neg(c)]))

    def cos(self, x):
        o = self.o
        r, n = self.reduce(self.m.finite_or_zero(x))
        s, c = self.k_sin(r), self.k_cos(r)
        return self.finite_case(x, self.by_quadrant(n, [c, o.neg(s), o.neg(c), s]))

    def tan(self, x):
        o = self.o
        r, n = self.reduce(self.m.finite_or_zero(x))
        return self.finite_case(x, self.k_tan(r, o.ieq(o.iand(n, o.ci(1)), o.ci(1))))


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
    if bits == 32 and op in ("sin", "cos", "tan"):
        value = getattr(Float32Trig(ops, math64), op)(*args)
    else:
        value = math64(op, *args)
    b.ret(value if bits == 64 else b.fptrunc(value, F32))
    return fn
