"""How far a kernel's element indices reach, per arch: what the compiler types `a.shape[k]` as
and what the launcher accepts as an ndarray argument.

- cpu, cuda, amdgpu: `a.shape[k]` is an i64 (the ctx holds 64-bit extents), so loops over an
  ndarray and the indices derived from its shape are 64-bit; element addresses are computed
  in 64 bits on every arch. An array may have up to 2**63 - 1 elements (numpy's own limit).
- vulkan, metal: the "args" words hold one 32-bit extent per axis, and `a.shape[k]` is an
  i32 (index arithmetic stays 32-bit, which GPUs without fast 64-bit integers need), so an
  ndarray argument may have at most 2**31 - 1 elements; the device's largest binding
  (maxStorageBufferRange, maxBufferLength) limits its bytes.
"""
from __future__ import annotations

from . import types as T

WIDE_INDEX_ARCHES = frozenset({"cpu", "cuda", "amdgpu"})


def shape_type(arch: str) -> T.DataType:
    """The type of `a.shape[k]` in kernels built for `arch`."""
    return T.i64 if arch in WIDE_INDEX_ARCHES else T.i32


def max_elements(arch: str) -> int:
    """The most elements (and the longest axis) an ndarray argument may have on `arch`."""
    return (1 << (shape_type(arch).bits - 1)) - 1
