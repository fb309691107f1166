"""CUDA device (runtime/device.py's asynchronous protocol) on the CUDA driver API, through
`cuda-bindings` only (driver.py).

Context and stream. The primary context of GPU `QDC_CUDA_DEVICE` (default 0) and one stream:
every launch, copy and memset goes on it, so stream order alone orders them.

Memory. `allocate` is cuMemAlloc plus a memset on the stream (zeroed, ordered before any later
launch); `ptr` is the real device address, written into ctx words as is. `copy_to_device`
and `copy_to_host` are ranged cuMemcpy*Async on the stream followed by a stream synchronise,
so the source may change and the destination is complete when they return.
`free_after_fence` records an event: the allocation is freed once the event completed
(checked at every later free_after_fence and at `wait`), so a heap replaced while launches
that use it are in flight is never freed under them.

Launches. A kernel's PTX is loaded once (cuModuleLoadData), with one CUfunction per task
(its record's entry). The kernel reads its ctx words from device memory: each (kernel, ctx
buffer) pair has a device copy, re-uploaded only when the words changed since the last
upload (staged through a pinned ring whose two halves are reused only after an event says the
copies reading them ran). Stream order makes the overwrite safe: the copy runs after the
launches before it. Grid = slices / block_dim blocks; `task_slices` is
min(ceil(N / block_dim), a cap) blocks, and the task's grid-stride loop covers the rest.

Adstacks. The kernel indexes the heap by the global thread id, so a launch needs a slice per
thread it really runs. Before a task holding stacks is launched, the heap is grown (through
the runtime's heap, runtime/adstack.py: max(required, 2 x current), retry at exactly
required, then a clear MemoryError; the old heap freed after the fence) to
`slices * stride` bytes when smaller, and the ctx words (heap pointer, slices held) follow.
`slices` is what the launcher evaluated for this launch, reading temporaries an earlier task
computed on the device back with a small device-to-host copy, so a dynamic range is sized
for the threads it launches.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ...device import Allocation, Device, DeviceCapabilities
from .driver import Driver

DEFAULT_BLOCK_DIM = 256
WAVES = 16                       # grid cap: this many waves of resident blocks on every SM
RING_BYTES = 1 << 20             # pinned staging for ctx uploads (two halves)
CTX_ALIGN = 256


class CudaTask:
    """One task's function, block size and whether it holds adstacks."""
    __slots__ = ("function", "block_dim", "stacks", "name")

    def __init__(self, function, block_dim, stacks, name):
        self.function, self.block_dim, self.stacks, self.name = function, block_dim, stacks, name


