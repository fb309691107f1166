"""Quadrants' tensor API as the runtime and the language share it (runtime/tensors.py makes the
arrays; compiler/language/matrix.py's `qd.Vector.tensor` and `qd.Matrix.tensor` make them through
python_scope.device_arrays): the backends, the storage layouts, the classes programs test arrays
against, and the checks of the factories' arguments."""
from __future__ import annotations

import abc
import enum

from .objects import FieldMarker, NdarrayMarker


class Tensor(abc.ABC):
    """`qd.Tensor` (Quadrants' tensor API, runtime/tensors.py): every field and ndarray is one;
    as a kernel parameter annotation it takes either (an array argument whose dtype and ndim are
    the argument's)."""

    @classmethod
    def __subclasshook__(cls, sub):
        if cls is Tensor:
            return issubclass(sub, (FieldMarker, NdarrayMarker)) or NotImplemented
        return NotImplemented


class _ElementRank(abc.ABCMeta):
    """`isinstance` of VectorTensor/MatrixTensor: a field or ndarray whose elements have that rank."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, (FieldMarker, NdarrayMarker)) and len(obj.element_shape) == cls.element_rank

    def __subclasscheck__(cls, sub):
        return False


VectorTensor = _ElementRank("VectorTensor", (Tensor,), {
    "element_rank": 1, "__module__": __name__, "__doc__": "A field or ndarray of vectors (`qd.Vector.tensor`)."})
MatrixTensor = _ElementRank("MatrixTensor", (Tensor,), {
    "element_rank": 2, "__module__": __name__, "__doc__": "A field or ndarray of matrices (`qd.Matrix.tensor`)."})



class Backend(enum.IntEnum):
    """Where a tensor lives: a field (its declaration compiled into the kernels that use it)
    or an ndarray (a kernel argument: one compiled kernel serves every shape)."""
    FIELD = 0
    NDARRAY = 1


class Layout(enum.IntEnum):
    """How the members of a struct or vector element are stored (a storage hint on qdc)."""
    AOS = 0
    SOA = 1


def coerce_backend(backend) -> Backend:
    try:
        return Backend(backend)
    except (ValueError, TypeError):
        raise ValueError(f"backend={backend!r} is not a qd.Backend (qd.Backend.FIELD or qd.Backend.NDARRAY)") from None


def check_layout(layout, ndim: int) -> tuple | None:
    """`layout` as a tuple, None for the identity; ValueError unless a permutation of the axes."""
    if layout is None:
        return None
    if isinstance(layout, Layout):
        raise TypeError(f"layout={layout!r} is a storage order of struct members (a field's layout=); "
                        f"qd.tensor's layout= is a permutation of the axes, e.g. (1, 0)")
    order = tuple(int(a) for a in layout)
    if sorted(order) != list(range(ndim)):
        raise ValueError(f"layout={tuple(layout)!r} is not a permutation of the {ndim} axes of the shape")
    return None if order == tuple(range(ndim)) else order


def check_keywords(factory: str, kwargs: dict, layout: bool = True) -> None:
    if kwargs:
        accepted = "backend, needs_grad" + (", layout" if layout else "")
        raise TypeError(f"{factory}() got unexpected keyword argument(s) {sorted(kwargs)}; accepted: {accepted}")
