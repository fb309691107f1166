"""Scalar data types shared by the compiler, the artifact format and the runtime."""
from __future__ import annotations

import numpy as np


class DataType:
    """A scalar type of the kernel language (`qd.f32`, `qd.i64`, `qd.u1`, ...)."""

    __slots__ = ("name", "bits", "kind", "np_dtype")

    def __init__(self, name: str, bits: int, kind: str, np_dtype):
        self.name = name
        self.bits = bits
        self.kind = kind  # "float", "int" (signed), "uint" (unsigned), "bool"
        self.np_dtype = np.dtype(np_dtype)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integral(self) -> bool:
        return self.kind != "float"

    @property
    def nbytes(self) -> int:
        return self.np_dtype.itemsize

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):  # types are singletons; copy/deepcopy must keep identity
        return (by_name, (self.name,))

    def __call__(self, value):
        """`qd.f32(1.5)` in Python scope converts like a numpy scalar."""
        return self.np_dtype.type(value).item()


i8 = DataType("i8", 8, "int", np.int8)
i16 = DataType("i16", 16, "int", np.int16)
i32 = DataType("i32", 32, "int", np.int32)
i64 = DataType("i64", 64, "int", np.int64)
u8 = DataType("u8", 8, "uint", np.uint8)
u16 = DataType("u16", 16, "uint", np.uint16)
u32 = DataType("u32", 32, "uint", np.uint32)
u64 = DataType("u64", 64, "uint", np.uint64)
f16 = DataType("f16", 16, "float", np.float16)
f32 = DataType("f32", 32, "float", np.float32)
f64 = DataType("f64", 64, "float", np.float64)
u1 = DataType("u1", 1, "bool", np.bool_)

ALL_TYPES = (i8, i16, i32, i64, u8, u16, u32, u64, f16, f32, f64, u1)
_BY_NAME = {t.name: t for t in ALL_TYPES}
_BY_NUMPY = {t.np_dtype: t for t in ALL_TYPES}


def by_name(name: str) -> DataType:
    return _BY_NAME[name]


def from_numpy(dtype) -> DataType | None:
    return _BY_NUMPY.get(np.dtype(dtype))


def promote(a: DataType, b: DataType) -> DataType:
    """Binary-operation result type, following Taichi/Quadrants.

    Floats win over integers and the wider float wins; among integers the wider wins,
    and at equal width unsigned wins. `u1` behaves as an integer narrower than all others.
    """
    if a is b:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            return a if a.bits >= b.bits else b
        return a if a.is_float else b
    if a is u1:
        return b
    if b is u1:
        return a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "uint" else b
