"""Adstacks in SPIR-V (a mixin of lowering.TaskLowering), laid out as
runtime/contract/adstack_layout.py's SPIR-V record says: a float heap ("adstack_float", f32,
primal and adjoint interleaved) and an int heap ("adstack_int", i32, u1 widened; primal only).
Each invocation owns a slice of `stride[heap]` elements in which stack s starts at `offset[s]`,
the slices interleaved element by element so that neighbouring invocations pushing entry j
write neighbouring words (coalesced): element r of invocation i's slice is heap element
`r * H + i`, H the invocations the heaps hold; the strides, offsets, capacities and H are read
from "adstack_meta". A stack's count is a private (Function) variable.

The per-invocation base `offset * H + i` is emitted where the stack is allocated, never
at a first use: the allocation dominates every push, pop and top of the stack, while a value
made inside a first loop would not dominate a sibling loop after it (SPIR-V §2.16).

Overflow: a push at a full stack writes nothing and raises the launch's overflow word (the
"errors" binding, word OVERFLOW_WORD; the encoding of adstack_layout); the count still
advances so pops stay balanced, and tops clamp to the last entry: no access leaves the stack.
Index arithmetic is 64-bit where the target has Int64, else 32-bit (the runtime then refuses a
launch whose heap a u32 cannot index).
"""
from __future__ import annotations

from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.contract import types as T
from qdc.runtime.device import OVERFLOW_WORD

from ..base import Unsupported
from .spec import GLSL, SCOPE_DEVICE, SEMANTICS_RELAXED, Capability, Op

META = layout.SPIRV_META
_HEAP_TYPES = (T.f32, T.i32)  # element type of the float and int heap


class _Stack:
    """A lowered stack: the heap element of its first entry for this invocation (index type),
    `pitch` (index type: elements from one element of an invocation's slice to the next, the
    invocations the heaps hold) and `step` (pitch times the entry's elements), capacity and
    last entry (u32), count variable (u32), heap."""
    __slots__ = ("base", "pitch", "step", "capacity", "last", "count", "heap", "dtype", "adjoint", "site")

    def __init__(self, base, pitch, step, capacity, last, count, heap, dtype, adjoint, site):
        self.base, self.pitch, self.step = base, pitch, step
        self.capacity, self.last, self.count = capacity, last, count
        self.heap, self.dtype, self.adjoint, self.site = heap, dtype, adjoint, site


