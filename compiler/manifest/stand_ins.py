"""Template arguments re-created from their descriptions (compiler/driver/template_values.py)
in a process that builds a manifest.

`rebuild` makes values as they were, imports classes, enums and functions by name, makes objects
without calling their `__init__` (their attributes set directly, so frozen dataclasses and
immutable configs work too) and makes fields and ndarrays as stand-ins of the declared dtype,
shape and name that never hold data (nothing is allocated until a launch, which a build never
makes). A program's config object holding fields, ndarrays and nested dataclasses thus becomes
a "shape-only" twin: compiled against it, a kernel gets the cache key the recording process
computed for the real objects, since the key reads only what the description holds.
"""
from __future__ import annotations

import importlib

import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.fields import ElementType, Field, Ndarray, StructField

from ..driver.template_values import lookup
from ..language.dataclass_args import DataclassArgument


class Unrebuildable(Exception):
    """A description that no longer matches the program (a class renamed, a module gone)."""


def rebuild(data, route: str):
    """The argument `data` describes (see the module docstring), made in this process."""
    return Rebuilder().rebuild(data, route)


class Rebuilder:
    """Re-creates the template arguments of one kernel variant, in the order they were described:
    `{"field_ref": n}` is the stand-in made for the n-th field described in full (template_values.
    Describer), so fields shared between arguments are shared again."""

    def __init__(self):
        self.fields: list = []
        self.enclosing: list = []  # the containers being rebuilt, outermost first (an object; None for others)

    def rebuild(self, data, route: str):
        return _rebuild(data, route, self)


def _rebuild(data, route: str, made: Rebuilder):
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):  # only inside tagged values
        raise Unrebuildable(f"{route}: a bare list in a description")
    if not isinstance(data, dict) or len(data) != 1:
        raise Unrebuildable(f"{route}: {data!r} is not a description")
    tag, body = next(iter(data.items()))
    if tag == "tuple":
        return tuple(_within(made, None, lambda: [_rebuild(e, f"{route}[{i}]", made) for i, e in enumerate(body)]))
    if tag == "list":
        return _within(made, None, lambda: [_rebuild(e, f"{route}[{i}]", made) for i, e in enumerate(body)])
    if tag in ("set", "frozenset"):
        items = _within(made, None, lambda: [_rebuild(e, f"{route} item", made) for e in body])
        try:
            return (set if tag == "set" else frozenset)(items)
        except TypeError as e:  # an item that is no longer hashable
            raise Unrebuildable(f"{route}: a {tag} of unhashable items ({e})") from None
    if tag == "dict":
        return _within(made, None, lambda: {_rebuild(k, f"{route} key", made): _rebuild(e, f"{route}[{k!r}]", made)
                                            for k, e in body})
    if tag == "method":
        return _rebuild_method(body, route, made)
    if tag == "enclosing":
        return _enclosing(body, route, made)
    if tag == "complex":
        return complex(*body)
    if tag == "bytes":
        return bytes.fromhex(body)
    if tag == "dtype":
        return T.by_name(body)
    if tag == "numpy":
        value = body["value"]
        return np.dtype(body["dtype"]).type(complex(*value) if isinstance(value, list) else value)
    if tag == "dataclass_argument":
        return DataclassArgument(_rebuild(body, route, made))
    if tag == "scalar":  # a launch argument: any value of its type stands in for it
        return _scalar_stand_in(body)
    if tag == "enum":
        cls = _import(body["class"], route)
        try:
            return cls[body["name"]]
        except (KeyError, TypeError):
            raise Unrebuildable(f"{route}: enum {body['class']} has no member {body['name']}") from None
    if tag == "named":
        return _import(body, route)
    if tag == "module":
        try:
            return importlib.import_module(body)
        except ImportError as e:
            raise Unrebuildable(f"{route}: module {body} cannot be imported ({e})") from None
    if tag == "field":
        made.fields.append(_stand_in_field(body))
        return made.fields[-1]
    if tag == "field_ref":
        if not isinstance(body, int) or not 0 <= body < len(made.fields):
            raise Unrebuildable(f"{route}: field_ref {body!r} names no field described before it")
        return made.fields[body]
    if tag == "struct_field":
        members = {m: _rebuild(d, f"{route}.{m}", made) for m, d in body["members"].items()}
        return StructField.of_members(body["name"], members)
    if tag == "ndarray":
        return _stand_in_ndarray(body)
    if tag == "object":
        return _rebuild_object(body["class"], body["attrs"], route, made)
    if tag == "container":
        items = _within(made, None, lambda: _rebuild(body["items"], route, made))  # as the describer counts
        try:
            return _import(body["class"], route)(items)
        except Exception as e:  # noqa: BLE001 (a class whose constructor changed: a stale entry)
            raise Unrebuildable(f"{route}: a {body['class']} cannot be made of its items ({e})") from None
    if tag == "namedtuple":
        items = _within(made, None, lambda: {k: _rebuild(d, f"{route}.{k}", made) for k, d in body["items"].items()})
        return _import(body["class"], route)(**items)
    raise Unrebuildable(f"{route}: unknown description '{tag}'")


