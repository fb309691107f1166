"""The operations fdlibm's algorithms (compiler/targets/fdlibm.py, `Float64Math`) are written
against, as LLVM IR: what the inline math of inline_math.py (f64) and inline_math_f32.py (f32)
is built from."""
from __future__ import annotations

from llvmlite import ir as ll

F32, F64 = ll.FloatType(), ll.DoubleType()
I1, I32, I64 = ll.IntType(1), ll.IntType(32), ll.IntType(64)
TWO_52 = 2.0 ** 52


class LlvmOps:
    """Float64Math's operations as LLVM IR at `builder`: values are f64, i32, i64 or i1.

    rint, floor and trunc are exact add-and-subtract-2^52 sequences rather than LLVM's
    intrinsics, which x86 CPUs without SSE4.1 (the portable baseline level) lower to libm calls."""

    INTEGERS_FROM = TWO_52  # the values from which on every one is an integer

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
        """Round half to even: |a| + 2^52 - 2^52 rounds |a| < 2^52 to an integer (2^23 in float);
        from there on (and for inf and NaN) a is its own value."""
        m, limit = self.fabs(a), self.c(self.INTEGERS_FROM)
        rounded = self.copysign(self.sub(self.add(m, limit), limit), a)
        return self.fsel(self.lt(m, limit), rounded, a)

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
