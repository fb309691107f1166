"""`qd.from_dlpack(obj)`: a qd.ndarray over another library's memory (a torch tensor, a numpy,
JAX or CuPy array), through its DLPack capsule (runtime/dlpack_capsule.py)."""
from __future__ import annotations

import numpy as np

from . import context
from .device import Allocation
from .dlpack_capsule import ARCH_DEVICES, CPU, CUDA, CUDA_HOST, host_array, import_array
from .fields import Ndarray


class _BorrowedNdarray(Ndarray):
    """A qd.ndarray over memory of another library (`from_dlpack`): usable while the runtime is
    on the arch that memory belongs to, and keeping its owner alive."""

    def __init__(self, dtype, shape, ptr: int, arch: str, owner, host: np.ndarray | None):
        super().__init__(dtype, shape)
        self._borrowed = (ptr, arch, owner, host)

    def allocation(self):
        ptr, arch, owner, host = self._borrowed
        rt = context.current()
        if rt.arch != arch:
            raise ValueError(f"{self._what()} wraps memory of arch {arch} (qd.from_dlpack); the runtime is on "
                             f"{rt.arch}")
        if self._gen != rt.generation:
            self._alloc = Allocation(ptr, self.nbytes, None if host is None else host.reshape(-1).view(np.uint8), owner)
            self._view = host
            self._gen = rt.generation
        return self._alloc

    def _what(self):
        return f"qd.ndarray {self._dtype}{list(self._shape)} (borrowed)"


def from_dlpack(obj) -> Ndarray:
    """`qd.from_dlpack(obj)`: a qd.ndarray over the memory of `obj` (a torch tensor, a numpy, JAX or
    CuPy array: anything with `__dlpack__`), without a copy; kernel writes to it are visible in
    `obj`. Its memory must be C-contiguous and on the active runtime's device (the host for arch
    cpu, the runtime's GPU for arch cuda)."""
    from .contract.types import by_name
    rt = context.current()
    kind = int(obj.__dlpack_device__()[0])
    stream = int(rt.device.stream) if rt.arch == "cuda" and kind == CUDA else None
    memory = import_array(obj, stream)
    where = f"qd.from_dlpack: the {type(obj).__name__} of shape {memory.shape} on {memory.device[0]}"
    if memory.dtype_name is None:
        raise TypeError(f"{where}: qdc has no type for its elements")
    if memory.read_only:
        raise ValueError(f"{where} is read-only (its producer says so): kernels could write it")
    if not memory.contiguous:
        raise ValueError(f"{where} is not C-contiguous: a qd.ndarray could not use it in place; pass a "
                         f"contiguous copy")
    host_memory = kind in (CPU, CUDA_HOST)
    if not (rt.arch == "cpu" and host_memory or ARCH_DEVICES.get(rt.arch) == kind != CPU):
        raise ValueError(f"{where}: the runtime is on {rt.arch}, whose kernels cannot use that memory in place"
                         + (" (for a copy: qd.ndarray(...).from_numpy(np.from_dlpack(obj)))" if host_memory else ""))
    if rt.arch == "cuda" and memory.device[1] != int(rt.device.device):
        raise ValueError(f"{where}:{memory.device[1]}: the runtime uses cuda:{int(rt.device.device)}")
    dtype = by_name(memory.dtype_name)
    host = host_array(memory, dtype.np_dtype) if host_memory else None
    return _BorrowedNdarray(dtype, memory.shape, memory.ptr, rt.arch, memory, host)
