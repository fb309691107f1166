"""Scalar values in the LLVM lowering (a mixin of llvm_ir._Env): arithmetic, comparisons,
conversions and math, with the semantics the SPIR-V lowering matches (spirv/arith.py): Python's
floor division and modulo, integer division by zero giving 0, shifts masked to the width,
saturating float -> int conversion, integer powers. It is apart from llvm_ir.py, which lowers
the kernel's structure (tasks, loops, memory, bounds checks): a reader of one operator's
lowering needs none of that.

Which math table a float function comes from depends on the loops around it: a loop whose
iterations hand a float on (`carries_state`) runs the target's `chain_math_table` where it has
one (llvm/target.py).
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from ..base import Unsupported
from .llvm_types import FLOAT_BITS, I1, float_suffix, lltype
from .target import MATH_ARITY

_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def carries_state(loop: ir.Stmt) -> bool:
    """Whether `loop`'s iterations hand a float on to the next: a float local declared outside
    the loop that its body both reads and writes, or an adstack it pushes to or pops from
    (reverse mode). LLVM vectorises no such loop (a float recurrence is not reassociable), so
    its math is bound by latency, where the target's scalar library may do better
    (`chain_math_table`)."""
    found: dict = {}
    find_state_carriers(loop, found)
    return found[loop]


def find_state_carriers(loop: ir.Stmt, found: dict) -> tuple:
    """carries_state of `loop` and of every loop nested in it into `found`, in one walk of the
    nest; returns what decides it for `loop`: (whether an adstack is pushed or popped, the locals
    declared, the float locals read, the float locals written) anywhere inside it."""
    stacks, declared, read, written = False, set(), set(), set()
    todo = list(loop.blocks())
    while todo:
        for s in todo.pop().stmts:
            if isinstance(s, (ir.RangeFor, ir.While)):
                inner = find_state_carriers(s, found)
                stacks |= inner[0]
                declared |= inner[1]
                read |= inner[2]
                written |= inner[3]
                continue
            if isinstance(s, (ir.AdStackPush, ir.AdStackPop)):
                stacks = True
            elif isinstance(s, (ir.Alloca, ir.LocalArray)):
                declared.add(s)
            elif isinstance(s, ir.LocalLoad) and s.var.type.is_float:
                read.add(s.var)
            elif isinstance(s, ir.LocalStore) and s.var.type.is_float:
                written.add(s.var)
            elif isinstance(s, (ir.ArrayLoad, ir.ArrayStore)) and s.array.type.is_float:
                (read if isinstance(s, ir.ArrayLoad) else written).add(s.array)
            if s.BLOCKS:
                todo.extend(s.blocks())
    found[loop] = stacks or bool((read & written) - declared)
    return stacks, declared, read, written


class ArithLowering:
    def s_Cast(self, s):
        return convert(self.b, self.mb, self.v(s.x), s.x.type, s.type)

    def s_Select(self, s):
        return self.b.select(self.v(s.cond), self.v(s.a), self.v(s.b))

    def s_Unary(self, s):
        b, x, t = self.b, self.v(s.x), s.type
        op = s.op
        if op == "neg":
            return b.fneg(x, flags=self.flags) if t.is_float else b.neg(x)
        if op == "not":
            return b.xor(x, ll.Constant(I1, 1))
        if op == "bit_not":
            return b.not_(x)
        if op == "abs" and not t.is_float:
            if t.kind == "uint" or t is T.u1:
                return x
            return b.select(b.icmp_signed("<", x, ll.Constant(x.type, 0)), b.neg(x), x)
        if t is T.f16:  # compute half-precision math in f32
            wide = b.fpext(x, ll.FloatType())
            r = self.float_unary(op, wide)
            return b.fptrunc(r, ll.HalfType())
        return self.float_unary(op, x)

    def float_unary(self, op, x):
        if op == "rsqrt":
            return self.b.fdiv(ll.Constant(x.type, 1.0), self.math("sqrt", x), flags=self.flags)
        return self.math(op, x)

    def math(self, op: str, *args):
        """`op` applied to float `args`, as the target's math table implements it."""
        target = self.cg.target
        table = target.chain_math_table if target.chain_math_table and self.in_chain() else target.math_table
        impl = table.get(op)
        if impl is None or MATH_ARITY.get(op) != len(args):
            raise Unsupported(f"'{op}' of {FLOAT_BITS[str(args[0].type)]}-bit floats is not available on "
                              f"target '{self.cg.target.arch}'")
        return self.b.call(self.mb.math(impl, args[0].type, len(args)), list(args))

    def in_chain(self) -> bool:
        """Whether a loop around the statement being lowered carries state (carries_state), worked
        out only where math is lowered, for a whole nest at once: walking every loop's nest as it
        is entered costs a deep kernel the square of its nesting."""
        for loop in reversed(self.enclosing_loops):
            if loop not in self.carrying:
                find_state_carriers(loop, self.carrying)
            if self.carrying[loop]:
                return True
        return False

    def s_Binary(self, s):
        b, x, y, t = self.b, self.v(s.a), self.v(s.b), s.a.type
        op = s.op
        if op in ir.COMPARISONS:
            if t.is_float:
                return b.fcmp_unordered("!=", x, y) if op == "ne" else b.fcmp_ordered(_FCMP[op], x, y)
            cmp = b.icmp_signed if t.kind == "int" else b.icmp_unsigned
            return cmp(_FCMP[op], x, y)
        if t.is_float:
            return self.float_binary(op, x, y, t)
        return self.int_binary(op, x, y, t)

    def float_binary(self, op, x, y, t):
        b, f = self.b, self.flags
        if t is T.f16 and op in ("pow", "atan2", "mod", "floordiv"):
            fx, fy = b.fpext(x, ll.FloatType()), b.fpext(y, ll.FloatType())
            return b.fptrunc(self.float_binary(op, fx, fy, T.f32), ll.HalfType())
        if op == "add":
            return b.fadd(x, y, flags=f)
        if op == "sub":
            return b.fsub(x, y, flags=f)
        if op == "mul":
            return b.fmul(x, y, flags=f)
        if op == "truediv":
            return b.fdiv(x, y, flags=f)
        if op in ("floordiv", "mod"):
            return self.float_divmod(x, y)[op == "mod"]
        if op in ("min", "max"):
            fn = self.mb.declare(f"llvm.{op}num.{float_suffix(x.type)}", x.type, [x.type, x.type])
            return b.call(fn, [x, y])
        if op in ("pow", "atan2"):
            return self.math(op, x, y)
        raise Unsupported(f"no LLVM lowering of float operator '{op}'")

    def float_divmod(self, x, y):
        """(x // y, x % y) exactly as Python (and numpy) compute them for floats: the remainder
        takes the divisor's sign and the quotient is the exact floor, e.g. 1.0 // 0.1 == 9.0
        (floor(1.0 / 0.1) would give 10). Division by zero gives numpy's inf/nan."""
        b, t = self.b, x.type
        zero, one = ll.Constant(t, 0.0), ll.Constant(t, 1.0)
        copysign = self.mb.declare(f"llvm.copysign.{float_suffix(t)}", t, [t, t])
        # the exact remainder: a target whose backend expands LLVM's frem inexactly maps "frem" to a function
        mod = self.math("frem", x, y) if "frem" in self.cg.target.math_table else b.frem(x, y)
        div = b.fdiv(b.fsub(x, mod), y)
        adjust = b.and_(b.fcmp_ordered("!=", mod, zero),
                        b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", mod, zero)))
        mod_adj = b.select(adjust, b.fadd(mod, y), mod)
        div = b.select(adjust, b.fsub(div, one), div)
        mod = b.select(b.fcmp_ordered("==", mod, zero), b.call(copysign, [zero, y]), mod_adj)
        floor = self.math("floor", div)
        quot = b.select(b.fcmp_ordered(">", b.fsub(div, floor), ll.Constant(t, 0.5)), b.fadd(floor, one), floor)
        quot = b.select(b.fcmp_ordered("==", div, zero), b.call(copysign, [zero, b.fdiv(x, y)]), quot)
        quot = b.select(b.fcmp_ordered("==", y, zero), b.fdiv(x, y), quot)
        return quot, mod

    def int_binary(self, op, x, y, t):
        b = self.b
        signed = t.kind == "int"
        ty = x.type
        zero, one = ll.Constant(ty, 0), ll.Constant(ty, 1)
        if op == "add":
            return b.add(x, y)
        if op == "sub":
            return b.sub(x, y)
        if op == "mul":
            return b.mul(x, y)
        if op in ("bit_and", "bit_or", "bit_xor"):
            return {"bit_and": b.and_, "bit_or": b.or_, "bit_xor": b.xor}[op](x, y)
        if op in ("shl", "shr"):
            amount = b.and_(y, ll.Constant(ty, ty.width - 1))  # never poison: x86 masks the same way
            if op == "shl":
                return b.shl(x, amount)
            return b.ashr(x, amount) if signed else b.lshr(x, amount)
        if op in ("min", "max"):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", x, y), x, y)
        if op in ("floordiv", "mod"):
            # Division by zero gives 0 and INT_MIN // -1 wraps, instead of trapping the process.
            y_zero = b.icmp_unsigned("==", y, zero)
            safe_y = b.select(y_zero, one, y)
            if signed:
                overflow = b.and_(b.icmp_signed("==", y, ll.Constant(ty, -1)),
                                  b.icmp_signed("==", x, ll.Constant(ty, -(1 << (ty.width - 1)))))
                safe_y = b.select(overflow, one, safe_y)
                q, r = b.sdiv(x, safe_y), b.srem(x, safe_y)
                adjust = b.and_(b.icmp_signed("!=", r, zero),
                                b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", safe_y, zero)))
                if op == "floordiv":
                    out = b.select(adjust, b.sub(q, one), q)
                    out = b.select(overflow, x, out)
                else:
                    out = b.select(adjust, b.add(r, safe_y), r)
                    out = b.select(overflow, zero, out)
            else:
                out = b.udiv(x, safe_y) if op == "floordiv" else b.urem(x, safe_y)
            return b.select(y_zero, zero, out)
        if op == "pow":
            return b.call(self.ipow_fn(ty, signed), [x, y])
        raise Unsupported(f"no LLVM lowering of integer operator '{op}'")

    def ipow_fn(self, ty, signed):
        name = f"qdc_ipow_{'i' if signed else 'u'}{ty.width}"
        fn = self.mb.module.globals.get(name)
        if fn is not None:
            return fn
        fn = ll.Function(self.mb.module, ll.FunctionType(ty, [ty, ty]), name=name)
        fn.linkage = "internal"
        base, exp = fn.args
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        loop = fn.append_basic_block("loop")
        done = fn.append_basic_block("done")
        entry = b.block
        b.branch(loop)
        b.position_at_end(loop)
        r = b.phi(ty)
        bb = b.phi(ty)
        e = b.phi(ty)
        r.add_incoming(ll.Constant(ty, 1), entry)
        bb.add_incoming(base, entry)
        e.add_incoming(exp, entry)
        odd = b.trunc(e, I1)
        r2 = b.select(odd, b.mul(r, bb), r)
        e2 = b.lshr(e, ll.Constant(ty, 1))
        bb2 = b.mul(bb, bb)
        r.add_incoming(r2, loop)
        bb.add_incoming(bb2, loop)
        e.add_incoming(e2, loop)
        cond = b.icmp_signed(">", e2, ll.Constant(ty, 0)) if signed else b.icmp_unsigned(">", e2, ll.Constant(ty, 0))
        b.cbranch(cond, loop, done)
        b.position_at_end(done)
        if signed:  # x ** -k truncated toward zero, like int(x ** -k) in Python: only |x| == 1 survives
            def c(v):
                return ll.Constant(ty, v)
            sign = b.select(b.trunc(exp, I1), c(-1), c(1))
            inverse = b.select(b.icmp_signed("==", base, c(1)), c(1),
                               b.select(b.icmp_signed("==", base, c(-1)), sign, c(0)))
            r2 = b.select(b.icmp_signed("<", exp, c(0)), inverse, r2)
        b.ret(r2)
        return fn


def convert(b: ll.IRBuilder, mb, v, src: T.DataType, dst: T.DataType):
    """Value conversion with C semantics, except float→int saturates (never poison); `mb` is the
    kernel's llvm_ir.ModuleBuilder, which declares the intrinsics."""
    if src is dst:
        return v
    dt = lltype(dst)
    if dst is T.u1:
        if src.is_float:
            return b.fcmp_unordered("!=", v, ll.Constant(v.type, 0.0))
        return b.icmp_unsigned("!=", v, ll.Constant(v.type, 0))
    if src.is_float and dst.is_float:
        return b.fpext(v, dt) if dst.bits > src.bits else b.fptrunc(v, dt)
    if src.is_float:
        kind = "fptosi" if dst.kind == "int" else "fptoui"
        fn = mb.declare(f"llvm.{kind}.sat.i{dst.bits}.{float_suffix(v.type)}", dt, [v.type])
        return b.call(fn, [v])
    if dst.is_float:
        return b.uitofp(v, dt) if src.kind in ("uint", "bool") else b.sitofp(v, dt)
    if dst.bits > src.bits:
        return b.sext(v, dt) if src.kind == "int" else b.zext(v, dt)
    if dst.bits < src.bits:
        return b.trunc(v, dt)
    return v
