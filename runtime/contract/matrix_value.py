"""Vectors and matrices in Python scope, as Quadrants' `qd.Matrix`: what `qd.Vector([...])`,
`qd.Matrix([...])` and `qd.math.vec3(...)` make, and what reading an element of a field or
ndarray of vectors/matrices gives (`x[i]`).

A value keeps its entries in a small numpy array (shape (n,) for a vector, (n, m) for a
matrix). Arithmetic, comparisons, `@`, numpy ufuncs (`qd.sqrt(v)`, `np.float64(1) + v`) work
element-wise and give values of this class again; `np.asarray(v)` and `v.to_numpy()` give
the entries. Operands of different shapes are an error (only scalars broadcast).

A value may have a sink, called after every write into it (runtime/element_proxy.py: an
element read from a field or ndarray writes itself back); a row of a matrix (`m[i]`) is a view
that writes through to it. Results of arithmetic are values of their own.

The kernel language subclasses this class (compiler/language/matrix.py: `qd.Matrix`,
`qd.Vector`, with `.field()` and friends) and installs its classes here with `use_classes`, so
that element reads are instances of `qd.Matrix`; the runtime never imports the compiler.
"""
from __future__ import annotations

import builtins
import hashlib
import operator

import numpy as np

# Swizzle letters, as in Quadrants (GLSL's three sets): `v.x`, `v.bgr`, `v.xxyy`, `v.st`.
_SWIZZLE_SETS = ("xyzw", "rgba", "stpq")


def _swizzle(name: str) -> list | None:
    """The component indices `name` selects (1 to 4 letters of one set), None if it is no swizzle."""
    if not 1 <= len(name) <= 4:
        return None
    for letters in _SWIZZLE_SETS:
        if all(c in letters for c in name):
            return [letters.index(c) for c in name]
    return None


class MatrixValue:
    """A vector (`ndim` 1) or matrix (`ndim` 2) of numbers in Python scope."""

    __slots__ = ("_data", "_sink")
    __array_priority__ = 100
    __hash__ = None  # `==` is element-wise

    def __init__(self, arr, dt=None, *, dtype=None):
        data = np.array(_entries(arr))
        dt = dt if dt is not None else dtype
        if dt is not None:
            data = data.astype(getattr(dt, "np_dtype", dt))
        if data.ndim not in (1, 2) or data.size == 0 or data.dtype.kind not in "biuf":
            raise ValueError(f"a vector/matrix needs a non-empty list (of rows) of numbers, got {arr!r:.80}")
        self._data, self._sink = data, None

    # ---- construction ------------------------------------------------------------------
    @staticmethod
    def of(data: np.ndarray, sink=None) -> MatrixValue:
        """A value over `data` (not copied), of the installed class for its ndim; `sink()` is
        called after each write into it."""
        value = object.__new__(_CLASSES[data.ndim])
        value._data, value._sink = data, sink
        return value

    def _result(self, data):
        data = np.asarray(data)
        return MatrixValue.of(data) if data.ndim in (1, 2) else data[()]

    def _written(self):
        if self._sink is not None:
            self._sink()

    # ---- shape ----------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._data.shape[0]

    @property
    def m(self) -> int:
        return self._data.shape[1] if self._data.ndim == 2 else 1

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    def __len__(self) -> int:
        return self._data.shape[0]

    # ---- numpy interoperation ---------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        if copy:
            return np.array(self._data, dtype=dtype)
        return np.asarray(self._data, dtype=dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*(_unwrap(x) for x in inputs), **kwargs)
        if isinstance(result, tuple):
            return tuple(self._result(r) for r in result)
        return self._result(result)

    def to_numpy(self, keep_dims: bool = False) -> np.ndarray:
        """A copy of the entries; `keep_dims=True` gives a vector the shape (n, 1)."""
        out = self._data.copy()
        return out.reshape(-1, 1) if keep_dims and out.ndim == 1 else out

    def to_list(self) -> list:
        return self._data.tolist()

    tolist = to_list

    def __copy__(self):
        return MatrixValue.of(self._data.copy())

    def __deepcopy__(self, memo):
        return self.__copy__()

    copy = __copy__

    def __reduce__(self):
        return MatrixValue.of, (self._data.copy(),)

    def __qdc_key__(self):  # a captured constant enters the kernel cache key by its contents
        return [self._data.dtype.str, list(self._data.shape),
                hashlib.sha256(np.ascontiguousarray(self._data).tobytes()).hexdigest()]

    # ---- items ------------------------------------------------------------------------------
    def __getitem__(self, key):
        item = self._data[key]
        if isinstance(item, np.ndarray):  # a row (a view: writes into it reach this value)
            return MatrixValue.of(item, self._written)
        return item.item()

    def __setitem__(self, key, value):
        self._data[key] = _unwrap(value)
        self._written()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getattr__(self, name):
        indices = _swizzle(name)
        if indices is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._check_swizzle(name, indices)
        if len(indices) == 1:
            return self[indices[0]]
        return MatrixValue.of(self._data[indices])  # a new vector (fancy indexing copies)

    def __setattr__(self, name, value):
        indices = _swizzle(name)
        if indices is None:
            object.__setattr__(self, name, value)
            return
        self._check_swizzle(name, indices)
        if len(set(indices)) != len(indices):
            raise AttributeError(f"cannot assign to swizzle '{name}': it repeats a component")
        if len(indices) == 1:
            self[indices[0]] = value
            return
        values = np.asarray(_unwrap(value))
        if values.ndim != 0 and values.shape != (len(indices),):
            raise ValueError(f"value len does not match the swizzle pattern={name}")
        self._data[indices] = values
        self._written()

    def _check_swizzle(self, name: str, indices: list) -> None:
        if self._data.ndim != 1 or max(indices) >= self._data.shape[0]:
            raise AttributeError(f"a value of shape {self._data.shape} has no component '{name}'")

    def fill(self, val) -> None:
        self._data[...] = val
        self._written()

    # ---- operators ---------------------------------------------------------------------------
    def __neg__(self):
        return self._result(-self._data)

    def __pos__(self):
        return self._result(+self._data)

    def __abs__(self):
        return self._result(np.abs(self._data))

    def __invert__(self):
        return self._result(~self._data)

    def __bool__(self):
        if self._data.size != 1:
            raise ValueError(f"the truth value of a vector/matrix of shape {self._data.shape} is ambiguous; "
                             f"use .any() or .all()")
        return bool(self._data.flat[0])

    def __matmul__(self, other):
        return self._result(self._data @ _operand(other, None))

    def __rmatmul__(self, other):
        return self._result(_operand(other, None) @ self._data)

    # ---- methods, as in kernels ---------------------------------------------------------------
    def dot(self, other):
        return np.dot(self._data, _operand(other, self._data.shape)).item()

    def cross(self, other):
        return self._result(np.cross(self._data, _operand(other, self._data.shape)))

    def outer_product(self, other):
        return self._result(np.outer(self._data, _operand(other, None)))

    def norm_sqr(self):
        return float(np.sum(self._data.astype(np.float64) ** 2))

    def norm(self, eps=0):
        return float(np.sqrt(self.norm_sqr() + eps))

    def norm_inv(self, eps=0):
        return 1.0 / self.norm(eps)

    def normalized(self, eps=0):
        return self._result(self._data / (self.norm() + eps))

    def transpose(self):
        return self._result(self._data.T.copy() if self._data.ndim == 2 else self._data.reshape(1, -1))

    @property
    def T(self):  # noqa: N802  (Quadrants' name)
        return self.transpose()

    def sum(self):
        return self._data.sum().item()

    def max(self):
        return self._data.max().item()

    def min(self):
        return self._data.min().item()

    def any(self):
        return bool(self._data.any())

    def all(self):
        return bool(self._data.all())

    def trace(self):
        return np.trace(self._data).item()

    def determinant(self):
        return float(np.linalg.det(self._data))

    def inverse(self):
        return self._result(np.linalg.inv(self._data))

    def cast(self, dtype):
        return self._result(self._data.astype(getattr(dtype, "np_dtype", dtype)))

    def __repr__(self):
        return f"{type(self).__name__}({self._data.tolist()})"

    def __str__(self):
        return str(self._data)


