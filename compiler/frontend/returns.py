"""Kernel return values (docs/api.md): `-> qd.f32` (any scalar type), a vector/matrix type, or a
tuple of them (`-> tuple[qd.f32, qd.i32]`, or Quadrants' `-> (qd.f32, qd.i32)`).

A kernel returns from its top-level code, once, as its last statement (as in Quadrants, a
`return` inside a loop or a run-time `if` is an error). Each returned scalar (each component
of a vector or matrix) is converted to the declared type and stored into a kernel temporary
of its own, in device memory like every temporary; the launcher reads them back after the
launch (which waits for it on a GPU) and the call returns Python scalars, numpy arrays for
vectors and matrices, or a tuple of those. `KernelIR.returns` (the artifact's "returns"
record, runtime/contract/artifact.py) says which temporaries hold which values. The grad
variant returns nothing: its front end evaluates the expression and stores nothing.

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import ast
import inspect
import math
import typing

from qdc.runtime.contract import types as T
from qdc.runtime.contract.artifact_schema import MAX_RETURN_SCALARS

from .. import ir
from ..language.structs import StructType
from .structs import StructValue
from .values import is_runtime


class StructItem:
    """A returned struct: its type, its layout as the metadata records it, and its members'
    values as (member path, dtype, element shape), nested structs flattened (StructType.leaves)."""

    def __init__(self, stype: StructType, default_ip: T.DataType, default_fp: T.DataType):
        self.stype = stype
        self.layout = stype.layout(default_ip, default_fp)
        self.leaves = stype.leaves(default_ip, default_fp)

    @property
    def scalars(self) -> int:
        return sum(math.prod(shape) for _, _, shape in self.leaves)


class ReturnType:
    """What a kernel's annotation says it returns: per item (dtype, element shape: () for a
    scalar, (n,) for a vector, (n, m) for a matrix) or a StructItem, and whether the items
    form a tuple."""

    def __init__(self, items: list, is_tuple: bool):
        self.items, self.is_tuple = items, is_tuple

    def record(self, slots: list[int]) -> dict:
        """The artifact's "returns" record: a struct's member values are values of their own,
        grouped back by "structs" (only with a struct among the items)."""
        values, structs = [], []
        for item in self.items:
            if isinstance(item, StructItem):
                structs.append([len(values), item.layout])
                values += [[dtype.name, list(shape)] for _, dtype, shape in item.leaves]
            else:
                values.append([item[0].name, list(item[1])])
        record = {"values": values, "tuple": self.is_tuple, "slots": slots}
        if structs:
            record["structs"] = structs
        return record


def return_type(fn, default_ip: T.DataType, default_fp: T.DataType, error) -> ReturnType | None:
    """The kernel's declared return type, None without an annotation (or `-> None`). `error(msg)`
    raises a located compile error."""
    ann = inspect.signature(fn).return_annotation
    if ann is inspect.Signature.empty or ann is None:
        return None
    if isinstance(ann, str):
        try:
            ann = eval(ann, fn.__globals__)  # noqa: S307  (the user's own annotation, as typing does)
        except Exception as e:  # noqa: BLE001  (reported at the annotation)
            error(f"the return annotation cannot be evaluated: {type(e).__name__}: {e}")
        if ann is None:
            return None
    if typing.get_origin(ann) is tuple:
        parts, is_tuple = typing.get_args(ann), True
        if len(parts) == 2 and parts[1] is Ellipsis:
            error("a kernel's return tuple needs one type per value (tuple[qd.f32, qd.i32]), not `...`")
    elif isinstance(ann, (tuple, list)):
        parts, is_tuple = tuple(ann), True
    else:
        parts, is_tuple = (ann,), False
    if is_tuple and not parts:
        error("a kernel's return tuple needs at least one type")
    items = [_item(p, default_ip, default_fp, error) for p in parts]
    scalars = sum(item.scalars if isinstance(item, StructItem) else math.prod(item[1]) for item in items)
    if scalars > MAX_RETURN_SCALARS:
        error(f"a kernel returns at most {MAX_RETURN_SCALARS} scalars (every component of every value), "
              f"this one declares {scalars}")
    return ReturnType(items, is_tuple)


def _item(ann, default_ip, default_fp, error) -> tuple[T.DataType, tuple]:
    if ann is int or ann is float:
        return (default_ip if ann is int else default_fp), ()
    if isinstance(ann, T.DataType):
        return ann, ()
    if isinstance(ann, StructType):
        return StructItem(ann, default_ip, default_fp)  # its scalars count against MAX_RETURN_SCALARS
    element_dtype = getattr(ann, "element_dtype", None)  # a vector/matrix type (language/matrix.py)
    if callable(element_dtype) and isinstance(getattr(ann, "shape", None), tuple):
        return element_dtype(default_ip, default_fp), tuple(ann.shape)
    error(f"unsupported return type {ann!r}: a kernel returns a qd scalar type (qd.f32, ...), a vector or "
          f"matrix type, a struct type, or a tuple of them")


class ReturnLowering:
    """`return` at a kernel's top level (funcs' returns are inlined: calls.py)."""

    def init_returns(self, fn, store: bool) -> None:
        self.store_returns = store
        self.kernel_returned = False
        self.declared_return = return_type(fn, self.values.default_ip, self.values.default_fp,
                                           lambda msg: self.error(msg, self.src.fn_def.returns or self.src.fn_def))

    def kernel_return(self, node: ast.Return) -> None:
        """A return the compiled code reaches (at the top level, possibly under `if qd.static`
        or in a qd.static loop) ends the kernel: frame.stop skips the rest."""
        declared = self.declared_return
        bare = node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)
        if declared is None and not bare:
            self.error("this kernel returns a value but declares no return type: annotate it, e.g. "
                       "`def k(...) -> qd.f32:`")
        if len(self.blocks) > 1:
            self.error("a kernel returns only from its top-level code: not inside a loop (a parallel loop's "
                       "iterations cannot return) or a run-time if; store into a variable and return it at the end")
        self.frame.stop = "return"
        if declared is None:  # `return` / `return None`: nothing to store
            return
        if node.value is None:
            self.error(f"this kernel declares a return type ({_describe(declared)}) but returns no value")
        value = self.visit(node.value)
        if declared.is_tuple:
            if not isinstance(value, tuple) or len(value) != len(declared.items):
                got = f"{len(value)} values" if isinstance(value, tuple) else "one value"
                self.error(f"the kernel declares {len(declared.items)} return values ({_describe(declared)}) but "
                           f"returns {got}", node.value)
            items = value
            nodes = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value] * len(items)
        else:
            items, nodes = (value,), (node.value,)
        scalars = []
        for item, v, n in zip(declared.items, items, nodes):
            if isinstance(item, StructItem):
                scalars += self.struct_return_components(v, item, n)
            else:
                scalars += self.return_components(v, item[0], item[1], n)
        slots = []
        if self.store_returns:
            k = self.kernel
            for v in scalars:
                slots.append(k.num_temps)
                k.num_temps += 1
                k.temp_types.append(v.type)
                self.emit(ir.TempStore(slots[-1], v))
            k.returns = declared.record(slots)
        self.kernel_returned = True

    def return_components(self, v, dtype: T.DataType, shape: tuple, node) -> list[ir.Stmt]:
        """The scalars of returned value `v` (row-major), each converted to `dtype`."""
        if not shape:
            if isinstance(v, tuple) or (not is_runtime(v) and hasattr(v, "shape")):
                self.error(f"the kernel declares a {dtype} return value but returns "
                           f"{_what(v)}", node)
            with self.at(node):
                return [self.values.materialize(self.convert(self.scalar(v, node), dtype, node))]
        components = self.vector_components(v, shape, node)
        with self.at(node):
            return [self.values.materialize(self.convert(self.scalar(c, node), dtype, node)) for c in components]

    def struct_return_components(self, v, item: StructItem, node) -> list[ir.Stmt]:
        """The scalars of a returned struct, member by member (StructType.leaves order)."""
        if not isinstance(v, StructValue) or v.stype != item.stype:
            got = f"a struct {v.stype!r}" if isinstance(v, StructValue) else _what(v)
            self.error(f"the kernel declares a struct {item.stype!r} return value but returns {got}", node)
        scalars = []
        for path, dtype, shape in item.leaves:
            member = v
            for name in path:
                member = member.members[name]
            scalars += self.return_components(member, dtype, shape, node)
        return scalars

    def vector_components(self, v, shape: tuple, node) -> list:
        """The scalars of a vector/matrix value of `shape`, row-major (a vector value of the
        front end, or nested tuples/lists of scalars)."""
        components = getattr(v, "components", None)  # a VectorValue (vectors.py): shape and components
        if isinstance(components, list):
            if tuple(v.shape) != shape:
                self.error(f"the kernel declares a return value of shape {shape} but returns one of shape "
                           f"{tuple(v.shape)}", node)
            return components
        rows = list(v) if isinstance(v, (tuple, list)) else None
        if rows is not None and len(shape) == 1 and len(rows) == shape[0]:
            return rows
        if rows is not None and len(shape) == 2 and len(rows) == shape[0] \
                and all(isinstance(r, (tuple, list)) and len(r) == shape[1] for r in rows):
            return [c for r in rows for c in r]
        self.error(f"the kernel declares a return value of shape {shape} but returns {_what(v)}", node)

    def finish_returns(self) -> None:
        if self.declared_return is not None and not self.kernel_returned:
            self.error(f"this kernel declares a return type ({_describe(self.declared_return)}) but its top-level "
                       f"code does not end with a return", self.src.fn_def.returns or self.src.fn_def)


def _describe(rt: ReturnType) -> str:
    names = [repr(item.stype) if isinstance(item, StructItem) else
             item[0].name if not item[1] else f"{item[0].name}{list(item[1])}" for item in rt.items]
    return f"({', '.join(names)})" if rt.is_tuple else names[0]


def _what(v) -> str:
    if isinstance(v, tuple):
        return f"a tuple of {len(v)}"
    if is_runtime(v):
        return f"a {v.type} scalar"
    shape = getattr(v, "shape", None)
    if shape is not None:
        return f"a value of shape {tuple(shape)}"
    return f"a {type(v).__name__}"
