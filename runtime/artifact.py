"""The artifact format: the one contract between the compiler and the runtime.

A compiled kernel is a `KernelMeta` (msgpack-able dict) plus named binary artifacts. The
launch context ("ctx") is an array of 64-bit words whose layout the metadata describes:

    word  param.slot                 scalar argument (stored in the low bytes by its type)
    word  param.slot                 ndarray data pointer, then one word per dimension (shape),
                                     then the gradient buffer pointer if needs_grad
    word  field_slot0 + i            base pointer of the kernel's i-th field
    word  temps_slot                 pointer to the kernel's temporaries (values crossing tasks)
    word  threads_slot               number of worker threads to use

Bump FORMAT_VERSION whenever this layout or the metadata schema changes.
"""
from __future__ import annotations

FORMAT_VERSION = 1


class ParamMeta:
    __slots__ = ("name", "kind", "dtype", "ndim", "needs_grad", "slot")

    def __init__(self, name, kind, dtype, ndim=0, needs_grad=False, slot=0):
        self.name, self.kind, self.dtype, self.ndim = name, kind, dtype, ndim
        self.needs_grad, self.slot = needs_grad, slot

    @property
    def words(self) -> int:
        return 1 if self.kind == "scalar" else 1 + self.ndim + (1 if self.needs_grad else 0)


class FieldMeta:
    __slots__ = ("name", "dtype", "shape", "is_grad")

    def __init__(self, name, dtype, shape, is_grad=False):
        self.name, self.dtype, self.shape, self.is_grad = name, dtype, tuple(shape), is_grad


class TaskMeta:
    __slots__ = ("name", "kind", "serial", "source_kind")

    def __init__(self, name, kind, serial, source_kind):
        self.name, self.kind, self.serial, self.source_kind = name, kind, serial, source_kind


class KernelMeta:
    """Everything the runtime needs to bind arguments and launch one compiled kernel."""

    def __init__(self, name: str, entry: str, params: list, fields: list, tasks: list,
                 num_temps: int = 0, is_grad: bool = False, adstack: dict | None = None):
        self.name, self.entry = name, entry
        self.params, self.fields, self.tasks = params, fields, tasks
        self.num_temps, self.is_grad = num_temps, is_grad
        self.adstack = adstack or {}
        slot = 0
        for p in params:
            p.slot = slot
            slot += p.words
        self.field_slot0 = slot
        self.temps_slot = slot + len(fields)
        self.threads_slot = self.temps_slot + 1
        self.ctx_words = self.threads_slot + 1

    def to_dict(self) -> dict:
        return {
            "name": self.name, "entry": self.entry, "num_temps": self.num_temps,
            "is_grad": self.is_grad, "adstack": self.adstack,
            "params": [[p.name, p.kind, p.dtype, p.ndim, p.needs_grad] for p in self.params],
            "fields": [[f.name, f.dtype, list(f.shape), f.is_grad] for f in self.fields],
            "tasks": [[t.name, t.kind, t.serial, t.source_kind] for t in self.tasks],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "KernelMeta":
        return cls(d["name"], d["entry"],
                   [ParamMeta(*p) for p in d["params"]],
                   [FieldMeta(*f) for f in d["fields"]],
                   [TaskMeta(*t) for t in d["tasks"]],
                   d["num_temps"], d["is_grad"], d.get("adstack") or {})
