"""What `x[i]` returns from Python for a field or ndarray of vectors or matrices.

Quadrants code writes into an element in place (`m[None][i, j] = v`, `x[i][0] = v`,
`u[i].y = 3`): a plain copy would drop such writes silently. The element is a small numpy array
that remembers where it came from and writes itself back after each item assignment (to its
own memory first, so that it stays consistent with what it shows)."""
from __future__ import annotations

import numpy as np

_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}


class ElementProxy(np.ndarray):
    """An element of `owner` at `index`, as a numpy array; item writes go through to `owner`.
    Results of arithmetic on it are arrays of their own: only writes into the element itself
    (or into a view of it, such as a matrix row) reach the owner."""

    _owner = None
    _index: tuple = ()
    _root: ElementProxy | None = None

    @classmethod
    def of(cls, values: np.ndarray, owner, index: tuple) -> ElementProxy:
        element = values.view(cls)
        element._owner, element._index = owner, index
        return element

    def __array_finalize__(self, obj):
        # A view of an element (a row, a slice) writes back through that element; anything
        # else (a ufunc's result, a copy) is detached.
        root = obj._root_element() if isinstance(obj, ElementProxy) else None
        self._owner, self._index = None, ()
        self._root = root if root is not None and np.may_share_memory(self, root) else None

    def _root_element(self) -> ElementProxy | None:
        if self._owner is not None:
            return self
        return self._root

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        root = self._root_element()
        if root is not None:
            root._owner[root._index] = np.asarray(root)

    def _component(self, name: str) -> int:
        i = _COMPONENTS[name]
        if self.ndim != 1 or i >= self.shape[0]:
            raise AttributeError(f"an element of shape {self.shape} has no component '{name}'")
        return i

    def __getattr__(self, name):
        if name in _COMPONENTS:
            return self[self._component(name)].item()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in _COMPONENTS:
            self[self._component(name)] = value
        else:
            super().__setattr__(name, value)

    def to_numpy(self) -> np.ndarray:
        """A plain copy, as Quadrants' `x[i].to_numpy()`."""
        return np.array(self)

    def __repr__(self):
        return repr(np.asarray(self))
