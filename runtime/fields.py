"""Fields (global, module-level arrays) and ndarrays (device arrays passed as arguments).

Both are backed by a device `Allocation` of the active runtime, made on first use and remade
(zeroed) after `qd.init`, so they may be declared before `qd.init`. Host access goes through
the allocation's host view when the device shares memory with the host (CPU), else through
explicit copies. Host-side indexing follows numpy for integer indices (negative ones count
from the end); values are converted to the element type as numpy assignment does.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from . import context
from .element_proxy import ElementProxy
from .contract.objects import FieldMarker, NdarrayMarker
from .contract.types import DataType, from_numpy as dtype_from_numpy

_ids = itertools.count()
DUAL_FIELDS: "weakref.WeakSet[Field]" = weakref.WeakSet()  # what a FwdMode clears on entry, as Quadrants does


def _normalise_shape(shape) -> tuple:
    """`shape` as a tuple of Python ints: an integer (Python or numpy), or a sequence of them
    (a tuple, list or 1-d integer array); anything else, or a negative size, is a ValueError."""
    if shape is None:
        return ()
    if isinstance(shape, np.ndarray) and shape.ndim == 0:
        shape = shape.item()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be an integer or a tuple of integers, got {shape!r}") from None
    out = tuple(_dimension(d, shape) for d in dims)
    if any(d < 0 for d in out):
        raise ValueError(f"shape {out} has a negative dimension")
    return out


def _dimension(d, shape) -> int:
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise ValueError(f"shape must be an integer or a tuple of integers, got {shape!r} "
                         f"(the size {d!r} is not an integer)")
    return int(d)


class ElementType:
    """A vector/matrix element type as the runtime sees it: a scalar type and the element's
    shape, stored as trailing axes (a field of `qd.math.vec3` is an f32 array of shape (..., 3)).
    The compiler's `MatrixType` (compiler/language/matrix.py) has the same two attributes."""

    def __init__(self, scalar_dtype: DataType, element_shape: tuple):
        self.scalar_dtype, self.element_shape = scalar_dtype, tuple(element_shape)


def _element_type(dtype) -> tuple:
    """(scalar type, element shape) of a field/ndarray dtype: () for a scalar type."""
    shape = getattr(dtype, "element_shape", None)
    if shape is not None and not isinstance(dtype, DataType):
        return _data_type(dtype.scalar_dtype), tuple(int(s) for s in shape)
    return _data_type(dtype), ()


def _data_type(dtype) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    try:
        dt = dtype_from_numpy(dtype)
    except TypeError:
        dt = None
    if dt is None:
        raise TypeError(f"unsupported dtype {dtype!r} (use qd.f32, qd.i32, ... or the matching numpy dtype)")
    return dt


