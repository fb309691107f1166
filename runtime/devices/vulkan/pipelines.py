"""Pipelines (one per task, built at load; on a CPU device one per workgroup size a task is
launched at, each made at its first launch) and the recording of one launch (kernels.py has the
ABI's pure parts: capabilities, args words, the grid)."""
from __future__ import annotations

import numpy as np

from ...contract.entry_points import spirv_entry_points
from ...contract.error_slot import ERROR_SLOT_WORDS
from ...contract.spirv_args import GRID_BLOCK_SPEC_ID, GRID_CAP_SPEC_ID, SERIAL_CHUNK_SPEC_ID
from ..spirv_abi import HEAP_WORDS, adstack_meta_words
from . import kernels
from .kernels import UnsupportedKernelError

# "adstack_meta" is written per launch into the args ring (a dynamic storage buffer, like
# "args"), from the ctx words (spirv_abi.py); so is "addresses", the buffer device addresses
# of the arrays a task reaches by address (its launch record's "addressed").
LAUNCH_WRITTEN = ("args", "adstack_meta", "addresses")
# Iterations one dispatch of a serial range-for runs on a device that stops long-running
# invocations (capabilities.loop_iteration_limit): a sixteenth of lavapipe's limit, which leaves
# room for inner loops of up to 15 iterations on average.
SERIAL_CHUNK_SHARE = 16
DISPATCH_BASE = 0x10  # VK_PIPELINE_CREATE_DISPATCH_BASE_BIT (Vulkan 1.1), which the binding lacks


class TaskPipeline:
    """A task's pipeline and how a launch binds it."""
    __slots__ = ("name", "pipeline", "layout", "set_layouts", "bindings", "addressed", "block_dim", "serial", "chunk",
                 "sets", "set_numbers", "dynamic", "dynamic_count", "uses", "plan", "narrow_block", "narrow",
                 "source", "grid_temp", "grid_pipeline", "grid_at")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class BindingPlan:
    """One binding of a task: where its buffer comes from at launch."""
    __slots__ = ("set", "binding", "resource", "index", "word", "adjust", "dynamic")

    def __init__(self, meta, b):
        self.set, self.binding, self.resource, self.index = b
        self.dynamic = self.resource in kernels.DYNAMIC_RESOURCES or self.resource == "adstack_meta"
        if self.resource in HEAP_WORDS and meta.adstack_slot is not None:
            found = meta.adstack_slot + HEAP_WORDS[self.resource], 0
        else:
            found = kernels.resolve_binding_word(meta, self.resource, self.index)
        self.word, self.adjust = found if found is not None else (None, 0)

    def what(self, meta) -> str:
        if self.resource == "field":
            return f"field '{meta.fields[self.index].name}'"
        if self.resource in ("ndarray", "ndarray_grad"):
            grad = ".grad" if self.resource == "ndarray_grad" else ""
            return f"ndarray argument '{meta.params[self.index].name}{grad}'"
        return self.resource


