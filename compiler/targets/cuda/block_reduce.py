"""chunk_final's atomics as block reductions: warp shuffles, shared memory, one atomic per block.

The thread-local reduction pass (compiler/passes/reductions.py) gives every grid-stride thread
a partial (`acc`) and ends its chunk with `atomic op(ptr, acc)`. On a GPU that is still one
atomic per thread on one address. Here each such atomic becomes

    x = warp_reduce(acc)                       5 butterfly shuffles (shfl.sync.bfly)
    if lane == 0: shared[warp] = x
    bar.sync
    if warp == 0:
        y = warp_reduce(lane < warps ? shared[lane] : identity)
        if lane == 0: atomic op(ptr, y)        one atomic per block

Every thread of the block must get there (the shuffles name all 32 lanes, the barrier every
thread), so the chunk's final block runs in every thread, also those whose chunk was empty:
their accumulator still holds the identity of the combination. A block whose size is not a
multiple of 32 has a partial warp, for which full-mask shuffles are undefined: it keeps one
atomic per thread (the branch is uniform across the block: it depends on blockDim only).
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from ..llvm.llvm_ir import _ChunkEnv
from ..llvm.llvm_types import I32, I64, lltype

WARP = 32
FULL_MASK = 0xFFFFFFFF
_SHARED = 3  # NVPTX address space of __shared__ memory


def flushable(task: ir.Task) -> bool:
    """Whether `task.chunk_final` only flushes partials (what the reduction pass puts there):
    then it may run in threads with empty chunks, and its atomics may be block reductions."""
    uses = ir.users_count(task.chunk_final)
    for s in task.chunk_final.stmts:
        if isinstance(s, (ir.AtomicRMW, ir.TempAtomic)):
            if uses.get(s):
                return False
        elif not isinstance(s, (ir.LocalLoad, ir.GlobalPtr, ir.Const)) and not s.PURE:
            return False
    return True


def _reducible(op: str, t: T.DataType) -> bool:
    return op in ("add", "min", "max", "and", "or", "xor") and t is not T.u1 and t.bits in (32, 64) \
        and not (t.is_float and op in ("and", "or", "xor"))


class BlockReduceEnv(_ChunkEnv):
    """The chunk environment whose atomics, while `flushing`, are block reductions, and whose
    adstack counts live in registers."""
    flushing = False

    # An adstack's count is private to the thread and lives from its AdStackAlloca to its last
    # pop inside this one chunk function: a local (promoted to a register) instead of the
    # heap's count header, whose store after every push and pop was a third of the gradient
    # kernel's memory traffic. The header's bytes stay in the layout, unused.
    def _count_slot(self, st):
        slots = self.__dict__.setdefault("_count_slots", {})
        slot = slots.get(st)
        if slot is None:
            slot = slots[st] = self.entry_alloca(I64, "adstack.count")
        return slot

    def _load_count(self, st):
        return self.b.load(self._count_slot(st), typ=I64)

    def _store_count(self, st, value):
        self.b.store(value, self._count_slot(st))

    def atomic_rmw(self, op: str, ptr, value: ir.Stmt, t: T.DataType):
        if not (self.flushing and _reducible(op, t)):
            return super().atomic_rmw(op, ptr, value, t)
        b = self.b
        full_warps = b.icmp_unsigned("==", b.urem(self._sreg("ntid.x"), ll.Constant(I32, WARP)), ll.Constant(I32, 0))
        with b.if_else(full_warps) as (reduce, per_thread):
            with reduce:
                self._block_reduce_then_atomic(op, ptr, self.v(value), t)
            with per_thread:
                super().atomic_rmw(op, ptr, value, t)
        return ll.Constant(lltype(t), 0 if not t.is_float else 0.0)  # unused (see `flushable`)

    def _block_reduce_then_atomic(self, op: str, ptr, v, t: T.DataType) -> None:
        b, ty = self.b, lltype(t)
        tid = self._sreg("tid.x")
        lane = b.and_(tid, ll.Constant(I32, WARP - 1))
        warp = b.lshr(tid, ll.Constant(I32, 5))
        warps = b.lshr(self._sreg("ntid.x"), ll.Constant(I32, 5))
        shared = ll.GlobalVariable(self.mb.module, ll.ArrayType(ty, WARP), self.mb.module.get_unique_name("partials"),
                                   addrspace=_SHARED)
        shared.linkage = "internal"
        shared.initializer = ll.Constant(ll.ArrayType(ty, WARP), None)  # undef: written before read
        lane0 = b.icmp_unsigned("==", lane, ll.Constant(I32, 0))
        x = self._warp_reduce(op, v, t)
        with b.if_then(lane0):
            b.store(x, self._slot(shared, warp, ty))
        b.call(self.mb.declare("llvm.nvvm.barrier0", ll.VoidType(), []), [])
        with b.if_then(b.icmp_unsigned("==", warp, ll.Constant(I32, 0))):
            mine = b.icmp_unsigned("<", lane, warps)
            safe_lane = b.select(mine, lane, ll.Constant(I32, 0))
            y = b.select(mine, b.load(self._slot(shared, safe_lane, ty), typ=ty), _identity(op, t))
            y = self._warp_reduce(op, y, t)
            with b.if_then(b.icmp_unsigned("==", lane, ll.Constant(I32, 0))):
                b.atomic_rmw(_atomic_name(op, t), ptr, y, "monotonic")

    def _slot(self, shared, index, ty):
        return self.b.gep(shared, [ll.Constant(I32, 0), index], inbounds=True)  # typed: an addrspace(3) global

    def _sreg(self, name: str):
        return self.b.call(self.mb.declare(f"llvm.nvvm.read.ptx.sreg.{name}", I32, []), [])

    def _warp_reduce(self, op: str, v, t: T.DataType):
        for offset in (16, 8, 4, 2, 1):
            v = self._combine(op, v, self._shuffle_xor(v, offset, t), t)
        return v

    def _shuffle_xor(self, v, offset: int, t: T.DataType):
        """The value of lane (this lane ^ offset); 64-bit values move as two 32-bit halves."""
        b = self.b
        shfl = self.mb.declare("llvm.nvvm.shfl.sync.bfly.i32", I32, [I32, I32, I32, I32])

        def move(word):
            return b.call(shfl, [ll.Constant(I32, FULL_MASK), word, ll.Constant(I32, offset), ll.Constant(I32, WARP - 1)])
        if t.bits == 32:
            word = b.bitcast(v, I32) if t.is_float else v
            got = move(word)
            return b.bitcast(got, lltype(t)) if t.is_float else got
        bits = b.bitcast(v, I64) if t.is_float else v
        low, high = move(b.trunc(bits, I32)), move(b.trunc(b.lshr(bits, ll.Constant(I64, 32)), I32))
        joined = b.or_(b.zext(low, I64), b.shl(b.zext(high, I64), ll.Constant(I64, 32)))
        return b.bitcast(joined, lltype(t)) if t.is_float else joined

    def _combine(self, op: str, a, c, t: T.DataType):
        b = self.b
        if t.is_float:
            if op == "add":
                return b.fadd(a, c)
            name = f"llvm.{'minnum' if op == 'min' else 'maxnum'}.{'f32' if t.bits == 32 else 'f64'}"
            return b.call(self.mb.declare(name, a.type, [a.type, a.type]), [a, c])
        if op in ("min", "max"):
            signed = t.kind == "int"
            less = b.icmp_signed("<", a, c) if signed else b.icmp_unsigned("<", a, c)
            return b.select(less, a, c) if op == "min" else b.select(less, c, a)
        return {"add": b.add, "and": b.and_, "or": b.or_, "xor": b.xor}[op](a, c)


def _atomic_name(op: str, t: T.DataType) -> str:
    if t.is_float:
        return {"add": "fadd", "min": "fmin", "max": "fmax"}[op]
    if op in ("min", "max"):
        return op if t.kind == "int" else "u" + op
    return op


def _identity(op: str, t: T.DataType):
    ty = lltype(t)
    if t.is_float:
        return ll.Constant(ty, {"add": 0.0, "min": float("inf"), "max": float("-inf")}[op])
    bits = t.bits
    if op in ("add", "or", "xor"):
        return ll.Constant(ty, 0)
    if op == "and":
        return ll.Constant(ty, (1 << bits) - 1)
    signed = t.kind == "int"
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return ll.Constant(ty, high if op == "min" else low)

