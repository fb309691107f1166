"""Reading a kernel's return value after its launch (the artifact's "returns" record).

The kernel stores each returned scalar into a kernel temporary (device memory, the low bytes
of its 8-byte word); the launch function of a kernel that returns ends with a call of a
`ResultReader`, which reads the temporaries back (on a GPU a ranged copy after `sync()`, which
waits for the launch and raises a pending error as any host read does; on a synchronous
host-memory device such as the CPU straight from memory) and builds the Python value: a
Python scalar per scalar, a numpy array per vector or matrix, a `StructResult` (a dict of the
members, also readable as attributes: `r.a`, `r["a"]`) per struct, a tuple when the kernel's
annotation is a tuple.
"""
from __future__ import annotations

import numpy as np

from .contract.types import by_name


class ResultReader:
    """`reader()` is the return value of the launch that just ran on `temps`."""

    def __init__(self, record: dict, device, temps):
        self.device, self.temps = device, temps
        caps = device.capabilities
        direct = temps.host is not None and caps.synchronous
        # the words read: device memory itself when the host may read it now, else a copy of it
        self.copy = None if direct else np.zeros(max(record["slots"]) + 1, np.uint64)
        words = temps.host.view(np.uint64) if direct else self.copy
        self.is_tuple = record["tuple"]
        self.items = []  # per item: (typed view of its words' low bytes, element shape)
        slots = iter(record["slots"])
        for dtype, shape in record["values"]:
            count = int(np.prod(shape)) if shape else 1
            self.items.append((_low_bytes(words, [next(slots) for _ in range(count)], by_name(dtype).np_dtype),
                               tuple(shape)))

        # struct items: (first value, layout); the other values are items of their own
        self.structs = {first: (layout, _value_count(layout)) for first, layout in record.get("structs", [])}

    def __call__(self):
        if self.copy is not None:
            # a host read, like x[i]: an error of any launch still in flight (this one's or an
            # earlier one's) is raised here rather than left for a later qd.sync()
            self.device.sync()
            self.device.copy_to_host(self.temps, self.copy)
        values = [view.item() if not shape else view.reshape(shape).copy() for view, shape in self.items]
        if self.structs:
            values = self.group_structs(values)
        return tuple(values) if self.is_tuple else values[0]

    def group_structs(self, values: list) -> list:
        items, i = [], 0
        while i < len(values):
            layout, count = self.structs.get(i, (None, 1))
            items.append(values[i] if layout is None else _build_struct(layout, iter(values[i:i + count])))
            i += count
        return items


class StructResult(dict):
    """A struct returned by a kernel: a dict of its members (nested structs are StructResults),
    whose members also read as attributes (`r.v`, as Quadrants' returned struct has them)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"the struct has no member '{name}' (its members: {', '.join(self)})") from None

    def to_dict(self) -> dict:
        """Plain nested dicts, vectors and matrices as nested lists (Quadrants' Struct.to_dict)."""
        return {k: v.to_dict() if isinstance(v, StructResult) else v.tolist() if isinstance(v, np.ndarray) else v
                for k, v in self.items()}


def _value_count(layout: dict) -> int:
    return sum(_value_count(sub) if isinstance(sub, dict) else 1 for _, sub in layout["members"])


def _build_struct(layout: dict, values) -> StructResult:
    return StructResult((member, _build_struct(sub, values) if isinstance(sub, dict) else next(values))
                        for member, sub in layout["members"])


def _low_bytes(words: np.ndarray, slots: list[int], np_dtype: np.dtype) -> np.ndarray:
    """A view of the values of type `np_dtype` in the low bytes of `words[slots]` (little-endian,
    as every target here), or a gathered copy's view when the slots are not consecutive."""
    first = slots[0]
    if slots != list(range(first, first + len(slots))):
        raise ValueError("returns: the temporaries of one returned value must be consecutive")
    block = words[first:first + len(slots)].view(np.uint8).reshape(len(slots), 8)
    return block[:, :np_dtype.itemsize].view(np_dtype).reshape(len(slots))
