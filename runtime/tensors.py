"""Quadrants' tensor API: one factory for fields and ndarrays, chosen per tensor.

`qd.tensor(dtype, shape, backend=qd.Backend.NDARRAY, layout=None, needs_grad=False)` returns a
qdc `Field` (Backend.FIELD) or `Ndarray` (Backend.NDARRAY) itself, not a wrapper: kernels take
it as they take any field or ndarray, and a launch pays nothing for the API. `qd.Tensor`,
`qd.VectorTensor` and `qd.MatrixTensor` are the classes programs test against (`isinstance(x,
qd.Tensor)` holds for every field and ndarray; the vector and matrix ones by element shape),
and `qd.Tensor` is also a parameter annotation accepting either kind. Quadrants' wrapper
methods that programs call (`_unwrap()`, `layout`, `has_grad()`) are the arrays' own.

`layout=` is a permutation of the canonical axes, outermost first: the array is stored with
its axes in that order, kernels and Python scope index it canonically, and qdc permutes the
indices (the front end at compile time, from the array's `layout`). `qd.Layout.AOS/SOA` (the
`layout=` of struct and vector fields) name the two ways of storing the members of an element;
qdc stores struct members as separate arrays and vector/matrix components together whatever
is asked, which changes where bytes lie, never a result.
"""
from __future__ import annotations

import enum

from .contract.objects import MatrixTensor, Tensor, VectorTensor  # noqa: F401 (qd.Tensor, ...)
from .fields import ElementType, _data_type, field, ndarray


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


def tensor(dtype, shape, *, backend=Backend.NDARRAY, layout=None, needs_grad=False, **kwargs):
    """A field or an ndarray of `dtype` (any scalar, vector, matrix type) with `shape`, canonical
    (what kernels index); `layout` permutes how its axes are stored."""
    _check_keywords("qd.tensor", kwargs)
    backend = coerce_backend(backend)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    order = check_layout(layout, len(shape))
    if backend is Backend.FIELD:
        return field(dtype, shape, needs_grad=needs_grad, layout=order)
    return ndarray(dtype, shape, needs_grad=needs_grad, layout=order)


def vector_tensor(n, dtype, shape, *, backend=Backend.NDARRAY, needs_grad=False, **kwargs):
    """`qd.Vector.tensor(n, dtype, shape, backend=..., needs_grad=...)`."""
    _check_keywords("qd.Vector.tensor", kwargs, layout=False)
    return tensor(ElementType(_data_type(dtype), (int(n),)), shape, backend=backend, needs_grad=needs_grad)


def matrix_tensor(n, m, dtype, shape, *, backend=Backend.NDARRAY, needs_grad=False, **kwargs):
    """`qd.Matrix.tensor(n, m, dtype, shape, backend=..., needs_grad=...)`."""
    _check_keywords("qd.Matrix.tensor", kwargs, layout=False)
    return tensor(ElementType(_data_type(dtype), (int(n), int(m))), shape, backend=backend,
                  needs_grad=needs_grad)


def _check_keywords(factory: str, kwargs: dict, layout: bool = True) -> None:
    if kwargs:
        accepted = "backend, needs_grad" + (", layout" if layout else "")
        raise TypeError(f"{factory}() got unexpected keyword argument(s) {sorted(kwargs)}; accepted: {accepted}")
