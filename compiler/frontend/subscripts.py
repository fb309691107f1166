"""Subscripts: elements of fields and ndarrays (`x[i, j]`, a vector index `x[I]`, arrays stored
with permuted axes), of vectors and matrices (vectors.py), of tuples and other compile-time
containers, and slices (`v[1:3]`, `m[i, :]`: compile-time Python slices, which vectors.py
resolves into components; a field or ndarray is not sliced).

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import ast

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker as StructField

from .. import ir
from .objects import GLOBAL_ARRAYS, Shape
from .values import holds_runtime, is_runtime
from .vectors import VectorValue, element_shape


class SubscriptLowering:
    def visit_Slice(self, node: ast.Slice):
        """`a:b:c` in a subscript: a Python slice of compile-time integers (vectors, matrices and
        tuples are sliced at compile time)."""
        parts = []
        for part in (node.lower, node.upper, node.step):
            v = None if part is None else self.scalar(self.visit(part), part)
            if v is not None and (is_runtime(v) or isinstance(v, bool) or not isinstance(v, int)):
                self.error("slice bounds and steps must be compile-time integers", part)
            parts.append(v)
        if parts[2] == 0:
            self.error("a slice step cannot be zero", node.step)
        return slice(*parts)

    def visit_Subscript(self, node: ast.Subscript):
        base = self.visit(node.value)
        if isinstance(base, GLOBAL_ARRAYS) and (tile_slice := self.tile_slice(base, node)) is not None:
            return tile_slice  # arr[r0:r1, c0:c1]: what a tile loads or stores (tiles.py)
        if isinstance(base, StructField):
            return self.struct_field_element(base, node)
        if isinstance(base, GLOBAL_ARRAYS) and element_shape(base):
            return self.load_global_vector(base, node)
        if isinstance(base, GLOBAL_ARRAYS):
            return self.emit(ir.GlobalLoad(self.global_ptr(base, node)))
        if isinstance(base, VectorValue):
            return self.vector_subscript(base, node)
        if isinstance(base, (tuple, list)):
            idx = self.visit(node.slice)
            if is_runtime(idx) or not isinstance(idx, (int, slice)):
                self.error("a tuple can only be indexed with a compile-time integer or slice", node.slice)
            try:
                return base[idx]
            except IndexError:
                if isinstance(base, Shape):
                    self.error(base.out_of_range(idx), node.slice)
                self.error(f"index {idx} is out of range for a tuple of {len(base)} element(s)", node.slice)
        if not is_runtime(base) and hasattr(type(base), "__getitem__") and not isinstance(base, GLOBAL_ARRAYS):
            # another compile-time Python object (a user's container): indexed by Python at compile time
            idx = self.visit(node.slice)
            if not holds_runtime(idx) and not isinstance(idx, VectorValue):
                try:
                    return base[idx]
                except Exception as e:  # noqa: BLE001  (the user's own __getitem__: reported, located)
                    self.error(f"{type(base).__name__}[{idx!r}] failed at compile time: {type(e).__name__}: {e}",
                               node)
        what = f"a run-time {base.type} value" if is_runtime(base) else f"a '{type(base).__name__}' value"
        self.error(f"{what} is not subscriptable in kernels")

    def global_ptr(self, base, node: ast.Subscript) -> ir.GlobalPtr:
        if element_shape(base):
            self.error(f"'{base.name}' holds vectors/matrices: its element is not a scalar here", node)
        ref, indices = self.global_address(base, node)
        return self.emit(ir.GlobalPtr(ref, indices))

    def global_address(self, base, node: ast.Subscript) -> tuple:
        """(reference, index values) of element `base[...]`; a vector index (`grid[base + offset]`)
        gives one index per component."""
        index_nodes = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if isinstance(node.slice, ast.Constant) and node.slice.value is None:
            index_nodes = []
        if isinstance(base, Field):
            ref = self.field_ref(base)
            rank, what = len(base.shape), f"field '{base.name}'"
        else:
            ref = base.ref()
            rank, what = base.ndim, f"ndarray '{base.name}'"
        indices = []
        for n in index_nodes:
            if isinstance(n, ast.Slice):
                self.error(f"{what} cannot be sliced in kernels (vectors and matrices can); index one "
                           f"element at a time", n)
            v = self.visit(n)
            # a vector index (`x[I]`, `grid[base + offset]`) or a tuple held in a local gives one
            # index per component
            parts = v.components if isinstance(v, VectorValue) else v if isinstance(v, (tuple, list)) else [v]
            indices += [self.index_value(n, what, c) for c in parts]
        if len(indices) != rank:
            hint = f" (index a 0-d array with {base.name}[None])" if rank == 0 else ""
            self.error(f"{what} has {rank} dimension(s) but is indexed with {len(indices)} "
                       f"index(es){hint}", node)
        layout = getattr(base, "layout", None)
        if layout is not None:  # stored with its axes permuted
            indices = [indices[axis] for axis in layout] + indices[len(layout):]
        return ref, indices

    def index_value(self, node, what: str, value) -> ir.Stmt:
        i = self.scalar(value, node)
        t = i.type if is_runtime(i) else (T.u1 if isinstance(i, bool) else self.values.literal_type(i))
        if t.is_float or t is T.u1:
            self.error(f"index into {what} must be an integer, got {t}", node)
        return self.values.materialize(i, t)  # a constant index past i32 is an i64, never an error

    def field_ref(self, field: Field) -> ir.FieldRef:
        for i, f in enumerate(self.field_objects):
            if f is field:
                return self.kernel.fields[i]
        ref = ir.FieldRef(len(self.kernel.fields), field.name, field.dtype, tuple(field.storage_shape), field.is_grad)
        self.kernel.fields.append(ref)
        self.field_objects.append(field)
        return ref
