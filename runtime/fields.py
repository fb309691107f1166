"""Fields (global, module-level arrays) and ndarrays (device arrays passed as arguments).

Both are backed by a device `Allocation` of the active runtime, made on first use and remade
(zeroed) after `qd.init`. Host access goes through the allocation's host view when the device
shares memory with the host, else through explicit copies.
"""
from __future__ import annotations

import itertools

import numpy as np

from . import context
from .types import DataType

_ids = itertools.count()


def _normalise_shape(shape) -> tuple:
    if shape is None or shape == ():
        return ()
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape {shape} has a negative dimension")
    return shape


class _DeviceArray:
    """Shared host-side API of fields and ndarrays."""

    dtype: DataType
    shape: tuple

    def __init__(self, dtype: DataType, shape):
        if not isinstance(dtype, DataType):
            from .types import from_numpy
            dt = from_numpy(dtype)
            if dt is None:
                raise TypeError(f"unsupported dtype {dtype!r}")
            dtype = dt
        self.dtype = dtype
        self.shape = _normalise_shape(shape)
        self._alloc = None
        self._gen = 0
        self._view = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.nbytes

    def allocation(self):
        rt = context.current()
        if self._gen != rt.generation:
            self._alloc = rt.device.allocate(self.nbytes)
            self._gen = rt.generation
            host = self._alloc.host
            self._view = None if host is None else host.view(self.dtype.np_dtype).reshape(self.shape)
        return self._alloc

    def _host_view(self):
        self.allocation()
        return self._view

    def to_numpy(self) -> np.ndarray:
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            return view.copy()
        out = np.empty(self.shape, self.dtype.np_dtype)
        context.current().device.copy_to_host(self.allocation(), out)
        return out

    def from_numpy(self, arr) -> None:
        arr = np.asarray(arr)
        if arr.shape != self.shape:
            raise ValueError(f"{self._what()}: from_numpy got shape {arr.shape}, expected {self.shape}")
        arr = np.ascontiguousarray(arr, dtype=self.dtype.np_dtype)
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            view[...] = arr
        else:
            context.current().device.copy_to_device(self.allocation(), arr)

    def fill(self, value) -> None:
        self.from_numpy(np.full(self.shape, value, dtype=self.dtype.np_dtype))

    def _index(self, key):
        if key is None:
            key = ()
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) != len(self.shape):
            raise IndexError(f"{self._what()} has {len(self.shape)} dimension(s), indexed with {len(key)}"
                             + (" (use x[None] for a 0-d field)" if not self.shape else ""))
        for k, n in zip(key, self.shape):
            if not isinstance(k, (int, np.integer)):
                raise TypeError(f"{self._what()}: index {k!r} is not an integer")
            if not -n <= k < n:
                raise IndexError(f"{self._what()}: index {k} out of range for dimension of size {n}")
        return key

    def __getitem__(self, key):
        key = self._index(key)
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            return view[key].item()
        return self.to_numpy()[key].item()

    def __setitem__(self, key, value):
        key = self._index(key)
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            view[key] = value
        else:
            arr = self.to_numpy()
            arr[key] = value
            self.from_numpy(arr)

    def _what(self) -> str:
        return type(self).__name__.lower()


class Field(_DeviceArray):
    """`qd.field(dtype, shape=(), needs_grad=False, name=None)`: a dense global array."""

    def __init__(self, dtype, shape=(), needs_grad=False, name=None, _is_grad=False):
        super().__init__(dtype, shape)
        self.id = next(_ids)
        self.name = name or f"field{self.id}"
        self.is_grad = _is_grad
        self.needs_grad = needs_grad
        self.grad = Field(self.dtype, self.shape, name=self.name + ".grad", _is_grad=True) if needs_grad else None

    def set_name(self, name: str) -> None:
        self.name = name
        if self.grad is not None:
            self.grad.name = name + ".grad"

    def _what(self):
        return f"field '{self.name}'"

    def __repr__(self):
        return f"<qdc field {self.name}: {self.dtype}{list(self.shape)}>"


class Ndarray(_DeviceArray):
    """`qd.ndarray(dtype, shape, needs_grad=False)`: a device-resident array passed to kernels."""

    def __init__(self, dtype, shape, needs_grad=False):
        super().__init__(dtype, shape)
        self.grad = Ndarray(self.dtype, self.shape) if needs_grad else None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"<qdc ndarray {self.dtype}{list(self.shape)}>"


def field(dtype, shape=(), needs_grad=False, name=None) -> Field:
    return Field(dtype, shape, needs_grad, name)


def ndarray(dtype, shape, needs_grad=False) -> Ndarray:
    return Ndarray(dtype, shape, needs_grad)
