"""Atomic read-modify-writes in the shared LLVM lowering (a mixin of llvm_ir._Env): LLVM's
`atomicrmw` where it has the operation, a compare-and-swap loop for multiplication, and a plain
load and store where the thread is known at run time to run alone (`_Env.alone`)."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from .llvm_types import I8, float_suffix, lltype


def atomic_operation(op: str, t: T.DataType) -> str:
    """The `atomicrmw` operation of the language's atomic `op` on a `t` (not "mul": no target has one)."""
    if op == "xchg":
        return "xchg"
    if t.is_float:
        return {"add": "fadd", "sub": "fsub", "min": "fmin", "max": "fmax"}[op]
    return {"add": "add", "sub": "sub", "and": "and", "or": "or", "xor": "xor",
            "min": "min" if t.kind == "int" else "umin", "max": "max" if t.kind == "int" else "umax"}[op]


class AtomicLowering:
    def s_AtomicRMW(self, s):
        if s in self.cg.plain_updates:
            return self.read_modify_write(s.op, self.v(s.ptr), self.v(s.value), s.type)
        return self.atomic_rmw(s.op, self.v(s.ptr), s.value, s.type)

    def s_TempAtomic(self, s):
        """A kernel-scope local updated by every iteration of a parallel task: the same
        `atomicrmw` as on a global, at the temporary's address."""
        return self.atomic_rmw(s.op, self.temp_ptr(s.slot), s.value, s.type)

    def atomic_rmw(self, op: str, ptr, value: ir.Stmt, t: T.DataType):
        return self.atomic_update(op, ptr, self.v(value), t)

    def atomic_update(self, op: str, ptr, v, t: T.DataType):
        """`*ptr = op(*ptr, v)` atomically; the old value. Where `alone` holds at run time (a CPU
        chunk that one thread runs while no other runs any code of the launch), a plain load and
        store instead: x86 has no floating-point atomic add, and the compare-and-swap loop that
        stands for one costs ~20 cycles even uncontended (most of a particle-to-grid scatter)."""
        b = self.b
        if t is T.u1:
            v = b.zext(v, I8)
        if self.alone is None:
            old = self.atomic_instruction(op, ptr, v, t)
        else:
            with b.if_else(self.alone) as (plain, atomic):
                with plain:
                    plain_old, plain_end = self.read_modify_write(op, ptr, v, t), b.block
                with atomic:
                    atomic_old, atomic_end = self.atomic_instruction(op, ptr, v, t), b.block
            old = b.phi(plain_old.type)
            old.add_incoming(plain_old, plain_end)
            old.add_incoming(atomic_old, atomic_end)
        return b.icmp_unsigned("!=", old, ll.Constant(I8, 0)) if t is T.u1 else old

    def atomic_instruction(self, op: str, ptr, v, t: T.DataType):
        if op == "mul":
            return self.multiply_atomically(ptr, v, t)
        return self.b.atomic_rmw(atomic_operation(op, t), ptr, v, "monotonic")

    def read_modify_write(self, op: str, ptr, v, t: T.DataType):
        """What `atomic_instruction` does, for a thread that runs alone."""
        b = self.b
        old = b.load(ptr, typ=v.type, align=max(t.nbytes, 1))
        name = op if op == "mul" else atomic_operation(op, t)
        if name == "xchg":
            new = v
        elif name in ("fmin", "fmax", "min", "max", "umin", "umax"):
            intrinsic = {"fmin": "minnum", "fmax": "maxnum", "min": "smin", "max": "smax"}.get(name, name)
            suffix = float_suffix(v.type) if t.is_float else f"i{v.type.width}"
            new = b.call(self.mb.declare(f"llvm.{intrinsic}.{suffix}", v.type, [v.type, v.type]), [old, v])
        elif t.is_float:
            new = {"fadd": b.fadd, "fsub": b.fsub, "mul": b.fmul}[name](old, v)
        else:
            new = {"add": b.add, "sub": b.sub, "mul": b.mul, "and": b.and_, "or": b.or_, "xor": b.xor}[name](old, v)
        b.store(new, ptr, align=max(t.nbytes, 1))
        return old

    def multiply_atomically(self, ptr, x, t: T.DataType):
        """`*ptr *= x` as a compare-and-swap loop on the element's bits (no target has a
        multiplying `atomicrmw`); integers wrap. The old value."""
        b = self.b
        bits = ll.IntType(t.bits)
        first = b.load_atomic(ptr, "monotonic", t.nbytes, typ=bits)
        entry = b.block
        loop = b.append_basic_block("atomic_mul.retry")
        done = b.append_basic_block("atomic_mul.done")
        b.branch(loop)
        b.position_at_end(loop)
        expected = b.phi(bits)
        expected.add_incoming(first, entry)
        if t.is_float:
            product = b.bitcast(b.fmul(b.bitcast(expected, lltype(t)), x), bits)
        else:
            product = b.mul(expected, x)
        pair = b.cmpxchg(ptr, expected, product, "monotonic", "monotonic")
        seen = b.extract_value(pair, 0)
        expected.add_incoming(seen, b.block)
        b.cbranch(b.extract_value(pair, 1), done, loop)
        b.position_at_end(done)
        return b.bitcast(expected, lltype(t)) if t.is_float else expected
