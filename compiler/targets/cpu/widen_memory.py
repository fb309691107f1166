"""How a width-W chunk (widen.py) reaches memory lane by lane, and the memory only the lane's own
iteration touches (widen_plan.py, `_invariant_loads` and `own_updates`):
- atomics at data-dependent addresses: one per running lane, in lane order, in a loop over the
  set bits of the mask;
- updates of an element no other iteration writes: a plain read-modify-write of the running
  lanes, as a gather, the operation and a scatter where the level has scatter instructions
  (`vector_memory`), else the same loop with plain loads and stores;
- loads of one element on every iteration of an inner loop: read once before the loop (gathered,
  or loaded in that loop where the level's gathers are not instructions LLVM uses).
"""
from __future__ import annotations

import functools

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from ..llvm.inline_math_vector import splat
from ..llvm.llvm_types import I1, I8, I32, I64, PTR, memtype


def whole_vector(vt: ll.VectorType, value) -> ll.Constant:
    """The vector constant of `value` (ll.Undefined, None or 0) in every lane, written as the one
    word `undef` or `zeroinitializer`: llvmlite writes each lane of ll.Constant(vt, value) out,
    and the splats of a wide chunk's IR were half of its text (P2G's gradient: 310 of 700 KB),
    printed by Python and parsed by LLVM again, which makes the same constant of either form.
    One instance per type and value, so that its text is made once."""
    return _whole_vector(vt.element, vt.count, value)


def splat_constant(c: ll.Constant, count: int) -> ll.Constant:
    """`<count x T> splat (T c)`: the constant `c` in every lane, written once."""
    return _WholeVector(ll.VectorType(c.type, count), [c] * count, f"splat ({c.type} {c.get_reference()})")


@functools.lru_cache(maxsize=None)
def _whole_vector(element, count: int, value) -> ll.Constant:
    return _WholeVector(ll.VectorType(element, count), [value] * count,
                        "undef" if value is ll.Undefined else "zeroinitializer")


class _WholeVector(ll.Constant):
    """A vector constant written as one word (its lanes stay, for llvmlite's checks)."""

    def __init__(self, vt: ll.VectorType, lanes: list, word: str):
        super().__init__(vt, lanes)
        self.word = word

    def _get_reference(self):
        return self.word


class _Ptr:
    """A GlobalPtr at W lanes: `uniform` (one scalar address), `contiguous` (lane l at
    `address + l` elements) or `varying` (a `<W x ptr>`)."""
    __slots__ = ("kind", "address")

    def __init__(self, kind: str, address):
        self.kind, self.address = kind, address


