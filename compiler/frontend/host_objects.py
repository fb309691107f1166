"""Python objects a kernel reaches through its dataclass parameters and template arguments.

`state.dofs.vel[i]` (state a dataclass parameter), `self.arr[i]` (self a template argument):
the front end walks the attributes at compile time (HostObject). What it finds is a field
(bound at compile time), a compile-time constant, another object to walk, or something
passed at every launch: an ndarray, or a scalar member of a dataclass parameter (annotated
`qd.f32`, `int`, ...). Each of those becomes a parameter of the compiled kernel, appended to
its parameters the first time it is used, and recorded in `KernelIR.members` with the path
the launch reads it from (`["state", "dofs", "vel"]`, runtime/member_arguments.py).

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import enum
import inspect
import keyword
import types

from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker as StructField

from .. import ir
from ..language import lang
from ..language.dataclass_args import (DataclassArgument, array_type, is_array_argument, is_dataclass_instance,
                                       is_dataclass_type, keyed_values, members, scalar_annotation)
from qdc.runtime.contract import types as T
from .objects import NdarrayHandle


class HostObject:
    """An object reached from a kernel argument at compile time, and the path to it:
    (parameter, attribute or index, ...). `runtime_scalars`: its members annotated with a scalar
    type are run-time parameters (a dataclass parameter's), not constants."""
    __slots__ = ("value", "path", "runtime_scalars")

    def __init__(self, value, path: tuple, runtime_scalars: bool):
        self.value, self.path, self.runtime_scalars = value, path, runtime_scalars

    def __bool__(self):
        return bool(self.value)

    def __repr__(self):
        return f"<{type(self.value).__name__} {describe_path(self.path)}>"


def describe_path(path) -> str:
    return path[0] + "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in path[1:])


def unwrap(v):
    """The Python object itself, where Python code (qd.static's host calls) receives it."""
    return v.value if isinstance(v, HostObject) else v


def _walked(v) -> bool:
    """Whether an object reached from an argument is walked further (its attributes may hold
    arrays): dataclass instances and instances of the user's own classes."""
    if is_dataclass_instance(v):
        return True
    if isinstance(v, (type, types.ModuleType, types.FunctionType, types.MethodType, Field, StructField,
                      lang.Func, T.DataType, enum.Enum)) or callable(v) or lang.is_kernel_function(v):
        return False
    module = type(v).__module__ or ""
    return hasattr(v, "__dict__") and module.split(".")[0] not in ("builtins", "qdc", "numpy", "enum")


def _bound_to(v):
    """The instance a qd.func method or a Python method is bound to; None for anything else."""
    return v.__self__ if isinstance(v, (lang.BoundFunc, types.MethodType)) else None


class HostObjects:
    def host_root(self, name: str, value):
        """The compile-time value of a template parameter or dataclass parameter `name`."""
        if isinstance(value, DataclassArgument):
            return HostObject(value.value, (name,), True)
        return self.host_member(value, (name,), None, False)

    def host_attribute(self, base: HostObject, attr: str, node):
        try:
            v = getattr(base.value, attr)
        except AttributeError:
            self.error(f"{describe_path(base.path)} (a {type(base.value).__name__}) has no attribute '{attr}'", node)
        if _bound_to(v) is base.value:  # a method of the object: `self` in it is the object, by its path
            return type(v)(v.__func__, base)
        ann = None
        if is_dataclass_instance(base.value):
            ann = dict(members(type(base.value))).get(attr)
        return self.host_member(v, base.path + (attr,), ann, base.runtime_scalars)

    def host_member(self, v, path: tuple, ann, runtime_scalars: bool):
        if isinstance(v, (Field, StructField)):
            return v
        if is_array_argument(v):  # a template's are keyed by their values where small, a dataclass parameter's not
            return self.member_ndarray(path, v, keyed=not runtime_scalars)
        if runtime_scalars and (dtype := scalar_annotation(ann, self.values.default_ip,
                                                           self.values.default_fp)) is not None:
            return self.member_scalar(path, dtype, v)
        if isinstance(v, (tuple, list)) and any(is_array_argument(e) or _walked(e) or _walked(_bound_to(e)) for e in v):
            return tuple(self.host_member(e, path + (i,), None, runtime_scalars) for i, e in enumerate(v))
        if _walked(v):
            return HostObject(v, path, runtime_scalars and is_dataclass_instance(v))
        if _walked(_bound_to(v)):  # a method stored apart from its object (`self.update = mat.update`)
            return type(v)(v.__func__, self.host_member(v.__self__, path + ("__self__",), None, runtime_scalars))
        return self.capture(describe_path(path), v)

    def member_parameter(self, path: tuple, param: ir.Param) -> int:
        """The index of the parameter for the member at `path`, appended on first use."""
        known = self.member_parameters.get(path)
        if known is not None:
            return known
        taken = {p.name for p in self.kernel.params}
        base = "_".join(str(p) for p in path)
        name, n = base, 1
        while name in taken or keyword.iskeyword(name) or not name.isidentifier():
            n += 1
            name = f"{base}_{n}" if base.isidentifier() else f"member{n}"
        param.name = name
        self.kernel.params.append(param)
        self.kernel.members[name] = list(path)
        self.member_parameters[path] = len(self.kernel.params) - 1
        return len(self.kernel.params) - 1

    def member_ndarray(self, path: tuple, a, keyed: bool = False) -> NdarrayHandle:
        try:
            dtype_name, ndim, element_shape, has_grad, layout = array_type(a)
        except TypeError as e:
            self.error(f"{describe_path(path)}: {e}")
        dtype = T.by_name(dtype_name)
        index = self.member_parameter(path, ir.Param("", "ndarray", dtype, ndim + len(element_shape), has_grad,
                                                     element_shape, layout))
        return NdarrayHandle(index, describe_path(path), dtype, ndim, has_grad, element_shape=element_shape,
                             layout=layout, keyed_values=keyed_values(a) if keyed else None)

    def member_scalar(self, path: tuple, dtype: T.DataType, value):
        if not isinstance(value, (bool, int, float)) and not hasattr(value, "__index__") \
                and not hasattr(value, "__float__"):
            self.error(f"{describe_path(path)} is annotated {dtype} but holds a {type(value).__name__}")
        known = len(self.kernel.params)
        index = self.member_parameter(path, ir.Param("", "scalar", dtype))
        if index == known:  # new: read into a variable at the kernel's start, as a scalar parameter is
            var = ir.Alloca(dtype, self.kernel.params[index].name)
            store = ir.LocalStore(var, ir.ArgLoad(index, dtype))
            body = self.kernel.body
            for offset, stmt in enumerate((store.value, var, store)):
                stmt.block = body
                body.stmts.insert(offset, stmt)
            self.member_variables[index] = var
        return self.emit(ir.LocalLoad(self.member_variables[index]))


def check_dataclass_parameter(func_name: str, name: str, ann, value, error) -> None:
    """A func parameter annotated with a dataclass type takes an argument of that type."""
    if not is_dataclass_type(ann):
        return
    got = value.value if isinstance(value, HostObject) else value
    if not isinstance(got, ann):
        error(f"call to qd.func '{func_name}': parameter '{name}' is a {ann.__name__}, the argument is "
              f"{'a ' + type(got).__name__ if not inspect.isclass(got) else repr(got)}")
