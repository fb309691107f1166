"""Vulkan device (runtime/device.py's asynchronous protocol) on the `vulkan` pip binding.

Memory. Every allocation is a VkBuffer with memory of its own, of the device-local type where
the device has one. Its `ptr` is an address in a virtual address space of this device's own
(from 2^48 up, never 0, never a host address): the launcher writes such addresses into ctx
words as it would device pointers, and a launch maps each binding's word back to (buffer,
offset). Memory that is also host-visible (lavapipe's only type; resizable BAR) is mapped
once and copied with memcpy whenever no submitted work may still use the buffer; otherwise
copies go through host-visible staging buffers and vkCmdCopyBuffer on the queue, so they stay
ordered with the launches around them.

Submissions. Each launch or queued copy is one command buffer, submitted with a fence of its
own and a serial number; a command buffer starts with a memory barrier against everything
submitted before it (submission order alone orders nothing in Vulkan) and ends with one
making its writes visible to the host. Finished submissions are retired oldest first: their
command buffer and fence are reused, the staging buffers and args ring space they held are
released, and `free_after_fence` frees what waited for them.

Launches. `launch_task` writes the "args" words into a host-visible ring (dynamic offset),
binds a descriptor set (cached per task and bound buffers), and dispatches ceil(slices /
block_dim) workgroups, 2-D beyond maxComputeWorkGroupCount[0]; `sync` waits for the fences and
reads each launch's error slot (runtime/device.py), raising the first error naming its kernel.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...device import Allocation, check_copy_range
from ...submission_device import QueuedKernel, SubmissionDevice
from . import driver, kernels

ARGS_RING_BYTES = 1 << 20
DESCRIPTOR_POOL_SETS = 1024
WAVES = 4                  # grid cap: this many waves of the invocations the device runs at once
FALLBACK_RESIDENT = 1 << 16  # invocations assumed to run at once where the driver does not say
U64_MAX = (1 << 64) - 1


class Buffer:
    """A VkBuffer and its memory; `mapped` a numpy byte view of it when host-visible;
    `last_use` the serial of the last submission that may use it; `serial` unique per buffer."""
    __slots__ = ("handle", "memory", "size", "mapped", "last_use", "serial", "address")

    def __init__(self, handle, memory, size, mapped, serial, address=0):
        self.handle, self.memory, self.size, self.mapped = handle, memory, size, mapped
        self.last_use, self.serial, self.address = 0, serial, address


class TaskPipeline:
    """A task's pipeline and how a launch binds it."""
    __slots__ = ("name", "pipeline", "layout", "set_layouts", "bindings", "block_dim", "serial", "sets",
                 "set_numbers", "dynamic")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


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
        self._args_align = max(16, self.capabilities.min_storage_buffer_offset_alignment)
        self._barrier_in = self._memory_barrier(self.vk.VK_ACCESS_MEMORY_WRITE_BIT,
                                                self.vk.VK_ACCESS_MEMORY_READ_BIT | self.vk.VK_ACCESS_MEMORY_WRITE_BIT)
        self._barrier_out = self._memory_barrier(self.vk.VK_ACCESS_MEMORY_WRITE_BIT, self.vk.VK_ACCESS_HOST_READ_BIT)
        self._begin_info = self.ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
        self._submit_info = self.ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                           "commandBufferCount": 1})
        self._command_slot = self.ffi.new("VkCommandBuffer[1]")
        self._submit_info.pCommandBuffers = self._command_slot
        self.max_grid_groups = min(65535, self.capabilities.max_workgroup_count[0])

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
        out = self.ffi.new("VkCommandPool*")
        self._check(self.lib.vkCreateCommandPool(self.device, info, self.ffi.NULL, out), "vkCreateCommandPool")
        return out[0]

    def _create_descriptor_pool(self):
        vk = self.vk
        sizes = self.ffi.new("VkDescriptorPoolSize[2]", [
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "descriptorCount": 8 * DESCRIPTOR_POOL_SETS},
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC, "descriptorCount": 2 * DESCRIPTOR_POOL_SETS}])
        info = self.ffi.new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, "maxSets": DESCRIPTOR_POOL_SETS,
            "poolSizeCount": 2, "pPoolSizes": sizes})
        out = self.ffi.new("VkDescriptorPool*")
        self._check(self.lib.vkCreateDescriptorPool(self.device, info, self.ffi.NULL, out), "vkCreateDescriptorPool")
        return out[0]

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            if result in (self.vk.VK_ERROR_OUT_OF_DEVICE_MEMORY, self.vk.VK_ERROR_OUT_OF_HOST_MEMORY):
                raise MemoryError(f"vulkan: {what}: out of memory (VkResult {result})")
            if result == self.vk.VK_ERROR_DEVICE_LOST:
                raise RuntimeError(f"vulkan: {what}: the device was lost (a kernel crashed or ran too long)")
            raise RuntimeError(f"vulkan: {what} failed (VkResult {result})")

    # ---- memory --------------------------------------------------------------------------------
    def _create_buffer(self, nbytes: int, memory_type: int, host: bool = False) -> Buffer:
        vk, ffi, lib = self.vk, self.ffi, self.lib
        size = max(-(-nbytes // 4) * 4, 4)
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": size,
            "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        handle = ffi.new("VkBuffer*")
        self._check(lib.vkCreateBuffer(self.device, info, ffi.NULL, handle), f"creating a buffer of {nbytes} bytes")
        needs = ffi.new("VkMemoryRequirements*")
        lib.vkGetBufferMemoryRequirements(self.device, handle[0], needs)
        if not needs.memoryTypeBits & (1 << memory_type):
            memory_type = next(i for i in range(32) if needs.memoryTypeBits & (1 << i))
        alloc_info = ffi.new("VkMemoryAllocateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                                       "allocationSize": needs.size, "memoryTypeIndex": memory_type})
        memory = ffi.new("VkDeviceMemory*")
        result = lib.vkAllocateMemory(self.device, alloc_info, ffi.NULL, memory)
        if result != 0:
            lib.vkDestroyBuffer(self.device, handle[0], ffi.NULL)
            self._check(result, f"allocating {nbytes} bytes of device memory")
        self._check(lib.vkBindBufferMemory(self.device, handle[0], memory[0], 0), "vkBindBufferMemory")
        mapped = None
        flags = self._memory_flags[memory_type]
        coherent = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        if host or flags & coherent == coherent:
            pointer = ffi.new("void**")
            self._check(lib.vkMapMemory(self.device, memory[0], 0, size, 0, pointer), "vkMapMemory")
            mapped = np.frombuffer(ffi.buffer(pointer[0], size), np.uint8)
        return Buffer(handle[0], memory[0], size, mapped, next(self._buffers))

    def _destroy_buffer(self, buf: Buffer) -> None:
        if buf.mapped is not None:
            buf.mapped = None
            self.lib.vkUnmapMemory(self.device, buf.memory)
        self.lib.vkDestroyBuffer(self.device, buf.handle, self.ffi.NULL)
        self.lib.vkFreeMemory(self.device, buf.memory, self.ffi.NULL)

    def _new_zeroed_buffer(self, nbytes: int) -> Buffer:
        buf = self._create_buffer(nbytes, self._device_type)
        if buf.mapped is not None:
            buf.mapped[:] = 0  # new memory: no submitted work can use it yet
        else:
            self._submit_commands(lambda cb: self.lib.vkCmdFillBuffer(cb, buf.handle, 0, buf.size, 0), [], [buf])
        return buf

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)  # 1-d first: a 0-d array has no byte view
        buf = check_copy_range(alloc, offset, data.size)
        if data.size == 0:
            return
        if buf.mapped is not None and self._idle_for(buf):
            buf.mapped[offset:offset + data.size] = data
            return
        staging = self._create_buffer(data.size, self._host_type, host=True)
        staging.mapped[:data.size] = data
        region = self.ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": offset, "size": data.size})
        self._submit_commands(lambda cb: self.lib.vkCmdCopyBuffer(cb, staging.handle, buf.handle, 1, region),
                              [staging], [buf])

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        out = dst.reshape(-1).view(np.uint8)  # a view of `dst` (contiguous), 1-d first as above
        buf = check_copy_range(alloc, offset, out.size)
        if out.size == 0:
            return
        self._wait_for(buf.last_use)
        if buf.mapped is not None:
            out[:] = buf.mapped[offset:offset + out.size]
            return
        staging = self._create_buffer(out.size, self._host_type, host=True)
        region = self.ffi.new("VkBufferCopy*", {"srcOffset": offset, "dstOffset": 0, "size": out.size})
        serial = self._submit_commands(lambda cb: self.lib.vkCmdCopyBuffer(cb, buf.handle, staging.handle, 1, region),
                                       [], [buf])
        self._wait_for(serial)
        out[:] = staging.mapped[:out.size]
        self._destroy_buffer(staging)

    def _idle_for(self, buf: Buffer) -> bool:
        if buf.last_use > self._completed:
            self._retire()
        return buf.last_use <= self._completed


    # ---- submissions ---------------------------------------------------------------------------
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

    def _begin(self):
        command, fence = self._command_buffer()
        lib, vk = self.lib, self.vk
        self._check(lib.vkBeginCommandBuffer(command, self._begin_info), "vkBeginCommandBuffer")
        all_commands = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        lib.vkCmdPipelineBarrier(command, all_commands, all_commands, 0, 1, self._barrier_in, 0, self.ffi.NULL,
                                 0, self.ffi.NULL)
        return command, fence

    def _submit(self, command, fence, keep: list, uses) -> int:
        lib, vk = self.lib, self.vk
        lib.vkCmdPipelineBarrier(command, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                 self._barrier_out, 0, self.ffi.NULL, 0, self.ffi.NULL)
        self._check(lib.vkEndCommandBuffer(command), "vkEndCommandBuffer")
        self._command_slot[0] = command
        self._check(lib.vkQueueSubmit(self.queue, 1, self._submit_info, fence[0]), "vkQueueSubmit")
        return self._track(command, fence, keep, uses)

    def _submit_commands(self, record, keep: list, uses) -> int:
        command, fence = self._begin()
        record(command)
        return self._submit(command, fence, keep, uses)

    def _block_on(self, sub) -> None:
        self._check(self.lib.vkWaitForFences(self.device, 1, sub.fence, 1, U64_MAX), "vkWaitForFences")

    def _finished(self, sub) -> bool:
        return self.lib.vkGetFenceStatus(self.device, sub.fence[0]) == 0

    def _recycle(self, sub) -> None:
        """Its command buffer and fence are reused; the staging buffers it kept are destroyed."""
        self._check(self.lib.vkResetFences(self.device, 1, sub.fence), "vkResetFences")
        self.lib.vkResetCommandBuffer(sub.command, 0)
        self._spare.append((sub.command, sub.fence))
        for buf in sub.keep:
            self._destroy_buffer(buf)

    # ---- kernels -------------------------------------------------------------------------------
    def load_kernel(self, artifacts: dict, meta) -> QueuedKernel:
        from .pipelines import build_task_pipeline
        tasks = [build_task_pipeline(self, artifacts, meta, i) for i in range(len(meta.tasks))]
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

    def heap_range_limit(self) -> int:
        """The most bytes one binding of an adstack heap may span (maxStorageBufferRange)."""
        return self.capabilities.max_storage_buffer_range

    def launch_task(self, loaded: QueuedKernel, task: int, ctx_address: int, slices: int) -> None:
        from .pipelines import record_dispatch
        if slices <= 0:
            return
        record_dispatch(self, loaded, loaded.tasks[task], loaded.ctx_words(ctx_address), slices)

    def args_space(self, nbytes: int) -> int:
        """A byte offset in the args ring for one launch's args; wraps once nothing uses it."""
        size = -(-nbytes // self._args_align) * self._args_align
        if self._args_offset + size > ARGS_RING_BYTES:
            self._wait_for(self._args_ring.last_use)  # everything still reading the ring
            self._args_offset = 0
        offset = self._args_offset
        self._args_offset += size
        return offset

    def close(self) -> None:
        """Wait for the queue and release every Vulkan object of this device; the device itself
        is destroyed even when releasing its children fails half-way (a driver caps how many
        devices a process may hold). Safe to call again, and on a half-built device."""
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
        while in_flight:  # the device is idle: every submission has finished
            sub = in_flight.popleft()
            self._spare.append((sub.command, sub.fence))
            for buf in sub.keep:
                self._destroy_buffer(buf)
        self._pending_frees = []
        addresses = getattr(self, "_addresses", None)
        for alloc in addresses.allocations() if addresses is not None else ():
            self.free(alloc)
        if getattr(self, "_args_ring", None) is not None:
            self._destroy_buffer(self._args_ring)
            self._args_ring = None
        from .pipelines import destroy_pipelines
        destroy_pipelines(self)
        for _command, fence in getattr(self, "_spare", ()):  # command buffers go with their pool
            lib.vkDestroyFence(self.device, fence[0], ffi.NULL)
        self._spare = []
        if getattr(self, "_descriptor_pool", None) is not None:
            lib.vkDestroyDescriptorPool(self.device, self._descriptor_pool, ffi.NULL)
            self._descriptor_pool = None
        if getattr(self, "_command_pool", None) is not None:
            lib.vkDestroyCommandPool(self.device, self._command_pool, ffi.NULL)
            self._command_pool = None


def _first(types: list, want, what):
    for i, (flags, _) in enumerate(types):
        if want(flags):
            return i
    if what is None:
        return None
    raise driver.VulkanUnavailableError(f"vulkan: the device has no {what} memory type")

