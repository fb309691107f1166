"""GPU entries over the shared LLVM lowering, for every target that launches tasks as a grid of
threads (cuda, amdgpu): one kernel entry per task, named as its task record's `entry`, taking
one pointer, the device copy of the launch's ctx words (runtime/contract/artifact.py).

- A range-for task is a grid-stride loop: global thread g runs indices begin + g,
  begin + g + G, ... below end (G = the threads of the grid), between its chunk_init and
  chunk_final (per-thread partials of the reduction passes are per grid-stride thread). The
  counter is 64-bit, so `end + G` cannot overflow.
- A serial task, and a range-for task that must run in order (serialized loops), runs on
  thread 0 only; the target's launch policy asks for one thread.
A target supplies the calling convention and how a thread reads its global id and the grid
size (`GridKernelCodegen.thread_id`, `.grid_threads`); the adstack slice of a thread is its
global id (the target's `emit_slice_index`).
"""
from __future__ import annotations

from llvmlite import ir as ll

from ... import ir
from .llvm_ir import KernelCodegen, _ChunkEnv, _Env, start_function
from .llvm_types import I1, I64, PTR, VOID, lltype


def widen(builder: ll.IRBuilder, value):
    return builder.sext(value, I64) if value.type.width < 64 else value


class GridKernelCodegen(KernelCodegen):
    """The shared lowering with GPU entries: one kernel per task, grid-stride chunks."""
    calling_convention = ""  # "ptx_kernel", "amdgpu_kernel"
    chunk_env = _ChunkEnv     # the environment a chunk is lowered in (CUDA's adds block reductions)

    def thread_id(self, b: ll.IRBuilder):
        """An i64: the calling thread's global id in the grid."""
        raise NotImplementedError

    def grid_threads(self, b: ll.IRBuilder):
        """An i64: the threads of the whole grid (the grid stride)."""
        raise NotImplementedError

    def emit_task_kernels(self) -> list:
        return [self.emit_task_kernel(task, record.entry) for task, record in zip(self.k.tasks, self.meta.tasks)]

    def emit_task_kernel(self, task: ir.Task, name: str) -> ll.Function:
        """`void @<name>(ptr ctx)` as a kernel entry: the task's range computed from the ctx and
        walked by the grid; a task that runs in order runs on thread 0 alone."""
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR]), name=name)
        fn.calling_convention = self.calling_convention
        b = start_function(fn)
        ctx = fn.args[0]
        ctx.add_attribute("noalias")
        thread = self.thread_id(b)
        if task.kind == "serial" or task.serial:
            chunk = self.emit_chunk(task)  # the shared in-order chunk
            with b.if_then(b.icmp_unsigned("==", thread, ll.Constant(I64, 0))):
                if task.kind == "serial":
                    b.call(chunk, [ctx])
                else:
                    begin, end = self._range(task, b, ctx)
                    b.call(chunk, [ctx, begin, end, ll.Constant(I1, 0)])  # atomics stay atomic on a GPU
        else:
            chunk = self.emit_strided_chunk(task)
            begin, end = self._range(task, b, ctx)
            first = b.add(widen(b, begin), thread, flags=("nsw",))
            b.call(chunk, [ctx, first, widen(b, end), self.grid_threads(b)])
        b.ret_void()
        return fn

    def _range(self, task: ir.Task, b: ll.IRBuilder, ctx):
        env = _Env(self, b, ctx)
        env.block(task.prologue)
        return env.v(task.begin), env.v(task.end)

    def start_strided_chunk(self, task: ir.Task):
        """(function, builder at its entry, chunk env) of `<task>_grid(ctx, first, end, step)`."""
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR, I64, I64, I64]), name=task.task_name + "_grid")
        fn.linkage = "internal"
        fn.args[0].add_attribute("noalias")
        b = start_function(fn)
        return fn, b, self.chunk_env(self, b, fn.args[0])

    def emit_strided_chunk(self, task: ir.Task) -> ll.Function:
        """`<task>_grid(ctx, i64 first, i64 end, i64 step)`: chunk_init, the body for indices
        first, first + step, ... below end, then (if there was one) chunk_final. The
        coordinates of a multi-dimensional range are divided out of each index: grid-stride
        threads do not walk rows."""
        fn, b, env = self.start_strided_chunk(task)
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
            self.finish_chunk(env, task, first, end)
        b.ret_void()
        return fn

    def finish_chunk(self, env, task: ir.Task, first, end) -> None:
        """chunk_final, in the threads whose chunk was not empty."""
        with env.b.if_then(env.b.icmp_signed("<", first, end)):
            env.block(task.chunk_final)


def internalize(module, entries: set) -> None:
    """Everything but the task entries internal, so the optimiser drops the library functions
    the kernel does not call and inlines the rest."""
    for f in module.functions:
        if not f.is_declaration and f.name not in entries:
            f.linkage = "internal"
    for g in module.global_variables:
        if not g.is_declaration:
            g.linkage = "internal"
