"""CPU device: memory is host memory; kernels are native shared libraries loaded with ctypes.

A kernel library exports one entry point per kernel, `void entry(uint64_t *ctx)`, which runs
the kernel's tasks in order and spreads range-for tasks over worker threads itself (libgomp),
so a launch is a single foreign call.

That call holds the GIL for the kernel's duration (the libraries are loaded as `ctypes.PyDLL`),
as Quadrants' launches do: other Python threads wait during a long kernel, and in exchange
an empty launch costs a third less (releasing and re-acquiring the GIL is the most expensive
part of a plain ctypes call).
"""
from __future__ import annotations

import ctypes
import os
import tempfile

import numpy as np

from .device import Allocation, Device

_ALIGN = 64


class CpuDevice(Device):
    arch = "cpu"

    def __init__(self, num_threads: int | None = None):
        self.num_threads = num_threads or os.cpu_count() or 1
        self._libs: dict = {}  # sha256 -> PyDLL, so a library is dlopen'ed once per device

    def allocate(self, nbytes: int) -> Allocation:
        raw = np.zeros(max(nbytes, 1) + _ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % _ALIGN
        host = raw[start:start + nbytes]
        return Allocation(host.ctypes.data if nbytes else raw.ctypes.data + start, nbytes, host, raw)

    def free(self, alloc: Allocation) -> None:
        alloc.host = alloc.handle = None

    def copy_to_device(self, alloc, src, offset=0):
        b = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
        alloc.host[offset:offset + b.size] = b

    def copy_to_host(self, alloc, dst, offset=0):
        dst.view(np.uint8).reshape(-1)[:] = alloc.host[offset:offset + dst.nbytes]

    def load_library(self, lib_bytes: bytes, digest: str) -> ctypes.PyDLL:
        """dlopen a verified shared library (written to a private temp file first).

        Not a memfd: glibc's dlopen recognises an already-loaded library by its path string,
        and /proc/self/fd/N paths are reused as descriptors are closed, so a second library
        would silently resolve to the first."""
        lib = self._libs.get(digest)
        if lib is None:
            fd, path = tempfile.mkstemp(prefix="qdc-", suffix=".so")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(lib_bytes)
                lib = ctypes.PyDLL(path, mode=ctypes.RTLD_LOCAL)  # calls keep the GIL: see above
            finally:
                os.unlink(path)  # the mapping stays valid after unlink
            self._libs[digest] = lib
        return lib

    def load_kernel(self, artifacts: dict, meta):
        lib = self.load_library(artifacts["so"], artifacts["so_sha256"])
        # A function object of its own (lib[...] does not cache), so its call settings are ours.
        # No argtypes: ctypes then passes a byref() argument with the least work per call.
        fn = lib[meta.entry]
        fn.restype = None
        fn.argtypes = None
        return fn

    def launch(self, loaded, ctx_address: int) -> None:
        loaded(ctypes.c_void_p(ctx_address))

    def launch_call(self, loaded, ctx: ctypes.Array) -> tuple:
        return loaded, ctypes.byref(ctx)
