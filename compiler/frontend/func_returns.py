"""A `@qd.func`'s return annotation converts what it returns, as in Quadrants: `def f(a: qd.f32)
-> qd.i32: return a` gives 1 for 1.5. The annotation is a scalar type (`qd.i32`, `int`,
`float`, `bool`), a vector/matrix type, a struct type (the value must be such a struct), a
tuple of those (`tuple[qd.f32, qd.i32]` or `(qd.f32, qd.i32)`) or None; anything else (a string naming no type, `qd.template()`) is a compile
error at the function's definition.

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import inspect
import typing

from qdc.runtime.contract import types as T

from ..language.structs import StructType
from .structs import StructValue
from .values import is_runtime
from .vectors import VectorValue

STRUCT = "struct"  # the "shape" of a struct return item: (StructType, STRUCT)


class FuncReturns:
    def func_return_items(self, fn):
        """[(dtype, element shape)] of `fn`'s return annotation and whether it is a tuple;
        None when `fn` declares nothing (or `-> None`)."""
        ann = self.signature(fn).return_annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, fn.__globals__)  # noqa: S307  (the user's own annotation, as typing does)
            except Exception as e:  # noqa: BLE001  (reported at the definition)
                self.error(f"the return annotation of '{fn.__name__}' cannot be evaluated: {type(e).__name__}: {e}",
                           self.frame.src.fn_def.returns)
        if ann is inspect.Signature.empty or ann is None:
            return None
        if typing.get_origin(ann) is tuple:
            return [self.func_return_item(p, fn) for p in typing.get_args(ann)], True
        if isinstance(ann, (tuple, list)):
            return [self.func_return_item(p, fn) for p in ann], True
        return [self.func_return_item(ann, fn)], False

    def func_return_item(self, ann, fn) -> tuple[T.DataType, tuple]:
        if ann is int or ann is float:
            return (self.values.default_ip if ann is int else self.values.default_fp), ()
        if ann is bool:  # as in Quadrants: a u1
            return T.u1, ()
        if isinstance(ann, StructType):  # a struct: returned as it is, if it is one of this type
            return ann, STRUCT
        if isinstance(ann, T.DataType):
            return ann, ()
        element_dtype = getattr(ann, "element_dtype", None)  # a vector/matrix type (language/matrix.py)
        if callable(element_dtype) and isinstance(getattr(ann, "shape", None), tuple):
            return element_dtype(self.values.default_ip, self.values.default_fp), tuple(ann.shape)
        self.error(f"unsupported return annotation {ann!r} of qd.func '{fn.__name__}': a qd scalar type "
                   f"(qd.f32, int, ...), a vector, matrix or struct type, or a tuple of them",
                   self.frame.src.fn_def.returns)

    def convert_func_result(self, fn, result, ret_node):
        """`result` of an inlined call to `fn` converted to `fn`'s return annotation; errors
        point at `ret_node` (a return statement of `fn`, or its definition)."""
        declared = self.func_return_items(fn)
        if declared is None:
            return result
        items, is_tuple = declared
        if result is None:
            self.error(f"qd.func '{fn.__name__}' declares a return type but returns no value", ret_node)
        values = result if is_tuple else (result,)
        if is_tuple and (not isinstance(result, tuple) or len(result) != len(items)):
            got = f"{len(result)} values" if isinstance(result, tuple) else "one value"
            self.error(f"qd.func '{fn.__name__}' declares {len(items)} return values but returns {got}", ret_node)
        converted = tuple(self.convert_returned(v, dtype, shape, ret_node, fn) for v, (dtype, shape) in
                          zip(values, items))
        return converted if is_tuple else converted[0]

    def convert_returned(self, v, dtype: T.DataType, shape: tuple, node, fn):
        if shape is STRUCT:
            if not isinstance(v, StructValue) or v.stype.members != dtype.members:
                got = f"a {v.stype!r}" if isinstance(v, StructValue) else "no struct"
                self.error(f"qd.func '{fn.__name__}' declares a {dtype!r} return value but returns {got}", node)
            return v
        if not shape:
            if isinstance(v, (tuple, VectorValue)):
                self.error(f"qd.func '{fn.__name__}' declares a {dtype} return value but returns a vector or "
                           f"tuple", node)
            with self.at(node):
                return self.convert(self.scalar(v, node), dtype, node)
        if isinstance(v, (tuple, list)):
            v = self.list_as_vector(v, shape, node)
        if not isinstance(v, VectorValue) or v.shape != shape:
            got = f"shape {v.shape}" if isinstance(v, VectorValue) else ("a scalar" if is_runtime(v) else repr(v))
            self.error(f"qd.func '{fn.__name__}' declares a return value of shape {shape} but returns {got}", node)
        with self.at(node):
            return v.map(lambda c: self.convert(c, dtype, node))