def build_task_pipeline(dev, artifacts: dict, meta, i: int):
    task = meta.tasks[i]
    what = f"kernel '{meta.name}' (task {i}, {task.name})"
    blob = artifacts.get(f"spirv_t{i}")
    if not isinstance(blob, (bytes, bytearray)):
        raise UnsupportedKernelError(f"{what}: its cache entry has no SPIR-V for this task (artifact 'spirv_t{i}'); "
                                     f"build the kernel for arch=vulkan")
    words = kernels.spirv_words(bytes(blob), what)
    kernels.check_capabilities(words, dev.capabilities, what)
    if task.launch.get("policy") != "grid":
        raise UnsupportedKernelError(f"{what}: launch policy {task.launch.get('policy')!r} is not a GPU grid")
    block = dev.block_dim(task.launch)
    caps = dev.capabilities
    compiled_for = task.launch.get("subgroup_size")
    if compiled_for is not None and compiled_for != caps.subgroup_size:
        raise UnsupportedKernelError(f"{what}: its block-level code (qd.simt) was built for subgroups of "
                                     f"{compiled_for} lanes, the Vulkan device '{caps.name}' has {caps.subgroup_size}: "
                                     f"build it with vulkan_subgroup_size={caps.subgroup_size}")
    if block > min(caps.max_workgroup_size[0], caps.max_workgroup_invocations):
        raise UnsupportedKernelError(f"{what}: block_dim {block} exceeds the device's workgroup size limit "
                                     f"{min(caps.max_workgroup_size[0], caps.max_workgroup_invocations)}")
    plans = sorted((BindingPlan(meta, b) for b in task.bindings), key=lambda p: (p.set, p.binding))
    if len(plans) > caps.max_bound_storage_buffers:
        raise UnsupportedKernelError(f"{what}: binds {len(plans)} storage buffers, more than the Vulkan device "
                                     f"'{caps.name}' binds to one shader ({caps.max_bound_storage_buffers})")
    addressed = [BindingPlan(meta, (None, None, resource, index))
                 for resource, index in task.launch.get("addressed", ())]
    for p in plans:
        if (p.resource in HEAP_WORDS or p.resource == "adstack_meta") and meta.adstack_slot is None:
            raise UnsupportedKernelError(f"{what}: binds '{p.resource}' but its metadata lists no adstacks")
    set_layouts = [_set_layout(dev, [p for p in plans if p.set == s]) for s in range(max((p.set for p in plans),
                                                                                           default=-1) + 1)]
    layout = _pipeline_layout(dev, set_layouts)
    serial = task.kind == "serial" or bool(task.serial)
    # A serial range-for runs in chunks where the device stops long invocations; not one with
    # adstacks, whose heap holds the one invocation's slice.
    chunk = (caps.loop_iteration_limit // SERIAL_CHUNK_SHARE if caps.loop_iteration_limit and task.kind == "range_for"
             and serial and not any(p.resource in HEAP_WORDS for p in plans) else 0)
    if task.entry not in spirv_entry_points(bytes(blob)):  # a pName the module lacks is undefined behaviour
        raise UnsupportedKernelError(f"{what}: its SPIR-V has no entry point '{task.entry}' (found "
                                     f"{sorted(spirv_entry_points(bytes(blob)))}): rebuild the kernel")
    ffi = dev.ffi
    grid_temp = task.launch.get("grid_temp")
    narrow = 0 if grid_temp is not None else narrow_block(caps, task.launch, block)
    # Where a task has two workgroup sizes (a CPU device), each pipeline is made at the first launch
    # that uses it: lavapipe compiles a pipeline to machine code when it is made, and most tasks of
    # a program like Genesis are only ever launched below a workgroup (or only above it).
    pipeline = None if narrow else _pipeline(dev, bytes(blob), task.entry, layout, block, what, chunk)
    tp = TaskPipeline(name=what, pipeline=pipeline, layout=layout, set_layouts=set_layouts, bindings=plans,
                      addressed=addressed, narrow_block=narrow, narrow=None,
                      source=(bytes(blob), task.entry) if narrow or grid_temp is not None else None,
                      grid_temp=grid_temp, grid_pipeline=None, grid_at=None,
                      block_dim=block, serial=serial, chunk=chunk,
                      sets=ffi.new("VkDescriptorSet[]", max(len(set_layouts), 1)),
                      set_numbers=len(set_layouts),
                      dynamic=ffi.new("uint32_t[]", max(sum(p.dynamic for p in plans), 1)),
                      dynamic_count=sum(p.dynamic for p in plans), uses=[], plan=None)
    dev.__dict__.setdefault("_pipeline_objects", []).append(tp)
    return tp


def narrow_block(caps, launch: dict, block: int) -> int:
    """The workgroup size of a task's launches of fewer invocations than its workgroup, or 0 (the
    task's own size always). A CPU device (lavapipe) runs every group of SIMD-width invocations
    of a workgroup through the whole shader, its masked-off branches and loop bodies included,
    whether or not any invocation of the group is in the range: a one-invocation launch of a
    large Genesis task took 4.5-5 ms at 256 invocations a workgroup, 0.45 ms at 8. There a launch
    of fewer invocations than the workgroup size uses workgroups of one subgroup, through a
    pipeline of that size made at its first such launch (and the task's own pipeline at its first
    larger launch). Not where the kernel chose its
    block_dim or uses block-level code (their workgroup is part of their meaning)."""
    if (not caps.cpu_device or launch.get("block_dim") or "subgroup_size" in launch
            or not 1 <= caps.subgroup_size < block):
        return 0
    return caps.subgroup_size