class AdStackLowering:
    @property
    def index_type(self) -> T.DataType:
        return T.u64 if self.caps.int64 else T.u32

    def _index(self, v: int) -> int:
        """A u32 value as an index."""
        return self.op(Op.UConvert, T.u64, v) if self.caps.int64 else v

    def _meta_word(self, position: int) -> int:
        return self.word("adstack_meta", 0, position)

    def adstack_invocations(self) -> int:
        """The invocations the heaps hold (u32): a task with stacks runs no iteration past it."""
        return self._meta_word(META.INVOCATIONS)

    # ---- statements ----------------------------------------------------------------------------
    def s_AdStackAlloca(self, s):
        heap_layout = layout.spirv_heap(self.caps.int64)
        if s.type.name not in layout.SPIRV_ELEMENT:  # check_capabilities reports it first, at its line
            raise Unsupported(f"an adstack of {s.type.name} ('{s.var_name}') cannot be stored on target "
                              f"'{self.arch}'")
        task = self.k.tasks.index(self.task)
        if not layout.fits_overflow_site(task, s.stack_id):
            raise Unsupported(f"too many adstacks or tasks in one kernel (stack {s.stack_id} of task {task}): "
                              f"split the kernel")
        heap = heap_layout.heap_of(s.type)
        it = self.index_type
        offset = self._meta_word(META.offset(s.stack_id))
        capacity = self._meta_word(META.capacity(s.stack_id))
        pitch = self._index(self.adstack_invocations())
        base = self.op(Op.IAdd, it, self.op(Op.IMul, it, self._index(offset), pitch), self._index(self.invocation))
        entry = heap_layout.entry_bytes(s.type, s.adjoint) // 4
        step = self.op(Op.IMul, it, pitch, self.c(it, entry))
        last = self.op(Op.ISub, T.u32, capacity, self.c(T.u32, 1))
        count = self.fb.local_variable(self.ty(T.u32))
        self.fb.emit_void(Op.Store, count, self.c(T.u32, 0))
        return _Stack(base, pitch, step, capacity, last, count, heap, s.type, s.adjoint,
                      layout.overflow_site(task, s.stack_id))

    def s_AdStackPush(self, s):
        st = self.v(s.stack)
        n = self.fb.emit(Op.Load, self.ty(T.u32), st.count)

        def write():
            at = self._entry_index(st, n)
            self.fb.emit_void(Op.Store, self._heap_element(st, at), self._to_heap(self.v(s.value), st))
            if st.adjoint:
                self.fb.emit_void(Op.Store, self._heap_element(st, self._adjoint_index(st, at)), self.c(T.f32, 0.0))

        self.if_then(self.boolean(Op.ULessThan, n, st.capacity), write, lambda: self._report_overflow(st, n))
        self.fb.emit_void(Op.Store, st.count, self.op(Op.IAdd, T.u32, n, self.c(T.u32, 1)))

    def s_AdStackPop(self, s):
        st = self.v(s.stack)
        n = self.fb.emit(Op.Load, self.ty(T.u32), st.count)
        empty = self.boolean(Op.IEqual, n, self.c(T.u32, 0))
        lower = self.select(T.u32, empty, n, self.op(Op.ISub, T.u32, n, self.c(T.u32, 1)))
        self.fb.emit_void(Op.Store, st.count, lower)

    def s_AdStackLoadTop(self, s):
        st = self.v(s.stack)
        return self._from_heap(self.fb.emit(Op.Load, self.ty(_HEAP_TYPES[st.heap]),
                                            self._heap_element(st, self._top_index(st))), st)

    def s_AdStackLoadTopAdj(self, s):
        st = self.v(s.stack)
        return self.fb.emit(Op.Load, self.ty(T.f32), self._heap_element(st, self._adjoint_index(st, self._top_index(st))))

    def s_AdStackAccAdjoint(self, s):
        st = self.v(s.stack)
        p = self._heap_element(st, self._adjoint_index(st, self._top_index(st)))
        old = self.fb.emit(Op.Load, self.ty(T.f32), p)
        self.fb.emit_void(Op.Store, p, self.op(Op.FAdd, T.f32, old, self.v(s.value)))

    def s_TempAtomicAdd(self, s):
        def locate(view: T.DataType) -> int:
            return self.element("temps", 0, view, self.c(T.u32, 2 * s.slot if view.bits == 32 else s.slot))
        self.atomic("add", s.value.type, self.v(s.value), locate)

    # ---- addressing ----------------------------------------------------------------------------
    def _entry_index(self, st: _Stack, position: int) -> int:
        """The heap element of entry `position` (u32) of the stack."""
        it = self.index_type
        return self.op(Op.IAdd, it, st.base, self.op(Op.IMul, it, self._index(position), st.step))

    def _top_index(self, st: _Stack) -> int:
        """The top entry, count - 1 clamped (unsigned) to capacity - 1: an empty stack's top is
        the last entry, never outside the stack."""
        n = self.fb.emit(Op.Load, self.ty(T.u32), st.count)
        top = self.glsl(T.u32, GLSL.UMin, self.op(Op.ISub, T.u32, n, self.c(T.u32, 1)), st.last)
        return self._entry_index(st, top)

    def _adjoint_index(self, st: _Stack, at: int) -> int:
        return self.op(Op.IAdd, self.index_type, at, st.pitch)

    def _heap_element(self, st: _Stack, at: int) -> int:
        return self.element(layout.SPIRV_HEAP_NAMES[st.heap], 0, _HEAP_TYPES[st.heap], at)

    def _to_heap(self, value: int, st: _Stack) -> int:
        if st.dtype is T.u1:
            return self.select(T.i32, value, self.c(T.i32, 1), self.c(T.i32, 0))
        return value

    def _from_heap(self, value: int, st: _Stack) -> int:
        if st.dtype is T.u1:
            return self.boolean(Op.INotEqual, value, self.c(T.i32, 0))
        return value

    def _report_overflow(self, st: _Stack, n: int) -> None:
        """Raise the overflow word to (required, task, stack) by an unsigned max: 64-bit where
        the target has Int64, else on each 32-bit half."""
        capped = self.glsl(T.u32, GLSL.UMin, n, self.c(T.u32, layout.REQUIRED_MAX - 1))
        required = self.op(Op.IAdd, T.u32, capped, self.c(T.u32, 1))
        scope, relaxed = self.c(T.u32, SCOPE_DEVICE), self.c(T.u32, SEMANTICS_RELAXED)
        if self.caps.int64:
            self.m.require(Capability.Int64Atomics)
            code = self.op(Op.BitwiseOr, T.u64,
                           self.op(Op.ShiftLeftLogical, T.u64, self.op(Op.UConvert, T.u64, required),
                                   self.c(T.u64, layout.REQUIRED_SHIFT)), self.c(T.u64, st.site))
            word = self.element("errors", 0, T.u64, self.c(T.u32, OVERFLOW_WORD))
            self.fb.emit(Op.AtomicUMax, self.ty(T.u64), word, scope, relaxed, code)
            return
        low = self.element("errors", 0, T.u32, self.c(T.u32, 2 * OVERFLOW_WORD))
        high = self.element("errors", 0, T.u32, self.c(T.u32, 2 * OVERFLOW_WORD + 1))
        self.fb.emit(Op.AtomicUMax, self.ty(T.u32), low, scope, relaxed, self.c(T.u32, st.site))
        self.fb.emit(Op.AtomicUMax, self.ty(T.u32), high, scope, relaxed, required)
