"""The CUDA target: the shared LLVM lowering on LLVM's NVPTX backend, math from libdevice,
PTX as the artifact (codegen.py). Built on any machine: no GPU, no CUDA toolkit (libdevice,
from the `nvidia-cuda-nvcc` package, only for kernels that do math)."""
from __future__ import annotations

from ... import ir
from ..base import Capabilities, TargetOption, fixed_block_dim
from qdc.runtime.contract.adstack_layout import LLVM_HEAP_INTERLEAVED

from ..llvm.target import PORTABLE_MATH, External, LlvmTarget
from .arch import DEFAULT_CUDA_ARCH, TRIPLE, check_cuda_arch

# sqrt, floor, ceil, rint and fabs are PTX instructions (PORTABLE_MATH's intrinsics); the
# rest are libdevice's functions.
CUDA_MATH = {**PORTABLE_MATH,
             **{op: External(f"__nv_{op}f", f"__nv_{op}")
                for op in ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "pow", "atan2")},
             "frem": External("__nv_fmodf", "__nv_fmod")}  # NVPTX expands LLVM's frem through an inexact division

DEFAULT_BLOCK_DIM = 256   # threads per block unless qd.loop_config(block_dim=...) says otherwise
MAX_BLOCK_DIM = 1024      # CUDA's limit on threads per block


class CudaTarget(LlvmTarget):
    arch = "cuda"
    display_name, workgroup_word = "CUDA", "block"
    capabilities = Capabilities(max_workgroup_size=MAX_BLOCK_DIM, subgroup_size=32, subgroup_reductions=True, simt=True)
    source_folders = ("llvm", "cuda")
    math_table = CUDA_MATH
    heap_layout = LLVM_HEAP_INTERLEAVED  # a warp's pushes of entry j land side by side
    # The PTX target; it enters the cache key through cache_description.
    options = (TargetOption("cuda_arch", default=DEFAULT_CUDA_ARCH, validate=check_cuda_arch,
                            help="GPU generation of CUDA code, sm_XY (default sm_70: the driver compiles it for "
                                 "newer GPUs)."),)

    def emit_slice_index(self, mb, builder):
        """The global thread id: each grid-stride thread owns one heap slice (the runtime sizes
        the heap for the threads a launch really runs)."""
        from .codegen import global_thread_id
        return global_thread_id(mb, builder)

    def simt_instructions(self):
        from .simt import NVPTX
        return NVPTX

    def cache_description(self, opts) -> str:
        from . import toolkit  # LLVM's version is in every key already (cache_key.compiler_fingerprint)
        return f"{TRIPLE}/{opts.effective('cuda_arch')}/libdevice-{toolkit.libdevice_digest()}"

    def launch_policy(self, task: ir.Task) -> dict:
        """Blocks of block_dim threads; a task that runs in order runs on one thread."""
        return {"policy": "grid", "block_dim": fixed_block_dim(task, DEFAULT_BLOCK_DIM)}

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from .codegen import compile_ptx
        return compile_ptx(kernel, meta, opts.effective("cuda_arch"), int(opts.opt_level), bool(opts.fast_math),
                           target=self)


TARGET = CudaTarget()
