"""Adstacks in SPIR-V (a mixin of lowering.TaskLowering), laid out as
runtime/contract/adstack_layout.py's SPIR-V record says: a float heap ("adstack_float", f32,
primal and adjoint interleaved) and an int heap ("adstack_int", u32 words: an i32, a u1 widened,
or an f64/i64 as two words, low then high, an f64's adjoint two more words after its primal).
Each invocation owns a slice of `stride[heap]` elements in which stack s starts at `offset[s]`,
the slices interleaved element by element so that neighbouring invocations pushing entry j
write neighbouring words (coalesced): element r of invocation i's slice is heap element
`r * H + i`, H the invocations the heaps hold; the strides, offsets, capacities and H are read
from "adstack_meta". A stack's count is a private (Function) variable.

A 64-bit value goes to and from its words as a two-component u32 vector (OpBitcast,
component 0 the low word): no 64-bit integer arithmetic.

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
from qdc.runtime.contract.error_slot import OVERFLOW_WORD

from ..base import Unsupported
from .spec import GLSL, SCOPE_DEVICE, SEMANTICS_RELAXED, Capability, Op

META = layout.SPIRV_META
FLOAT_HEAP = layout.SPIRV_ELEMENT["f32"][0]
_HEAP_TYPES = (T.f32, T.u32)  # element type of the float and int heap


class _Stack:
    """A lowered stack: the heap element of its first entry for this invocation (index type),
    `pitch` (index type: elements from one element of an invocation's slice to the next, the
    invocations the heaps hold) and `step` (pitch times the entry's elements), capacity and
    last entry (u32), count variable (u32), heap, `words` (heap elements of one value)."""
    __slots__ = ("base", "pitch", "step", "capacity", "last", "count", "heap", "dtype", "adjoint", "site", "words")

    def __init__(self, base, pitch, step, capacity, last, count, heap, dtype, adjoint, site, words):
        self.base, self.pitch, self.step = base, pitch, step
        self.capacity, self.last, self.count = capacity, last, count
        self.heap, self.dtype, self.adjoint, self.site, self.words = heap, dtype, adjoint, site, words


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
                      layout.overflow_site(task, s.stack_id), heap_layout.element_bytes(s.type) // 4)

    def s_AdStackPush(self, s):
        st = self.v(s.stack)
        n = self.fb.emit(Op.Load, self.ty(T.u32), st.count)

        def write():
            at = self._entry_index(st, n)
            self._store_value(st, at, self.v(s.value))
            if st.adjoint:
                self._store_value(st, self._adjoint_index(st, at), self.c(st.dtype, 0.0))

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
        return self._load_value(st, self._top_index(st))

    def s_AdStackLoadTopAdj(self, s):
        st = self.v(s.stack)
        return self._load_value(st, self._adjoint_index(st, self._top_index(st)))

    def s_AdStackAccAdjoint(self, s):
        st = self.v(s.stack)
        at = self._adjoint_index(st, self._top_index(st))
        self._store_value(st, at, self.op(Op.FAdd, st.dtype, self._load_value(st, at), self.v(s.value)))

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
        """The heap element of the adjoint of the entry at `at`: right after its primal's words."""
        return self._word_index(st, at, st.words)

    def _word_index(self, st: _Stack, at: int, word: int) -> int:
        """The heap element of word `word` of the value at `at`: each word its own element of
        the slice, so neighbouring invocations touch neighbouring words."""
        if word == 0:
            return at
        it = self.index_type
        return self.op(Op.IAdd, it, at, self.op(Op.IMul, it, st.pitch, self.c(it, word)))

    def _heap_element(self, st: _Stack, at: int) -> int:
        return self.element(layout.SPIRV_HEAP_NAMES[st.heap], 0, _HEAP_TYPES[st.heap], at)

    def _store_value(self, st: _Stack, at: int, value: int) -> None:
        """Store a value of the stack's type (a primal, or an adjoint) at `at` as its heap words."""
        for word, bits in enumerate(self._to_heap(value, st)):
            self.fb.emit_void(Op.Store, self._heap_element(st, self._word_index(st, at, word)), bits)

    def _load_value(self, st: _Stack, at: int) -> int:
        """The value of the stack's type whose heap words start at `at`."""
        element = self.ty(_HEAP_TYPES[st.heap])
        words = [self.fb.emit(Op.Load, element, self._heap_element(st, self._word_index(st, at, word)))
                 for word in range(st.words)]
        return self._from_heap(words, st)

    def _to_heap(self, value: int, st: _Stack) -> list:
        """`value`'s heap words: an f32 as is, an i32 or a u1 (0/1) as one u32, a 64-bit value as
        two (low first)."""
        if st.heap == FLOAT_HEAP:
            return [value]
        if st.dtype is T.u1:
            return [self.select(T.u32, value, self.c(T.u32, 1), self.c(T.u32, 0))]
        if st.words == 1:
            return [self.op(Op.Bitcast, T.u32, value)]
        pair = self.fb.emit(Op.Bitcast, self._word_pair(), value)
        return [self.fb.emit(Op.CompositeExtract, self.ty(T.u32), pair, word) for word in range(2)]

    def _from_heap(self, words: list, st: _Stack) -> int:
        if st.heap == FLOAT_HEAP:
            return words[0]
        if st.dtype is T.u1:
            return self.boolean(Op.INotEqual, words[0], self.c(T.u32, 0))
        if st.words == 1:
            return self.op(Op.Bitcast, st.dtype, words[0])
        return self.op(Op.Bitcast, st.dtype, self.fb.emit(Op.CompositeConstruct, self._word_pair(), *words))

    def _word_pair(self) -> int:
        return self.m.vector(self.ty(T.u32), 2)

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
