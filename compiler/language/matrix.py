"""Vector and matrix types of the kernel language (docs/api.md, Vectors and matrices).

`qd.types.vector(n, dtype)`, `qd.types.matrix(n, m, dtype)`, `qd.math.vec3`... are
`MatrixType`s: field and ndarray element types, annotations, and constructors (in kernels
`qd.math.vec3(1, 2, 3)`, in Python scope a `qd.Matrix` value). `qd.Vector` / `qd.Matrix` build
literals in kernels, values in Python scope (runtime/contract/matrix_value.py: arithmetic, `@`,
`.norm()`, `.to_numpy()`, ...; elements read from fields and ndarrays are such values too) and
declare fields (`qd.Vector.field(3, qd.f32, shape=n)`).

A field or ndarray of vectors is a scalar array with the element's shape as trailing axes
(runtime/fields.py); inside kernels every vector operation is lowered to scalars by the
front end (compiler/frontend/vectors.py), so nothing past the front end knows about vectors.
"""
from __future__ import annotations

import operator

import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.contract.matrix_value import MatrixValue, use_classes
from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray
from qdc.runtime.contract.tensor_api import Backend, check_keywords, coerce_backend
from qdc.runtime.contract.python_scope import DEFAULT_FP, DEFAULT_IP, device_arrays, scope_types  # noqa: F401


def _size(v, what: str) -> int:
    try:
        n = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be a positive integer, got {v!r}") from None
    if n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n}")
    return n


def _default_types() -> tuple:
    """(default_ip, default_fp) of Python-scope declarations: the import context of a `qdc
    build`, else qd.init's (runtime/contract/python_scope.py, shared with runtime/fields.py).
    DEFAULT_IP / DEFAULT_FP, imported from there too, are the options' defaults."""
    return scope_types.current()


