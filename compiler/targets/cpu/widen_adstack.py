"""The adstack statements at W lanes (a mixin of widen.WideChunkEnv, which provides b, W, exec,
plan, splat, vv, lane_numbers, intrinsic, any_lane, vector_suffix, vt, store_lanes and the
scalar lowering's `_adstack_cache`, `_entry_word`, `_tag`, `_report_overflow`).

Each lane has its own slice: a thread of a widened task takes W consecutive slices of the heap
(the runtime sizes it for threads x lanes: the task record's `lanes`), interleaved element by
element: byte o of lane l's stack s at `heap + t*W*stride + offset[s]*W + o*W + l*size` (every
o a multiple of the element size: the 8-byte header, entries and adjoints are), so the W
lanes' entry j is one vector. Where no adstack operation is in narrow code (widen_plan.py) one
scalar count serves every lane, and a push or pop is one vector store or load; else each lane
keeps its count (`plan.lane_counts`), and pushes, pops and reads scatter and gather under the
lane mask. A push checks every running lane's capacity; an overflow reports the largest count,
naming the kernel, as the scalar code does.
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.contract import types as T

from ..llvm import llvm_adstack
from ..llvm.inline_math_vector import splat
from ..llvm.llvm_types import I8, I32, I64, PTR, memtype
from .widen_memory import whole_vector

HEAP = layout.LLVM_HEAP


class _LaneStack(llvm_adstack._StackRef):
    """A lowered stack at W lanes: its count is one scalar of the function (`count`, a local)."""
    __slots__ = ("count",)



class LaneAdStacks:
    def s_AdStackAlloca(self, s):
        if not self.wide:
            return super().s_AdStackAlloca(s)
        base, capacity, last = self._lane_stack_base(s.stack_id)
        task = self.cg.meta.adstack["stacks"][s.stack_id]["task"]
        if not layout.fits_overflow_site(task, s.stack_id):
            return super().s_AdStackAlloca(s)  # refused there, with the message
        st = _LaneStack(base, capacity, last, s.type, s.adjoint, s.stack_id, task)
        if self.plan.lane_counts:
            st.count = self.entry_alloca(ll.VectorType(I64, self.W), f"{s.var_name}.counts")
            self.store_lanes(st.count, whole_vector(ll.VectorType(I64, self.W), None), T.i64)
        else:
            st.count = self.entry_alloca(I64, f"{s.var_name}.count")  # one count for all lanes
            self.b.store(ll.Constant(I64, 0), st.count)
        return st

    def _lane_stack_base(self, stack_id: int):
        """(address of stack `stack_id` in this thread's W interleaved slices, capacity, last):
        the thread's slices t*W .. t*W + W - 1 hold `W * stride` bytes, byte o of lane l's
        stack at `heap + t*W*stride + offset*W + o*W + l*size` (every o a multiple of the
        element size: the header is 8 bytes, entries and adjoints multiples of the size)."""
        cache = self._adstack_cache()
        key = ("lanes", stack_id)
        if key in cache:
            return cache[key]
        entry = self.b.function.entry_basic_block
        eb = ll.IRBuilder(entry)
        eb.position_before(entry.terminator)
        slot, w = self.cg.meta.adstack_slot, ll.Constant(I64, self.W)
        if "lanes slice" not in cache:
            heap = self._entry_word(eb, slot, PTR)
            stride = self._entry_word(eb, slot + 1, I64)
            thread = self.cg.target.emit_slice_index(self.mb, eb)
            cache["lanes slice"] = eb.gep(heap, [eb.mul(eb.mul(thread, w, flags=("nuw",)), stride, flags=("nuw",))],
                                          source_etype=I8)
            cache["overflow"] = self._entry_word(eb, slot + 2, PTR)
        offset = self._entry_word(eb, slot + 3 + 2 * stack_id, I64)
        capacity = self._entry_word(eb, slot + 4 + 2 * stack_id, I64)
        base = eb.gep(cache["lanes slice"], [eb.mul(offset, w, flags=("nuw",))], source_etype=I8)
        cache[key] = (base, capacity, eb.sub(capacity, ll.Constant(I64, 1)))
        return cache[key]

    def _lanes_at(self, st, index, adjoint: bool):
        """The address of entry `index`'s W primals (or adjoints)."""
        b = self.b
        rel = b.add(ll.Constant(I64, HEAP.header_bytes), b.mul(index, ll.Constant(I64, st.entry_bytes), flags=("nuw",)),
                    flags=("nuw",))
        if adjoint:
            rel = b.add(rel, ll.Constant(I64, HEAP.adjoint_offset(st.dtype)), flags=("nuw",))
        return b.gep(st.base, [b.mul(rel, ll.Constant(I64, self.W), flags=("nuw",))], source_etype=I8)

    def _lanes_top(self, st):
        b = self.b
        index = b.sub(b.load(st.count, typ=I64), ll.Constant(I64, 1))
        if not llvm_adstack._UNCHECKED_FOR_BENCHMARK:
            index = self.intrinsic("llvm.umin.i64", I64, [I64, I64], [index, st.last])
        return index

    def _store_lanes(self, value, address, dtype):
        value = self.splat(value)
        if dtype is T.u1:
            value = self.b.zext(value, ll.VectorType(I8, self.W))
        self._tag(self.b.store(value, address, align=dtype.nbytes), "entry")

    def _load_lanes(self, address, dtype):
        v = self._tag(self.b.load(address, typ=ll.VectorType(memtype(dtype), self.W), align=dtype.nbytes), "entry")
        return self.b.icmp_unsigned("!=", v, splat(I8, 0, self.W)) if dtype is T.u1 else v

    # With a count per lane (`plan.lane_counts`): entry n_l of lane l at the address below,
    # pushes and pops only in the running lanes, an overflow reported for the largest count.
    def _lane_addresses(self, st, index, adjoint: bool):
        """`<W x ptr>`: lane l's entry `index[l]` (its adjoint if `adjoint`)."""
        b, w = self.b, self.W
        rel = b.add(splat(I64, HEAP.header_bytes, w), b.mul(index, splat(I64, st.entry_bytes, w)))
        if adjoint:
            rel = b.add(rel, splat(I64, HEAP.adjoint_offset(st.dtype), w))
        offsets = b.add(b.mul(rel, splat(I64, w, w)), b.mul(self.lane_numbers(I64), splat(I64, st.dtype.nbytes, w)))
        return b.inttoptr(b.add(self.splat(b.ptrtoint(st.base, I64)), offsets), ll.VectorType(PTR, w))

    def _lane_tops(self, st):
        b, w = self.b, self.W
        index = b.sub(b.load(st.count, typ=ll.VectorType(I64, w)), splat(I64, 1, w))
        if not llvm_adstack._UNCHECKED_FOR_BENCHMARK:
            vt = index.type
            index = self.intrinsic(f"llvm.umin.v{w}i64", vt, [vt, vt], [index, self.splat(st.last)])
        return index

    def _scatter(self, value, addresses, mask, dtype):
        value = self.splat(value)
        if dtype is T.u1:
            value = self.b.zext(value, ll.VectorType(I8, self.W))
        vt = value.type
        self.intrinsic(f"llvm.masked.scatter.{self.vector_suffix(vt)}.{self.vector_suffix(addresses.type)}",
                       ll.VoidType(), [vt, addresses.type, I32, mask.type],
                       [value, addresses, ll.Constant(I32, dtype.nbytes), mask])

    def _gather(self, addresses, dtype):
        vt = ll.VectorType(memtype(dtype), self.W)
        v = self.intrinsic(f"llvm.masked.gather.{self.vector_suffix(vt)}.{self.vector_suffix(addresses.type)}", vt,
                           [addresses.type, I32, self.exec.type, vt],
                           [addresses, ll.Constant(I32, dtype.nbytes), self.exec, whole_vector(vt, None)])
        return self.b.icmp_unsigned("!=", v, splat(I8, 0, self.W)) if dtype is T.u1 else v

    def _push_per_lane(self, s, st):
        b, w = self.b, self.W
        vt = ll.VectorType(I64, w)
        n = b.load(st.count, typ=vt)
        if llvm_adstack._UNCHECKED_FOR_BENCHMARK:
            write = self.exec
        else:
            fits = b.icmp_unsigned("<", n, self.splat(st.capacity))
            write = b.and_(self.exec, fits)
            over = b.and_(self.exec, b.not_(fits))
            with b.if_then(self.any_lane(over), likely=False):
                largest = self.intrinsic(f"llvm.vector.reduce.umax.v{w}i64", I64, [vt],
                                         [b.select(over, n, whole_vector(vt, None))])
                self._report_overflow(st, largest)
        self._scatter(self.v(s.value), self._lane_addresses(st, n, False), write, st.dtype)
        if st.adjoint:
            self._scatter(whole_vector(self.vt(st.dtype), None), self._lane_addresses(st, n, True), write, st.dtype)
        b.store(b.add(n, b.zext(self.exec, vt)), st.count)

    def s_AdStackPush(self, s):
        if not self.wide:
            return super().s_AdStackPush(s)
        if self.plan.lane_counts:
            return self._push_per_lane(s, self.v(s.stack))
        b, st = self.b, self.v(s.stack)
        n = b.load(st.count, typ=I64)

        def write():
            self._store_lanes(self.v(s.value), self._lanes_at(st, n, False), st.dtype)
            if st.adjoint:
                self._store_lanes(whole_vector(self.vt(st.dtype), None), self._lanes_at(st, n, True), st.dtype)

        if llvm_adstack._UNCHECKED_FOR_BENCHMARK:
            write()
        else:
            with b.if_else(b.icmp_unsigned("<", n, st.capacity), likely=True) as (fits, overflows):
                with fits:
                    write()
                with overflows:  # every lane's stack is full at once: one report, as the scalar code
                    self._report_overflow(st, n)
        b.store(b.add(n, ll.Constant(I64, 1)), st.count)

    def s_AdStackPop(self, s):
        if not self.wide:
            return super().s_AdStackPop(s)
        b, st = self.b, self.v(s.stack)
        if self.plan.lane_counts:
            vt = ll.VectorType(I64, self.W)
            n = b.load(st.count, typ=vt)
            popped = self.intrinsic(f"llvm.usub.sat.v{self.W}i64", vt, [vt, vt], [n, splat(I64, 1, self.W)])
            b.store(b.select(self.exec, popped, n), st.count)
            return
        n = b.load(st.count, typ=I64)
        b.store(self.intrinsic("llvm.usub.sat.i64", I64, [I64, I64], [n, ll.Constant(I64, 1)]), st.count)

    def s_AdStackLoadTop(self, s):
        return self._load_tops(s, False) if self.wide else super().s_AdStackLoadTop(s)

    def s_AdStackLoadTopAdj(self, s):
        return self._load_tops(s, True) if self.wide else super().s_AdStackLoadTopAdj(s)

    def _load_tops(self, s, adjoint: bool):
        """Each lane's top entry of the stack (its adjoint where `adjoint`)."""
        st = self.v(s.stack)
        if self.plan.lane_counts:
            return self._gather(self._lane_addresses(st, self._lane_tops(st), adjoint), st.dtype)
        return self._load_lanes(self._lanes_at(st, self._lanes_top(st), adjoint), st.dtype)

    def s_AdStackAccAdjoint(self, s):
        if not self.wide:
            return super().s_AdStackAccAdjoint(s)
        st = self.v(s.stack)
        if self.plan.lane_counts:
            addresses = self._lane_addresses(st, self._lane_tops(st), True)
            total = self.b.fadd(self._gather(addresses, st.dtype), self.vv(s.value))
            return self._scatter(total, addresses, self.exec, st.dtype)
        p = self._lanes_at(st, self._lanes_top(st), True)
        old = self._load_lanes(p, st.dtype)
        self._store_lanes(self.b.fadd(old, self.vv(s.value)), p, st.dtype)
