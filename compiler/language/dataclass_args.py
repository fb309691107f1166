"""Dataclass kernel parameters (`state: State`, State a `dataclasses.dataclass`), as Quadrants has them.

The argument is an instance whose members are fields, ndarrays (also numpy arrays), scalars,
nested dataclasses or other Python values. The kernel reads them as `state.dofs.vel[i]`;
it is compiled as if each member it uses were a parameter of its own: a field is bound at
compile time (as a template's is), an ndarray becomes an ndarray parameter and a member
annotated with a scalar type (`n: qd.i32`, `int`, `float`, `bool`) a scalar parameter, whose
values are read off the instance at every launch (runtime/member_arguments.py). Any other
member (a `qd.template()`-annotated one, a number under another annotation, a tuple, an
object) is a compile-time constant. Members the kernel does not use cost nothing.

A kernel is compiled once per distinct *structure* of its dataclass arguments (`argument_key`):
which fields, the type of each ndarray (dtype, rank, element shape, gradient), the values of
the compile-time members; two instances alike in these share the compiled kernel. The key of
a frozen dataclass whose nested dataclasses are all frozen is computed once per instance.
"""
from __future__ import annotations

import dataclasses
import typing
import weakref

import numpy as np

from qdc.runtime.contract import foreign_arrays, types as T
from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray
from qdc.runtime.contract.objects import StructFieldMarker as StructField


def is_dataclass_type(ann) -> bool:
    return isinstance(ann, type) and dataclasses.is_dataclass(ann)


def is_dataclass_instance(v) -> bool:
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


def is_array_argument(v) -> bool:
    """An array a kernel takes as an ndarray parameter when a dataclass or template holds it (a
    torch tensor or DLPack array too: runtime/external_arrays.py)."""
    return isinstance(v, (Ndarray, np.ndarray)) or foreign_arrays.is_external(v)


# A numpy array of at most this many numbers, held by a template or dataclass argument, is keyed
# by its values too (compiler/driver/template_values.py), so that `*a` in a kernel may spread
# them as compile-time constants (`qd.ndrange(*self.grid_res)`), as Quadrants evaluates it.
MAX_KEYED_VALUES = 64


def keyed_values(v) -> list | None:
    """The values of a small numeric 1-D numpy array (see MAX_KEYED_VALUES); None otherwise."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.size <= MAX_KEYED_VALUES and v.dtype.kind in "biuf":
        return v.tolist()
    return None


class DataclassArgument:
    """The argument of a dataclass-annotated parameter as the compiler is given it: its scalar
    members (by annotation) are run-time values, unlike those of a template argument."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_HINTS: dict = {}


def members(cls) -> list[tuple[str, object]]:
    """(name, annotation) of each member of dataclass `cls`, annotations evaluated (postponed
    ones as typing resolves them; an unresolvable one stays as written)."""
    got = _HINTS.get(cls)
    if got is None:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001  (a forward reference typing cannot resolve: as written)
            hints = {}
        got = _HINTS[cls] = [(f.name, hints.get(f.name, f.type)) for f in dataclasses.fields(cls)]
    return got


def scalar_annotation(ann, default_ip: T.DataType, default_fp: T.DataType) -> T.DataType | None:
    """The scalar type a member annotated `ann` is passed as, None for any other annotation."""
    if ann is bool:
        return T.u1
    if ann is int:
        return default_ip
    if ann is float:
        return default_fp
    return ann if isinstance(ann, T.DataType) else None


def array_type(a) -> tuple:
    """(dtype name, rank without element axes, element shape, has a gradient, layout: the storage
    order of its axes or None) of an array argument."""
    if isinstance(a, Ndarray):
        element = tuple(a.element_shape)
        grad = a.dtype.is_float and getattr(a, "grad", None) is not None
        return a.dtype.name, len(a.storage_shape) - len(element), element, bool(grad), getattr(a, "layout", None)
    if not isinstance(a, np.ndarray):  # a tensor: its requires_grad says whether it has a gradient
        name, ndim, grad = foreign_arrays.signature(a)
        if name is None:
            raise TypeError(f"an array of dtype {getattr(a, 'dtype', '?')} cannot be a kernel argument")
        return name, ndim, (), bool(grad), None
    dtype = T.from_numpy(a.dtype)
    if dtype is None:
        raise TypeError(f"an array of dtype {a.dtype} cannot be a kernel argument")
    return dtype.name, a.ndim, (), False, None


class Identity:
    """An object in a key by identity (it also keeps the object alive, so its id cannot be
    reused by another object while the key is in use): dataclass keys here, template keys
    (compiler/driver/templates.py)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, Identity) and other.obj is self.obj


_KEYS: dict = {}  # id(frozen instance) -> (weak reference to it, its key)
LIVE_KEYS: dict = {}  # id(frozen instance) -> its key, while it lives (compiler/jit/member_dispatch.py)
# description -> the int that stands for it: a launch hashes that, not a tuple of hundreds of members
_TOKENS: dict = {}


def argument_key(v, value_key, what: str) -> int:
    """The key of dataclass argument `v`: equal for two arguments exactly when their
    descriptions (see the module docstring) are; `value_key(x, what)` keys a compile-time
    member (templates.specialisation_key)."""
    cached = _KEYS.get(id(v))
    if cached is not None and cached[0]() is v:
        return cached[1]
    description, frozen = _describe(v, value_key, what, 0)
    key = _TOKENS.setdefault(description, len(_TOKENS))
    if frozen:
        try:
            ref = weakref.ref(v, lambda _, i=id(v): (_KEYS.pop(i, None), LIVE_KEYS.pop(i, None)))
        except TypeError:  # a dataclass with __slots__ and no __weakref__: keyed at every call
            return key
        _KEYS[id(v)] = (ref, key)
        LIVE_KEYS[id(v)] = key
    return key


_MAX_NESTING = 32


def _describe(v, value_key, what: str, depth: int) -> tuple:
    if depth > _MAX_NESTING:
        raise TypeError(f"{what}: dataclasses nested more than {_MAX_NESTING} deep")
    cls = type(v)
    frozen = bool(cls.__dataclass_params__.frozen)
    out = [cls]
    for name, ann in members(cls):
        m = getattr(v, name)
        if isinstance(m, (Field, StructField)):
            out.append(("field", Identity(m)))
        elif is_array_argument(m):
            out.append(("ndarray",) + array_type(m))
        elif is_dataclass_instance(m):
            sub, sub_frozen = _describe(m, value_key, f"{what}.{name}", depth + 1)
            out.append(sub)
            frozen = frozen and sub_frozen
        elif scalar_annotation(ann, T.i32, T.f32) is not None:
            out.append(("scalar", ann))  # its value is an argument: only the annotation decides the code
        else:
            out.append(value_key(m, f"{what}.{name}"))
    return tuple(out), frozen
