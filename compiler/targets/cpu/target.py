"""The CPU target: the shared LLVM lowering, libgomp dispatch and libm, one shared library per
ISA level (`cpu_target`, see isa_levels.py)."""
from __future__ import annotations

from ... import ir
from ..base import Capabilities, Target


class CpuTarget(Target):
    arch = "cpu"
    capabilities = Capabilities()
    source_folders = ("llvm", "cpu")

    def cache_description(self, opts) -> str:
        from .codegen import target_description
        return target_description(opts.effective_cpu_target())

    def parallel_from(self, task: ir.Task) -> int:
        if task.kind == "serial" or task.serial:
            return 0
        from ..llvm.llvm_ir import KernelCodegen
        from .codegen import PARALLEL_WORK_THRESHOLD
        cost = max(KernelCodegen.task_cost(task), 1)
        return max(-(-PARALLEL_WORK_THRESHOLD // cost), 1)

    def compile(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from .codegen import compile_kernel
        artifacts = compile_kernel(kernel, meta, int(opts.opt_level), bool(opts.fast_math),
                                   opts.effective_cpu_target())
        meta.cpu_libraries = artifacts.pop("cpu_libraries")  # which library suits which CPU: the loader picks
        return artifacts


TARGET = CpuTarget()
