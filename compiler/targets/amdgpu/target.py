"""The AMDGPU target: the shared LLVM lowering on LLVM's AMDGPU backend, a code object per gfx
processor of `amdgpu_targets` (codegen.py). Built on any machine: no GPU, no ROCm; ld.lld
(16 or newer) links the code objects.

Math: LLVM's AMDGPU backend lowers sqrt, floor, ceil, rint and fabs of both widths, and sin,
cos, exp, log and pow of f32 (hardware v_sin/v_exp/v_log with the backend's range handling);
any other call would be a libcall it cannot make (ROCm's device libraries are not available to
qdc). Those are the shared branch-free IR of llvm/inline_math.py, the functions the CPU runs.
"""
from __future__ import annotations

from qdc.runtime.contract.adstack_layout import LLVM_HEAP_INTERLEAVED

from ... import ir
from ..base import Capabilities, TargetOption, fixed_block_dim
from ..llvm.target import INLINE_MATH_OPS, PORTABLE_MATH, Inline, Intrinsic, LlvmTarget, PerWidth
from .arch import CODE_OBJECT_VERSION, DEFAULT_AMDGPU_TARGETS, TRIPLE, check_amdgpu_targets, parse_amdgpu_targets

BACKEND_F32_MATH = ("sin", "cos", "exp", "log", "pow")
AMDGPU_MATH = {**PORTABLE_MATH, **{op: Inline(op) for op in INLINE_MATH_OPS},
               **{op: PerWidth(Intrinsic(f"llvm.{op}"), Inline(op)) for op in BACKEND_F32_MATH}}

DEFAULT_BLOCK_DIM = 256   # work-items per workgroup unless qd.loop_config(block_dim=...) says otherwise
MAX_BLOCK_DIM = 1024      # HIP's limit on threads per block


class AmdgpuTarget(LlvmTarget):
    arch = "amdgpu"
    display_name, workgroup_word = "AMDGPU", "block"
    capabilities = Capabilities(max_workgroup_size=MAX_BLOCK_DIM, simt=True)
    source_folders = ("llvm", "amdgpu")
    math_table = AMDGPU_MATH
    heap_layout = LLVM_HEAP_INTERLEAVED  # as on CUDA: a wavefront's pushes of entry j side by side
    alloca_addrspace = 5  # private (scratch) memory
    # A comma-separated string or a list; it enters the cache key through cache_description.
    options = (TargetOption("amdgpu_targets", default=",".join(DEFAULT_AMDGPU_TARGETS), validate=check_amdgpu_targets,
                            help="AMD GPUs to build code objects for, comma-separated gfx names (default "
                                 "gfx90a,gfx942,gfx1100)."),)

    def emit_slice_index(self, mb, builder):
        """The global thread id: each grid-stride thread owns one heap slice."""
        from .codegen import global_thread_id
        return global_thread_id(mb, builder)

    def simt_instructions(self):
        from .simt import AMDGCN
        return AMDGCN

    def cache_description(self, opts) -> str:
        from .linker import lld_description  # LLVM's version is in every key already (compiler_fingerprint)
        gfx = ",".join(parse_amdgpu_targets(opts.effective("amdgpu_targets")))
        return f"{TRIPLE}/{gfx}/co{CODE_OBJECT_VERSION}/{lld_description()}"

    def launch_policy(self, task: ir.Task) -> dict:
        """Workgroups of block_dim work-items; a task that runs in order runs on one."""
        return {"policy": "grid", "block_dim": fixed_block_dim(task, DEFAULT_BLOCK_DIM)}

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from .codegen import compile_code_objects
        return compile_code_objects(kernel, meta, parse_amdgpu_targets(opts.effective("amdgpu_targets")),
                                    int(opts.opt_level), bool(opts.fast_math), target=self)


TARGET = AmdgpuTarget()