class _DeviceArray:
    """Shared host-side API of fields and ndarrays."""

    def __init__(self, dtype, shape):
        self._dtype, self._element_shape = _element_type(dtype)
        self._shape = _normalise_shape(shape)
        self._alloc = None
        self._gen = 0
        self._view = None

    @property
    def dtype(self) -> DataType:
        return self._dtype

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def element_shape(self) -> tuple:
        """The shape of one element: () for scalars, (n,) for vectors, (n, m) for matrices."""
        return self._element_shape

    @property
    def storage_shape(self) -> tuple:
        """`shape` followed by `element_shape`: the shape of the scalar array in memory (and of
        to_numpy()); kernels index it with the element's components as trailing indices."""
        return self._shape + self._element_shape

    def _element_spec(self):
        """What a buffer of the same elements (a .grad, a .dual) is declared with."""
        return ElementType(self._dtype, self._element_shape) if self._element_shape else self._dtype

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64)) if self._shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * int(np.prod(self._element_shape, dtype=np.int64)) * self._dtype.nbytes

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError(f"len() of 0-d {self._what()}")
        return self._shape[0]

    def allocation(self):
        """This array's memory on the active runtime (allocated, zeroed, on first use); a
        DeviceLostError while that runtime's device is lost."""
        rt = context.current()
        if rt.device.lost is not None:
            rt.device.check_not_lost()
        if self._gen != rt.generation:
            self._alloc = rt.device.allocate(self.nbytes)
            self._gen = rt.generation
            host = self._alloc.host
            self._view = None if host is None else host.view(self._dtype.np_dtype).reshape(self.storage_shape)
        return self._alloc

    def _host_view(self):
        """The host view of the current allocation (no sync), or None for device memory."""
        self.allocation()
        return self._view

    def _synced_view(self):
        """The host view after pending device work completed, or None for device memory."""
        view = self._host_view()
        context.current().device.sync()
        return view

    def to_numpy(self, dtype=None, keep_dims: bool = False) -> np.ndarray:
        """A copy of the contents (converted to `dtype` if given). `keep_dims=True` gives a
        vector element the shape (n, 1), as Quadrants does."""
        out = self._copy_to_numpy(dtype)
        if keep_dims and len(self._element_shape) == 1:
            return out.reshape(self.storage_shape + (1,))
        return out

    def _copy_to_numpy(self, dtype) -> np.ndarray:
        view = self._synced_view()
        if view is not None:
            out = view.copy()
        else:
            out = np.empty(self.storage_shape, self._dtype.np_dtype)
            context.current().device.copy_to_host(self.allocation(), out)
        return out if dtype is None else out.astype(dtype)

    def from_numpy(self, arr) -> None:
        """Overwrite the contents with `arr` (same shape; converted within its kind)."""
        arr = np.asarray(arr)
        if arr.shape != self.storage_shape:
            raise ValueError(f"{self._what()}: from_numpy got an array of shape {arr.shape}, "
                             f"expected {self.storage_shape}")
        want = self._dtype.np_dtype
        if arr.dtype != want and not np.can_cast(arr.dtype, want, "same_kind"):
            raise TypeError(f"{self._what()} holds {self._dtype}: from_numpy cannot convert {arr.dtype} "
                            f"data without changing its kind; convert it first (arr.astype(np.{want}))")
        view = self._synced_view()
        if view is not None:
            np.copyto(view, arr, casting="same_kind")
        else:
            context.current().device.copy_to_device(self.allocation(), np.ascontiguousarray(arr, want))

    def fill(self, value) -> None:
        """Set every element to `value`: on a device without host memory, a fill on the device
        ordered with the launches before and after it (no wait)."""
        element = self._element(value)
        view = self._host_view()
        if view is None:
            context.current().device.fill(self.allocation(), 0, self.nbytes, element.tobytes())
            return
        context.current().device.sync()
        view[...] = element

    def _element(self, value):
        """`value` as this array's element type (as numpy assignment converts it: floats into
        an integer type truncate, integers out of its range are an error)."""
        try:
            element = np.array(value, dtype=self._dtype.np_dtype)
            if element.shape != self._element_shape:  # a scalar fills a vector element
                element = np.broadcast_to(element, self._element_shape).copy()
            return element
        except OverflowError:
            raise ValueError(f"{self._what()}: {value!r} is out of range for {self._dtype}"[:300]) from None
        except (TypeError, ValueError):
            raise TypeError(f"{self._what()}: cannot store {value!r} in a {self._dtype} element"[:300]) from None

    def _index(self, key) -> tuple:
        if key is None:
            key = ()
        elif not isinstance(key, tuple):
            key = (key,)
        if len(key) != len(self._shape):
            hint = " (use x[None] for a 0-d field)" if not self._shape else ""
            raise IndexError(f"{self._what()} has {len(self._shape)} dimension(s), "
                             f"indexed with {len(key)}{hint}")
        for k, n in zip(key, self._shape):
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"{self._what()}: index {k!r} is not an integer "
                                f"(for slices, use to_numpy() / from_numpy())")
            if not -n <= k < n:
                raise IndexError(f"{self._what()}: index {k} is out of range for a dimension of size {n}")
        return key

    def __getitem__(self, key):
        return self._read_element(self._index(key))

    def __setitem__(self, key, value):
        key = self._index(key)
        element = self._element(value)
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            view[key] = element
        else:  # a ranged write of that one element, ordered with the launches around it (no wait)
            context.current().device.copy_to_device(self.allocation(), element.reshape(-1), self._byte_offset(key))

    def _byte_offset(self, idx: tuple) -> int:
        """Where element `idx` (in range; negative indices count from the end) starts."""
        flat = 0
        for i, n in zip(idx, self._shape):
            flat = flat * n + (i + n if i < 0 else i)
        return flat * self._element_count() * self._dtype.np_dtype.itemsize

    def _element_count(self) -> int:
        return int(np.prod(self._element_shape, dtype=np.int64))

    def _read_element(self, idx: tuple):
        """Element `idx` (checked by the caller) as a Python scalar, or a vector/matrix element as
        an ElementProxy that writes item assignments back: read through the host view
        where the device shares memory, else a ranged read of that element alone (never a
        copy of the whole array)."""
        view = self._synced_view()
        if view is not None:
            if not self._element_shape:
                return view[idx].item()
            return ElementProxy.of(view[idx].copy(), self, idx)
        out = np.empty(self._element_count(), self._dtype.np_dtype)
        context.current().device.copy_to_host(self.allocation(), out, self._byte_offset(idx))
        return ElementProxy.of(out.reshape(self._element_shape), self, idx) if self._element_shape else out[0].item()

    def _what(self) -> str:
        return type(self).__name__.lower()


