"""What `x[i]` returns from Python for a field or ndarray of vectors or matrices: a `qd.Matrix`
(runtime/contract/matrix_value.py) that writes itself back.

Quadrants code writes into an element in place (`m[None][i, j] = v`, `x[i][0] = v`,
`u[i].y = 3`, `m[None][i][j] = v`): a plain copy would drop such writes silently. The element
holds its own copy of the entries and stores them back into the array after each write. An
element of a struct field is a dict of its members that also reads and writes them as
attributes (`p[i].a = 1`, `p[i].v.x = 2`)."""
from __future__ import annotations

import numpy as np

from .contract.matrix_value import MatrixValue


def element(data: np.ndarray, owner, index: tuple) -> MatrixValue:
    """Element `index` of field/ndarray `owner`, holding `data` (its own copy): writes into it
    are stored back into `owner[index]`."""
    def store():
        owner[index] = data
    return MatrixValue.of(data, store)


class StructElement(dict):
    """What `p[i]` returns from Python for a struct field: a dict of the members' values at `i`
    (as before: `p[i]["a"]`, `p[i] == {...}`) that also reads and writes members as attributes,
    as Quadrants' struct elements do (`p[i].a = 1` stores into member `a`'s field at `i`)."""

    __slots__ = ("_owner", "_key")

    def __init__(self, owner, key, values: dict):
        super().__init__(values)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_key", key)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"struct element has no member {name!r}") from None

    def __setattr__(self, name, value):
        if name not in self:
            raise AttributeError(f"struct element has no member {name!r}")
        self._owner[self._key] = {name: value}
        self[name] = self._owner.members[name][self._key]


def struct_element(owner, key) -> StructElement:
    """Element `key` of struct field `owner` (runtime/fields.py, StructField)."""
    return StructElement(owner, key, {member: f[key] for member, f in owner.members.items()})
