"""Recognising other libraries' arrays (torch tensors, `__dlpack__` objects) and their element
type and rank, without importing torch: what the launcher (runtime/external_arrays.py) and the
compiler (an ndarray parameter's omitted dtype/ndim, arrays in dataclass and template
arguments) both need. A tensor can only exist where its program imported torch, so
`sys.modules` says whether an argument may be one."""
from __future__ import annotations

import sys

import numpy as np

# qdc's scalar types by the torch dtype's attribute name
TORCH_NAMES = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16",
               "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
               "u64": "uint64", "u1": "bool"}
_by_torch_dtype: dict | None = None


def is_tensor(a) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def is_external(a) -> bool:
    """Whether `a` is an array of another library that an ndarray parameter takes."""
    return is_tensor(a) or (not isinstance(a, np.ndarray) and hasattr(type(a), "__dlpack__")
                            and hasattr(type(a), "__dlpack_device__"))


def qdc_dtype_name(tensor) -> str | None:
    """qdc's name of a tensor's dtype ('f32', ...), None for one qdc has no type for (complex,
    bfloat16, ...)."""
    global _by_torch_dtype
    if _by_torch_dtype is None:
        torch = sys.modules["torch"]
        _by_torch_dtype = {getattr(torch, n): q for q, n in TORCH_NAMES.items() if hasattr(torch, n)}
    return _by_torch_dtype.get(tensor.dtype)


def signature(a) -> tuple[str | None, int, bool] | None:
    """(qdc dtype name or None, ndim, whether it has a gradient to follow) of an external array:
    what an ndarray parameter whose dtype, ndim or needs_grad is omitted takes from it; None for
    anything that is not one. A DLPack array is described by its numpy-style `dtype` and `ndim`
    (JAX, CuPy), else through numpy's view of its host memory."""
    if is_tensor(a):
        return qdc_dtype_name(a), a.dim(), bool(a.requires_grad) and a.is_floating_point()
    if not is_external(a):
        return None
    from .types import from_numpy
    try:
        dtype, ndim = np.dtype(a.dtype), int(a.ndim)
    except (AttributeError, TypeError):
        view = np.from_dlpack(a)
        dtype, ndim = view.dtype, view.ndim
    dt = from_numpy(dtype)
    return (dt.name if dt is not None else None), ndim, False
