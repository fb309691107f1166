"""The Metal target: each task's SPIR-V module (the shared compiler/targets/spirv/ lowering,
as for Vulkan) translated to Metal Shading Language by spirv-cross (msl.py); artifact `msl_t<i>`
for task i (its SPIR-V kept as `spirv_t<i>` for inspection). The ABI, which the Metal device
(runtime/devices/metal/) follows:

- One MSL source per task, holding one `kernel` function named as the task record's entry
  (spelled without a double underscore, which MSL reserves: msl.metal_entry), as is the entry
  point of its SPIR-V.
- Buffers: the task record's "bindings" [set, binding, resource, index], exactly as on Vulkan
  (compiler/targets/vulkan/target.py), with buffer binding N at Metal buffer index N
  (`[[buffer(N)]]`); "args" holds the same u32 words. Metal has 31 buffer slots per function,
  so a task may use at most 31 buffers.
- Workgroup size: fixed at compile time and recorded as the task's launch policy
  {"policy": "grid", "block_dim": B} (B from qd.loop_config, else 256; 1 for a task that runs in
  order), also the default of MSL function constant 0; the device dispatches threadgroups of B
  threads, ceil(N / B) of them (2-D beyond 65535, folded into the invocation id as on Vulkan).
- Float atomics are compare-and-swap loops (see `capabilities`), valid in every MSL version.
- No 64-bit types: MSL has no double, and no 64-bit atomics (which the error words and 64-bit
  atomics would need), so the code uses 32-bit heap index arithmetic (the runtime checks that
  stride x threads fits 32 bits) and a kernel using f64, i64 or u64 is a compile error at the
  statement that does.
- The adstack uses the float and int heaps of the SPIR-V layout (adstack_layout.spirv_heap).
"""
from __future__ import annotations

from qdc.runtime.contract.adstack_layout import spirv_heap

from ... import ir, timings
from ..base import Capabilities, Target, codegen_error, fixed_block_dim

DEFAULT_BLOCK_DIM = 256
MAX_BLOCK_DIM = 1024       # maxTotalThreadsPerThreadgroup on every Metal GPU
MAX_BUFFERS = 31           # Metal's buffer argument table


class MetalTarget(Target):
    arch = "metal"
    display_name, workgroup_word = "Metal", "threadgroup"
    # float_atomic_add=False: an f32 atomic add is a compare-and-swap loop on its bits (spirv-cross
    # releases before 2023 translate OpAtomicFAddEXT to GLSL's atomicAdd, which is no MSL).
    capabilities = Capabilities(int64=False, float64=False, float_atomic_add=False,
                                adstack_dtypes=frozenset(("f32", "i32", "u1")), max_workgroup_size=MAX_BLOCK_DIM, simt=True)
    source_folders = ("spirv", "metal")

    def cache_description(self, opts) -> str:
        from .msl import MSL_VERSION, spirv_cross_version
        c = self.capabilities
        return (f"msl{MSL_VERSION}/spirv-cross-{spirv_cross_version()}/int64={c.int64}/float64={c.float64}/"
                f"float_atomic_add={c.float_atomic_add}")

    def block_dim(self, task: ir.Task) -> int:
        return fixed_block_dim(task, DEFAULT_BLOCK_DIM)

    def launch_policy(self, task: ir.Task) -> dict:
        return {"policy": "grid", "block_dim": self.block_dim(task)}

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from ..spirv import tools
        from ..spirv.lowering import TaskLowering
        from .msl import metal_entry, translate
        artifacts = {}
        for i, (task, record) in enumerate(zip(kernel.tasks, meta.tasks)):
            record.entry = metal_entry(record.entry)
            with timings.phase("SPIR-V generation"):
                module, bindings = TaskLowering(kernel, task, record.entry, self.capabilities, self.arch,
                                                self.block_dim(task), bool(meta.debug_checks)).lower()
            if len(bindings) > MAX_BUFFERS:
                raise codegen_error(kernel, task, f"task {i} uses {len(bindings)} buffers, more than the "
                                    f"{MAX_BUFFERS} a Metal function can bind: split the loop", kernel.loc,
                                    describe=False)
            tools.check_task_module(kernel, task, i, module)
            artifacts[f"spirv_t{i}"] = module
            with timings.phase("SPIR-V to MSL"):
                artifacts[f"msl_t{i}"] = translate(module, record.entry,
                                                   f"task {i} of kernel '{kernel.name}'").encode()
            record.bindings = bindings
        if meta.adstack.get("stacks"):  # the layout the code was generated for, which the runtime checks
            meta.adstack["layout"] = spirv_heap(self.capabilities.int64).record()
        return artifacts


TARGET = MetalTarget()
