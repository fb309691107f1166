"""The CPU target: the shared LLVM lowering, libgomp dispatch and libm, one shared library per
ISA level (`cpu_target`, see isa_levels.py)."""
from __future__ import annotations

from ... import ir
from ..base import Capabilities
from ..llvm.target import PORTABLE_MATH, External, Intrinsic, LlvmTarget

# LLVM's CPU backends lower these intrinsics to the C math library's calls (or inline code);
# the rest are the C math library's functions (f32 name, f64 name), linked with -lm.
CPU_MATH = {**PORTABLE_MATH,
            **{op: Intrinsic(f"llvm.{op}") for op in ("sin", "cos", "exp", "log", "pow")},
            **{op: External(op + "f", op) for op in ("tan", "asin", "acos", "atan", "tanh", "atan2")}}


class CpuTarget(LlvmTarget):
    arch = "cpu"
    capabilities = Capabilities()  # every IR type, adstacks included
    source_folders = ("llvm", "cpu")
    math_table = CPU_MATH

    def emit_slice_index(self, mb, builder):
        """The OpenMP thread number: a task with adstacks runs on at most as many threads as the
        heap has slices (codegen.py, `_dispatch`), and a serial run is thread 0."""
        from llvmlite import ir as ll
        thread_num = mb.declare("omp_get_thread_num", ll.IntType(32), [])
        return builder.zext(builder.call(thread_num, []), ll.IntType(64))

    def cache_description(self, opts) -> str:
        from .codegen import target_description
        return target_description(opts.effective_cpu_target())

    def launch_policy(self, task: ir.Task) -> dict:
        return {"policy": "cpu_chunks", "parallel_from": self.parallel_from(task)}

    def parallel_from(self, task: ir.Task) -> int:
        """The least trip count from which `task` runs on several threads (0: never): the
        native dispatch's rule (codegen.py, `_dispatch`), which CpuDevice.task_slices mirrors."""
        if task.kind == "serial" or task.serial:
            return 0
        from ..llvm.llvm_ir import KernelCodegen
        from .codegen import PARALLEL_WORK_THRESHOLD
        cost = max(KernelCodegen.task_cost(task), 1)
        return max(-(-PARALLEL_WORK_THRESHOLD // cost), 1)

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from .codegen import compile_kernel
        artifacts = compile_kernel(kernel, meta, int(opts.opt_level), bool(opts.fast_math),
                                   opts.effective_cpu_target(), target=self)
        meta.cpu_libraries = artifacts.pop("cpu_libraries")  # which library suits which CPU: the loader picks
        return artifacts


TARGET = CpuTarget()
