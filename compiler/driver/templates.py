"""Template parameters (`x: qd.template()` / `qd.Template`): what a call binds to them.

A template argument is a field (the kernel is compiled per distinct field declaration and
bound to the field passed) or a Python value that becomes a compile-time constant: a number,
a dtype, a tuple, a config object, a dataclass; an array (a qd.ndarray or numpy array) inside
one (a tuple's item, an object's attribute) is passed at every launch like an ndarray parameter
(compiler/frontend/host_objects.py) and keys the kernel by its type only; an array is never a
template argument itself (an ndarray parameter is that). Within a
process, `specialisation_key` says which arguments are the same (a field or an object by
identity, a value by type and value: an object's attributes are read when its variant is
compiled, as in Quadrants); the offline cache (cache_key.kernel_key) keys each by its
description by value (template_values.py), so another process passing an equal argument
finds the variant compiled for this one. The launch
function of a template kernel takes only the other parameters: `split` separates them.
"""
from __future__ import annotations

import inspect
import weakref

import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray

from ..language.dataclass_args import Identity as _Identity, array_type, is_array_argument

_VALUES = (bool, int, float, complex, str, bytes, type(None))


class TemplateArgs:
    """The template arguments of one call: `values` (name -> object, in signature order) and
    `key`, equal for two calls exactly when they may share a compiled variant."""
    __slots__ = ("values", "key")

    def __init__(self, values: dict, kernel_name: str):
        self.values = values
        self.key = tuple((name, _argument_key(v, f"template argument '{name}' of kernel '{kernel_name}'"))
                         for name, v in values.items())


def _argument_key(v, what: str):
    """The key of a whole template argument: an array is an ndarray parameter's argument, not a
    template's (arrays inside a config object or tuple are taken: frontend/host_objects.py)."""
    if is_array_argument(v):
        raise TypeError(f"{what}: an array (a {type(v).__name__}) is passed through a qd.types.ndarray() "
                        f"parameter, not a qd.template() one")
    return specialisation_key(v, what)


# Deeper than this a template argument is refused: the key and the front end walk it recursively,
# and a clear TypeError beats a RecursionError from wherever the stack happens to run out.
MAX_TEMPLATE_NESTING = 256


def specialisation_key(v, what: str, _enclosing: tuple = ()):
    """A hashable stand-in for template argument `v`: fields and other objects by identity,
    numbers, strings and dtypes by type and value, tuples and lists element by element.
    TypeError for a tuple or list that contains itself or nests deeper than MAX_TEMPLATE_NESTING.
    `_enclosing`: the ids of the tuples and lists `v` sits in, outermost first."""
    if isinstance(v, Field):
        return ("field", _Identity(v))
    if isinstance(v, _VALUES):
        return (type(v).__qualname__, _value_key(v))
    if isinstance(v, np.generic):
        return ("numpy", v.dtype.str, _value_key(v.item()))
    if isinstance(v, T.DataType):
        return ("dtype", v.name)
    if isinstance(v, (tuple, list)):
        if id(v) in _enclosing:
            raise TypeError(f"{what}: a {type(v).__name__} that contains itself cannot be a template argument "
                            f"(its key would be infinite); pass a tuple of fields, numbers and strings")
        if len(_enclosing) >= MAX_TEMPLATE_NESTING:
            raise TypeError(f"{what}: tuples and lists nested more than {MAX_TEMPLATE_NESTING} deep cannot be "
                            f"a template argument; pass a flatter value")
        inner = _enclosing + (id(v),)
        return (type(v).__qualname__, tuple(specialisation_key(e, what, inner) for e in v))
    if is_array_argument(v):  # passed at every launch (frontend/host_objects.py): by its type
        try:
            return ("ndarray",) + array_type(v)
        except TypeError as e:
            raise TypeError(f"{what}: {e}") from None
    if type(v).__module__ == "builtins":
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"{what}: a {type(v).__name__} cannot be a template argument (it is not hashable); "
                            f"pass a field, a number, a string, a tuple of them or a config object") from None
    return ("object", _Identity(v))  # a config object, hashable or not (an unfrozen dataclass)


