"""Metal device (runtime/device.py's asynchronous protocol) on PyObjC's Metal wrapper, macOS only.

It runs the Metal target's code (compiler/targets/metal/target.py has the ABI): per task an
MSL source with one kernel function, its buffers bound at the indices the task record's
"bindings" give, threadgroups of the block_dim its launch policy records.

Memory. Every allocation is an MTLBuffer of shared storage (host-visible on Apple silicon and
on Intel Macs alike), zeroed when made. `newBufferWithLength:options:` returning nil is an
out-of-memory error naming the size and the device's maxBufferLength, never a nil bound later
(on which writes vanish and reads give zeros); a request above maxBufferLength is one too, so
the adstack heap's growth (runtime/adstack.py: max(required, 2 x current), then exactly
required) falls back to exactly what a launch needs. `ptr` is an address in a space of this
device's own (runtime/address_space.py), which ctx words hold as on Vulkan; a launch maps each binding's
word back to (buffer, offset). Copies wait for the command buffers that use the buffer, then
go through its contents.

Launches. Each task launch is one command buffer with one compute encoder: the pipeline, the
buffers (the "args" and "adstack_meta" words with setBytes, devices/spirv_abi.py builds them),
ceil(slices / block_dim) threadgroups (2-D beyond 65535). Pipelines are built at load: an MSL
compile error, a missing function or a failed pipeline creation raises, naming the task.
`free_after_fence` frees once the command buffers submitted before it completed; `sync`
waits for them and raises the first kernel error (a command buffer in error state included).
"""
from __future__ import annotations

import numpy as np

from ...contract.errors import QdcError
from ...device import Allocation, DeviceCapabilities, check_copy_range
from ..spirv_abi import HEAP_WORDS, ArgsPlan, adstack_meta_words, dispatch_grid, resolve_binding_word
from ..submission import QueuedKernel, SubmissionDevice
from . import driver

BUFFER_ALIGN = 16
SET_BYTES_LIMIT = 4096           # setBytes:length:atIndex: takes at most 4 KiB
MAX_GRID_GROUPS = 65535          # threadgroups per grid dimension the 2-D grid uses
GRID_CAP_INVOCATIONS = 1 << 18   # the most invocations a launch dispatches (4 waves of 2^16)
UNKNOWN_TRIP_GROUPS = 1024       # threadgroups for an unknown trip count: the grid-stride loop does the rest
U32_MAX = 0xFFFFFFFF
LAUNCH_WRITTEN = ("args", "adstack_meta")


class UnsupportedKernelError(QdcError, ValueError):
    """A kernel's code cannot run on this Metal device."""


class Buffer:
    """An MTLBuffer, a numpy byte view of its contents, the serial of the last command buffer
    that may use it, its address."""
    __slots__ = ("buffer", "size", "view", "last_use", "address")

    def __init__(self, buffer, size, view, address):
        self.buffer, self.size, self.view, self.last_use, self.address = buffer, size, view, 0, address


class Binding:
    """One binding of a task: its Metal buffer index, resource, and the ctx word (plus a byte
    adjustment) holding the address of what it binds (None for the launch-written words)."""
    __slots__ = ("index", "resource", "word", "adjust")

    def __init__(self, meta, b, what: str):
        _set, self.index, self.resource, position = b
        self.word, self.adjust = None, 0
        if self.resource in LAUNCH_WRITTEN:
            return
        if self.resource in HEAP_WORDS:
            if meta.adstack_slot is None:
                raise UnsupportedKernelError(f"{what}: binds '{self.resource}' but its metadata lists no adstacks")
            self.word = meta.adstack_slot + HEAP_WORDS[self.resource]
            return
        found = resolve_binding_word(meta, self.resource, position)
        if found is None:
            raise UnsupportedKernelError(f"{what}: binds '{self.resource}', which no ctx word of the kernel holds")
        self.word, self.adjust = found


class MetalTask:
    __slots__ = ("name", "pipeline", "bindings", "block_dim", "serial")

    def __init__(self, name, pipeline, bindings, block_dim, serial):
        self.name, self.pipeline, self.bindings, self.block_dim, self.serial = (name, pipeline, bindings,
                                                                               block_dim, serial)


