"""Template arguments described by value, and re-created from their descriptions.

A kernel with `qd.template()` parameters is compiled per template argument. The offline cache
(cache_key.kernel_key) and the kernel manifest (compiler/manifest/) need to say *which*
argument in terms that hold in another process and on another machine, so every argument is
described by what it is, as plain data (numbers, strings, lists and one-key mappings), the
same tree on every machine for equal arguments:

    None, True, 3, 0.5, "text"             themselves
    {"tuple": [...]}, {"list": [...]}      element by element ({"dict": [[key, value], ...]};
                                           {"set": [...]}, {"frozenset": [...]} sorted by description)
    {"dtype": "f32"}                       a qd scalar type
    {"numpy": {"dtype": "float32", "value": 0.5}}               a numpy scalar
    {"enum": {"class": "pkg.mod:Mode", "name": "FAST"}}         an enum member
    {"named": "pkg.mod:function"}          a function, class or other object its name leads back to
    {"module": "math"}                     a module
    {"field": {"name": .., "dtype": .., "shape": [..], "needs_grad": .., "needs_dual": ..,
               "element_shape": [..]}}     a field, by declaration (its data is bound at launch;
                                           needs_dual and element_shape only where set)
    {"field_ref": n}                       the n-th field described in full before, met again
    {"struct_field": {"name": .., "members": {member: field description}}}
    {"ndarray": {"dtype": .., "ndim": .., "needs_grad": .., "element_shape": [..]}}
                                           an array (a qd.ndarray or numpy array): passed at every
                                           launch, so by its type, and a small 1-D numpy array's
                                           "values" too (`*a` in a kernel compiles them in)
    {"enclosing": n}                       an object met again while it is being described (a
                                           cycle): the n-th container out of those being described
    {"method": {"function": {"named": ..}, "self": description}}   a method bound to an object
    {"namedtuple": {"class": "pkg.mod:Pair", "items": {name: description, ...}}}
    {"container": {"class": "pkg.mod:Items", "items": {"list": [...]}}}   a subclass of tuple, list or
                                           dict that holds nothing but its items
    {"object": {"class": "pkg.mod:Config", "attrs": {name: description, ...}}}
    {"dataclass_argument": {"object": ...}}    the argument of a dataclass-annotated parameter:
                                           its members annotated with a scalar type are passed at
                                           every launch, so by their annotation: {"scalar": "f32"}
                                           any other object (a config object, a dataclass, a
                                           @qd.data_oriented instance): its class and its
                                           instance attributes (`__dict__`, then `__slots__`), sorted

An object is described through the attributes it holds, recursively (a config holding a
dataclass holding fields); the fields met on the way are collected in order (`fields`), so a
cached kernel binds the fields of the argument passed now, through the same routes. A class is
named by module and qualified name; its source enters the cache key (cache_key.py), since its
methods and properties run at compile time. What cannot be described (an object with no
attributes of its own such as a lock or a socket, a cycle, too large a value) raises
`Undescribable` naming the route to it (`cfg.solver.lock`).

compiler/manifest/stand_ins.py re-creates an argument from its description in a build process.
"""
from __future__ import annotations

import enum
import json
import os
import re
import sys
import types

import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker, StructFieldMarker

from ..language.funcs import BoundFunc
from ..language.dataclass_args import (DataclassArgument, array_type, is_array_argument, is_dataclass_instance,
                                       keyed_values, members as dataclass_members, scalar_annotation)

# Past these an argument is refused: describing it would cost more than compiling.
MAX_VALUES, MAX_DEPTH = 1 << 16, 64


class Undescribable(TypeError):
    """A template argument, or something it holds, has no description by value."""


class Description:
    """The description of one template argument (`data`) and the functions and classes whose
    source decides what it does (for the cache key); the fields it holds went to `field_index`."""

    def __init__(self, data, functions: list, classes: list, portable: str | None):
        self.data, self.functions, self.classes = data, functions, classes
        # Why it cannot be re-created in another process (a lambda, a class defined in a
        # function), else None: the manifest warns about it.
        self.portable_problem = portable


def describe(value, route: str, field_index=None) -> Description:
    """The description of `value` (named `route` in messages, e.g. "cfg"). `field_index(f)`,
    if given, is called for each field reached, in order."""
    return Describer(field_index).describe(value, route)


