"""CUDA backend: the shared LLVM lowering → NVPTX → PTX text, one module per kernel.

Every task becomes a `ptx_kernel` entry named as its task record's `entry`, taking one
pointer: the device copy of the launch's ctx words (runtime/contract/artifact.py), so the
shared lowering reads arguments, fields, temporaries and adstack words exactly as on the CPU.
- A range-for task is a grid-stride loop: thread g = blockIdx.x * blockDim.x + threadIdx.x
  (64-bit) runs indices begin + g, begin + g + G, ... below end, G = gridDim.x * blockDim.x,
  between its chunk_init and chunk_final (the per-thread partials the reduction passes make
  are per grid-stride thread here). The counter is 64-bit, so `end + G` cannot overflow.
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

from ... import ir
from ..llvm.llvm_ir import I32, I64, PTR, VOID, KernelCodegen, ModuleBuilder, _ChunkEnv, _Env, lltype, \
    start_function
from . import toolkit

TRIPLE = "nvptx64-nvidia-cuda"
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


def _widen(builder: ll.IRBuilder, value):
    return builder.sext(value, I64) if value.type.width < 64 else value


class CudaKernelCodegen(KernelCodegen):
    """The shared lowering with GPU entries: one ptx_kernel per task, grid-stride chunks."""

    def emit_task_kernels(self) -> list:
        return [self.emit_task_kernel(task, record.entry) for task, record in zip(self.k.tasks, self.meta.tasks)]

    def emit_task_kernel(self, task: ir.Task, name: str) -> ll.Function:
        """`void @<name>(ptr ctx)` as a ptx_kernel: the task's range computed from the ctx and
        walked by the grid; a task that runs in order runs on thread 0 alone."""
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR]), name=name)
        fn.calling_convention = "ptx_kernel"
        b = start_function(fn)
        ctx = fn.args[0]
        ctx.add_attribute("noalias")
        thread = global_thread_id(self.mb, b)
        if task.kind == "serial" or task.serial:
            chunk = self.emit_chunk(task)  # the shared in-order chunk
            with b.if_then(b.icmp_unsigned("==", thread, ll.Constant(I64, 0))):
                if task.kind == "serial":
                    b.call(chunk, [ctx])
                else:
                    begin, end = self._range(task, b, ctx)
                    b.call(chunk, [ctx, begin, end])
        else:
            chunk = self.emit_strided_chunk(task)
            begin, end = self._range(task, b, ctx)
            first = b.add(_widen(b, begin), thread, flags=("nsw",))
            b.call(chunk, [ctx, first, _widen(b, end), grid_threads(self.mb, b)])
        b.ret_void()
        return fn

    def _range(self, task: ir.Task, b: ll.IRBuilder, ctx):
        env = _Env(self, b, ctx)
        env.block(task.prologue)
        return env.v(task.begin), env.v(task.end)

    def emit_strided_chunk(self, task: ir.Task) -> ll.Function:
        """`<task>_grid(ctx, i64 first, i64 end, i64 step)`: chunk_init, the body for indices
        first, first + step, ... below end, then (if there was one) chunk_final. The
        coordinates of a multi-dimensional range are divided out of each index: grid-stride
        threads do not walk rows."""
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR, I64, I64, I64]), name=task.task_name + "_grid")
        fn.linkage = "internal"
        fn.args[0].add_attribute("noalias")
        b = start_function(fn)
        env = _ChunkEnv(self, b, fn.args[0])
        first, end, step = fn.args[1:]
        env.block(task.chunk_init)
        it = lltype(task.index.type)
        extents = [env.v(a) for a in task.axes]

        def bind(i):
            index = b.trunc(i, it) if it.width < 64 else i
            env.vals[task.index] = index
            if task.axis_index:
                rest = index
                for coord, extent in zip(reversed(task.axis_index[1:]), reversed(extents)):
                    env.vals[coord] = b.srem(rest, extent)
                    rest = b.sdiv(rest, extent)
                env.vals[task.axis_index[0]] = rest
        env.loop(first, end, task.body, bind, name="grid", step=step)
        if task.chunk_final.stmts:
            with b.if_then(b.icmp_signed("<", first, end)):
                env.block(task.chunk_final)
        b.ret_void()
        return fn


def generate_llvm(kernel: ir.KernelIR, meta: KernelMeta, cuda_arch: str, fast_math: bool, target) -> ll.Module:
    tm = target_machine(cuda_arch)
    mb = ModuleBuilder(kernel.name, TRIPLE, str(tm.target_data))
    CudaKernelCodegen(mb, kernel, meta, fast_math, target=target).emit_task_kernels()
    return mb.module


def link_libdevice(module) -> None:
    """Link libdevice into `module` if it calls any of its functions (a kernel without math
    needs no toolkit at all)."""
    if not any(f.is_declaration and f.name.startswith(LIBDEVICE_PREFIX) for f in module.functions):
        return
    libdevice = llvm.parse_bitcode(toolkit.libdevice_bitcode())  # link_in consumes it: parse per module
    libdevice.triple, libdevice.data_layout = module.triple, module.data_layout
    module.link_in(libdevice)


def internalize(module, entries: set) -> None:
    """Everything but the task entries internal, so the optimiser drops the libdevice functions
    the kernel does not call and inlines the rest."""
    for f in module.functions:
        if not f.is_declaration and f.name not in entries:
            f.linkage = "internal"
    for g in module.global_variables:
        if not g.is_declaration:
            g.linkage = "internal"


def compile_ptx(kernel: ir.KernelIR, meta: KernelMeta, cuda_arch: str, opt_level: int = 3,
                fast_math: bool = False, target=None) -> dict:
    """Artifacts of one kernel for CUDA: "ptx" (every task's entry in one module) and the
    optimised module as "ll" and "bc"."""
    if target is None:
        from .target import TARGET as target
    module = llvm.parse_assembly(str(generate_llvm(kernel, meta, cuda_arch, fast_math, target)))
    module.verify()  # llvmlite's LLVM aborts the process on bad IR given to a backend
    link_libdevice(module)
    internalize(module, {t.entry for t in meta.tasks})
    tm = target_machine(cuda_arch, opt_level)
    # libdevice asks __nvvm_reflect whether to flush denormals (no); NVVMReflect, a pass of the
    # NVPTX pipeline, answers, so the module is optimised even at opt_level 0.
    pto = llvm.create_pipeline_tuning_options(speed_level=max(opt_level, 1))
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)
    module.verify()
    ptx = tm.emit_assembly(module)
    return {"ptx": ptx.encode(), "ll": str(module).encode(), "bc": module.as_bitcode()}
