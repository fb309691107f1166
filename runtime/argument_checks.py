"""The checks of a kernel's arguments that a launch makes (runtime/launcher.py generates the
launch code that calls them): each raises the TypeError/ValueError that names the kernel, the
argument (and the element of a vector argument) and what is wrong with it."""
from __future__ import annotations

import ctypes
import math
import struct

import numpy as np

from .contract import extents
from .contract.artifact import KernelMeta
from .contract.types import by_name
from .fields import Field, Ndarray

PACK_CODE = {"i8": "b", "i16": "h", "i32": "i", "i64": "q", "u8": "B", "u16": "H", "u32": "I",
             "u64": "Q", "f16": "e", "f32": "f", "f64": "d", "u1": "?"}
_LARGEST_NUMPY_ARRAY = (1 << 63) - 1  # elements (and bytes): numpy's sizes are signed 64-bit


class ArrayMismatchError(TypeError, ValueError):
    """An external array (a torch tensor, a DLPack array) of the wrong rank, element axes or
    device for its ndarray parameter: a TypeError, as any argument of the wrong type is, and a
    ValueError, as a numpy array of the wrong rank is."""


def built_without_its_gradient(meta: KernelMeta, p) -> bool:
    """A float ndarray of a grad kernel whose needs_grad followed the argument in an AOT build
    (None): a qd.ndarray with a gradient passed to it would silently get none."""
    return bool(meta.is_grad) and p.kind == "ndarray" and p.needs_grad is None and p.dtype[0] == "f"


def argument_name(meta: KernelMeta, index: int) -> str:
    p = meta.params[index]
    if not p.is_element:
        return f"kernel '{meta.name}', argument '{p.name}'"
    return f"kernel '{meta.name}', argument '{p.name}', element {meta.record_names()[index][len(p.name):]}"


def explain_scalar(meta: KernelMeta, index: int, value):
    """Raise the TypeError/ValueError for scalar argument `index`, or return if it is fine."""
    p = meta.params[index]
    if p.dtype == "u1":
        if not isinstance(value, (bool, int, np.bool_, np.integer)) or value not in (0, 1):
            raise TypeError(f"{argument_name(meta, index)}: expected a u1 (bool) scalar, got "
                            f"{type(value).__name__} {value!r}"[:300])
        return
    try:
        struct.pack("=" + PACK_CODE[p.dtype], value)
    except OverflowError:
        raise ValueError(f"{argument_name(meta, index)}: {value!r} is out of range for {p.dtype}"[:300]) from None
    except (struct.error, TypeError, ValueError):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            raise ValueError(f"{argument_name(meta, index)}: {value!r} is out of range for {p.dtype}"[:300]) from None
        kind = "an integer" if p.dtype[0] in "iu" else "a number"
        raise TypeError(f"{argument_name(meta, index)}: expected a {p.dtype} scalar ({kind}), got "
                        f"{type(value).__name__} {value!r}"[:300]) from None