class Describer:
    """Describes the template arguments of one kernel variant, one after the other: a field met
    again, in the same argument or another, is `{"field_ref": n}`, the n-th field described in
    full before it (counting from 0 over all the arguments), so that a program's aliasing (one
    field held by two dataclasses) is part of the description and re-created by a build."""

    def __init__(self, field_index=None):
        self.walker = _Describer(field_index)

    def describe(self, value, route: str) -> Description:
        w = self.walker
        w.functions, w.classes, w.portable_problem = [], [], None
        data = w.value(value, route, 0)
        return Description(data, w.functions, w.classes, w.portable_problem)


_AUTOMATIC_NAME = re.compile(r"^(field|struct)\d+(?=$|\.|__)")


def stable_name(name: str) -> str:
    """A field's name as keys and descriptions hold it: a name qdc gave it from a creation count
    (`field12`, `field12.grad`, `struct3__pos`) is `field*`, since another process of the program
    may create its fields in another order; a name the program gave is itself."""
    return _AUTOMATIC_NAME.sub(r"\1*", name)


def class_name(cls) -> str:
    return f"{import_name(cls.__module__)}:{cls.__qualname__}"


def import_name(module: str) -> str:
    """A module's name as another process imports it: the script a program was started with
    (`__main__`) by its import name (`python app.py`: `app`; `python -m pkg.app`: `pkg.app`),
    so that a description, a cache key or a manifest is the same whichever way the module ran."""
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name
    path = getattr(main, "__file__", None)
    return os.path.splitext(os.path.basename(path))[0] if isinstance(path, str) else module


def lookup(module: str, qual: str):
    """The object `module`.`qual` names in this process (the script's own module under its import
    name too), else None."""
    obj = sys.modules.get(module)
    if obj is None and module == import_name("__main__"):
        obj = sys.modules.get("__main__")
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj


