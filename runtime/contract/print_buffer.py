"""The device print buffer: how kernels hand `print` lines, failed asserts and debug-check
messages (integer overflow, negative integer powers) to the host.

Layout (little-endian, one buffer per device, its address in the ctx word `print_slot`, on
SPIR-V the "print" binding):

    bytes 0-3    u32 count     records appended since the host last drained the buffer; a
                               kernel adds 1 only while it is below COUNT_LIMIT, so it never
                               wraps (the host then reports "at least N lines dropped")
    bytes 4-7    u32 capacity  records the buffer holds (written by the host)
    bytes 64...  capacity records of RECORD_WORDS u64 words each:
                 word 0        the message's key (low u32, `message_key`) and its index in
                               the kernel's `messages` (high u32)
                 words 1...    the message's values, each in the low bytes of its word

A kernel appends with one atomic add on the count and writes the record only when its index
is below the capacity. The host reads the buffer at sync (after each launch on synchronous
devices), prints the records in order, notes the dropped ones, resets the count, and raises
an AssertionError for the first failed assert. A kernel without messages binds nothing.

Metadata: KernelMeta.messages has one record per message, its index being its position:
[kind, texts, specs, dtypes, where, source] with kind one of MESSAGE_KINDS, texts the literal
pieces around the values (len(values) + 1 of them), specs each value's format spec ("" for
its plain form), dtypes their types, where "file:line:col" and source the line's text.
"""
from __future__ import annotations

import zlib

import numpy as np

from .types import by_name

HEADER_BYTES = 64
RECORD_WORDS = 32
MAX_VALUES = RECORD_WORDS - 1
RECORD_BYTES = 8 * RECORD_WORDS
COUNT_LIMIT = 1 << 31
DEFAULT_RECORDS = 4096  # 1 MiB of records per device

MESSAGE_KINDS = ("print", "assert", "overflow", "index")  # index: a debug check, raised as IndexError


def message_key(kernel_name: str, messages: list) -> int:
    """A kernel's 32-bit message key: records name their message table by it. Kernels with
    equal names and tables share a key, harmlessly: their records read the same."""
    return zlib.crc32(repr((kernel_name, messages)).encode()) or 1


def record_head(key: int, index: int) -> int:
    """Word 0 of a record: the message key in the low u32, the message's index in the high."""
    return key | index << 32


def split_head(word: int) -> tuple[int, int]:
    """(key, index) of a record's word 0."""
    return word & 0xFFFFFFFF, word >> 32


def check_message_record(i: int, r) -> None:
    """Message record `i` of a kernel's metadata (see the module docstring)."""
    def need(ok: bool, what: str):
        if not ok:
            raise ValueError(f"message {i}: {what}")
    need(isinstance(r, list) and len(r) == 6, "not a 6-entry record")
    kind, texts, specs, dtypes, where, source = r
    need(kind in MESSAGE_KINDS, f"unknown kind {kind!r}")
    need(isinstance(specs, list) and isinstance(dtypes, list) and len(specs) == len(dtypes) <= MAX_VALUES,
         "specs and dtypes")
    need(isinstance(texts, list) and len(texts) == len(specs) + 1 and all(isinstance(t, str) for t in texts),
         "texts")
    need(all(isinstance(s, str) and len(s) < 64 for s in specs), "format specs")
    for d in dtypes:
        try:
            by_name(d)
        except (KeyError, ValueError, TypeError):
            need(False, f"unknown dtype {d!r}")
    need(isinstance(where, str) and isinstance(source, str), "location")


def decode_value(word: np.uint64, dtype: str):
    """The Python value in the low bytes of a record word."""
    t = by_name(dtype)
    if t.bits == 1:
        return bool(int(word) & 1)
    low = np.array([word], np.uint64).view(np.uint8)[: max(t.bits // 8, 1)]
    value = low.view(t.np_dtype)[0]
    return value


def format_value(value, spec: str) -> str:
    """A value as Python's format() writes it with `spec`; without one, floats in their
    shortest round-tripping form for their own precision (numpy's str of an f32 0.1 is 0.1)."""
    if spec:
        python = value.item() if isinstance(value, np.generic) else value
        return format(python, spec)
    return str(value)


def format_message(record: list, words: np.ndarray) -> str:
    """The text of one message record with its values `words`."""
    kind, texts, specs, dtypes, where, source = record
    parts = [texts[0]]
    for k, (spec, dtype) in enumerate(zip(specs, dtypes)):
        parts.append(format_value(decode_value(words[k], dtype), spec))
        parts.append(texts[k + 1])
    return "".join(parts)


def drained_records(buffer: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """(records as a [n, RECORD_WORDS] u64 array, records dropped, whether the count hit its
    limit) of a buffer's bytes up to its records."""
    count, capacity = (int(x) for x in buffer[:8].view(np.uint32))
    kept = min(count, capacity)
    records = buffer[HEADER_BYTES:HEADER_BYTES + kept * RECORD_BYTES].view(np.uint64).reshape(kept, RECORD_WORDS)
    return records, count - kept, count >= COUNT_LIMIT