def numpy_address(a: np.ndarray) -> int:
    """The data pointer of a C-contiguous numpy array, through the buffer protocol: a quarter
    of the cost of `a.ctypes.data`, which read-only and empty arrays (no writable byte to
    export) still take."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


def extent_limits(device) -> tuple | None:
    """(elements, bytes) that one ndarray argument may span on `device`: the extent its
    kernels can index (runtime/contract/extents.py) and the largest buffer the device binds
    (Vulkan's maxStorageBufferRange, Metal's maxBufferLength); None where every array numpy
    can make fits (64-bit extents, no binding limit)."""
    elements = extents.max_elements(device.arch)
    binding = device.max_binding_bytes()
    return None if elements >= _LARGEST_NUMPY_ARRAY and binding is None else (elements, binding)


def check_extent(meta: KernelMeta, index: int, shape: tuple, limits: tuple, arch: str) -> None:
    """Raise the ValueError that refuses an array of `shape` for ndarray parameter `index` when
    it is larger than `limits` (`extent_limits`) allow."""
    max_elements, max_bytes = limits
    count, name = math.prod(shape), argument_name(meta, index)
    if count > max_elements or any(n > max_elements for n in shape):
        raise ValueError(f"{name}: an array of shape {tuple(shape)} ({count} elements) is larger than "
                         f"kernels built for {arch} can index ({max_elements} elements, 32-bit extents): split it "
                         f"into smaller arrays, or use arch cpu, cuda or amdgpu (64-bit extents)")
    nbytes = count * by_name(meta.params[index].dtype).nbytes
    if max_bytes is not None and nbytes > max_bytes:
        raise ValueError(f"{name}: an array of shape {tuple(shape)} takes {nbytes} bytes, more than "
                         f"the {arch} device binds at once ({max_bytes} bytes): split it into smaller arrays")


def check_ndarray(meta: KernelMeta, index: int, value) -> None:
    """Raise the TypeError/ValueError that rejects `value` for ndarray parameter `index`."""
    p = meta.params[index]
    where = argument_name(meta, index)
    want = f"an ndarray of {p.dtype} with ndim={p.ndim}"
    if p.element_shape:
        want += f" ending in the element's axes {p.element_shape}"
    storage = value.shape if isinstance(value, np.ndarray) else getattr(value, "storage_shape", ())
    if p.element_shape and isinstance(value, (np.ndarray, Ndarray, Field)) and len(storage) == p.ndim \
            and tuple(storage[p.ndim - len(p.element_shape):]) != p.element_shape:
        raise ValueError(f"{where}: expected {want}, got an array of shape {tuple(storage)}")
    if isinstance(value, np.ndarray):
        if value.dtype != by_name(p.dtype).np_dtype:
            raise TypeError(f"{where}: expected {want}, got a numpy array of dtype {value.dtype}")
        if value.ndim != p.ndim:
            raise ValueError(f"{where}: expected {want}, got a numpy array with ndim={value.ndim}")
        if p.writes and not value.flags.writeable:
            raise ValueError(f"{where}: the numpy array is read-only (flags.writeable is False, e.g. a "
                             f"read-only memmap) and the kernel writes it; pass a writable array (np.array(a))")
        if p.needs_grad:
            raise TypeError(f"{where}: the kernel uses this array's gradient, so it needs a qd.ndarray(..., "
                            f"needs_grad=True), not a numpy array (which has no gradient)")
        return
    if isinstance(value, (Ndarray, Field)):  # a field's buffer is an array too (a qd.Tensor argument)
        if value.layout != p.layout:
            stored = "in declared order" if value.layout is None else f"with its axes permuted (layout={value.layout})"
            wanted = "in declared order" if p.layout is None else f"with layout={p.layout}"
            raise TypeError(f"{where}: this {value._what()} is stored {stored}; the kernel was compiled for an "
                            f"array stored {wanted} (annotate the parameter without dtype or ndim, "
                            f"qd.types.ndarray(), or qd.Tensor, to compile it for each layout)")
        if value.dtype.name != p.dtype:
            raise TypeError(f"{where}: expected {want}, got a {value._what()} of {value.dtype}")
        if len(value.storage_shape) != p.ndim:  # an ndarray of vectors counts its element's axes too
            raise ValueError(f"{where}: expected {want}, got a qd.ndarray with ndim={len(value.storage_shape)}")
        if p.needs_grad and value.grad is None:
            raise ValueError(f"{where}: the kernel uses this array's gradient: pass a qd.ndarray created with "
                             f"needs_grad=True")
        if built_without_its_gradient(meta, p) and value.grad is not None:
            raise ValueError(f"{where}: this gradient kernel was compiled without a gradient for '{p.name}' "
                             f"(its needs_grad=None follows the argument, and it had none to follow: built ahead "
                             f"of time, or given it by keyword), so its gradient would stay zero; annotate it "
                             f"needs_grad=True (and rebuild), pass it positionally, or pass an array without one")
        return
    raise TypeError(f"{where}: expected {want} (a numpy array, qd.ndarray, torch tensor or DLPack array), "
                    f"got {type(value).__name__}")
