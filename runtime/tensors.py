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

from .contract.tensor_api import (Backend, Layout, MatrixTensor, Tensor, VectorTensor,  # noqa: F401 (qd.Tensor, ...)
                                  check_keywords, check_layout, coerce_backend)
from .fields import field, ndarray


def tensor(dtype, shape, *, backend=Backend.NDARRAY, layout=None, needs_grad=False, **kwargs):
    """A field or an ndarray of `dtype` (any scalar, vector, matrix type) with `shape`, canonical
    (what kernels index); `layout` permutes how its axes are stored."""
    check_keywords("qd.tensor", kwargs)
    backend = coerce_backend(backend)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    order = check_layout(layout, len(shape))
    if backend is Backend.FIELD:
        return field(dtype, shape, needs_grad=needs_grad, layout=order)
    return ndarray(dtype, shape, needs_grad=needs_grad, layout=order)
