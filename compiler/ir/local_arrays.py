"""IR statements of vector and matrix locals indexed at run time, and of the local arrays they
become.

The front end keeps a vector local as one scalar `Alloca` per component (frontend/vectors.py),
so that every pass treats its components as the scalars they are. `v[i]` with `i` known only at
run time is a `ComponentLoad` of those scalars, `v[i] = x` a `ComponentStore`: one statement
each, whatever the number of components, which store forwarding and dead-code elimination see as
a read (a write) of every component. Forward-mode and reverse-mode autodiff first expand them
into what they mean on scalars (passes/local_arrays.py, `expand_component_accesses`):

    ComponentLoad:  select(i == 0, v0, select(i == 1, v1, ... v[n-1]))   (i outside [0, n): v[n-1])
    ComponentStore: v_k = select(i == k, x, v_k) for every k              (i outside [0, n): no write)

The last pass of both pipelines (passes/local_arrays.py, `group_local_arrays`) makes the scalars
of such a local one `LocalArray`, and every access to them an `ArrayLoad` or `ArrayStore`: in
LLVM an `alloca [N x T]` and a GEP by the index, in SPIR-V a Function-storage array variable and
an OpAccessChain: one load or store where the expanded form is N compares and selects. Every
index an `ArrayLoad` or `ArrayStore` gets is an i32 within the array: that pass clamps run-time
indices in the IR itself (it says how), so no backend checks them.
"""
from __future__ import annotations

from qdc.runtime.contract.types import DataType

from .stmts import SourceLoc, Stmt

__all__ = ["ComponentLoad", "ComponentStore", "COMPONENT_ACCESSES", "INDEXED_MIN_COMPONENTS", "LocalArray",
           "ArrayLoad", "ArrayStore"]

# Vector locals of fewer components are indexed by the expanded form from the start: a chain of one
# or two selects costs no more than an array index's clamp, and scalars stay in registers where an
# array indexed at run time lives in memory.
INDEXED_MIN_COMPONENTS = 4


class ComponentLoad(Stmt):
    """Component `index` (a run-time integer) of the vector local whose scalar locals are
    `components` (Allocas of one type, row-major); an index outside them reads the last."""
    OPERANDS = ("components", "index")

    def __init__(self, components: list, index: Stmt, loc: SourceLoc | None = None):
        super().__init__(components[0].type, loc)
        self.components, self.index = list(components), index


class ComponentStore(Stmt):
    """Component `index` of the vector local whose scalar locals are `components` = `value`; an
    index outside them writes nothing."""
    OPERANDS = ("components", "index", "value")

    def __init__(self, components: list, index: Stmt, value: Stmt, loc: SourceLoc | None = None):
        super().__init__(None, loc)
        self.components, self.index, self.value = list(components), index, value


COMPONENT_ACCESSES = (ComponentLoad, ComponentStore)


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
