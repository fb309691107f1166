"""CUDA backend: the shared LLVM lowering → NVPTX → PTX text, one module per kernel.

Every task becomes a `ptx_kernel` entry named as its task record's `entry`, taking one
pointer: the device copy of the launch's ctx words (runtime/contract/artifact.py), so the
shared lowering reads arguments, fields, temporaries and adstack words exactly as on the CPU.
- A range-for task is a grid-stride loop: thread g = blockIdx.x * blockDim.x + threadIdx.x
  (64-bit) runs indices begin + g, begin + g + G, ... below end, G = gridDim.x * blockDim.x,
  between its chunk_init and chunk_final (the per-thread partials the reduction passes make
  are per grid-stride thread here, combined across the block before one atomic:
  block_reduce.py). The counter is 64-bit, so `end + G` cannot overflow.
- A serial task, and a range-for task that must run in order (serialized loops), runs on
  thread 0 only; its launch policy asks for one thread (target.py).
- The adstack slice of a thread is g (target.py, `emit_slice_index`).
Math ops call libdevice (`__nv_*`), linked into the module, internalized and optimised with
it; nothing of the host's C library is ever involved. There is no kernel-wide entry: a GPU
launches the tasks one by one.
"""
from __future__ import annotations

import functools

import llvmlite.binding as llvm
from llvmlite import ir as ll

from qdc.runtime.contract.artifact import KernelMeta

from ... import ir, timings
from ..llvm.grid import GridKernelCodegen, internalize
from ..llvm.llvm_ir import ModuleBuilder
from ..llvm.llvm_types import I32, I64, lltype
from . import toolkit, vectorize
from .arch import TRIPLE
from .block_reduce import BlockReduceEnv, flushable

LIBDEVICE_PREFIX = "__nv_"


@functools.lru_cache(maxsize=None)
def target_machine(cuda_arch: str, opt_level: int = 3):
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=cuda_arch, features="", opt=opt_level)


def special_register(mb: ModuleBuilder, builder: ll.IRBuilder, name: str):
    """An i64 of the PTX special register `name` (tid.x, ntid.x, ctaid.x, nctaid.x)."""
    fn = mb.declare(f"llvm.nvvm.read.ptx.sreg.{name}", I32, [])
    return builder.zext(builder.call(fn, []), I64)


def global_thread_id(mb: ModuleBuilder, builder: ll.IRBuilder):
    """blockIdx.x * blockDim.x + threadIdx.x, multiplied in 64 bits."""
    block, width = special_register(mb, builder, "ctaid.x"), special_register(mb, builder, "ntid.x")
    return builder.add(builder.mul(block, width, flags=("nuw",)), special_register(mb, builder, "tid.x"),
                       flags=("nuw",))


def grid_threads(mb: ModuleBuilder, builder: ll.IRBuilder):
    """gridDim.x * blockDim.x: the grid stride."""
    return builder.mul(special_register(mb, builder, "nctaid.x"), special_register(mb, builder, "ntid.x"),
                       flags=("nuw",))


class CudaKernelCodegen(GridKernelCodegen):
    """The shared grid entries (llvm/grid.py) as ptx_kernels, on NVPTX's special registers."""
    calling_convention = "ptx_kernel"
    chunk_env = BlockReduceEnv

    def thread_id(self, b: ll.IRBuilder):
        return global_thread_id(self.mb, b)

    def finish_chunk(self, env, task: ir.Task, first, end) -> None:
        """A chunk_final that only flushes partials runs in every thread (an empty chunk's
        partial is the identity), its atomics as block reductions (block_reduce.py)."""
        if not flushable(task):
            return super().finish_chunk(env, task, first, end)
        env.flushing = True
        env.block(task.chunk_final)
        env.flushing = False

    def grid_threads(self, b: ll.IRBuilder):
        return grid_threads(self.mb, b)

    def emit_strided_chunk(self, task: ir.Task) -> ll.Function:
        """An element-wise task: the vector loop over the aligned part of the range, then the
        scalar grid-stride loop over the rest (vectorize.py); any other: the shared chunk."""
        arrays = None if self.check_id else vectorize.plan(task)
        if arrays is None:
            return super().emit_strided_chunk(task)
        fn, b, env = self.start_strided_chunk(task)
        first, end, step = fn.args[1:]
        scalar_begin = vectorize.emit_vector_loop(self, env, task, arrays, first, end, step)
        it = lltype(task.index.type)

        def bind(i):
            env.vals[task.index] = b.trunc(i, it) if it.width < 64 else i
        env.loop(b.add(scalar_begin, self.thread_id(b), flags=("nsw",)), end, task.body, bind, name="grid", step=step)
        b.ret_void()
        return fn


def generate_llvm(kernel: ir.KernelIR, meta: KernelMeta, cuda_arch: str, fast_math: bool, target) -> ll.Module:
    tm = target_machine(cuda_arch)
    mb = ModuleBuilder(kernel.name, TRIPLE, str(tm.target_data))
    CudaKernelCodegen(mb, kernel, meta, fast_math, target=target).emit_task_kernels()
    return mb.module


def link_libdevice(module, context) -> None:
    """Link libdevice into `module` if it calls any of its functions (a kernel without math
    needs no toolkit at all)."""
    if not any(f.is_declaration and f.name.startswith(LIBDEVICE_PREFIX) for f in module.functions):
        return
    libdevice = llvm.parse_bitcode(toolkit.libdevice_bitcode(), context=context)  # link_in consumes it: parse per module
    libdevice.triple, libdevice.data_layout = module.triple, module.data_layout
    module.link_in(libdevice)


def compile_ptx(kernel: ir.KernelIR, meta: KernelMeta, cuda_arch: str, opt_level: int = 3,
                fast_math: bool = False, *, target) -> dict:
    """Artifacts of one kernel for CUDA: "ptx" (every task's entry in one module) and the
    optimised module as "ll" and "bc"."""
    context = llvm.create_context()  # the bitcode must not depend on earlier kernels (cpu/codegen.py)
    text = str(generate_llvm(kernel, meta, cuda_arch, fast_math, target))
    with timings.phase("LLVM parse"):
        module = llvm.parse_assembly(text, context=context)
        module.verify()  # llvmlite's LLVM aborts the process on bad IR given to a backend
        link_libdevice(module, context)
        internalize(module, {t.entry for t in meta.tasks})
    tm = target_machine(cuda_arch, opt_level)
    with timings.phase("LLVM optimisation"):
        # libdevice asks __nvvm_reflect whether to flush denormals (no); NVVMReflect, a pass of the
        # NVPTX pipeline, answers, so the module is optimised even at opt_level 0.
        pto = llvm.create_pipeline_tuning_options(speed_level=max(opt_level, 1))
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        module.verify()
    with timings.phase("PTX emission"):
        ptx = tm.emit_assembly(module)
    with timings.phase("artifacts"):
        return {"ptx": ptx.encode(), "ll": str(module).encode(), "bc": module.as_bitcode()}