class _Describer:
    def __init__(self, field_index):
        self.field_index = field_index
        self.field_ordinals: dict = {}  # id(field) -> its ordinal among the fields described in full
        self.described_fields: list = []  # those fields (their ids stay theirs while described)
        self.functions: list = []
        self.classes: list = []
        self.portable_problem: str | None = None
        self.budget = MAX_VALUES
        # ids of the containers being described, outermost first: an object met again is a
        # back-reference, a tuple, list or dict that contains itself is refused
        self.enclosing: list = []

    def value(self, v, route: str, depth: int):
        self.budget -= 1
        if self.budget < 0:
            raise Undescribable(f"{route}: the argument holds more than {MAX_VALUES} values to describe")
        if depth > MAX_DEPTH:
            raise Undescribable(f"{route}: nested more than {MAX_DEPTH} deep")
        if v is None or type(v) in (bool, int, float, str):
            return v
        if type(v) is complex:
            return {"complex": [v.real, v.imag]}
        if type(v) is bytes:
            return {"bytes": v.hex()}
        if isinstance(v, T.DataType):
            return {"dtype": v.name}
        if isinstance(v, np.generic) and type(v).__module__ == "numpy":
            if v.dtype.hasobject or v.dtype.kind not in "biufc":
                raise Undescribable(f"{route}: a numpy {v.dtype} scalar cannot be described")
            item = v.item()
            return {"numpy": {"dtype": v.dtype.name,
                              "value": [item.real, item.imag] if isinstance(item, complex) else item}}
        if isinstance(v, enum.Enum):
            self.named_class(type(v), route)
            return {"enum": {"class": class_name(type(v)), "name": v.name}}
        if isinstance(v, FieldMarker):
            return self.field(v)
        if isinstance(v, StructFieldMarker):
            members = {m: self.value(f, f"{route}.{m}", depth + 1) for m, f in v.members.items()}
            return {"struct_field": {"name": stable_name(v.name), "members": members}}
        if is_array_argument(v):
            try:
                dtype, ndim, element_shape, grad, layout = array_type(v)
            except TypeError as e:
                raise Undescribable(f"{route}: {e}") from None
            described = {"dtype": dtype, "ndim": ndim, "needs_grad": grad, "element_shape": list(element_shape)}
            if layout is not None:
                described["layout"] = list(layout)
            if (values := keyed_values(v)) is not None:  # `*a` in a kernel compiles them in
                described["values"] = values
            return {"ndarray": described}
        if isinstance(v, DataclassArgument):
            return {"dataclass_argument": self.object(v.value, route, depth, runtime_scalars=True)}
        if isinstance(v, types.ModuleType):
            return {"module": v.__name__}
        if isinstance(v, tuple) and hasattr(type(v), "_fields"):  # a named tuple
            self.named_class(type(v), route)
            return {"namedtuple": {"class": class_name(type(v)), "items": self.container(v, route, depth, lambda: {
                name: self.value(e, f"{route}.{name}", depth + 1) for name, e in zip(type(v)._fields, v)})}}
        if (base := _plain_container(v)) is not None:
            self.named_class(type(v), route)
            return {"container": {"class": class_name(type(v)),
                                  "items": self.container(v, route, depth, lambda: self.value(base(v), route, depth))}}
        if isinstance(v, (int, float, complex, str, bytes, tuple, list, dict)) and type(v).__module__ != "builtins":
            raise Undescribable(f"{route} is a {type(v).__module__}.{type(v).__qualname__}, a subclass of "
                                f"{type(v).__mro__[1].__name__} that cannot be described by value")
        if type(v) in (tuple, list):
            return {type(v).__name__: self.container(v, route, depth, lambda: [
                self.value(e, f"{route}[{i}]", depth + 1) for i, e in enumerate(v)])}
        if type(v) in (set, frozenset):  # in a canonical order: that of the items' descriptions
            return {type(v).__name__: self.container(v, route, depth, lambda: sorted(
                (self.value(e, f"{route} item", depth + 1) for e in v), key=_canonical))}
        if type(v) is dict:
            return {"dict": self.container(v, route, depth, lambda: [
                [self.value(k, f"{route} key", depth + 1), self.value(e, f"{route}[{k!r}]", depth + 1)]
                for k, e in v.items()])}
        if isinstance(v, (BoundFunc, types.MethodType)):
            return self.method(v, route, depth)
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type)) or _is_language_function(v):
            return self.function(v, route)
        if _names_itself(v):  # a callable object its module names (numpy.sin, a ufunc)
            return {"named": f"{import_name(v.__module__)}:{v.__qualname__}"}
        return self.object(v, route, depth)

    def method(self, v, route: str, depth: int) -> dict:
        """A method bound to an instance: its function and the instance (a back-reference where
        the instance is being described and holds it: `self.update = self._update`)."""
        return {"method": {"function": self.function(v.__func__, f"{route}.__func__"),
                           "self": self.value(v.__self__, f"{route}.__self__", depth + 1)}}

    def container(self, v, route: str, depth: int, items):
        if id(v) in self.enclosing:
            raise Undescribable(f"{route}: contains itself")
        self.enclosing.append(id(v))
        try:
            return items()
        finally:
            self.enclosing.pop()

    def field(self, f) -> dict:
        if self.field_index is not None:
            self.field_index(f)
        seen = self.field_ordinals.get(id(f))
        if seen is not None:
            return {"field_ref": seen}
        self.field_ordinals[id(f)] = len(self.described_fields)
        self.described_fields.append(f)
        out = {"name": stable_name(f.name), "dtype": f.dtype.name, "shape": list(f.shape),
               "needs_grad": bool(f.needs_grad)}
        if getattr(f, "needs_dual", False):
            out["needs_dual"] = True
        if f.element_shape:
            out["element_shape"] = list(f.element_shape)
        if f.layout is not None:  # a permuted layout (the tensor API) changes the addressing
            out["layout"] = [int(a) for a in f.layout]
        return {"field": out}

    def function(self, v, route: str) -> dict:
        """By the name that leads back to it; its source enters the cache key (cache_key.py)."""
        fn = getattr(v, "__wrapped__", None) or getattr(v, "fn", None) or v
        module, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
        if isinstance(v, type):
            self.named_class(v, route)
        elif isinstance(fn, types.FunctionType):
            self.functions.append(v)
        if not isinstance(module, str) or not isinstance(qual, str):
            raise Undescribable(f"{route}: a {type(v).__name__} without a module and qualified name")
        module = import_name(module)
        if lookup(module, qual) is not v:
            self.not_portable(f"{route}: {module}.{qual} cannot be imported by that name (a lambda or a "
                              f"function defined inside another function?)")
        return {"named": f"{module}:{qual}"}

    def named_class(self, cls: type, route: str) -> None:
        if cls not in self.classes:
            self.classes.append(cls)
        if lookup(import_name(cls.__module__), cls.__qualname__) is not cls:
            self.not_portable(f"{route}: class {class_name(cls)} cannot be imported by that name (defined inside "
                              f"a function?)")

    def object(self, v, route: str, depth: int, runtime_scalars: bool = False) -> dict:
        """`runtime_scalars`: `v` is (held by) a dataclass parameter's argument, whose members
        annotated with a scalar type are launch arguments (language/dataclass_args.py)."""
        if id(v) in self.enclosing:  # a cycle back to an object being described: by how far out it is
            return {"enclosing": len(self.enclosing) - self.enclosing.index(id(v))}
        cls = type(v)
        attrs = _attributes(v)
        if attrs is None:
            raise Undescribable(f"{route} is a {cls.__module__}.{cls.__qualname__} object, which holds no "
                                f"attributes to describe it by")
        self.named_class(cls, route)
        scalars = {}
        if runtime_scalars and is_dataclass_instance(v):
            scalars = {name: ann for name, ann in dataclass_members(cls)
                       if scalar_annotation(ann, T.i32, T.f32) is not None}

        def member(name, a):
            sub = f"{route}.{name}"
            if name in scalars and not is_array_argument(a):
                return {"scalar": getattr(scalars[name], "name", getattr(scalars[name], "__name__", ""))}
            if runtime_scalars and is_dataclass_instance(a):
                return self.object(a, sub, depth + 1, runtime_scalars=True)
            return self.value(a, sub, depth + 1)
        described = self.container(v, route, depth, lambda: {name: member(name, a) for name, a in attrs})
        return {"object": {"class": class_name(cls), "attrs": described}}

    def not_portable(self, problem: str) -> None:
        if self.portable_problem is None:
            self.portable_problem = problem