class CtxCopy:
    """The device copy of one ctx buffer: its allocation, the bytes last uploaded, the
    kernel-parameter array (void* to a u64 holding the device address), a numpy view of the
    host words."""
    __slots__ = ("alloc", "last", "param", "params", "words", "nbytes")

    def __init__(self, alloc, nbytes, host_address):
        self.alloc, self.nbytes, self.last = alloc, nbytes, None
        self.param = ctypes.c_uint64(alloc.ptr)
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.param))
        self.words = np.frombuffer((ctypes.c_uint64 * (nbytes // 8)).from_address(host_address), np.uint64)


class CudaKernel:
    """A loaded kernel: its module, a CudaTask per task, its ctx copies."""

    def __init__(self, meta, module, tasks):
        self.meta, self.module, self.tasks = meta, module, tasks
        self.ctx_copies: dict = {}  # host ctx address -> CtxCopy
        self.ctx_bytes = 8 * max(meta.ctx_words, 1)


class CudaDevice(Device):
    arch = "cuda"
    capabilities = DeviceCapabilities(host_memory=False, synchronous=False, fused_launch=False)

    def __init__(self, device_index: int | None = None):
        d = self.driver = Driver()
        cu = self.cu = d.cu
        index = int(os.environ.get("QDC_CUDA_DEVICE", "0")) if device_index is None else device_index
        self.device = d.check(cu.cuDeviceGet(index), f"cuDeviceGet({index})")
        self.context = d.check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        d.check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = d.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        name = d.check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.sm_count = d.attribute(self.device, "MULTIPROCESSOR_COUNT")
        self.threads_per_sm = d.attribute(self.device, "MAX_THREADS_PER_MULTIPROCESSOR")
        self.max_grid_x = d.attribute(self.device, "MAX_GRID_DIM_X")
        self._pending_frees: list = []  # (event, Allocation)
        self._ring_host = d.check(cu.cuMemHostAlloc(RING_BYTES, 0), "cuMemHostAlloc")
        self._ring_offset = 0
        self._ring_events = [None, None]  # per half: recorded when the ring last left it
        self._ring_half = 0
        self._launch = cu.cuLaunchKernel
        self._upload = cu.cuMemcpyHtoDAsync
        self._grid_caps: dict = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"CudaDevice({self.name!r})"

    # ---- memory --------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Allocation:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        cu, d = self.cu, self.driver
        size = max(-(-nbytes // 8) * 8, 8)
        ptr = d.check(cu.cuMemAlloc(size), f"allocating {nbytes} bytes of device memory")
        d.check(cu.cuMemsetD8Async(ptr, 0, size, self.stream), "cuMemsetD8Async")
        return Allocation(int(ptr), nbytes, None, ptr)

    def free(self, alloc: Allocation) -> None:
        if alloc.handle is None:
            return
        handle, alloc.handle = alloc.handle, None
        self.driver.check(self.cu.cuMemFree(handle), "cuMemFree")

    def free_after_fence(self, alloc: Allocation) -> None:
        self._retire()
        if alloc.handle is None:
            return
        self._pending_frees.append((self._record_event(), alloc))

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
        _check_range(alloc, offset, data.size)
        if data.size == 0:
            return
        d = self.driver
        d.check(self.cu.cuMemcpyHtoDAsync(alloc.ptr + offset, data.ctypes.data, data.size, self.stream),
                "cuMemcpyHtoDAsync")
        d.check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize (after a copy to the device)")

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        out = dst.view(np.uint8).reshape(-1)
        _check_range(alloc, offset, out.size)
        if out.size == 0:
            return
        d = self.driver
        d.check(self.cu.cuMemcpyDtoHAsync(out.ctypes.data, alloc.ptr + offset, out.size, self.stream),
                "cuMemcpyDtoHAsync")
        d.check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize (a copy to the host)")

    # ---- events and completion -----------------------------------------------------------------
    def _record_event(self):
        cu, d = self.cu, self.driver
        event = d.check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        d.check(cu.cuEventRecord(event, self.stream), "cuEventRecord")
        return event

    def _event_done(self, event, block: bool = False) -> bool:
        cu = self.cu
        if block:
            self.driver.check(cu.cuEventSynchronize(event), "cuEventSynchronize")
            return True
        (err,) = cu.cuEventQuery(event)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        if err != self.driver.ok:
            self.driver.fail(err, "cuEventQuery")
        return True

    def _retire(self, block: bool = False) -> None:
        """Free what waited for events that completed (all of them when `block`)."""
        keep = []
        for event, alloc in self._pending_frees:
            if self._event_done(event, block):
                self.cu.cuEventDestroy(event)
                self.free(alloc)
            else:
                keep.append((event, alloc))
        self._pending_frees = keep

    def wait(self) -> None:
        self.driver.check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize (a kernel failed)")
        self._retire(block=True)

    # ---- kernels -------------------------------------------------------------------------------
    def load_kernel(self, artifacts: dict, meta) -> CudaKernel:
        ptx = artifacts.get("ptx")
        if ptx is None:
            raise ValueError(f"kernel '{meta.name}': no PTX among its artifacts ({', '.join(sorted(artifacts))})")
        cu, d = self.cu, self.driver
        image = bytes(ptx) + b"\0"
        module = d.check(cu.cuModuleLoadData(image), f"loading the PTX of kernel '{meta.name}' (cuModuleLoadData)")
        stack_tasks = {r["task"] for r in (meta.adstack.get("stacks") or [])}
        tasks = []
        for i, t in enumerate(meta.tasks):
            fn = d.check(cu.cuModuleGetFunction(module, t.entry.encode()), f"kernel '{meta.name}': entry {t.entry}")
            tasks.append(CudaTask(fn, self.block_dim(t.launch), i in stack_tasks, t.name))
        return CudaKernel(meta, module, tasks)

    def block_dim(self, launch: dict) -> int:
        return launch.get("block_dim") or DEFAULT_BLOCK_DIM

    def grid_cap(self, block_dim: int) -> int:
        """The most blocks a launch of `block_dim`-thread blocks gets: WAVES waves of the blocks
        every SM holds at once (the grid-stride loop covers larger ranges)."""
        cap = self._grid_caps.get(block_dim)
        if cap is None:
            cap = self._grid_caps[block_dim] = min(self.max_grid_x,
                                                   self.sm_count * max(self.threads_per_sm // block_dim, 1) * WAVES)
        return cap

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The threads launched for `iterations`: ceil(N / block_dim) blocks up to the grid cap
        (None: the cap); 0 iterations launch nothing."""
        if launch["policy"] != "grid":
            raise ValueError(f"the cuda device cannot launch a task with launch policy {launch['policy']!r}")
        block = self.block_dim(launch)
        cap = self.grid_cap(block)
        if iterations is None:
            return cap * block
        if iterations <= 0:
            return 0
        return min(-(-iterations // block), cap) * block

    def launch_task(self, loaded: CudaKernel, task: int, ctx_address: int, slices: int) -> None:
        if slices <= 0:
            return
        t = loaded.tasks[task]
        copy = loaded.ctx_copies.get(ctx_address)
        if copy is None:
            copy = loaded.ctx_copies[ctx_address] = CtxCopy(self.allocate(loaded.ctx_bytes), loaded.ctx_bytes,
                                                            ctx_address)
        if t.stacks:
            self._size_heap(loaded, copy.words, slices)
        data = ctypes.string_at(ctx_address, copy.nbytes)
        if data != copy.last:
            self._upload_ctx(copy, data)
        block = t.block_dim
        err = self._launch(t.function, -(-slices // block), 1, 1, block, 1, 1, 0, self.stream,
                           ctypes.addressof(copy.params), 0)[0]
        if err != self.driver.ok:
            self.driver.fail(err, f"launching task '{t.name}' of kernel '{loaded.meta.name}'")

    def _upload_ctx(self, copy: CtxCopy, data: bytes) -> None:
        """Stage `data` in the pinned ring and copy it to the ctx's device copy on the stream."""
        host = int(self._ring_host) + self._stage(-(-len(data) // CTX_ALIGN) * CTX_ALIGN)
        ctypes.memmove(host, data, len(data))
        err = self._upload(copy.alloc.ptr, host, len(data), self.stream)[0]
        if err != self.driver.ok:
            self.driver.fail(err, "uploading a launch's ctx words (cuMemcpyHtoDAsync)")
        copy.last = data

    def _stage(self, size: int) -> int:
        """Ring offset of `size` staging bytes. Entering a half waits for the event recorded when
        the ring last left it (the copies reading it ran); leaving one records its event."""
        half = RING_BYTES // 2
        start = self._ring_offset
        if start + size > RING_BYTES:
            start = 0
        elif start < half < start + size:
            start = half  # a staging never straddles the halves
        entered = start // half
        if entered != self._ring_half:
            self._ring_events[self._ring_half] = self._record_event()
            old = self._ring_events[entered]
            if old is not None:
                self._event_done(old, block=True)
                self.cu.cuEventDestroy(old)
                self._ring_events[entered] = None
            self._ring_half = entered
        self._ring_offset = start + size
        return start

    def _size_heap(self, loaded: CudaKernel, words: np.ndarray, slices: int) -> None:
        """Grow the runtime's adstack heap to a slice per launched thread and point the ctx at it."""
        from ... import context
        from ...adstack import heap_for
        meta = loaded.meta
        slot = meta.adstack_slot
        stride = int(words[slot + 1])
        if stride == 0:
            return
        heap = heap_for(context.current())
        required = slices * stride
        if heap.nbytes >= required and int(words[slot]) == heap.ptr and int(words[meta.adstack_threads_slot]) >= slices:
            return
        heap.ensure(required, meta.name)
        words[slot] = heap.ptr
        words[meta.adstack_threads_slot] = heap.nbytes // stride

    def close(self) -> None:
        """Wait for the stream and release this device's stream, staging ring and context."""
        if self._closed:
            return
        self._closed = True
        cu = self.cu
        cu.cuStreamSynchronize(self.stream)
        self._retire(block=True)
        cu.cuStreamDestroy(self.stream)
        cu.cuMemFreeHost(self._ring_host)
        cu.cuDevicePrimaryCtxRelease(self.device)


def _check_range(alloc: Allocation, offset: int, nbytes: int) -> None:
    if alloc.handle is None:
        raise ValueError("a copy to or from a freed allocation")
    if offset < 0 or offset + nbytes > alloc.nbytes:
        raise ValueError(f"a copy of {nbytes} bytes at offset {offset} does not fit an allocation of "
                         f"{alloc.nbytes} bytes")
