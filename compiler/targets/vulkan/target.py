"""The Vulkan target: one SPIR-V module per task (compiler/targets/spirv/), artifact
`spirv_t<i>` for task i. The ABI, which the Vulkan device (runtime/devices/vulkan/) follows:

- Module: one entry point, named as the task record's "entry" (the device creates the
  pipeline with that name; loading refuses a module whose entry point is named otherwise),
  GLCompute, Vulkan 1.2 environment (SPIR-V 1.5), Shader capability, logical addressing,
  GLSL450 memory model, structured control flow. The
  WorkgroupSize built-in is a composite of spec constants SpecId 0, 1, 2 (x = block size, y =
  z = 1): the device sets SpecId 0 from the task's launch policy {"policy": "grid",
  "block_dim": B}; B = 0 means the device's default (qd.loop_config(block_dim=...) gives B).
- Buffers: storage buffers in descriptor set 0, as the task record's "bindings" lists them
  ([set, binding, resource, index]): "args", "field" i, "ndarray" p, "ndarray_grad" p,
  "temps" (temporary s at byte 8*s, value in the low bytes), "errors", "adstack_*". Only the
  buffers a task uses are listed. A task that would bind more than MAX_BOUND_BUFFERS buffers
  binds no field or ndarray: its launch record's "addressed" lists them ([resource, index],
  in order), the device writes their buffer device addresses (u64, low word first) into the
  "addresses" buffer (bound like "args"), and the module reads them through
  PhysicalStorageBuffer pointers (PhysicalStorageBuffer64 addressing; the device needs
  bufferDeviceAddress).
- "args": little-endian u32 words; each parameter in order: a scalar of 8, 16 or 32 bits one
  word (low bits, sign- or zero-extended), a 64-bit scalar two words (low first), an ndarray
  one word per dimension (its extent, i32); then, in a kernel that draws random numbers
  (metadata "random"), its seed and launch counter, two words each, low first.
- Dispatch: ceil(N / B) workgroups for N iterations (2-D when beyond
  maxComputeWorkGroupCount[0]); invocation id = gid.x + gid.y * (groups.x * B), total =
  groups.x * groups.y * B. The shader computes begin/end itself and runs iterations id, id +
  total, ... (grid-stride). A serial task: one workgroup, invocation 0 runs it.
- A range task whose bounds its prologue reads from device memory (a count in an ndarray, a
  field or an earlier task's temporary) has "grid_temp": T in its launch record: the device
  dispatches it indirectly, on the grid its module computes when specialised to
  (GRID_BLOCK_SPEC_ID, runtime/contract/spirv_args.py) into temporaries T and T + 1, so the
  host never reads the bounds back (a wait for every earlier launch) nor dispatches the grid
  cap for a small count.
- Capabilities Int64 / Float64 / Int8 / Int16 / Float16 only when the task uses those types.
"""
from __future__ import annotations

from qdc.runtime.contract.adstack_layout import spirv_heap
from qdc.runtime.contract.spirv_args import GRID_TEMPS

from ... import ir, timings
from ...ir.adstack import AdStackAlloca
from ..base import Capabilities, Target, TargetOption

SPIRV_ENV = "spirv1.5/vulkan1.2"
# The most storage buffers a task binds as descriptors: a task using more arrays (Genesis's
# solver kernels take dozens) reaches them by address. Devices bind maxPerStageDescriptorStorageBuffers
# to one shader (lavapipe 32, desktop GPUs far more; Vulkan's minimum is 4): one that binds fewer
# than a task asks refuses it at load.
MAX_BOUND_BUFFERS = 24


class VulkanTarget(Target):
    arch = "vulkan"
    # What the generated code may use. lavapipe and NVIDIA have all of these; a device
    # without one refuses the module at load, as it refuses a block_dim beyond its own limit.
    capabilities = Capabilities(int64=True, float64=True, float_atomic_add=True, subgroup_reductions=True, simt=True,
                                adstack_dtypes=frozenset(("f32", "i32", "u1", "f64", "i64")))
    source_folders = ("spirv", "vulkan")
    # qd.simt.subgroup.group_size() is a compile-time int; a device of another size refuses
    # kernels using subgroup operations at load. Direct mode sets it from the device.
    options = (TargetOption("vulkan_subgroup_size", default=32, type=int, keyed=True,
                            validate=lambda v: _check_subgroup_size(v),
                            help="Lanes per subgroup of the Vulkan devices kernels are built for (default 32, "
                                 "NVIDIA's; 64 on AMD's wave64, 8 on lavapipe)."),)

    def cache_description(self, opts) -> str:
        c = self.capabilities
        return (f"{SPIRV_ENV}/int64={c.int64}/float64={c.float64}/float_atomic_add={c.float_atomic_add}"
                f"/subgroup_reductions={c.subgroup_reductions}")

    def launch_policy(self, task: ir.Task) -> dict:
        """block_dim 0: the device's default (256 on NVIDIA)."""
        return {"policy": "grid", "block_dim": int(task.block_dim or 0)}

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from ..spirv import tools
        artifacts = {}
        for i, (task, record) in enumerate(zip(kernel.tasks, meta.tasks)):
            if grid_on_device(task):
                record.launch["grid_temp"] = meta.num_temps
                meta.num_temps += GRID_TEMPS
            with timings.phase("SPIR-V generation"):
                module, bindings = self.lower_task(kernel, task, record, meta, opts)
            tools.check_task_module(kernel, task, i, module)
            artifacts[f"spirv_t{i}"] = module
            record.bindings = bindings
            if ir.uses_simt(task) is not None:  # the size its qd.simt code assumed, which the device checks
                record.launch["subgroup_size"] = int(opts.effective("vulkan_subgroup_size"))
        if meta.adstack.get("stacks"):  # the layout the code was generated for, which the runtime checks
            meta.adstack["layout"] = spirv_heap(self.capabilities.int64).record()
        return artifacts


    def lower_task(self, kernel: ir.KernelIR, task: ir.Task, record, meta, opts) -> tuple[bytes, list]:
        """(module, bindings) of one task; a task that would bind more than MAX_BOUND_BUFFERS
        buffers is lowered again with its arrays reached by address, which its record lists."""
        from ..spirv.lowering import TaskLowering
        for address_arrays in (False, True):
            lowering = TaskLowering(kernel, task, record.entry, self.capabilities, self.arch, task.block_dim,
                                    bool(meta.debug_checks), bool(opts.fast_math), address_arrays,
                                    record.launch.get("grid_temp"))
            module, bindings = lowering.lower()
            if len(bindings) <= MAX_BOUND_BUFFERS:
                break
        if lowering.addressed:
            record.launch["addressed"] = [[resource, index] for resource, index in lowering.addressed]
        return module, bindings


def grid_on_device(task: ir.Task) -> bool:
    """Whether a task computes its own grid: a parallel range whose bounds the prologue reads
    from memory, holding no adstacks (whose heaps are sized for the grid the host chooses)."""
    if task.kind != "range_for" or task.serial:
        return False
    if any(isinstance(s, AdStackAlloca) for s in ir.walk_nested(task)):
        return False
    return any(isinstance(s, (ir.GlobalLoad, ir.TempLoad)) for s in ir.walk(task.prologue))


def _check_subgroup_size(v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > 128 or v & (v - 1):
        raise ValueError(f"vulkan_subgroup_size must be a power of two from 1 to 128, got {v!r}")


TARGET = VulkanTarget()