def _binary(op, reflected: bool = False):
    def method(self, other):
        o = _operand(other, self._data.shape)
        if o is NotImplemented:
            return NotImplemented
        return self._result(op(o, self._data) if reflected else op(self._data, o))
    return method


for _name, _op in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv), ("mod", operator.mod),
                   ("pow", operator.pow), ("and", operator.and_), ("or", operator.or_), ("xor", operator.xor),
                   ("lshift", operator.lshift), ("rshift", operator.rshift)):
    setattr(MatrixValue, f"__{_name}__", _binary(_op))
    setattr(MatrixValue, f"__r{_name}__", _binary(_op, reflected=True))
for _name, _op in (("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)):
    setattr(MatrixValue, f"__{_name}__", _binary(_op))


def _entries(arr):
    """Nested lists of numbers from lists, tuples, values of this class and numpy arrays."""
    if isinstance(arr, MatrixValue):
        return arr._data
    if isinstance(arr, (list, tuple)):
        return [_entries(e) for e in arr]
    return arr


def _unwrap(x):
    return x._data if isinstance(x, MatrixValue) else x


def _operand(other, shape):
    """`other` as an operand of a value of `shape`: a scalar, or entries of that very shape
    (None: any shape, for `@`)."""
    if isinstance(other, MatrixValue):
        data = other._data
    elif isinstance(other, (list, tuple, np.ndarray)):
        data = np.asarray(_entries(other))
    elif isinstance(other, (bool, int, float, np.generic)):
        return other
    else:
        return NotImplemented
    if shape is not None and data.ndim and data.shape != shape:
        raise ValueError(f"operands of shapes {shape} and {data.shape} cannot be combined element-wise")
    return data


def minimum(*args):
    """`qd.min(a, b, ...)` in Python scope: element-wise on vectors/matrices, else Python's min."""
    if len(args) > 1 and builtins.any(isinstance(a, MatrixValue) for a in args):
        return _reduce(np.minimum, args)
    return builtins.min(*args)


def maximum(*args):
    """`qd.max(a, b, ...)` in Python scope: element-wise on vectors/matrices, else Python's max."""
    if len(args) > 1 and builtins.any(isinstance(a, MatrixValue) for a in args):
        return _reduce(np.maximum, args)
    return builtins.max(*args)


def _reduce(ufunc, args):
    shape = next(a.shape for a in args if isinstance(a, MatrixValue))
    acc = _operand(args[0], shape)
    for a in args[1:]:
        acc = ufunc(acc, _operand(a, shape))
    return MatrixValue.of(np.asarray(acc))


_CLASSES = {1: MatrixValue, 2: MatrixValue}


def use_classes(vector_class: type, matrix_class: type) -> None:
    """Make vectors instances of `vector_class` and matrices of `matrix_class` (both subclasses
    of MatrixValue without instance attributes of their own)."""
    _CLASSES[1], _CLASSES[2] = vector_class, matrix_class