class LaneMemory:
    """WideChunkEnv's memory accesses done lane by lane, and those of the lane's own iteration."""

    def hoist_invariant_loads(self, loop):
        """The loads widen_plan found invariant in `loop`, read before it under the lanes that
        enter it (a debug build's checked accesses stay where they are, reported in order)."""
        for load in self.plan.invariant_loads.get(loop, ()):
            ptr = load.ptr
            if ptr in self.cg.check_id:
                continue
            if ptr not in self.hoisted and ptr not in self.vals:
                for index in ptr.indices:
                    if index not in self.vals:  # a constant defined inside the loop
                        self.stmt(index)
                if self.vector_memory:  # else each lane's address is the scalar code's, in the loop
                    self.stmt(ptr)
                self.hoisted.add(ptr)
            if self.vector_memory:
                self.stmt(load)
            else:
                self.vals[load] = self.load_by_lane(load)
            self.hoisted.add(load)

    def atomic_by_lane(self, op: str, p: _Ptr, value: ir.Stmt, t: T.DataType):
        """One atomic per running lane, in lane order (the scalar code's iteration order)."""
        b = self.b
        v = self.v(value)
        if self.is_vec(v):  # in memory once, read by lane number (an extractelement by a variable
            v = self._spilled(v)  # lane would store the whole vector in every iteration)
        if p.kind != "contiguous":
            p = _Ptr("spilled", self._spilled(p.address))

        def update(index):
            x = b.load(b.gep(v[0], [index], source_etype=v[1]), typ=v[1]) if isinstance(v, tuple) else v
            self.scalar_atomic(op, self.lane_address(p, index, memtype(t)), x, t)
        self.each_running_lane(update)

    def own_update(self, s: ir.AtomicRMW, p: _Ptr):
        """An atomic at an element no other iteration writes (widen_plan.own_updates), as a
        plain read-modify-write of the running lanes: a gather (or masked load), the operation
        and a scatter (or masked store) with `vector_memory`, else one per lane in a loop."""
        b, t = self.b, s.type
        if not self.vector_memory:
            v = self.v(s.value)
            if self.is_vec(v):
                v = self._spilled(v)
            address = self.lane_addresses(s.ptr)

            def update(index):
                x = b.load(b.gep(v[0], [index], source_etype=v[1]), typ=v[1]) if isinstance(v, tuple) else v
                self.read_modify_write(s.op, address(index), x, t)
            self.each_running_lane(update)
            return
        vt = ll.VectorType(memtype(t), self.W)
        align = ll.Constant(I32, t.nbytes)
        suffix = self.vector_suffix(vt)
        if p.kind == "contiguous":
            old = self.intrinsic(f"llvm.masked.load.{suffix}.p0", vt, [PTR, I32, self.exec.type, vt],
                                 [p.address, align, self.exec, whole_vector(vt, None)])
        else:
            old = self.intrinsic(f"llvm.masked.gather.{suffix}.{self.vector_suffix(p.address.type)}", vt,
                                 [p.address.type, I32, self.exec.type, vt],
                                 [p.address, align, self.exec, whole_vector(vt, None)])
        new = self.lanes_operation(s.op, old, self.vv(s.value), t)
        if p.kind == "contiguous":
            self.intrinsic(f"llvm.masked.store.{suffix}.p0", ll.VoidType(), [vt, PTR, I32, self.exec.type],
                           [new, p.address, align, self.exec])
        else:
            self.intrinsic(f"llvm.masked.scatter.{suffix}.{self.vector_suffix(p.address.type)}", ll.VoidType(),
                           [vt, p.address.type, I32, self.exec.type], [new, p.address, align, self.exec])

    def lanes_operation(self, op: str, old, x, t: T.DataType):
        """`op(old, x)` lane by lane, as the scalar code's read-modify-write computes it (no
        reassociation)."""
        b = self.b
        if t.is_float:
            if op in ("add", "sub"):
                return (b.fadd if op == "add" else b.fsub)(old, x)
            return self.intrinsic(f"llvm.{op}num.{self.vector_suffix(old.type)}", old.type, [old.type] * 2, [old, x])
        if op in ("min", "max"):
            cmp = b.icmp_signed if t.kind == "int" else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", old, x), old, x)
        return {"add": b.add, "sub": b.sub, "and": b.and_, "or": b.or_, "xor": b.xor}[op](old, x)

    def load_by_lane(self, s: ir.GlobalLoad):
        """`s` as one scalar load per running lane, in a loop: the code of a gather that runs
        once before a loop (`hoist_invariant_loads`), as small at every level (a masked gather
        without gather instructions is a branch and a load per lane)."""
        b, w = self.b, self.W
        mt = memtype(s.type)
        vt = ll.VectorType(mt, w)
        address = self.lane_addresses(s.ptr)
        lanes = self.entry_alloca(ll.ArrayType(mt, w))
        b.store(whole_vector(vt, None), b.bitcast(lanes, ll.PointerType(vt)), align=1)  # the lanes that do not run
        first = b.bitcast(lanes, ll.PointerType(mt))
        self.each_running_lane(lambda index: b.store(b.load(address(index), typ=mt, align=s.type.nbytes),
                                                     b.gep(first, [index])))
        v = b.load(b.bitcast(lanes, ll.PointerType(vt)), typ=vt, align=1)
        return b.icmp_unsigned("!=", v, splat(I8, 0, w)) if s.type is T.u1 else v

    def lane_addresses(self, ptr: ir.GlobalPtr):
        """`address(lane)`: the lane's element of `ptr`, as the scalar code computes it from the
        lane's indices, for a loop over the lanes: an index that is the lane's position plus a
        uniform value (`lin`) is that sum, another varying one is read from its vector, stored
        before the loop (no vector of W 64-bit addresses to compute and store)."""
        b = self.b
        lanes = {}
        for i in dict.fromkeys(ptr.indices):
            v = self.vals[i]
            if self.is_vec(v) and i not in self.lin:
                lanes[i] = self._spilled(v)

        def address(index):
            saved = {i: self.vals[i] for i in ptr.indices}
            for i, v in saved.items():
                if i in lanes:
                    array, elem = lanes[i]
                    self.vals[i] = b.load(b.gep(array, [index], source_etype=elem), typ=elem)
                elif self.is_vec(v):
                    first = self.lin[i]
                    self.vals[i] = b.add(first, b.trunc(index, first.type) if first.type.width < 64 else index)
            try:
                return self._scalar(ptr)
            finally:
                self.vals.update(saved)
        return address

    def lane_address(self, p: _Ptr, index, elem):
        """Lane `index`'s address of a contiguous or spilled `p`."""
        if p.kind == "contiguous":
            return self.b.gep(p.address, [index], source_etype=elem)
        return self.b.load(self.b.gep(p.address[0], [index], source_etype=PTR), typ=PTR)

    def each_running_lane(self, visit):
        """`visit(lane number)` for each running lane, in lane order, in a loop over the set bits
        of the mask: written out for each of W lanes, a P2G scatter's 27 atomics were thousands
        of blocks (ten times the build time)."""
        b, w = self.b, self.W
        word = ll.IntType(w)
        mask = b.bitcast(self.exec, word)
        entry = b.block
        head, body, done = (b.append_basic_block(f"lanes.each.{part}") for part in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        left = b.phi(word)
        left.add_incoming(mask, entry)
        b.cbranch(b.icmp_unsigned("!=", left, ll.Constant(word, 0)), body, done)
        b.position_at_end(body)
        lane = b.call(self.mb.declare(f"llvm.cttz.i{w}", word, [word, I1]), [left, ll.Constant(I1, 1)])
        visit(b.zext(lane, I64) if w < 64 else lane)
        left.add_incoming(b.and_(left, b.sub(left, ll.Constant(word, 1))), b.block)  # the lowest set bit cleared
        b.branch(head)
        b.position_at_end(done)

    def _spilled(self, vector):
        """(pointer to `vector` stored in an entry-block array, element type)."""
        array = self.entry_alloca(ll.ArrayType(vector.type.element, self.W))
        self.b.store(vector, self.b.bitcast(array, ll.PointerType(vector.type)), align=1)  # an array's alignment
        return array, vector.type.element