def _import(name: str, route: str):
    module, _, qual = name.partition(":")
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (a module that fails to import is a stale entry)
        raise Unrebuildable(f"{route}: module {module} cannot be imported ({type(e).__name__}: {e})") from None
    obj = lookup(module, qual)
    if obj is None:
        raise Unrebuildable(f"{route}: {module} has no {qual}")
    return obj


def _rebuild_object(name: str, attrs: dict, route: str, made: Rebuilder):
    cls = _import(name, route)
    if not isinstance(cls, type):
        raise Unrebuildable(f"{route}: {name} is no longer a class")
    try:
        obj = cls.__new__(cls)
    except TypeError:
        try:
            obj = object.__new__(cls)
        except TypeError as e:
            raise Unrebuildable(f"{route}: a {name} cannot be made without its arguments ({e})") from None
    def set_attributes():
        for attr, d in attrs.items():
            object.__setattr__(obj, attr, _rebuild(d, f"{route}.{attr}", made))
    _within(made, obj, set_attributes)
    return obj


def _within(made: Rebuilder, container, rebuild_items):
    """`rebuild_items()` with `container` the innermost of those being rebuilt, as the
    describer counted them (template_values.Describer.container)."""
    made.enclosing.append(container)
    try:
        return rebuild_items()
    finally:
        made.enclosing.pop()


def _enclosing(out, route: str, made: Rebuilder):
    """The object `out` containers out of those being rebuilt (a cycle in the described objects)."""
    found = made.enclosing[-out] if isinstance(out, int) and 0 < out <= len(made.enclosing) else None
    if found is None:
        raise Unrebuildable(f"{route}: refers to an enclosing object that is not there")
    return found


def _rebuild_method(body: dict, route: str, made: Rebuilder):
    """A method bound to its object (an object being rebuilt, by its back-reference)."""
    function = _rebuild(body["function"], f"{route}.__func__", made)
    receiver = _rebuild(body["self"], f"{route}.__self__", made)
    if not hasattr(function, "__get__"):
        raise Unrebuildable(f"{route}: {body['function']} is no longer a function")
    return function.__get__(receiver, type(receiver))


def _scalar_stand_in(annotation: str):
    if annotation in ("bool", "int", "float"):
        return {"bool": False, "int": 0, "float": 0.0}[annotation]
    return 0.0 if T.by_name(annotation).is_float else 0


def _stand_in_field(d: dict):
    dtype = T.by_name(d["dtype"])
    spec = ElementType(dtype, tuple(d["element_shape"])) if d.get("element_shape") else dtype
    layout = tuple(d["layout"]) if isinstance(d.get("layout"), list) else None
    name = None if d["name"].startswith("field*") else d["name"]  # named by its creation count, as it was
    return Field(spec, tuple(d["shape"]), d["needs_grad"], name, needs_dual=d.get("needs_dual", False),
                 layout=layout)


def _stand_in_ndarray(d: dict):
    """An ndarray of the declared dtype and rank with no elements: only its type is compiled in;
    a small numpy array's values too, where they were described."""
    dtype = T.by_name(d["dtype"])
    if isinstance(d.get("values"), list):
        return np.asarray(d["values"], dtype=dtype.np_dtype)
    spec = ElementType(dtype, tuple(d["element_shape"])) if d.get("element_shape") else dtype
    layout = tuple(d["layout"]) if d.get("layout") else None
    return Ndarray(spec, (0,) * d["ndim"], needs_grad=d["needs_grad"], layout=layout)
