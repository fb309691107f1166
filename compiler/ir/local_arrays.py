"""IR statements of local arrays: a vector or matrix local that the kernel indexes at run time.

The front end keeps a vector local as one scalar `Alloca` per component (frontend/vectors.py), so
that every pass, forward-mode and reverse-mode autodiff included, treats its components as the
scalars they are. A read `v[i]` with `i` known only at run time is a chain of selects over the
components, a write a conditional store to each of them. Once the passes and autodiff are done,
passes/local_arrays.py regroups such a local into one `LocalArray` and makes those chains an
`ArrayLoad` and those stores an `ArrayStore` at the run-time index: a load or store through an
address instead of N compares and selects, in LLVM (an `alloca [N x T]` and a GEP) and SPIR-V
(a Function-storage array variable and an OpAccessChain).

Every index an `ArrayLoad` or `ArrayStore` gets is an i32 within the array: the pass clamps
run-time indices in the IR itself (passes/local_arrays.py says how), so no backend checks them.
"""
from __future__ import annotations

from qdc.runtime.contract.types import DataType

from .stmts import SourceLoc, Stmt

__all__ = ["ComponentGroup", "LocalArray", "ArrayLoad", "ArrayStore"]


class ComponentGroup:
    """The scalar locals of one vector or matrix local: the front end marks each component's
    `Alloca` with `component_of = (group, position)` (row-major position), which tells the
    regrouping pass which scalars form one array. Copies of a statement share the group."""
    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


class LocalArray(Stmt):
    """A mutable local array of `length` elements of scalar type `type`, zero-initialised where
    it stands (as an `Alloca` is); used only as the `array` of ArrayLoad and ArrayStore."""
    ATTRS = ("length", "var_name")

    def __init__(self, type: DataType, length: int, var_name: str = "", loc: SourceLoc | None = None):
        super().__init__(type, loc)
        self.length, self.var_name = length, var_name


class ArrayLoad(Stmt):
    """Element `index` (an i32 in [0, length)) of `array`."""
    OPERANDS = ("array", "index")

    def __init__(self, array: LocalArray, index: Stmt, loc=None):
        super().__init__(array.type, loc)
        self.array, self.index = array, index


class ArrayStore(Stmt):
    """Element `index` (an i32 in [0, length)) of `array` = `value`."""
    OPERANDS = ("array", "index", "value")

    def __init__(self, array: LocalArray, index: Stmt, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.array, self.index, self.value = array, index, value