def _canonical(description) -> str:
    return json.dumps(description, sort_keys=True)


def _plain_container(v) -> type | None:
    """The builtin base of a tuple, list or dict subclass (not a named tuple) whose instances hold
    nothing but their items; None for anything else."""
    if type(v) in (tuple, list, dict) or not isinstance(v, (tuple, list, dict)) or hasattr(type(v), "_fields"):
        return None
    if getattr(v, "__dict__", None):  # attributes of its own: its items do not describe it
        return None
    return next(t for t in (tuple, list, dict) if isinstance(v, t))


def _is_language_function(v) -> bool:
    """A `@qd.func` or `@qd.kernel` object: named like a function."""
    from ..language import lang
    return isinstance(v, lang.Func) or lang.is_kernel_function(v)


def _names_itself(v) -> bool:
    module, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    try:
        return isinstance(module, str) and isinstance(qual, str) and lookup(import_name(module), qual) is v
    except Exception:  # noqa: BLE001 (attributes that raise: not a named object)
        return False


def _attributes(v) -> list | None:
    """(name, value) of an instance's own attributes, sorted; None for an object without any
    (a C object, or a Python object whose attributes live elsewhere)."""
    cls = type(v)
    if cls.__module__ == "builtins":
        return None
    found: dict = {}
    state = getattr(v, "__dict__", None)
    if isinstance(state, dict):
        found.update(state)
    slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s not in ("__dict__", "__weakref__")]
    for s in ([slots] if isinstance(slots, str) else slots):
        if hasattr(v, s):
            found[s] = getattr(v, s)
    if not found and state is None and not slots:
        return None
    return sorted(found.items())


def brief(data, limit: int = 160) -> str:
    """A one-line rendering of a description, for messages: `Config(n=3, mode=Mode.FAST)`."""
    text = _brief(data)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _brief(d) -> str:
    if not isinstance(d, dict):
        return repr(d)
    tag, body = next(iter(d.items()))
    if tag in ("object", "namedtuple"):
        inner = ", ".join(f"{k}={_brief(v)}" for k, v in body["attrs" if tag == "object" else "items"].items())
        return f"{body['class'].rpartition(':')[2]}({inner})"
    if tag in ("tuple", "list"):
        inner = ", ".join(_brief(e) for e in body)
        return f"({inner}{',' if len(body) == 1 else ''})" if tag == "tuple" else f"[{inner}]"
    if tag == "enum":
        return f"{body['class'].rpartition(':')[2]}.{body['name']}"
    if tag == "field":
        return f"field({body['dtype']}, shape={tuple(body['shape'])})"
    if tag == "ndarray":
        values = f", values={body['values']}" if "values" in body else ""
        return f"ndarray({body['dtype']}, ndim={body['ndim']}{values})"
    if tag == "method":
        return f"{_brief(body['self'])}.{_brief(body['function']).rpartition('.')[2]}"
    if tag == "dataclass_argument":
        return _brief(body)
    if tag == "scalar":
        return f"<{body}>"
    if tag in ("dtype", "module"):
        return str(body)
    if tag == "named":
        return body.replace(":", ".")
    if tag == "numpy":
        return f"np.{body['dtype']}({body['value']!r})"
    return f"{tag}({body!r})"