class MatrixType:
    """A vector (shape `(n,)`) or matrix (shape `(n, m)`) element type. `dtype` None means the
    default float (or, for `ivec`, the default integer) type, resolved from the options in
    force: at compile time in kernels, at creation for fields and ndarrays."""

    def __init__(self, shape: tuple, dtype=None, default: str = "fp", name: str | None = None):
        self.shape = tuple(_size(s, "a vector/matrix dimension") for s in shape)
        if dtype is int or dtype is float:  # Python's types mean the defaults, as for scalars
            default, dtype = ("ip" if dtype is int else "fp"), None
        if dtype is not None and not isinstance(dtype, T.DataType):
            try:
                converted = T.from_numpy(dtype)
            except TypeError:
                converted = None
            if converted is None:
                raise TypeError(f"unsupported vector/matrix element type {dtype!r}")
            dtype = converted
        self.declared_dtype, self.default = dtype, default
        self.name = name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def m(self) -> int:
        return self.shape[1] if len(self.shape) > 1 else 1

    def element_dtype(self, default_ip: T.DataType, default_fp: T.DataType) -> T.DataType:
        return self.declared_dtype or (default_ip if self.default == "ip" else default_fp)

    @property
    def dtype(self) -> T.DataType:
        """The element type under Python scope's default types (ScopeTypes: how fields and
        ndarrays resolve it when declared)."""
        if self.declared_dtype is not None:
            return self.declared_dtype
        return self.element_dtype(*_default_types())

    # fields and ndarrays read these two (runtime/fields.py, by duck typing)
    @property
    def element_shape(self) -> tuple:
        return self.shape

    @property
    def scalar_dtype(self) -> T.DataType:
        return self.dtype

    def __call__(self, *args):
        """Python scope: a qd.Matrix value (`vec3(1, 2, 3)`, `vec3(0)` fills, vectors concatenate)."""
        flat = np.concatenate([np.ravel(np.asarray(a)) for a in args]) if args else np.zeros(0)
        size = int(np.prod(self.shape))
        if flat.size == 1:
            flat = np.repeat(flat, size)
        if flat.size != size:
            raise ValueError(f"{self!r} needs {size} values, got {flat.size}")
        return MatrixValue.of(flat.astype(self.dtype.np_dtype).reshape(self.shape))

    def field(self, shape=(), order=None, name=None, offset=None, needs_grad=False, needs_dual=False,
              layout=None) -> Field:
        """A field of these elements (the runtime's, made through the contract: python_scope.py),
        with qd.field's parameters."""
        return device_arrays.field(self, shape, order=order, name=name, offset=offset, needs_grad=needs_grad,
                                   needs_dual=needs_dual, layout=layout)

    def ndarray(self, shape, needs_grad=False, needs_dual=False) -> Ndarray:
        return device_arrays.ndarray(self, shape, needs_grad, needs_dual)

    def tensor(self, shape, backend=Backend.NDARRAY, needs_grad=False):
        """A field (Backend.FIELD) or an ndarray (Backend.NDARRAY) of these elements."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if coerce_backend(backend) is Backend.FIELD:
            return self.field(shape, needs_grad=needs_grad)
        return self.ndarray(shape, needs_grad)

    def _spec(self):
        dtype = self.declared_dtype.name if self.declared_dtype is not None else f"default_{self.default}"
        return (self.shape, dtype)

    def __qdc_key__(self):  # the cache key identifies a captured type by what it is
        shape, dtype = self._spec()
        return [list(shape), dtype]

    def __eq__(self, other):
        return isinstance(other, MatrixType) and self._spec() == other._spec()

    def __hash__(self):
        return hash(self._spec())

    def __repr__(self):
        if self.name:
            return self.name
        dtype = self.declared_dtype or f"default_{self.default}"
        if len(self.shape) == 1:
            return f"vector({self.shape[0]}, {dtype})"
        return f"matrix({self.shape[0]}, {self.shape[1]}, {dtype})"


def vector(n, dtype=None) -> MatrixType:
    """`qd.types.vector(n, dtype)`."""
    return MatrixType((n,), dtype)


def matrix(n, m, dtype=None) -> MatrixType:
    """`qd.types.matrix(n, m, dtype)`."""
    return MatrixType((n, m), dtype)


class Matrix(MatrixValue):
    """`qd.Matrix([[a, b], [c, d]], dt=None)` in kernels and Python scope (a list of numbers makes
    a vector); `qd.Matrix.field(n, m, dtype, shape, needs_grad=...)` declares a field of n x m
    matrices. Every Python-scope vector or matrix is an instance."""

    __slots__ = ()

    @staticmethod
    def field(n, m, dtype, shape=(), order=None, name=None, offset=None, needs_grad=False, needs_dual=False,
              layout=None, ndim=None) -> Field:
        """Quadrants' parameters; `ndim`, the element's number of axes, is 2 for a matrix."""
        if ndim not in (None, 2):
            raise ValueError(f"qd.Matrix.field(ndim={ndim!r}): a matrix element has 2 axes (qd.Vector.field: 1)")
        return MatrixType((n, m), dtype).field(shape, order, name, offset, needs_grad, needs_dual, layout)

    @staticmethod
    def tensor(n, m, dtype, shape, *, backend=Backend.NDARRAY, needs_grad=False, **options):
        """`qd.Matrix.tensor(n, m, dtype, shape, backend=qd.Backend.NDARRAY, needs_grad=False)`: a
        field or ndarray of n x m matrices (Quadrants' tensor API: runtime/tensors.py)."""
        check_keywords("qd.Matrix.tensor", options, layout=False)
        return MatrixType((n, m), dtype).tensor(shape, backend, needs_grad)

    @staticmethod
    def ndarray(n, m, dtype, shape, needs_grad=False, needs_dual=False) -> Ndarray:
        return MatrixType((n, m), dtype).ndarray(shape, needs_grad, needs_dual)

    @staticmethod
    def identity(dt, n):
        """The n x n identity matrix (also in kernels; `dt` as Quadrants names it)."""
        return MatrixValue.of(np.eye(n, dtype=dt.np_dtype))

    @staticmethod
    def diag(dim, val):
        """`val` on the diagonal of a dim x dim matrix (also in kernels)."""
        return MatrixValue.of(np.eye(dim) * val)

    @staticmethod
    def one(dt, n, m=None):
        """A vector (n) or matrix (n x m) of ones (also in kernels)."""
        return MatrixValue.of(np.ones((n,) if m is None else (n, m), dtype=dt.np_dtype))

    @staticmethod
    def rows(rows):
        """The matrix whose rows are the given vectors or lists (also in kernels)."""
        return MatrixValue.of(np.array([np.asarray(r) for r in rows]))

    @staticmethod
    def cols(cols):
        """The matrix whose columns are the given vectors or lists (also in kernels)."""
        return MatrixValue.of(np.array([np.asarray(c) for c in cols]).T.copy())

    @staticmethod
    def zero(dt, n, m=None):
        """A zero vector (n) or matrix (n x m) (also in kernels)."""
        return MatrixValue.of(np.zeros((n,) if m is None else (n, m), dtype=dt.np_dtype))


class Vector(Matrix):
    """`qd.Vector([a, b, c], dt=None)` in kernels (a vector literal) and in Python scope (a
    qd.Matrix value); `qd.Vector.field(n, dtype, shape, needs_grad=...)` declares a field of
    vectors."""

    __slots__ = ()

    def __init__(self, arr, dt=None, *, dtype=None):
        super().__init__(arr, dt, dtype=dtype)
        if self.ndim != 1:
            raise ValueError(f"qd.Vector() needs a flat list of numbers, got shape {self.shape}")

    @staticmethod
    def field(n, dtype, shape=(), order=None, name=None, offset=None, needs_grad=False, needs_dual=False,
              layout=None, ndim=None) -> Field:
        if ndim not in (None, 1):
            raise ValueError(f"qd.Vector.field(ndim={ndim!r}): a vector element has 1 axis")
        return MatrixType((n,), dtype).field(shape, order, name, offset, needs_grad, needs_dual, layout)

    @staticmethod
    def tensor(n, dtype, shape, *, backend=Backend.NDARRAY, needs_grad=False, **options):
        """`qd.Vector.tensor(n, dtype, shape, backend=qd.Backend.NDARRAY, needs_grad=False)`: a
        field or ndarray of n-vectors (Quadrants' tensor API: runtime/tensors.py)."""
        check_keywords("qd.Vector.tensor", options, layout=False)
        return MatrixType((n,), dtype).tensor(shape, backend, needs_grad)

    @staticmethod
    def ndarray(n, dtype, shape, needs_grad=False, needs_dual=False) -> Ndarray:
        return MatrixType((n,), dtype).ndarray(shape, needs_grad, needs_dual)

    @staticmethod
    def zero(dt, n):
        """A vector of n zeros (also in kernels)."""
        return MatrixValue.of(np.zeros(n, dtype=dt.np_dtype))

    @staticmethod
    def one(dt, n):
        """A vector of n ones (also in kernels)."""
        return MatrixValue.of(np.ones(n, dtype=dt.np_dtype))

    @staticmethod
    def unit(n, i, dt=None):
        """The i-th unit vector of length n, of integers unless `dt` says otherwise (as in
        Quadrants; also in kernels)."""
        return MatrixValue.of(np.eye(n, dtype=np.int32 if dt is None else dt.np_dtype)[i].copy())


use_classes(Vector, Matrix)


def zero(x):
    """`qd.zero(x)`: zero of the type and shape of `x` (a scalar, vector or matrix; also in kernels)."""
    if isinstance(x, MatrixValue):
        return MatrixValue.of(np.zeros_like(np.asarray(x)))
    return type(x)(0)
