"""Vector, matrix and struct kernel arguments (`v: qd.math.vec3`, `s: MyStruct`, passed by value):
what the launch code (runtime/launcher.py) calls to turn one into the values of its records."""
from __future__ import annotations

import numpy as np

from .fields import Field, Ndarray


def describe_element_type(p) -> str:
    """A vector/matrix parameter's type as Quadrants spells it: `vector(3, f32)`, `matrix(2, 2, f32)`."""
    kind = "vector" if len(p.element_shape) == 1 else "matrix"
    return f"{kind}({', '.join(map(str, p.element_shape))}, {p.dtype})"


def element_reader(meta, argument):
    """`elements(value)` for a vector/matrix or struct argument (see `struct_reader`)"""
    if argument.name in meta.structs:
        return struct_reader(meta, argument)
    return vector_reader(meta, argument)


def vector_reader(meta, argument):
    """`elements(value)` for a vector/matrix argument: its elements row-major, as a sequence of
    `argument.count` values that the launch code then packs (and checks) as scalars. A list or
    tuple of a vector's length is taken as it is (the common case, no numpy involved); anything
    else goes through numpy (nested lists, numpy arrays, qd.Vector/qd.Matrix values, which are
    numpy arrays in Python scope) and must have exactly the element shape."""
    p = meta.params[argument.first]
    shape, count = p.element_shape, argument.count
    flat = len(shape) == 1
    where = f"kernel '{meta.name}', argument '{p.name}'"
    want = f"a {describe_element_type(p)} (a list, tuple or numpy array of shape {shape})"

    def elements(value):
        if flat and value.__class__ in (list, tuple) and len(value) == count:
            return value
        return _components(value, shape, where, want)
    return elements


def _components(value, shape: tuple, where: str, want: str) -> list:
    """The elements of a vector/matrix value of `shape`, row-major, as Python numbers."""
    if value.__class__ is np.ndarray and value.shape == shape and value.dtype.kind in "biuf":
        return value.ravel().tolist()  # Python numbers, packed as scalars are
    if isinstance(value, (Field, Ndarray)):
        raise TypeError(f"{where}: expected {want}, got {value._what()}; a vector parameter takes a value")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # ragged nesting, or an object numpy cannot take
        raise ValueError(f"{where}: expected {want}, got {type(value).__name__} {value!r:.80}") from None
    if array.shape == ():
        raise TypeError(f"{where}: expected {want}, got {type(value).__name__} {value!r:.80}")
    if array.shape != shape:
        what = "a numpy array" if isinstance(value, np.ndarray) else type(value).__name__
        raise ValueError(f"{where}: expected {want}, got {what} of shape {array.shape}")
    if array.dtype.kind not in "biufO":
        raise TypeError(f"{where}: expected {want}, got elements of dtype {array.dtype}")
    return array.ravel().tolist()


def describe_struct(layout: dict) -> str:
    """A struct layout (runtime/contract/artifact.py) as its members: `S(a: f32, v: vector(3, f32))`."""
    parts = [f"{member}: {describe_struct(sub) if isinstance(sub, dict) else _describe_leaf(sub)}"
             for member, sub in layout["members"]]
    return f"{layout['name']}({', '.join(parts)})"


def _describe_leaf(leaf: list) -> str:
    dtype, shape = leaf
    if not shape:
        return dtype
    return f"{'vector' if len(shape) == 1 else 'matrix'}({', '.join(map(str, shape))}, {dtype})"


class MissingMember(KeyError):
    """A dict passed for a struct lacks a member (or has one the struct has not)."""

    def __str__(self):  # the message itself, not KeyError's repr of it
        return str(self.args[0])


def struct_reader(meta, argument):
    """`scalars(value)` for a struct argument: the values of its records, as the struct's
    layout orders them (members in order, nested structs flattened, vectors row-major). The
    value is a dict of the members (what `MyStruct(a=..., v=...)` makes in Python scope, and
    what a kernel returning a struct returns), nested dicts for nested structs, or an object
    with the members as attributes; every member must be given, and a dict may have no others.
    Each scalar is then packed and checked as a scalar argument is, its errors naming it
    (`argument 's', element .v[1]`)."""
    layout = meta.structs[argument.name]
    where = f"kernel '{meta.name}', argument '{argument.name}'"

    def flatten(value, layout: dict, path: str, out: list) -> None:
        members = [m for m, _ in layout["members"]]
        what = f"{where}: expected a {describe_struct(layout)}{' for member ' + repr(path) if path else ''}"
        if isinstance(value, dict):
            missing = [m for m in members if m not in value]
            if missing:
                raise MissingMember(f"{what}: member{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(repr(path + '.' + m if path else m) for m in missing)} missing "
                               f"from the dict given (its keys: {', '.join(map(repr, value)) or 'none'})"[:400])
            unknown = [k for k in value if k not in members]
            if unknown:
                raise MissingMember(f"{what}: the dict given has no such member(s) "
                                    f"{', '.join(map(repr, unknown))}"[:400])
            get = value.__getitem__
        elif isinstance(value, (int, float, complex, str, bytes, list, tuple, np.ndarray, np.generic, Field, Ndarray)) \
                or not all(hasattr(value, m) for m in members):
            raise TypeError(f"{what} (a dict of its members), got {type(value).__name__} {value!r:.80}")
        else:
            def get(m):
                return getattr(value, m)
        for member, sub in layout["members"]:
            name = f"{path}.{member}" if path else member
            v = get(member)
            if isinstance(sub, dict):
                flatten(v, sub, name, out)
            elif sub[1]:
                out += _components(v, tuple(sub[1]), f"{where}, member '{name}'",
                                   f"a {_describe_leaf(sub)} (a list, tuple or numpy array of shape {tuple(sub[1])})")
            else:
                out.append(v)

    def scalars(value):
        out: list = []
        flatten(value, layout, "", out)
        return out
    return scalars
