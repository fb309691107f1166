"""LLVM lowering of the adstack statements (a mixin of llvm_ir._Env).

Storage is a heap owned by the runtime, never the thread's stack, laid out as
runtime/contract/adstack_layout.py records (`LLVM_HEAP`): thread t's slice starts at
`heap + t * stride` (GPU targets interleave the slices in 8-byte granules instead, so that
a warp's pushes coalesce: `HeapLayout.interleave`, `_at`); stack s of the slice at `offset[s]` holds a count header then
`capacity[s]` entries, each the primal value followed (stacks with adjoints) by its adjoint.
`heap`, `stride`, `offset[]` and `capacity[]` are ctx words written by the runtime before
each launch (runtime/adstack.py), so one binary serves every launch size. They are loaded
once per chunk, in the function's entry block; t, the thread's slice number, is what the
target emits for it (`LlvmTarget.emit_slice_index`).

Overflow: a push at a full stack writes nothing and records the overflow word (required
capacity, task, stack: `adstack_layout.encode_overflow`) with an atomic unsigned max (the
runtime decodes and raises); the count still advances (a virtual count), so pops stay
balanced, and tops clamp to the last entry: no access ever leaves the stack's slice. (After
an overflow the launch's gradients are meaningless, and the runtime says so.)
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.contract import types as T

from ..base import Unsupported
from .llvm_types import I8, I64, PTR, memtype

HEAP = layout.LLVM_HEAP
# Set only by bench/bench_autodiff.py, around a compile_kernel call that bypasses the cache, to
# measure what the overflow check costs; never for kernels users run (the unchecked code can
# write past a stack's capacity) and never through the cache (it is not part of the key).
_UNCHECKED_FOR_BENCHMARK = False


class _StackRef:
    """A lowered stack: where it starts (`base`: its address, or with interleaved slices its
    byte offset in the thread's slice), capacity, element layout."""
    __slots__ = ("base", "capacity", "last", "dtype", "entry_bytes", "adjoint", "stack_id", "task")

    def __init__(self, base, capacity, last, dtype: T.DataType, adjoint: bool, stack_id: int, task: int):
        self.base, self.capacity, self.last, self.dtype = base, capacity, last, dtype
        self.entry_bytes = HEAP.entry_bytes(dtype, adjoint)
        self.adjoint = adjoint
        self.stack_id, self.task = stack_id, task


class AdStackLowering:
    """The `s_AdStack*` methods of `_Env` (which provides b, ctx, cg, mb, v, temp_ptr)."""

    # ---- per-function setup (entry block) -------------------------------------------------
    def _adstack_cache(self) -> dict:
        cache = getattr(self, "_adstack_state", None)
        if cache is None:
            cache = self._adstack_state = {}
        return cache

    def _entry_word(self, builder, slot: int, typ):
        p = builder.gep(self.ctx, [ll.Constant(I64, slot)], source_etype=I64)
        return builder.load(p, typ=typ)

    def _adstack_base(self, stack_id: int):
        """(address of stack `stack_id` in this thread's slice, its capacity), emitted once."""
        cache = self._adstack_cache()
        if stack_id in cache:
            return cache[stack_id]
        entry = self.b.function.entry_basic_block
        eb = ll.IRBuilder(entry)
        eb.position_before(entry.terminator)
        meta, granule = self.cg.meta, self._granule()
        slot = meta.adstack_slot
        if "slice" not in cache:
            heap = self._entry_word(eb, slot, PTR)
            index = self.cg.target.emit_slice_index(self.mb, eb)
            if granule:  # thread t's granule g at heap + g * pitch + t * granule
                cache["slice"] = eb.gep(heap, [eb.mul(index, ll.Constant(I64, granule), flags=("nuw",))],
                                        source_etype=I8)
                threads = self._entry_word(eb, meta.adstack_threads_slot, I64)
                cache["pitch"] = eb.mul(threads, ll.Constant(I64, granule), flags=("nuw",))
            else:
                stride = self._entry_word(eb, slot + 1, I64)
                cache["slice"] = eb.gep(heap, [eb.mul(index, stride, flags=("nuw",))], source_etype=I8)
            cache["overflow"] = self._entry_word(eb, slot + 2, PTR)
        offset = self._entry_word(eb, slot + 3 + 2 * stack_id, I64)
        capacity = self._entry_word(eb, slot + 4 + 2 * stack_id, I64)
        base = offset if granule else eb.gep(cache["slice"], [offset], source_etype=I8)
        cache[stack_id] = (base, capacity, eb.sub(capacity, ll.Constant(I64, 1)))
        return cache[stack_id]

    # ---- addressing ------------------------------------------------------------------------
    def _granule(self) -> int:
        return self.cg.target.heap_layout.interleave

    def _at(self, st: _StackRef, rel):
        """The address of byte `rel` (an i64) of stack `st` in this thread's slice."""
        b, granule = self.b, self._granule()
        if not granule:
            return b.gep(st.base, [rel], source_etype=I8)
        cache = self._adstack_cache()
        o = b.add(st.base, rel, flags=("nuw",))
        shift = granule.bit_length() - 1
        within = b.and_(o, ll.Constant(I64, granule - 1))
        off = b.add(b.mul(b.lshr(o, ll.Constant(I64, shift)), cache["pitch"], flags=("nuw",)), within, flags=("nuw",))
        return b.gep(cache["slice"], [off], source_etype=I8)

    def _entry_rel(self, index, st: _StackRef):
        return self.b.add(ll.Constant(I64, HEAP.header_bytes), self.b.mul(index, ll.Constant(I64, st.entry_bytes),
                                                                      flags=("nuw",)), flags=("nuw",))

    def _top_rel(self, st: _StackRef):
        """The top entry's byte in the stack, at count-1 clamped to capacity-1 (unsigned, so an
        empty stack's top is the last entry too): never outside the stack's slice."""
        b = self.b
        index = b.sub(self._load_count(st), ll.Constant(I64, 1))
        if not _UNCHECKED_FOR_BENCHMARK:
            umin = self.mb.declare("llvm.umin.i64", I64, [I64, I64])
            index = b.call(umin, [index, st.last])
        return self._entry_rel(index, st)

    def _top_ptr(self, st: _StackRef):
        return self._at(st, self._top_rel(st))

    # The count, the entries and the overflow word are told apart for LLVM's alias analysis
    # (TBAA), so that a loop keeps the count and the pushed values in registers instead of
    # reloading them after every entry access.
    def _load_count(self, st: _StackRef):
        return self._tag(self.b.load(self._at(st, ll.Constant(I64, 0)), typ=I64), "count")

    def _store_count(self, st: _StackRef, value):
        self._tag(self.b.store(value, self._at(st, ll.Constant(I64, 0))), "count")

    def _tag(self, instr, what: str):
        cache = self._adstack_cache()
        key = "tbaa " + what
        if key not in cache:
            module = self.mb.module
            root = cache.get("tbaa root") or module.add_metadata(["qdc adstack"])
            cache["tbaa root"] = root
            node = module.add_metadata([f"adstack {what}", root, ll.Constant(I64, 0)])
            cache[key] = module.add_metadata([node, node, ll.Constant(I64, 0)])
        instr.set_metadata("tbaa", cache[key])
        return instr

    def _adjoint_ptr(self, st: _StackRef, entry_rel):
        """The adjoint of the entry at byte `entry_rel` of the stack."""
        return self._at(st, self.b.add(entry_rel, ll.Constant(I64, HEAP.adjoint_offset(st.dtype)), flags=("nuw",)))

    def _to_memory(self, value, dtype: T.DataType):
        return self.b.zext(value, I8) if dtype is T.u1 else value

    def _from_memory(self, value, dtype: T.DataType):
        return self.b.icmp_unsigned("!=", value, ll.Constant(I8, 0)) if dtype is T.u1 else value

    # ---- statements ------------------------------------------------------------------------
    def s_AdStackAlloca(self, s):
        base, capacity, last = self._adstack_base(s.stack_id)
        task = self.cg.meta.adstack["stacks"][s.stack_id]["task"]
        if not layout.fits_overflow_site(task, s.stack_id):
            raise Unsupported(f"too many adstacks or tasks in one kernel (stack {s.stack_id} of task {task}; the "
                              f"overflow word holds {layout.STACK_MAX + 1} stacks and {layout.TASK_MAX + 1} tasks): "
                              f"split the kernel")
        st = _StackRef(base, capacity, last, s.type, s.adjoint, s.stack_id, task)
        self._store_count(st, ll.Constant(I64, 0))
        return st

    def s_AdStackPush(self, s):
        b, st = self.b, self.v(s.stack)
        n = self._load_count(st)

        def write():
            rel = self._entry_rel(n, st)
            self._tag(b.store(self._to_memory(self.v(s.value), st.dtype), self._at(st, rel)), "entry")
            if st.adjoint:
                self._tag(b.store(ll.Constant(memtype(st.dtype), 0.0), self._adjoint_ptr(st, rel)), "entry")

        if _UNCHECKED_FOR_BENCHMARK:
            write()
        else:
            with b.if_else(b.icmp_unsigned("<", n, st.capacity), likely=True) as (fits, overflows):
                with fits:
                    write()
                with overflows:  # skip the write; the count still advances, so pops stay balanced
                    self._report_overflow(st, n)
        self._store_count(st, b.add(n, ll.Constant(I64, 1)))

    def _report_overflow(self, st: _StackRef, n):
        b = self.b
        umin = self.mb.declare("llvm.umin.i64", I64, [I64, I64])
        required = b.call(umin, [b.add(n, ll.Constant(I64, 1)), ll.Constant(I64, layout.REQUIRED_MAX)])
        code = b.or_(b.shl(required, ll.Constant(I64, layout.REQUIRED_SHIFT)),
                     ll.Constant(I64, layout.overflow_site(st.task, st.stack_id)))
        self._tag(b.atomic_rmw("umax", self._adstack_cache()["overflow"], code, "monotonic"), "overflow")

    def s_AdStackPop(self, s):
        b, st = self.b, self.v(s.stack)
        usub_sat = self.mb.declare("llvm.usub.sat.i64", I64, [I64, I64])
        self._store_count(st, b.call(usub_sat, [self._load_count(st), ll.Constant(I64, 1)]))

    def s_AdStackLoadTop(self, s):
        st = self.v(s.stack)
        value = self._tag(self.b.load(self._top_ptr(st), typ=memtype(st.dtype)), "entry")
        return self._from_memory(value, st.dtype)

    def s_AdStackLoadTopAdj(self, s):
        st = self.v(s.stack)
        return self._tag(self.b.load(self._adjoint_ptr(st, self._top_rel(st)), typ=memtype(st.dtype)), "entry")

    def s_AdStackAccAdjoint(self, s):
        b, st = self.b, self.v(s.stack)
        p = self._adjoint_ptr(st, self._top_rel(st))
        old = self._tag(b.load(p, typ=memtype(st.dtype)), "entry")
        self._tag(b.store(b.fadd(old, self.v(s.value)), p), "entry")

    def s_TempAtomicAdd(self, s):
        self.b.atomic_rmw("fadd", self.temp_ptr(s.slot), self.v(s.value), "monotonic")
