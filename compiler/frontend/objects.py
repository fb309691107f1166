"""Compile-time objects the front end passes around besides numbers and IR values."""
from __future__ import annotations

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker as Field

from .. import ir


class NdarrayHandle:
    """An ndarray parameter as seen inside a kernel."""

    def __init__(self, arg_index: int, name: str, dtype: T.DataType, ndim: int, needs_grad: bool, grad=False,
                 element_shape: tuple = (), layout=None, keyed_values=None):
        """`ndim` counts the array's own axes; an ndarray of vectors adds `element_shape`'s.
        `layout`: the order its axes are stored in (None: as indexed); the kernel indexes it in
        declared order and the front end permutes (ast_to_ir.py, global_address and extent).
        `keyed_values`: the values of a small numpy array of a template argument, which are part
        of the cache key (language/dataclass_args.py): `*a` spreads them as constants."""
        self.arg_index, self.name, self.dtype, self.ndim = arg_index, name, dtype, ndim
        self.needs_grad, self.is_grad = needs_grad, grad
        self.element_shape = tuple(element_shape)
        self.layout = layout
        self.keyed_values = keyed_values

    def ref(self) -> ir.NdarrayRef:
        return ir.NdarrayRef(self.arg_index, self.name, self.dtype, self.ndim + len(self.element_shape), self.is_grad)


class SharedArrayHandle:
    """A `qd.simt.block.SharedArray` inside a kernel: indexed like an ndarray, its shape static."""

    def __init__(self, ref: ir.SharedRef, element: tuple):
        self.shared = ref
        self.name, self.dtype = ref.name, ref.dtype
        self.element_shape = element
        self.ndim = len(ref.shape) - len(element)
        self.shape = ref.shape[:self.ndim]
        self.is_grad = False

    def ref(self) -> ir.SharedRef:
        return self.shared


# What a kernel indexes as memory: fields, ndarray parameters, block-shared arrays.
GLOBAL_ARRAYS = (Field, NdarrayHandle, SharedArrayHandle)


class Shape(tuple):
    """`a.shape` inside a kernel: a tuple (of run-time values for an ndarray) that remembers
    whose shape it is, so that an index past its end names the array and its ndim."""

    def __new__(cls, dims, kind: str, name: str):
        shape = super().__new__(cls, dims)
        shape.kind, shape.name = kind, name  # kind: "field" or "ndarray parameter"
        return shape

    def out_of_range(self, index) -> str:
        return f"{self.kind} '{self.name}' has ndim {len(self)}: {self.name}.shape[{index}] is out of range"


class RangeSpec:
    """`range(...)` inside a kernel: begin/end compile-time ints or run-time integers, and a
    constant positive step. Only valid as a loop iterable (or inside qd.static when constant)."""

    def __init__(self, begin, end, step: int):
        self.begin, self.end, self.step = begin, end, step

    def as_static(self) -> range | None:
        if isinstance(self.begin, ir.Stmt) or isinstance(self.end, ir.Stmt):
            return None
        return range(self.begin, self.end, self.step)
