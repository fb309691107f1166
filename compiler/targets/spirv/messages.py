"""SPIR-V lowering of DebugMessage: one record appended to the print buffer (the "print"
binding, runtime/contract/print_buffer.py), viewed as u32 words. Metal has no such buffer
here: its messages are dropped with a compile warning."""
from __future__ import annotations

import warnings

from qdc.runtime.contract import types as T
from qdc.runtime.contract.print_buffer import COUNT_LIMIT, HEADER_BYTES, RECORD_BYTES, message_key

from .spec import SCOPE_DEVICE, SEMANTICS_RELAXED, Op


class MessageLowering:
    def s_DebugMessage(self, s):
        if self.arch == "metal":
            self.warn_messages_dropped()
            return
        scope, relaxed = self.c(T.u32, SCOPE_DEVICE), self.c(T.u32, SEMANTICS_RELAXED)
        count = self.element("print", 0, T.u32, self.c(T.u32, 0))
        words = [self.c(T.u32, message_key(self.k.name, self.k.messages)), self.c(T.u32, s.message)]
        for v in s.values:
            words += self.record_words(self.v(v), v.type)

        def append():
            index = self.fb.emit(Op.AtomicIAdd, self.ty(T.u32), count, scope, relaxed, self.c(T.u32, 1))
            capacity = self.fb.emit(Op.Load, self.ty(T.u32), self.element("print", 0, T.u32, self.c(T.u32, 1)))
            self.if_then(self.boolean(Op.ULessThan, index, capacity), lambda: self.write_record(index, words))

        # Below the limit only, so the count never wraps however many records are dropped.
        seen = self.fb.emit(Op.AtomicLoad, self.ty(T.u32), count, scope, relaxed)
        self.if_then(self.boolean(Op.ULessThan, seen, self.c(T.u32, COUNT_LIMIT)), append)

    def write_record(self, index: int, words: list) -> None:
        start = self.op(Op.IAdd, T.u32, self.c(T.u32, HEADER_BYTES // 4),
                        self.op(Op.IMul, T.u32, index, self.c(T.u32, RECORD_BYTES // 4)))
        for k, word in enumerate(words):
            position = self.op(Op.IAdd, T.u32, start, self.c(T.u32, k))
            self.fb.emit_void(Op.Store, self.element("print", 0, T.u32, position), word)

    def record_words(self, value: int, t: T.DataType) -> list:
        """(low, high) u32 words holding `value`'s bits in their low bytes."""
        zero = self.c(T.u32, 0)
        if t is T.u1:
            return [self.select(T.u32, value, self.c(T.u32, 1), zero), zero]
        if t.bits == 64:
            bits = self.op(Op.Bitcast, T.u64, value)
            high = self.op(Op.ShiftRightLogical, T.u64, bits, self.c(T.u64, 32))
            return [self.op(Op.UConvert, T.u32, bits), self.op(Op.UConvert, T.u32, high)]
        if t.bits == 32:
            return [self.op(Op.Bitcast, T.u32, value), zero]
        unsigned = T.u16 if t.bits == 16 else T.u8
        return [self.op(Op.UConvert, T.u32, self.op(Op.Bitcast, unsigned, value)), zero]

    def warn_messages_dropped(self) -> None:
        if getattr(self, "warned_messages", False):
            return
        self.warned_messages = True
        warnings.warn(f"kernel '{self.k.name}': print, assert and debug checks print nothing on Metal",
                      stacklevel=2)
