"""The one protocol through which the runtime talks to every device.

A backend implements `Device`: allocate/free memory, copy between host and device, load a
compiled kernel artifact, launch it with a packed argument context, and synchronise. Nothing
else about a backend is visible to the rest of the runtime.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np


class Allocation:
    """Device memory: `ptr` is the device address; `host` is a host-visible numpy byte view when
    the device shares memory with the host (CPU), else None."""
    __slots__ = ("ptr", "nbytes", "host", "handle")

    def __init__(self, ptr: int, nbytes: int, host: np.ndarray | None = None, handle=None):
        self.ptr, self.nbytes, self.host, self.handle = ptr, nbytes, host, handle


class Device:
    arch: str = "?"

    def allocate(self, nbytes: int) -> Allocation:
        raise NotImplementedError

    def free(self, alloc: Allocation) -> None:
        raise NotImplementedError

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        raise NotImplementedError

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        raise NotImplementedError

    def load_kernel(self, artifacts: dict, meta) -> object:
        """Turn a kernel's artifacts into something `launch` accepts."""
        raise NotImplementedError

    def launch(self, loaded, ctx_address: int) -> None:
        raise NotImplementedError

    def launch_call(self, loaded, ctx: ctypes.Array) -> tuple:
        """`(call, arg)` such that `call(arg)` launches `loaded` on the ctx buffer `ctx`.

        Launchers make exactly this call once per launch, so a backend whose launch is a single
        foreign call should return that foreign function itself (see CpuDevice)."""
        return functools.partial(self.launch, loaded), ctypes.addressof(ctx)

    def sync(self) -> None:
        pass
