"""Vulkan device (runtime/device.py's asynchronous protocol) on the `vulkan` pip binding.

Memory. Every allocation is a VkBuffer with memory of its own, of the device-local type where
the device has one. Its `ptr` is an address in a virtual address space of this device's own
(from 2^48 up, never 0, never a host address): the launcher writes such addresses into ctx
words as it would device pointers, and a launch maps each binding's word back to (buffer,
offset). Memory that is also host-visible (lavapipe's only type; resizable BAR) is mapped
once and copied with memcpy whenever no recorded or submitted work may still use the buffer;
otherwise a write is a command in the batch (vkCmdUpdateBuffer up to 64 KiB, 4-aligned; else
vkCmdCopyBuffer from the args ring or a staging buffer), so it stays ordered with the launches
around it, and a read records a copy into a staging buffer and waits for it. `fill` is
vkCmdFillBuffer where the pattern repeats a 32-bit word (8/16-bit values replicated) over a
4-aligned range, else a seed write plus doubling vkCmdCopyBuffers within the buffer.

Batches. Launches, fills and queued copies are commands recorded into one open command
buffer (a Batch), which takes the next serial when it opens; the buffers its commands use
take that serial as their last use at once. A memory barrier goes before a command that uses
a buffer an earlier command of the batch touched since the last barrier (and one opens every
batch, against earlier submissions); one at its end makes its writes visible to the host. The
batch is submitted, with a fence of its own, at `wait`/`sync`, at a host read or a wait for a
buffer it uses, when the args ring wraps or the descriptor pool is reset, and once it holds
BATCH_COMMANDS commands. Finished submissions are retired oldest first: their command buffer
and fence are reused, the staging buffers they held are destroyed, and `free_after_fence` /
`free` release what waited for them. A batch whose submission fails is dropped (its error
raised); the next one starts afresh. A batch knows the kernels it launches: at its submission
they join the device's last submitted kernels, which a DeviceLostError names
(VK_ERROR_DEVICE_LOST from vkQueueSubmit, vkWaitForFences or vkGetFenceStatus; runtime/device.py,
"Loss").

Launches. `launch_task` writes the "args" words into a host-visible ring (dynamic offset),
binds a descriptor set (cached per task and bound buffers), and dispatches ceil(slices /
block_dim) workgroups, 2-D beyond maxComputeWorkGroupCount[0], recorded in the batch; `sync`
submits it, waits for the fences and reads each launch's error slot (runtime/device.py),
raising the first error naming its kernel. A one-task launch on an idle device (no open batch,
nothing in flight) is instead a command buffer recorded once and submitted again while what it
recorded holds (replays.py).
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from ...device import Allocation, check_copy_range, check_fill_pattern, fill_seed, pattern_period
from ..submission import QueuedKernel, Submission, SubmissionDevice
from . import driver, kernels, pipelines, replays

ARGS_RING_BYTES = 1 << 20
# The ring's tail holds the args slots of recorded launches (replays.py); launches that record
# take their args from the rest.
ARGS_RING_RECORDED = ARGS_RING_BYTES - replays.REPLAYS * replays.REPLAY_SLOT_BYTES
# Commands one batch holds before it is submitted without waiting for a sync: enough that a
# loop of small launches pays one vkQueueSubmit per 256 of them, few enough that the device
# starts on long work while the host records more.
BATCH_COMMANDS = 256
UPDATE_BUFFER_BYTES = 65536     # vkCmdUpdateBuffer's limit (4-aligned offset and size)
DESCRIPTOR_POOL_SETS = 1024
WAVES = 4                  # grid cap: this many waves of the invocations the device runs at once
FALLBACK_RESIDENT = 1 << 16  # invocations assumed to run at once where the driver does not say
U64_MAX = (1 << 64) - 1
# Vulkan 1.2's values, which the `vulkan` binding leaves out (its KHR aliases are None)
BUFFER_USAGE_SHADER_DEVICE_ADDRESS = 0x00020000
MEMORY_ALLOCATE_DEVICE_ADDRESS = 0x00000002
# A wait polls the fence this long before it blocks in vkWaitForFences: a short launch then
# returns when the GPU signals, not when the kernel driver wakes the thread (as CUDA's default
# spin-then-block scheduling). Not on a CPU device (lavapipe), whose invocations need the cores.
SPIN_SECONDS = 100e-6


class Buffer:
    """A VkBuffer and its memory; `mapped` a numpy byte view of it when host-visible;
    `last_use` the serial of the last submission that may use it; `serial` unique per buffer."""
    # address: where the device's address space (runtime/address_space.py) put it; device_address:
    # its buffer device address (vkGetBufferDeviceAddress, 0 on a device without them)
    __slots__ = ("handle", "memory", "size", "mapped", "last_use", "serial", "address", "device_address")

    def __init__(self, handle, memory, size, mapped, serial, address=0, device_address=0):
        self.handle, self.memory, self.size, self.mapped = handle, memory, size, mapped
        self.last_use, self.serial, self.address, self.device_address = 0, serial, address, device_address


class Batch:
    """The open command buffer: its fence and serial, the staging buffers it keeps alive, the
    commands recorded, the buffers touched since its last memory barrier, the kernels launched."""
    __slots__ = ("command", "fence", "serial", "keep", "commands", "touched", "kernels")

    def __init__(self, command, fence, serial):
        self.command, self.fence, self.serial = command, fence, serial
        self.keep, self.commands, self.touched, self.kernels = [], 0, set(), []


class VulkanDevice(SubmissionDevice):
    arch = "vulkan"

    def __init__(self, device_index: int | None = None):
        vk = self.vk = driver.load_binding()
        self.ffi, self.lib = vk.ffi, vk.lib
        self.device = None
        self.instance = driver.shared_instance(vk)  # the process's; never destroyed here
        self.physical, self.family = driver.select_physical_device(vk, self.instance, device_index)
        atomic = driver.ATOMIC_FLOAT_EXTENSION in driver.device_extensions(vk, self.physical)
        chain = driver.FeatureChain(vk, atomic).query(vk, self.physical)
        self.capabilities = driver.read_capabilities(vk, self.physical, chain)
        self.device, self.queue = driver.create_device(vk, self.physical, self.family, chain,
                                                       [driver.ATOMIC_FLOAT_EXTENSION] if atomic else [])
        try:
            self._set_up()
        except BaseException:  # nobody else can close a device whose __init__ failed
            self.close()
            raise

    def _set_up(self) -> None:
        """Everything made on the logical device at creation: pools, the args ring, reused structs."""
        vk = self.vk
        self._choose_memory_types()
        self._set_up_submissions()
        self._buffers = itertools.count(1)
        self._spare = []                # (command buffer, fence) ready for reuse
        self._command_pool = self._create_command_pool()
        self._descriptor_pool = self._create_descriptor_pool()
        self._set_cache: dict = {}
        self._args_ring = self._create_buffer(ARGS_RING_BYTES, self._host_type, host=True)
        self._args_offset = 0
        self._args_wraps = 0            # times the ring started over: older offsets may be overwritten
        self._ring_words: dict = {}     # ArgsPlan -> (wraps, offset, bytes) of its last args in the ring
        self._args_align = max(16, self.capabilities.min_storage_buffer_offset_alignment)
        self._batch = None              # the open Batch, if any
        self._host_visible_allocations = False  # set while error blocks are allocated
        self._barrier_between = self._memory_barrier(vk.VK_ACCESS_MEMORY_WRITE_BIT,
                                                     vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT)
        self._barrier_to_host = self._memory_barrier(vk.VK_ACCESS_MEMORY_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        self._begin_info = self.ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
        self._replay_begin_info = self.ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        self._replays = replays.Replays(self, ARGS_RING_RECORDED, replays.REPLAY_SLOT_BYTES)
        self._submit_info = self.ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                           "commandBufferCount": 1})
        self._command_slot = self.ffi.new("VkCommandBuffer[1]")
        self._submit_info.pCommandBuffers = self._command_slot
        self.max_grid_groups = min(65535, self.capabilities.max_workgroup_count[0])
        self._spin_seconds = 0.0 if self.capabilities.cpu_device else SPIN_SECONDS

    def __repr__(self) -> str:
        return f"VulkanDevice({self.capabilities.name!r})"

    # ---- setup ---------------------------------------------------------------------------------
    def _choose_memory_types(self) -> None:
        vk = self.vk
        types = driver.memory_types(vk, self.physical)
        host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        self._memory_flags = [flags for flags, _ in types]
        self._host_type = _first(types, lambda f: f & host == host, "host-visible coherent")
        self._device_type = _first(types, lambda f: f & local, None)
        if self._device_type is None:
            self._device_type = self._host_type

    def _memory_barrier(self, src_access, dst_access):
        return self.ffi.new("VkMemoryBarrier*", {"sType": self.vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                                  "srcAccessMask": src_access, "dstAccessMask": dst_access})

    def _create_command_pool(self):
        vk = self.vk
        info = self.ffi.new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, "queueFamilyIndex": self.family,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT})
        return self.create("CommandPool", info)

    def _create_descriptor_pool(self):
        vk = self.vk
        sizes = self.ffi.new("VkDescriptorPoolSize[2]", [
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "descriptorCount": 8 * DESCRIPTOR_POOL_SETS},
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC, "descriptorCount": 2 * DESCRIPTOR_POOL_SETS}])
        info = self.ffi.new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, "maxSets": DESCRIPTOR_POOL_SETS,
            "poolSizeCount": 2, "pPoolSizes": sizes})
        return self.create("DescriptorPool", info)

    def create(self, kind: str, info, what: str = ""):
        """A new Vk<kind> that vkCreate<kind> makes from `info`; a failure names `what`, else the call."""
        out = self.ffi.new(f"Vk{kind}*")
        call = f"vkCreate{kind}"
        self._check(getattr(self.lib, call)(self.device, info, self.ffi.NULL, out), what or call)
        return out[0]

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            if result in (self.vk.VK_ERROR_OUT_OF_DEVICE_MEMORY, self.vk.VK_ERROR_OUT_OF_HOST_MEMORY):
                raise MemoryError(f"vulkan: {what}: out of memory (VkResult {result})")
            if result == self.vk.VK_ERROR_DEVICE_LOST:
                raise self.device_lost(f"{what}: VK_ERROR_DEVICE_LOST, a kernel crashed or ran too long")
            raise RuntimeError(f"vulkan: {what} failed (VkResult {result})")

    # ---- memory --------------------------------------------------------------------------------
    def _create_buffer(self, nbytes: int, memory_type: int, host: bool = False) -> Buffer:
        vk, ffi, lib = self.vk, self.ffi, self.lib
        size = max(-(-nbytes // 4) * 4, 4)
        # Buffer device addresses for the tasks that reach their arrays by address (more arrays
        # than the device binds to one shader: compiler/targets/vulkan/target.py)
        addressable = self.capabilities.buffer_device_address
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                 | vk.VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT)  # the grids tasks compute (pipelines.py)
        if addressable:
            usage |= BUFFER_USAGE_SHADER_DEVICE_ADDRESS
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": size, "usage": usage,
            "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        handle = self.create("Buffer", info, f"creating a buffer of {nbytes} bytes")
        needs = ffi.new("VkMemoryRequirements*")
        lib.vkGetBufferMemoryRequirements(self.device, handle, needs)
        if not needs.memoryTypeBits & (1 << memory_type):
            memory_type = next(i for i in range(32) if needs.memoryTypeBits & (1 << i))
        flags_info = ffi.new("VkMemoryAllocateFlagsInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
            "flags": MEMORY_ALLOCATE_DEVICE_ADDRESS}) if addressable else ffi.NULL
        alloc_info = ffi.new("VkMemoryAllocateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                                       "pNext": flags_info, "allocationSize": needs.size,
                                                       "memoryTypeIndex": memory_type})
        memory = ffi.new("VkDeviceMemory*")
        result = lib.vkAllocateMemory(self.device, alloc_info, ffi.NULL, memory)
        if result != 0:
            lib.vkDestroyBuffer(self.device, handle, ffi.NULL)
            self._check(result, f"allocating {nbytes} bytes of device memory")
        self._check(lib.vkBindBufferMemory(self.device, handle, memory[0], 0), "vkBindBufferMemory")
        device_address = 0
        if addressable:
            device_address = lib.vkGetBufferDeviceAddress(self.device, ffi.new("VkBufferDeviceAddressInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, "buffer": handle}))
        mapped = None
        flags = self._memory_flags[memory_type]
        coherent = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        if host or flags & coherent == coherent:
            pointer = ffi.new("void**")
            self._check(lib.vkMapMemory(self.device, memory[0], 0, size, 0, pointer), "vkMapMemory")
            mapped = np.frombuffer(ffi.buffer(pointer[0], size), np.uint8)
        return Buffer(handle, memory[0], size, mapped, next(self._buffers), device_address=device_address)

    def _destroy_buffer(self, buf: Buffer) -> None:
        if buf.mapped is not None:
            buf.mapped = None
            self.lib.vkUnmapMemory(self.device, buf.memory)
        self.lib.vkDestroyBuffer(self.device, buf.handle, self.ffi.NULL)
        self.lib.vkFreeMemory(self.device, buf.memory, self.ffi.NULL)

    def _new_zeroed_buffer(self, nbytes: int) -> Buffer:
        if self._host_visible_allocations:
            buf = self._create_buffer(nbytes, self._host_type, host=True)
        else:
            buf = self._create_buffer(nbytes, self._device_type)
        if buf.mapped is not None:
            buf.mapped[:] = 0  # new memory: no submitted work can use it yet
        else:
            self.lib.vkCmdFillBuffer(self._record([buf]), buf.handle, 0, buf.size, 0)
        return buf

    def allocate_host_read(self, nbytes: int) -> Allocation:
        """Host-visible memory: a read of device-local memory would be a submission and a wait."""
        self._host_visible_allocations = True
        try:
            return self.allocate(nbytes)
        finally:
            self._host_visible_allocations = False

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)  # 1-d first: a 0-d array has no byte view
        buf = check_copy_range(alloc, offset, data.size)
        if data.size == 0:
            return
        if buf.mapped is not None and self._idle_for(buf):
            buf.mapped[offset:offset + data.size] = data
            return
        self._record_write(buf, offset, data)

    def _record_write(self, buf: Buffer, offset: int, data: np.ndarray) -> None:
        """Write `data` (bytes) at `offset` of `buf` in the batch: inline in the command buffer
        when vkCmdUpdateBuffer takes it, else copied from the args ring (small) or from a
        staging buffer of its own."""
        lib, size = self.lib, data.size
        if size <= UPDATE_BUFFER_BYTES and offset % 4 == 0 and size % 4 == 0:
            lib.vkCmdUpdateBuffer(self._record([buf]), buf.handle, offset, size, self.ffi.from_buffer(data))
            return
        if size <= UPDATE_BUFFER_BYTES:
            source, source_offset, keep = self._args_ring, self.args_space(size), []
        else:
            source, source_offset = self._create_buffer(size, self._host_type, host=True), 0
            keep = [source]
        source.mapped[source_offset:source_offset + size] = data
        region = self.ffi.new("VkBufferCopy*", {"srcOffset": source_offset, "dstOffset": offset, "size": size})
        lib.vkCmdCopyBuffer(self._record([buf, source], keep), source.handle, buf.handle, 1, region)

    def fill(self, alloc: Allocation, offset: int, nbytes: int, pattern: bytes) -> None:
        """vkCmdFillBuffer in the batch where the pattern repeats a 4-byte word over a 4-aligned
        range; otherwise `fill_seed` of it written, then copied onto the rest of the range in
        doubling copies (each reads what the previous ones wrote)."""
        buf = check_copy_range(alloc, offset, nbytes)
        check_fill_pattern(pattern, nbytes)
        if nbytes == 0:
            return
        word, end = _repeated_word(pattern), offset + nbytes
        if word is not None and end == alloc.nbytes:
            end = -(-end // 4) * 4  # into the buffer's own padding (its size is a multiple of 4)
        if word is not None and offset % 4 == 0 and end % 4 == 0:
            self.lib.vkCmdFillBuffer(self._record([buf]), buf.handle, offset, end - offset,
                                     int(np.frombuffer(word, np.uint32)[0]))
            return
        seed = fill_seed(pattern, nbytes)
        self._record_write(buf, offset, seed)
        done = seed.size
        while done < nbytes:
            size = min(done, nbytes - done)
            region = self.ffi.new("VkBufferCopy*", {"srcOffset": offset, "dstOffset": offset + done, "size": size})
            self.lib.vkCmdCopyBuffer(self._record([buf]), buf.handle, buf.handle, 1, region)
            done += size

    def copy_between(self, src: Allocation, dst: Allocation, nbytes: int) -> None:
        """The first `nbytes` of `src` onto `dst`: a vkCmdCopyBuffer in the batch."""
        source, target = check_copy_range(src, 0, nbytes), check_copy_range(dst, 0, nbytes)
        if nbytes:
            region = self.ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": nbytes})
            self.lib.vkCmdCopyBuffer(self._record([target, source]), source.handle, target.handle, 1, region)

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        out = dst.reshape(-1).view(np.uint8)  # a view of `dst` (contiguous), 1-d first as above
        buf = check_copy_range(alloc, offset, out.size)
        if out.size == 0:
            return
        if buf.mapped is not None:
            self._wait_for(buf.last_use)
            out[:] = buf.mapped[offset:offset + out.size]
            return
        staging = self._create_buffer(out.size, self._host_type, host=True)
        region = self.ffi.new("VkBufferCopy*", {"srcOffset": offset, "dstOffset": 0, "size": out.size})
        self.lib.vkCmdCopyBuffer(self._record([buf, staging]), buf.handle, staging.handle, 1, region)
        try:
            self._wait_for(staging.last_use)
            out[:] = staging.mapped[:out.size]
        finally:
            self._destroy_buffer(staging)

    def _idle_for(self, buf: Buffer) -> bool:
        if buf.last_use > self._completed:
            self._retire()
        return buf.last_use <= self._completed

    # ---- batches -------------------------------------------------------------------------------
    def _record(self, uses, keep=()):
        """The open batch's command buffer, ready for one more command that uses the buffers
        `uses` (they stay alive until the batch completed, as the staging buffers `keep` do):
        a memory barrier first when an earlier command since the last one touched any of them."""
        if self.lost is not None:
            self.check_not_lost()
        batch = self._batch
        if batch is None or batch.commands >= BATCH_COMMANDS:
            self._flush()
            batch = self._open_batch()
        elif not batch.touched.isdisjoint(uses):
            self._barrier(batch.command, self._barrier_between)
            batch.touched.clear()
        serial = batch.serial
        for buf in uses:
            buf.last_use = serial
        batch.touched.update(uses)
        batch.touched.discard(self._args_ring)  # written by the host only: no device hazard
        batch.keep.extend(keep)
        batch.commands += 1
        return batch.command

    def _open_batch(self) -> "Batch":
        command, fence = self._command_buffer()
        self._check(self.lib.vkBeginCommandBuffer(command, self._begin_info), "vkBeginCommandBuffer")
        # Against everything submitted before (submission order alone orders no memory access).
        self._barrier(command, self._barrier_between)
        self._recording = next(self._serials)
        self._batch = Batch(command, fence, self._recording)
        return self._batch

    def _flush(self) -> None:
        """Submit the open batch: its writes made visible to the host at the end."""
        batch = self._batch
        if batch is None:
            return
        self._batch, self._recording = None, 0
        for kernel in batch.kernels:
            self._note_submitted(kernel)
        lib = self.lib
        self._barrier(batch.command, self._barrier_to_host, self.vk.VK_PIPELINE_STAGE_HOST_BIT)
        self._command_slot[0] = batch.command
        call, result = "vkEndCommandBuffer", lib.vkEndCommandBuffer(batch.command)
        if result == 0:
            call, result = "vkQueueSubmit", lib.vkQueueSubmit(self.queue, 1, self._submit_info, batch.fence[0])
        if result != 0:  # the batch is lost; what it used is idle again, the next batch starts afresh
            self._last_submitted = batch.serial
            self._recycle(Submission(batch.serial, batch.command, batch.fence, batch.keep), reset_fence=False)
            self._retire()
            self._check(result, f"submitting {batch.commands} recorded commands ({call})")
        self._track(batch.command, batch.fence, batch.keep, (), batch.serial)

    def _barrier(self, command, barrier, dst_stage=None) -> None:
        all_commands = self.vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        self.lib.vkCmdPipelineBarrier(command, all_commands, dst_stage or all_commands, 0, 1, barrier, 0,
                                      self.ffi.NULL, 0, self.ffi.NULL)

    def _submit_commands(self, record, keep: list, uses) -> int:
        """Record `record(command buffer)` into the open batch; its serial."""
        record(self._record(uses, keep))
        return self._recording

    def _command_buffer(self):
        if self._spare:
            return self._spare.pop()
        ffi, vk = self.ffi, self.vk
        info = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "commandPool": self._command_pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        command = ffi.new("VkCommandBuffer*")
        self._check(self.lib.vkAllocateCommandBuffers(self.device, info, command), "vkAllocateCommandBuffers")
        fence_info = ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        fence = ffi.new("VkFence[1]")
        self._check(self.lib.vkCreateFence(self.device, fence_info, ffi.NULL, fence), "vkCreateFence")
        return command[0], fence

    def _block_on(self, sub) -> None:
        if self._spin_seconds:
            # Locals only in the loop: each lookup less is a finer poll (~0.4 us an iteration).
            status, device, fence, clock = self.lib.vkGetFenceStatus, self.device, sub.fence[0], time.perf_counter
            deadline = clock() + self._spin_seconds
            while True:
                result = status(device, fence)
                if result == 0:
                    return
                if result == self.vk.VK_ERROR_DEVICE_LOST:
                    self._check(result, "vkGetFenceStatus")
                if clock() > deadline:
                    break
        self._check(self.lib.vkWaitForFences(self.device, 1, sub.fence, 1, U64_MAX), "vkWaitForFences")

    def _finished(self, sub) -> bool:
        status = self.lib.vkGetFenceStatus(self.device, sub.fence[0])
        if status == self.vk.VK_ERROR_DEVICE_LOST:
            self._check(status, "vkGetFenceStatus")
        return status == 0

    def _recycle(self, sub, reset_fence: bool = True) -> None:
        """Its command buffer and fence are reused (a replay's stay its own: no command buffer
        here); the staging buffers it kept are destroyed."""
        if reset_fence:
            self._check(self.lib.vkResetFences(self.device, 1, sub.fence), "vkResetFences")
        if sub.command is None:
            return
        self.lib.vkResetCommandBuffer(sub.command, 0)
        self._spare.append((sub.command, sub.fence))
        for buf in sub.keep:
            self._destroy_buffer(buf)

    # ---- kernels -------------------------------------------------------------------------------
    def load_kernel(self, artifacts: dict, meta) -> QueuedKernel:
        tasks = [pipelines.build_task_pipeline(self, artifacts, meta, i) for i in range(len(meta.tasks))]
        return QueuedKernel(meta, tasks, kernels.ArgsPlan(meta))

    def block_dim(self, launch: dict) -> int:
        return launch.get("block_dim") or self.capabilities.default_block_dim

    def grid_cap(self, block_dim: int) -> int:
        """The most workgroups a launch of `block_dim`-invocation workgroups gets: WAVES waves of
        what the device runs at once (where the driver says; else FALLBACK_RESIDENT). The
        shader's grid-stride loop covers larger ranges, so an adstack heap holds the invocations
        in flight, never one slice per iteration."""
        resident = self.capabilities.resident_invocations or FALLBACK_RESIDENT
        return min(max(resident // block_dim, 1) * WAVES, self.max_grid_groups)

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The invocations a launch dispatches for `iterations`: one per iteration up to the grid
        cap (None: the cap); 0 iterations dispatch nothing. Invocations past the count, up to the
        end of the last workgroup, leave at once."""
        if launch["policy"] != "grid":
            raise ValueError(f"the vulkan device cannot launch a task with launch policy {launch['policy']!r}")
        block = self.block_dim(launch)
        cap = self.grid_cap(block) * block
        if iterations is None:
            return cap
        return min(max(iterations, 0), cap)

    def max_binding_bytes(self) -> int:
        return self.capabilities.max_storage_buffer_range

    def launch_task(self, loaded: QueuedKernel, task: int, ctx_address: int, slices: int) -> None:
        if slices <= 0:
            return
        tp, ctx = loaded.tasks[task], loaded.ctx_words(ctx_address)
        if self._batch is None and not self._in_flight and len(loaded.tasks) == 1:
            if self.lost is not None:
                self.check_not_lost()
            if self._replays.launch(loaded, tp, ctx, slices):
                return
        pipelines.record_dispatch(self, loaded, tp, ctx, slices)
        kernels, name = self._batch.kernels, loaded.meta.name
        if not kernels or kernels[-1] != name:
            kernels.append(name)
        if not self._in_flight and task == len(loaded.tasks) - 1:
            # The device is idle: start the kernel now rather than at the sync, so the host's
            # way to the sync overlaps the GPU's. Launches that follow while it runs are batched.
            self._flush()

    def submit_replay(self, replay, kernel: str) -> None:
        """Submit a recorded launch (replays.py) on the idle device."""
        serial = next(self._serials)
        self._note_submitted(kernel)
        result = self.lib.vkQueueSubmit(self.queue, 1, replay.submit_info, replay.fence_handle)
        if result != 0:  # nothing was submitted: what it would use is idle again
            self._last_submitted = serial
            self._retire()
            self._check(result, f"submitting kernel '{kernel}' (vkQueueSubmit)")
        # Its Submission is reused: a replay is in flight at most once (only an idle device replays).
        replay.submission.serial = serial
        self._track_submission(replay.submission, replay.uses)

    def args_space(self, nbytes: int) -> int:
        """A byte offset in the args ring for one launch's args; wraps once nothing uses it."""
        size = -(-nbytes // self._args_align) * self._args_align
        if self._args_offset + size > ARGS_RING_RECORDED:
            self._wait_for(self._args_ring.last_use)  # everything still reading the ring
            self._args_offset = 0
            self._args_wraps += 1
        offset = self._args_offset
        self._args_offset += size
        return offset

    def close(self) -> None:
        """Wait for the queue and release every Vulkan object of this device; the device itself
        is destroyed even when releasing its children fails half-way (a driver caps how many
        devices a process may hold). Safe to call again, and on a half-built device, and on a
        lost one (Vulkan promises that waiting for a lost device returns)."""
        device = self.device
        if device is None:
            return
        try:
            self.lib.vkDeviceWaitIdle(device)
            self._destroy_children()
        finally:
            self.device = None
            driver.destroy_device(self.vk, device)

    def _destroy_children(self) -> None:
        """Destroy what was made on the (idle) device, as far as __init__ got."""
        ffi, lib = self.ffi, self.lib
        in_flight = getattr(self, "_in_flight", ())
        batch = getattr(self, "_batch", None)
        if batch is not None:  # recorded, never submitted: nothing could observe what it would write
            in_flight.append(Submission(batch.serial, batch.command, batch.fence, batch.keep))
            self._batch = None
        while in_flight:  # the device is idle: every submission has finished
            sub = in_flight.popleft()
            if sub.command is not None:  # a replay's pair comes back with the replays below
                self._spare.append((sub.command, sub.fence))
            for buf in sub.keep:
                self._destroy_buffer(buf)
        if getattr(self, "_replays", None) is not None:
            self._spare.extend(self._replays.release())
        # Every serial has completed: the frees below destroy at once.
        self._completed = self._last_submitted = max(getattr(self, "_last_submitted", 0),
                                                     getattr(self, "_recording", 0))
        self._recording = 0
        self._pending_frees = []
        for buf in getattr(self, "_pending_destroys", ()):
            self._destroy_buffer(buf)
        self._pending_destroys = []
        addresses = getattr(self, "_addresses", None)
        for alloc in addresses.allocations() if addresses is not None else ():
            self.free(alloc)
        if getattr(self, "_args_ring", None) is not None:
            self._destroy_buffer(self._args_ring)
            self._args_ring = None
        pipelines.destroy_pipelines(self)
        for _command, fence in getattr(self, "_spare", ()):  # command buffers go with their pool
            lib.vkDestroyFence(self.device, fence[0], ffi.NULL)
        self._spare = []
        if getattr(self, "_descriptor_pool", None) is not None:
            lib.vkDestroyDescriptorPool(self.device, self._descriptor_pool, ffi.NULL)
            self._descriptor_pool = None
        if getattr(self, "_command_pool", None) is not None:
            lib.vkDestroyCommandPool(self.device, self._command_pool, ffi.NULL)
            self._command_pool = None


def _repeated_word(pattern: bytes) -> bytes | None:
    """The 4 bytes whose repetition is `pattern` repeated (a pattern of period 1, 2 or 4
    bytes), or None."""
    period = pattern_period(pattern)
    return pattern[:period] * (4 // period) if period in (1, 2, 4) else None


def _first(types: list, want, what):
    for i, (flags, _) in enumerate(types):
        if want(flags):
            return i
    if what is None:
        return None
    raise driver.VulkanUnavailableError(f"vulkan: the device has no {what} memory type")