class Field(_DeviceArray, FieldMarker):
    """`qd.field(dtype, shape=(), needs_grad=False, name=None, needs_dual=False)`: a dense global array."""

    def __init__(self, dtype, shape=(), needs_grad=False, name=None, _is_grad=False, needs_dual=False):
        super().__init__(dtype, shape)
        self.id = next(_ids)
        self.name = name or f"field{self.id}"
        self.is_grad = _is_grad
        self.needs_grad = bool(needs_grad)
        self.grad = Field(self._element_spec(), self._shape, name=self.name + ".grad", _is_grad=True) if needs_grad else None
        # Forward mode's tangents (runtime/forward_mode.py); a dual is a buffer of its field, as a .grad is
        self.needs_dual = bool(needs_dual)
        self.dual = Field(self._element_spec(), self._shape, name=self.name + ".dual", _is_grad=True) if needs_dual else None
        if needs_dual:
            DUAL_FIELDS.add(self)

    def set_name(self, name: str) -> None:
        self.name = name
        if self.grad is not None:
            self.grad.name = name + ".grad"
        if self.dual is not None:
            self.dual.name = name + ".dual"

    def _what(self):
        return f"field '{self.name}'"

    def __repr__(self):
        return f"<qdc field {self.name}: {self._dtype}{list(self._shape)}>"


class Ndarray(_DeviceArray, NdarrayMarker):
    """`qd.ndarray(dtype, shape, needs_grad=False, needs_dual=False)`: a device-resident array passed to kernels."""

    def __init__(self, dtype, shape, needs_grad=False, needs_dual=False):
        super().__init__(dtype, shape)
        self.needs_grad = bool(needs_grad)
        self.grad = Ndarray(self._element_spec(), self._shape) if needs_grad else None
        self.needs_dual = bool(needs_dual)
        self.dual = Ndarray(self._element_spec(), self._shape) if needs_dual else None

    def _what(self):
        return f"qd.ndarray {self._dtype}{list(self._shape)}"

    def __repr__(self):
        return f"<qdc ndarray {self._dtype}{list(self._shape)}>"


def field(dtype, shape=(), needs_grad=False, name=None, needs_dual=False) -> Field:
    return Field(dtype, shape, needs_grad, name, needs_dual=needs_dual)


def ndarray(dtype, shape, needs_grad=False, needs_dual=False) -> Ndarray:
    return Ndarray(dtype, shape, needs_grad, needs_dual)