def _made(dev, tp, slot: str, block: int, chunk: int = 0, grid: tuple = (0, 1)):
    """Task `tp`'s pipeline in `slot` ("pipeline": its own workgroup size, of a task that also has
    a narrow one; "narrow"; "grid_pipeline": one invocation computing the task's grid,
    spirv_args.py GRID_BLOCK_SPEC_ID), made from its module at the first launch that needs it."""
    pipeline = getattr(tp, slot)
    if pipeline is None:
        blob, entry = tp.source
        pipeline = _pipeline(dev, blob, entry, tp.layout, block, tp.name, chunk, grid)
        setattr(tp, slot, pipeline)
    return pipeline


def _set_layout(dev, plans: list):
    vk, ffi = dev.vk, dev.ffi
    entries = ffi.new("VkDescriptorSetLayoutBinding[]", max(len(plans), 1))
    for j, p in enumerate(plans):
        entries[j].binding = p.binding
        entries[j].descriptorType = (vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC if p.dynamic
                                     else vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER)
        entries[j].descriptorCount = 1
        entries[j].stageFlags = vk.VK_SHADER_STAGE_COMPUTE_BIT
    info = ffi.new("VkDescriptorSetLayoutCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, "bindingCount": len(plans),
        "pBindings": entries})
    return dev.create("DescriptorSetLayout", info)


def _pipeline_layout(dev, set_layouts: list):
    vk, ffi = dev.vk, dev.ffi
    layouts = ffi.new("VkDescriptorSetLayout[]", set_layouts or [ffi.NULL])
    info = ffi.new("VkPipelineLayoutCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, "setLayoutCount": len(set_layouts),
        "pSetLayouts": layouts})
    return dev.create("PipelineLayout", info)


def _pipeline(dev, blob: bytes, entry_point: str, layout, block: int, what: str, chunk: int = 0,
              grid: tuple = (0, 1)):
    """A compute pipeline of SPIR-V `blob`'s entry point `entry_point` (the task record's entry,
    which loading checked the module defines), its WorkgroupSize x specialised to `block`, a
    serial range-for's chunk to `chunk` (0: the whole range in one dispatch), and `grid` (the
    workgroup size and cap of the grid it computes; (0, _): it runs the task)."""
    vk, ffi, lib = dev.vk, dev.ffi, dev.lib
    code = ffi.from_buffer(blob)
    module_info = ffi.new("VkShaderModuleCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, "codeSize": len(blob),
        "pCode": ffi.cast("uint32_t*", code)})
    module = dev.create("ShaderModule", module_info, f"{what}: vkCreateShaderModule")
    entry = ffi.new("char[]", entry_point.encode())
    spec_ids = (0, SERIAL_CHUNK_SPEC_ID, GRID_BLOCK_SPEC_ID, GRID_CAP_SPEC_ID)
    spec_entries = ffi.new("VkSpecializationMapEntry[]", [{"constantID": c, "offset": 4 * k, "size": 4}
                                                          for k, c in enumerate(spec_ids)])
    spec_data = ffi.new("uint32_t[]", [block, chunk, *grid])
    spec = ffi.new("VkSpecializationInfo*", {"mapEntryCount": len(spec_ids), "pMapEntries": spec_entries,
                                             "dataSize": 4 * len(spec_ids), "pData": spec_data})
    info = ffi.new("VkComputePipelineCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, "layout": layout,
        "flags": DISPATCH_BASE if chunk else 0,
        "stage": {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": module, "pName": entry,
                  "pSpecializationInfo": spec}})
    out = ffi.new("VkPipeline*")
    try:
        dev._check(lib.vkCreateComputePipelines(dev.device, ffi.NULL, 1, info, ffi.NULL, out),
                   f"{what}: vkCreateComputePipelines")
    finally:
        lib.vkDestroyShaderModule(dev.device, module, ffi.NULL)
    return out[0]


