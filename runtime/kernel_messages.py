"""The host side of the print buffer (runtime/contract/print_buffer.py): one buffer per
device, a table of the message keys of the kernels loaded on it, and `drain`, which prints
what the kernels wrote, in order, and raises the first failed assert.

Synchronous devices drain right after each launch of a kernel with messages (its launcher's
finish hook); asynchronous ones at `Device.sync`.
"""
from __future__ import annotations

import sys

import numpy as np

from .contract.print_buffer import (DEFAULT_RECORDS, HEADER_BYTES, RECORD_BYTES, drained_records,
                                    format_message, message_key, split_head)


class PrintBuffer:
    """A device's print buffer and the message tables of the kernels that write into it."""

    def __init__(self, device, records: int = DEFAULT_RECORDS):
        self.device, self.records = device, records
        self.alloc = device.allocate_host_read(HEADER_BYTES + records * RECORD_BYTES)
        device.copy_to_device(self.alloc, np.array([0, records], np.uint32))
        self.kernels: dict = {}  # message key -> (kernel name, messages)

    def register(self, meta) -> int:
        """The buffer's address, for the ctx word of `meta`'s launches."""
        self.kernels[message_key(meta.name, meta.messages)] = (meta.name, meta.messages)
        return self.alloc.ptr

    def drain(self, out=None) -> None:
        """Print every record written since the last drain (and how many were dropped), reset
        the count, and raise AssertionError for the first failed assert among them."""
        header = np.zeros(HEADER_BYTES, np.uint8)
        self.device.copy_to_host(self.alloc, header)
        count = int(header[:4].view(np.uint32)[0])
        if not count:
            return
        kept = min(count, self.records)
        data = np.zeros(HEADER_BYTES + kept * RECORD_BYTES, np.uint8)
        self.device.copy_to_host(self.alloc, data)
        self.device.copy_to_device(self.alloc, np.zeros(1, np.uint32))
        records, dropped, saturated = drained_records(data)
        out = out or sys.stdout
        failure = None
        for words in records:
            key, index = split_head(int(words[0]))
            kernel, messages = self.kernels.get(key, (None, None))
            if messages is None or index >= len(messages):
                out.write(f"[qdc] a print record of an unknown kernel (key {key:#x}, message {index})\n")
                continue
            record = messages[index]
            text = format_message(record, words[1:])
            if record[0] == "print":
                out.write(text)  # its `end` included
            elif record[0] == "overflow":
                out.write(f"{text} in kernel '{kernel}' at {record[4]}\n    {record[5].strip()}\n")
            elif failure is None:
                error = IndexError if record[0] == "index" else AssertionError
                failure = error(f"{record[4]}: kernel '{kernel}': {text}\n    {record[5].strip()}")
        if dropped:
            note = "at least " if saturated else ""
            out.write(f"[qdc] {note}{dropped} lines dropped: the print buffer holds {self.records} lines "
                      f"between syncs\n")
        out.flush()
        if failure is not None:
            raise failure


def print_buffer(device) -> PrintBuffer:
    """`device`'s print buffer, made on first use."""
    if device.print_buffer is None:
        device.print_buffer = PrintBuffer(device)
    return device.print_buffer


def drain(device) -> None:
    """Drain `device`'s print buffer, if it has one."""
    if device.print_buffer is not None:
        device.print_buffer.drain()
