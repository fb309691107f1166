"""The AMDGPU target: the shared LLVM lowering on LLVM's AMDGPU backend, a code object per gfx
processor of `amdgpu_targets` (codegen.py), math from LLVM intrinsics where the backend lowers
them and from own code elsewhere (math.py). Built on any machine: no GPU, no ROCm; ld.lld
(16 or newer) links the code objects."""
from __future__ import annotations

from qdc.runtime.contract.adstack_layout import LLVM_HEAP_INTERLEAVED

from ... import ir
from ..base import Capabilities, codegen_error
from ..llvm.target import PORTABLE_MATH, External, LlvmTarget
from .arch import CODE_OBJECT_VERSION, TRIPLE, parse_amdgpu_targets
from .math import OWN_OPS, function_name

AMDGPU_MATH = {**PORTABLE_MATH, **{op: External(function_name(op, 32), function_name(op, 64)) for op in OWN_OPS}}

DEFAULT_BLOCK_DIM = 256   # work-items per workgroup unless qd.loop_config(block_dim=...) says otherwise
MAX_BLOCK_DIM = 1024      # HIP's limit on threads per block


class AmdgpuTarget(LlvmTarget):
    arch = "amdgpu"
    capabilities = Capabilities(max_workgroup_size=MAX_BLOCK_DIM)
    source_folders = ("llvm", "amdgpu")
    math_table = AMDGPU_MATH
    heap_layout = LLVM_HEAP_INTERLEAVED  # as on CUDA: a wavefront's pushes of entry j side by side
    alloca_addrspace = 5  # private (scratch) memory

    def emit_slice_index(self, mb, builder):
        """The global thread id: each grid-stride thread owns one heap slice."""
        from .codegen import global_thread_id
        return global_thread_id(mb, builder)

    def cache_description(self, opts) -> str:
        import llvmlite.binding as llvm

        from .linker import lld_description
        version = ".".join(map(str, llvm.llvm_version_info))
        gfx = ",".join(parse_amdgpu_targets(getattr(opts, "amdgpu_targets", None)))
        return f"{TRIPLE}/{gfx}/co{CODE_OBJECT_VERSION}/llvm-{version}/{lld_description()}"

    def launch_policy(self, task: ir.Task) -> dict:
        """Workgroups of block_dim work-items; a task that runs in order runs on one."""
        if task.kind == "serial" or task.serial:
            return {"policy": "grid", "block_dim": 1}
        return {"policy": "grid", "block_dim": task.block_dim or DEFAULT_BLOCK_DIM}

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        for task in kernel.tasks:
            if task.block_dim is not None and task.block_dim > MAX_BLOCK_DIM:
                where = next((s for s in ir.walk_nested(task) if s.loc is not None), task)
                raise codegen_error(kernel, where, f"qd.loop_config(block_dim={task.block_dim}) is more threads "
                                    f"per block than AMDGPU allows ({MAX_BLOCK_DIM})", task.loc, describe=False)
        from .codegen import compile_code_objects
        return compile_code_objects(kernel, meta, parse_amdgpu_targets(getattr(opts, "amdgpu_targets", None)),
                                    int(opts.opt_level), bool(opts.fast_math), target=self)


TARGET = AmdgpuTarget()