def destroy_pipelines(dev) -> None:
    ffi, lib = dev.ffi, dev.lib
    for tp in dev.__dict__.pop("_pipeline_objects", []):
        for pipeline in (tp.pipeline, tp.narrow, tp.grid_pipeline):
            if pipeline is not None:
                lib.vkDestroyPipeline(dev.device, pipeline, ffi.NULL)
        lib.vkDestroyPipelineLayout(dev.device, tp.layout, ffi.NULL)
        for layout in tp.set_layouts:
            lib.vkDestroyDescriptorSetLayout(dev.device, layout, ffi.NULL)


# ---- one launch ------------------------------------------------------------------------------

def record_dispatch(dev, loaded, tp, ctx, slices: int) -> None:
    """Record one launch of task `tp` with the ctx words `ctx`: the bound buffers resolved from
    the ctx (or taken from the task's LaunchPlan when the words it was made from are unchanged),
    this launch's args in the ring, the dispatch."""
    plan = tp.plan
    if plan is None or plan.epoch != dev.bindings_epoch or not _record_planned(dev, loaded, tp, plan, ctx):
        _record_resolved(dev, loaded, tp, ctx)
    record_task(dev, dev._record(tp.uses), tp, tp.dynamic, slices)


def record_task(dev, command, tp, dynamic, slices: int) -> None:
    """Record task `tp` into `command`: its pipeline, its descriptor sets (as tp.sets holds them)
    with the dynamic offsets `dynamic`, and the dispatch of `slices` invocations (through the
    task's narrow pipeline where it has one and they fill less than a workgroup), or, for a task
    computing its grid, that computation and the indirect dispatch of the grid it wrote."""
    pipeline, block = tp.pipeline, tp.block_dim
    if slices < block and tp.narrow_block:
        pipeline, block = _made(dev, tp, "narrow", tp.narrow_block, tp.chunk), tp.narrow_block
    elif pipeline is None:
        pipeline = _made(dev, tp, "pipeline", block, tp.chunk)
    groups = 1 if tp.serial else -(-slices // block)
    x, y = kernels.dispatch_grid(groups, dev.capabilities.max_workgroup_count)
    lib, vk = dev.lib, dev.vk
    grid = tp.grid_temp is not None  # the task's grid computed on the device first (spirv_args.py)
    first = _made(dev, tp, "grid_pipeline", 1, grid=(tp.block_dim, dev.grid_cap(tp.block_dim))) if grid else pipeline
    lib.vkCmdBindPipeline(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, first)
    if tp.set_numbers:  # they stay bound across pipelines of the task's layout
        lib.vkCmdBindDescriptorSets(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, tp.layout, 0, tp.set_numbers,
                                    tp.sets, tp.dynamic_count, dynamic)
    if grid:
        lib.vkCmdDispatch(command, 1, 1, 1)
        dev._barrier(command, dev._barrier_between)  # its words reach the indirect dispatch
        lib.vkCmdBindPipeline(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
        buf, offset = tp.grid_at
        lib.vkCmdDispatchIndirect(command, buf.handle, offset)
        return
    if not tp.chunk:
        lib.vkCmdDispatch(command, x, y, 1)
        return
    # A serial range-for in chunks (lowering.py, serial_chunk): workgroup (k, last) runs chunk k,
    # each after the previous one's writes; the last runs to the end of the range, which `slices`
    # (capped at the grid cap) may not reach.
    chunks = max(-(-slices // tp.chunk), 1)
    for k in range(chunks):
        if k:
            dev._barrier(command, dev._barrier_between)
        lib.vkCmdDispatchBase(command, k, int(k == chunks - 1), 0, 1, 1, 1)


class LaunchPlan:
    """What a task's last fully resolved launch bound, reusable while the ctx words naming its
    buffers (`key_of(words)`) are the same and no buffer was freed nor descriptor set dropped
    since (`epoch`): the per-launch work is then the args in the ring and the dynamic offsets.
    `dynamic` holds per dynamic binding (its plan, the base and end address of the allocation
    it points into; None and None for the ring; None and the offset for a constant slot);
    `addresses` the "addresses" words of a task reaching arrays by address (else None)."""
    __slots__ = ("epoch", "key_of", "key", "dynamic", "addresses", "addresses_at")

    def __init__(self, epoch, key_of, key, dynamic, addresses=None):
        self.epoch, self.key_of, self.key, self.dynamic = epoch, key_of, key, dynamic
        self.addresses = addresses
        self.addresses_at = None  # (ring round, offset) where `addresses` were last written


def _record_planned(dev, loaded, tp, plan, ctx) -> bool:
    """Write this launch's ring words and dynamic offsets by `plan`; False (nothing written) when
    the plan does not hold for these ctx words."""
    offsets = planned_offsets(plan, ctx)
    if offsets is None:
        return False
    for j, (p, base, end) in enumerate(plan.dynamic):
        if base is None and end is None:  # the ring (a planned task binds no adstack words)
            if p.resource == "addresses":
                offsets[j] = _planned_addresses(dev, plan)
            else:
                offsets[j] = _ring_args(dev, loaded.args, loaded.args.pack(ctx))
        tp.dynamic[j] = offsets[j]
    return True


def planned_offsets(plan, ctx):
    """The dynamic offsets of a launch with the ctx words `ctx` by `plan` (None at the args
    ring's, which the launch writes), or None when the plan does not hold for them."""
    if plan.key_of(ctx) != plan.key:
        return None
    offsets = []
    for p, base, end in plan.dynamic:
        if base is None:
            offsets.append(end)
            continue
        address = int(ctx[p.word]) + p.adjust
        if not base <= address < end:  # an error slot of another block
            return None
        offsets.append(address - base)
    return offsets


def _ring_args(dev, owner, words) -> int:
    """The args-ring offset of a launch's `words` for `owner` (a kernel's ArgsPlan): where its
    previous launch wrote the same words, while the ring has not started over since, else
    written anew. A kernel's tasks share its args, and Genesis's launches repeat theirs step after
    step: the ring then wraps (which waits for the device) far less often."""
    data = words.tobytes()
    last = dev._ring_words.get(owner)
    if last is not None and last[0] == dev._args_wraps and last[2] == data:
        return last[1]
    offset = _write_ring(dev, words)
    dev._ring_words[owner] = (dev._args_wraps, offset, data)
    return offset


def _planned_addresses(dev, plan) -> int:
    """The ring offset of a LaunchPlan's "addresses" words, written once per ring round."""
    if plan.addresses_at is None or plan.addresses_at[0] != dev._args_wraps:
        plan.addresses_at = (dev._args_wraps, _write_ring(dev, plan.addresses))
    return plan.addresses_at[1]


def _write_ring(dev, words) -> int:
    """This launch's "args" or "adstack_meta" words into the args ring; their offset there."""
    offset = dev.args_space(words.nbytes)
    dev._args_ring.mapped[offset:offset + words.nbytes] = words.view(dev._args_ring.mapped.dtype)
    return offset


def _record_resolved(dev, loaded, tp, ctx) -> None:
    """Resolve every binding from the ctx words (checking each), point tp.sets, tp.uses and
    tp.dynamic at them, and leave a LaunchPlan for the next launches when the task binds no
    adstack heap or words (the heaps' bound range depends on the launch's sizing)."""
    meta = loaded.meta
    adstack_words = (adstack_meta_words(meta, ctx, tp.name)  # once: the ring and each heap's range read them
                     if any(p.resource in HEAP_WORDS or p.resource == "adstack_meta" for p in tp.bindings) else None)
    buffers, uses, dynamic, ring = [], [], [], []
    written = {"args": None, "adstack_meta": adstack_words,
               "addresses": _array_addresses(dev, meta, tp, ctx, uses) if tp.addressed else None}
    for p in tp.bindings:
        if p.resource in LAUNCH_WRITTEN:  # this launch's words in the args ring, by dynamic offset
            words = loaded.args.pack(ctx) if p.resource == "args" else written[p.resource]
            buffers.append((dev._args_ring, 0, words.nbytes))
            uses.append(dev._args_ring)
            dynamic.append((p, None, None))
            ring.append((len(dynamic) - 1, p.resource, words))
            continue
        alloc, offset = _bound_allocation(dev, meta, tp, p, ctx)
        buf = alloc.handle
        uses.append(buf)
        if p.resource == "temps" and tp.grid_temp is not None:  # the task's grid words (spirv_args.py)
            tp.grid_at = (buf, offset + 8 * tp.grid_temp)
        if p.dynamic:  # the launch's error slot: the block's descriptor, the slot by offset
            buffers.append((buf, 0, 8 * ERROR_SLOT_WORDS))
            tp.dynamic[len(dynamic)] = offset
            dynamic.append((p, alloc.ptr, alloc.ptr + alloc.nbytes) if p.word is not None else (p, None, offset))
        elif p.resource in HEAP_WORDS:
            buffers.append((buf, 0, _heap_range(dev, tp, p, alloc, adstack_words)))
        else:
            _check_bindable(dev, meta, tp, p, alloc, offset)
            # Whole 32-bit words: an 8/16-bit atomic is a compare-and-swap of the word holding
            # its element, which must lie in the bound range (the buffer is a multiple of 4).
            buffers.append((buf, offset, min(-(-(alloc.nbytes - offset) // 4) * 4, buf.size - offset)))
    for j, resource, words in ring:
        tp.dynamic[j] = _ring_args(dev, loaded.args, words) if resource == "args" else _write_ring(dev, words)
    _bind_sets(dev, tp, buffers)
    tp.uses = uses
    tp.plan = None
    if adstack_words is None:
        # the words naming the bound buffers and the addressed arrays: while they are the same,
        # so are the bindings and the addresses
        key_words = [p.word for p in tp.bindings + tp.addressed if p.word is not None and not p.dynamic]
        key_of = words_key(key_words)
        tp.plan = LaunchPlan(dev.bindings_epoch, key_of, key_of(ctx), dynamic, written["addresses"])


def _array_addresses(dev, meta, tp, ctx, uses: list) -> np.ndarray:
    """The "addresses" words of a launch: the buffer device address of each array the task
    reaches by address (u64, low word first); their buffers join the launch's `uses`."""
    words = np.zeros(2 * len(tp.addressed), np.uint32)
    for k, p in enumerate(tp.addressed):
        alloc, offset = _bound_allocation(dev, meta, tp, p, ctx)
        uses.append(alloc.handle)
        address = alloc.handle.device_address + offset
        words[2 * k], words[2 * k + 1] = address & 0xFFFFFFFF, address >> 32
    return words


def words_key(positions: list):
    """A function of a launch's ctx words (np.uint64) giving the bytes of those at `positions`:
    one gather, whatever the ctx's length (a kernel taking Genesis's dataclasses has hundreds of
    words, which a list conversion would copy at every launch of each task)."""
    index = np.array(positions, np.intp)
    return lambda ctx: ctx.take(index).tobytes()


def _heap_range(dev, tp, p, alloc, words) -> int:
    """The bytes of an adstack heap a launch binds: the whole allocation up to the device's
    maxStorageBufferRange, which must cover what the launch uses (the sizing lowers the
    invocations the heaps hold until it does: this is the last line of defence). Python ints:
    the u32 words' product would wrap."""
    limit = dev.max_binding_bytes()
    needed = 4 * int(words[HEAP_WORDS[p.resource]]) * int(words[2])
    if needed > limit:
        raise ValueError(f"{tp.name}: its {p.resource} heap needs {needed} bytes, more than the Vulkan device's "
                         f"maxStorageBufferRange ({limit} bytes)")
    return min(alloc.nbytes, limit)


def _bound_allocation(dev, meta, tp, p, ctx):
    """(Allocation, offset) the binding's ctx word points at."""
    if p.word is None:  # an error binding in a kernel that reports none: a slot nobody reads
        slot = dev.__dict__.get("_scratch_errors")
        if slot is None:
            slot = dev._scratch_errors = dev.acquire_error_slot()
        return slot.alloc, slot.offset
    address = int(ctx[p.word]) + p.adjust
    found = dev.lookup(address)
    if found is None:
        hint = (": pass a qd.ndarray (numpy arrays are not copied to the device by this runtime yet)"
                if p.resource.startswith("ndarray") else "")
        raise ValueError(f"{tp.name}: its {p.what(meta)} is not in the Vulkan device's memory "
                         f"(address {address:#x}){hint}")
    return found


def _check_bindable(dev, meta, tp, p, alloc, offset) -> None:
    caps = dev.capabilities
    if alloc.nbytes - offset > caps.max_storage_buffer_range:
        raise ValueError(f"{tp.name}: its {p.what(meta)} takes {alloc.nbytes - offset} bytes, more than the Vulkan "
                         f"device's maxStorageBufferRange ({caps.max_storage_buffer_range} bytes)")
    if offset % caps.min_storage_buffer_offset_alignment:
        raise ValueError(f"{tp.name}: its {p.what(meta)} starts at offset {offset}, not a multiple of the device's "
                         f"minStorageBufferOffsetAlignment")


def _bind_sets(dev, tp, buffers: list) -> None:
    """Point tp.sets at descriptor sets holding `buffers` (in tp.bindings order): cached per
    task and buffers (dynamic ones by buffer only), so steady launches write no descriptors."""
    key = (id(tp),) + tuple((b.serial, off, rng) for b, off, rng in buffers)
    sets = dev._set_cache.get(key)
    if sets is None:
        sets = _allocate_sets(dev, tp)
        _write_sets(dev, tp, sets, buffers)
        dev._set_cache[key] = sets
    for s, handle in enumerate(sets):
        tp.sets[s] = handle


def _allocate_sets(dev, tp) -> list:
    vk, ffi, lib = dev.vk, dev.ffi, dev.lib
    if not tp.set_layouts:
        return []
    layouts = ffi.new("VkDescriptorSetLayout[]", tp.set_layouts)
    info = ffi.new("VkDescriptorSetAllocateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorPool": dev._descriptor_pool,
        "descriptorSetCount": len(tp.set_layouts), "pSetLayouts": layouts})
    out = ffi.new("VkDescriptorSet[]", len(tp.set_layouts))
    if lib.vkAllocateDescriptorSets(dev.device, info, out) != 0:
        # The pool is full: once nothing in flight uses its sets, start it afresh.
        dev.wait()
        dev._check(lib.vkResetDescriptorPool(dev.device, dev._descriptor_pool, 0), "vkResetDescriptorPool")
        dev._set_cache.clear()
        dev.bindings_epoch += 1  # every LaunchPlan's sets are gone
        dev._check(lib.vkAllocateDescriptorSets(dev.device, info, out), "vkAllocateDescriptorSets")
    return [out[i] for i in range(len(tp.set_layouts))]


def _write_sets(dev, tp, sets: list, buffers: list) -> None:
    vk, ffi = dev.vk, dev.ffi
    n = len(buffers)
    if not n:
        return
    infos = ffi.new("VkDescriptorBufferInfo[]", n)
    writes = ffi.new("VkWriteDescriptorSet[]", n)
    for j, (p, (buf, offset, size)) in enumerate(zip(tp.bindings, buffers)):
        infos[j].buffer, infos[j].offset, infos[j].range = buf.handle, offset, max(size, 4)
        w = writes[j]
        w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
        w.dstSet, w.dstBinding, w.descriptorCount = sets[p.set], p.binding, 1
        w.descriptorType = (vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC if p.dynamic
                            else vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER)
        w.pBufferInfo = infos + j
    dev.lib.vkUpdateDescriptorSets(dev.device, n, writes, 0, ffi.NULL)
