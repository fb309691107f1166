"""Numpy (and host tensor or DLPack) arguments on a device without host memory (Vulkan, CUDA):
the device buffers they are copied through at every launch (runtime/launcher.py)."""
from __future__ import annotations

import numpy as np

from . import external_arrays


class DeviceCopies:
    """The device buffers that numpy arguments are copied through on a device without host
    memory: one per ndarray parameter, reused while the array fits, replaced (the old one freed
    once the launches using it are done) when a larger one comes."""

    def __init__(self, device):
        self.device = device
        self.buffers: dict = {}  # parameter index -> Allocation

    def buffer(self, index: int, nbytes: int):
        alloc = self.buffers.get(index)
        if alloc is None or alloc.nbytes < nbytes:
            if alloc is not None:
                self.device.free_after_fence(alloc)
            alloc = self.buffers[index] = self.device.allocate(nbytes)
        return alloc

    def copy_in(self, alloc, a) -> None:
        self.device.copy_to_device(alloc, host_array(a).reshape(-1))  # 1-d: a 0-d array has no byte view

    def copy_out(self, alloc, a) -> None:
        a = host_array(a)
        if a.flags.c_contiguous:
            self.device.copy_to_host(alloc, a.reshape(-1))  # a view of `a`: fills `a`
            return
        contiguous = np.empty(a.shape, a.dtype)  # a transpose, a strided slice: written back through a copy
        self.device.copy_to_host(alloc, contiguous.reshape(-1))
        a[...] = contiguous


def host_array(a) -> np.ndarray:
    """A numpy argument as it is, a host tensor or DLPack array as its numpy view."""
    return a if isinstance(a, np.ndarray) else external_arrays.host_view(a)