def _value_key(v):
    """A number as the cache key sees it (by repr): -0.0 is not 0.0, and a NaN is one value."""
    return repr(v) if isinstance(v, (float, complex)) else v


class TemplateParams:
    """A kernel's template parameters (`names`, in signature order) and how to split a call's
    arguments into the template ones and the rest (`runtime`, the launch function's)."""

    def __init__(self, fn, names: list[str]):
        self.signature = inspect.signature(fn)
        self.kernel_name = fn.__name__
        self.names = list(names)
        self.runtime = [n for n in self.signature.parameters if n not in self.names]
        order = list(self.signature.parameters)
        # positions, for the common call that passes every argument positionally (the kernel
        # function always does): no signature binding needed
        self._count = len(order)
        self._template_at = [(n, order.index(n)) for n in self.names]
        self._runtime_at = [order.index(n) for n in self.runtime]

    def split(self, args, kwargs=None) -> tuple[TemplateArgs, tuple]:
        """(template arguments, the other arguments positionally); TypeError naming the kernel
        for a missing, extra or unknown argument."""
        if not kwargs and len(args) == self._count:
            return (TemplateArgs({n: args[i] for n, i in self._template_at}, self.kernel_name),
                    tuple(args[i] for i in self._runtime_at))
        try:
            bound = self.signature.bind(*args, **(kwargs or {}))
        except TypeError as e:
            raise TypeError(f"kernel '{self.kernel_name}': {e}") from None
        bound.apply_defaults()
        values = {n: bound.arguments[n] for n in self.names}
        return TemplateArgs(values, self.kernel_name), tuple(bound.arguments[n] for n in self.runtime)

    def bind(self, values: dict) -> TemplateArgs:
        """`qd.aot.instantiate(kernel, **values)`: every template parameter and nothing else."""
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            raise TypeError(f"kernel '{self.kernel_name}' has no template parameter '{unknown[0]}' "
                            f"(template parameters: {', '.join(self.names)})")
        missing = [n for n in self.names if n not in values and
                   self.signature.parameters[n].default is inspect.Parameter.empty]
        if missing:
            raise TypeError(f"kernel '{self.kernel_name}': template parameter '{missing[0]}' needs a value")
        ordered = {n: values[n] if n in values else self.signature.parameters[n].default for n in self.names}
        return TemplateArgs(ordered, self.kernel_name)


_EXACT = frozenset({bool, int, str, bytes, type(None), np.bool_})


def fast_keyable(v) -> bool:
    """Whether arguments equal to `v` by class and `==` all have v's specialisation_key: `==`
    is identity (fields, dtypes, functions, enum members, plain objects), or `v` is an exact
    builtin or numpy int, bool, str, bytes or None, or a float that is neither zero nor NaN
    (-0.0 == 0.0, and a NaN equals nothing). Not so: tuples, whose `==` ignores element types
    ((1, 2) == (1.0, 2)), classes with an `__eq__` of their own, unhashable values."""
    cls = v.__class__
    if cls in _EXACT or (isinstance(v, np.integer) and cls.__module__ == "numpy"):
        return True
    if cls is float or (isinstance(v, np.floating) and cls.__module__ == "numpy"):
        return v == v and v != 0
    return cls.__eq__ is object.__eq__  # a hit is then the very object, whatever its hash (Enum members)


class _Token:
    """What stands for one object in a dispatch key (`identity_token`): equal to itself only,
    whatever the other side's `__eq__` says (its own answers first, and never NotImplemented)."""
    __slots__ = ()

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


IDENTITY_TOKENS: dict = {}  # id(object) -> its token, while the object lives
_HELD: list = []  # objects without weak references: kept alive, so that their ids stay theirs


def identity_token(v) -> _Token | None:
    """The token of template argument `v` where its specialisation_key is its identity (a config
    object, whatever its `==`), else None: a key holding it matches `v` and nothing else."""
    token = IDENTITY_TOKENS.get(id(v))
    if token is not None:
        return token
    if specialisation_key(v, "")[0] not in ("object", "field"):
        return None
    token = IDENTITY_TOKENS[id(v)] = _Token()
    try:
        weakref.finalize(v, IDENTITY_TOKENS.pop, id(v), None)
    except TypeError:  # no weak references to it
        _HELD.append(v)
    return token
