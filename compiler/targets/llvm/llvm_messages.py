"""LLVM lowering of DebugMessage: one record appended to the print buffer
(runtime/contract/print_buffer.py), whose address is the ctx word `print_slot`."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract.print_buffer import COUNT_LIMIT, HEADER_BYTES, RECORD_BYTES, message_key, record_head

from .llvm_types import I8, I32, I64, PTR

_FLOAT_BITS = {ll.HalfType: 16, ll.FloatType: 32, ll.DoubleType: 64}


class MessageLowering:
    def s_DebugMessage(self, s):
        b, meta = self.b, self.cg.meta
        buffer = self.ctx_word(meta.print_slot, PTR)
        count = buffer  # the u32 count is the buffer's first word
        # Below the limit only, so the count never wraps however many records are dropped.
        seen = b.load_atomic(count, "monotonic", 4, typ=I32)
        with b.if_then(b.icmp_unsigned("<", seen, ll.Constant(I32, COUNT_LIMIT)), likely=True):
            index = b.atomic_rmw("add", count, ll.Constant(I32, 1), "monotonic")
            capacity = b.load(b.gep(buffer, [ll.Constant(I64, 1)], source_etype=I32), typ=I32)
            with b.if_then(b.icmp_unsigned("<", index, capacity), likely=True):
                offset = b.add(b.mul(b.zext(index, I64), ll.Constant(I64, RECORD_BYTES)),
                               ll.Constant(I64, HEADER_BYTES))
                record = b.gep(buffer, [offset], source_etype=I8)
                head = record_head(message_key(meta.name, meta.messages), s.message)
                words = [ll.Constant(I64, head)] + [self.record_word(self.v(v)) for v in s.values]
                for k, word in enumerate(words):
                    b.store(word, b.gep(record, [ll.Constant(I64, k)], source_etype=I64))

    def record_word(self, value):
        """`value`'s bits in the low bytes of an i64."""
        bits = _FLOAT_BITS.get(type(value.type))
        if bits is not None:
            value = self.b.bitcast(value, ll.IntType(bits))
        return value if value.type.width == 64 else self.b.zext(value, I64)
