"""Vector and matrix kernel arguments (`v: qd.math.vec3`, passed by value): what the launch code
(runtime/launcher.py) calls to turn one into the values of its element records."""
from __future__ import annotations

import numpy as np

from .fields import Field, Ndarray


def describe_element_type(p) -> str:
    """A vector/matrix parameter's type as Quadrants spells it: `vector(3, f32)`, `matrix(2, 2, f32)`."""
    kind = "vector" if len(p.element_shape) == 1 else "matrix"
    return f"{kind}({', '.join(map(str, p.element_shape))}, {p.dtype})"


def element_reader(meta, argument):
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
        if value.__class__ is np.ndarray and value.shape == shape and value.dtype.kind in "biuf":
            return value.tolist() if flat else value.ravel().tolist()  # Python numbers, packed as scalars are
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
    return elements