class MetalDevice(SubmissionDevice):
    arch = "metal"
    capabilities = DeviceCapabilities(host_memory=False, synchronous=False, fused_launch=False)

    def __init__(self, device_index: int | None = None, *, metal=None, mtl_device=None):
        """`metal` / `mtl_device`: the Metal module and an MTLDevice (default: PyObjC's, the
        system's default GPU; tests pass stand-ins)."""
        if metal is None:
            metal, mtl_device = driver.load_metal()
        self.metal, self.mtl = metal, mtl_device
        self.name = str(mtl_device.name())
        self.max_buffer_length = int(mtl_device.maxBufferLength())
        self.queue = mtl_device.newCommandQueue()
        self._set_up_submissions()
        self._empty = None                     # bound where a heap is not allocated (a launch that needs none)

    def __repr__(self) -> str:
        return f"MetalDevice({self.name!r})"

    # ---- memory --------------------------------------------------------------------------------
    def _new_zeroed_buffer(self, nbytes: int) -> Buffer:
        size = max(-(-nbytes // BUFFER_ALIGN) * BUFFER_ALIGN, BUFFER_ALIGN)
        if size > self.max_buffer_length:
            raise MemoryError(f"metal: {nbytes} bytes is more than this GPU's maxBufferLength "
                              f"({self.max_buffer_length} bytes)")
        buffer = self.mtl.newBufferWithLength_options_(size, driver.STORAGE_MODE_SHARED)
        if buffer is None:
            raise MemoryError(f"metal: newBufferWithLength:{size} returned nil: out of GPU memory "
                              f"(maxBufferLength {self.max_buffer_length} bytes)")
        view = np.frombuffer(buffer.contents().as_buffer(size), np.uint8)
        view[:] = 0
        return Buffer(buffer, size, view, 0)

    def _destroy_buffer(self, buf: Buffer) -> None:
        buf.view = buf.buffer = None  # the last reference: PyObjC releases the MTLBuffer

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        buf = check_copy_range(alloc, offset, data.size)
        self._wait_for(buf.last_use)  # the launches before this copy must not see its bytes
        buf.view[offset:offset + data.size] = data

    def copy_between(self, src: Allocation, dst: Allocation, nbytes: int) -> None:
        """The first `nbytes` of `src` onto `dst` (deep copies of arrays): once the launches that
        use either buffer ran, a memcpy between their shared-storage contents (no host copy)."""
        source, target = check_copy_range(src, 0, nbytes), check_copy_range(dst, 0, nbytes)
        self._wait_for(source.last_use)
        self._wait_for(target.last_use)
        target.view[:nbytes] = source.view[:nbytes]

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        out = dst.reshape(-1).view(np.uint8)
        buf = check_copy_range(alloc, offset, out.size)
        self._wait_for(buf.last_use)
        out[:] = buf.view[offset:offset + out.size]

    # ---- completion (a command buffer is its own fence) ------------------------------------------
    def _block_on(self, sub) -> None:
        sub.command.waitUntilCompleted()

    def _finished(self, sub) -> bool:
        return sub.command.status() >= driver.COMMAND_BUFFER_COMPLETED

    def _recycle(self, sub) -> None:
        """Nothing to give back (the buffers it kept go with it); one that ended in error raises."""
        if sub.command.status() == driver.COMMAND_BUFFER_ERROR:
            raise RuntimeError(f"metal: a kernel failed on the GPU: {sub.command.error()}")

    # ---- kernels -------------------------------------------------------------------------------
    def load_kernel(self, artifacts: dict, meta) -> QueuedKernel:
        return QueuedKernel(meta, [self._build_task(artifacts, meta, i) for i in range(len(meta.tasks))],
                           ArgsPlan(meta))

    def _build_task(self, artifacts: dict, meta, i: int) -> MetalTask:
        record = meta.tasks[i]
        what = f"task {i} ('{record.name}') of kernel '{meta.name}'"
        source = artifacts.get(f"msl_t{i}")
        if source is None:
            raise UnsupportedKernelError(f"{what}: no MSL among its artifacts (built for another arch?)")
        library, error = self.mtl.newLibraryWithSource_options_error_(bytes(source).decode(), None, None)
        if library is None:
            raise RuntimeError(f"metal: compiling the MSL of {what} failed: {error}")
        function = library.newFunctionWithName_(record.entry)
        if function is None:
            raise RuntimeError(f"metal: the MSL of {what} has no kernel function '{record.entry}'")
        pipeline, error = self.mtl.newComputePipelineStateWithFunction_error_(function, None)
        if pipeline is None:
            raise RuntimeError(f"metal: creating the compute pipeline of {what} failed: {error}")
        block = int(record.launch.get("block_dim") or 0)
        limit = int(pipeline.maxTotalThreadsPerThreadgroup())
        if not 0 < block <= limit:
            raise UnsupportedKernelError(f"{what}: threadgroups of {block} threads, but its pipeline takes 1 to "
                                         f"{limit} (rebuild with a smaller qd.loop_config(block_dim=...))")
        bindings = [Binding(meta, b, what) for b in record.bindings]
        return MetalTask(record.name, pipeline, bindings, block, record.kind == "serial" or record.serial)

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The invocations a launch dispatches: one per iteration (the last threadgroup's extra
        invocations leave at once) up to GRID_CAP_INVOCATIONS, a few waves of what a GPU of this
        class runs at once (Metal does not say): the grid-stride loop covers larger ranges, so
        an adstack heap holds the invocations in flight. Unknown: a fixed, smaller grid."""
        if launch["policy"] != "grid":
            raise ValueError(f"the metal device cannot launch a task with launch policy {launch['policy']!r}")
        block = launch.get("block_dim") or 1
        if iterations is None:
            return UNKNOWN_TRIP_GROUPS * block
        return min(max(iterations, 0), max(GRID_CAP_INVOCATIONS // block, 1) * block)

    def max_binding_bytes(self) -> int:
        return self.max_buffer_length

    def launch_task(self, loaded: QueuedKernel, task: int, ctx_address: int, slices: int) -> None:
        if slices <= 0:
            return
        meta, t = loaded.meta, loaded.tasks[task]
        ctx = loaded.ctx_words(ctx_address)
        command = self.queue.commandBuffer()
        encoder = command.computeCommandEncoder()
        encoder.setComputePipelineState_(t.pipeline)
        uses, keep = [], []
        for b in t.bindings:
            if b.resource in LAUNCH_WRITTEN:
                words = loaded.args.pack(ctx) if b.resource == "args" else self._adstack_words(meta, ctx, t.name)
                self._set_bytes(encoder, words, b.index, keep)
                continue
            buf, offset = self._bound(ctx, b, t.name)
            encoder.setBuffer_offset_atIndex_(buf.buffer, offset, b.index)
            uses.append(buf)
        groups = 1 if t.serial else -(-slices // t.block_dim)
        x, y = dispatch_grid(groups, (MAX_GRID_GROUPS, MAX_GRID_GROUPS))
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(driver.size(self.metal, x, y),
                                                            driver.size(self.metal, t.block_dim))
        encoder.endEncoding()
        command.commit()
        self._track(command, None, keep, uses + keep)

    def _adstack_words(self, meta, ctx, name: str) -> np.ndarray:
        """adstack_meta's words; the code indexes the heaps in 32 bits (Metal has no 64-bit
        atomics, so no Int64), so each heap's stride x invocations must fit them."""
        words = adstack_meta_words(meta, ctx, name)
        for heap in HEAP_WORDS.values():
            if int(words[heap]) * int(words[2]) > U32_MAX:
                raise ValueError(f"{name}: its adstack heap needs {int(words[heap]) * int(words[2])} 4-byte entries, "
                                 f"more than Metal's 32-bit heap indices reach: launch fewer iterations at once or "
                                 f"lower the adstack capacity (qd.init(ad_stack_size=N))")
        return words

    def _set_bytes(self, encoder, words: np.ndarray, index: int, keep: list) -> None:
        data = words.tobytes()
        if len(data) <= SET_BYTES_LIMIT:
            encoder.setBytes_length_atIndex_(data, len(data), index)
            return
        buf = self._new_zeroed_buffer(len(data))  # kept alive until the command buffer completed
        buf.view[:len(data)] = np.frombuffer(data, np.uint8)
        encoder.setBuffer_offset_atIndex_(buf.buffer, 0, index)
        keep.append(buf)

    def _bound(self, ctx, b: Binding, name: str):
        """(Buffer, byte offset) a binding's ctx word points into; an adstack heap not allocated
        yet (a launch that pushes nothing) binds a small empty buffer, never nil."""
        address = int(ctx[b.word])
        if address == 0 and b.resource in HEAP_WORDS:
            if self._empty is None:
                self._empty = self._new_zeroed_buffer(BUFFER_ALIGN)
            return self._empty, 0
        found = self.lookup(address + b.adjust)
        if found is None:
            raise ValueError(f"{name}: its '{b.resource}' binding points at {address:#x}, which is no buffer of "
                             f"this Metal device")
        alloc, offset = found
        return alloc.handle, offset

    def close(self) -> None:
        """Wait for the queue and drop every buffer (PyObjC releases them)."""
        if self.queue is None:
            return
        try:
            self._retire(self._last_submitted)
        finally:
            for alloc in self._addresses.allocations():
                self.free(alloc)
            self._pending_frees, self._empty, self.queue = [], None, None

