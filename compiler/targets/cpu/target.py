"""The CPU target: the shared LLVM lowering, libgomp dispatch and libm, one shared library per
ISA level (`cpu_target`, see isa_levels.py)."""
from __future__ import annotations

from ... import ir
from ..base import Capabilities, TargetOption
from ..llvm.target import INLINE_MATH_OPS, PORTABLE_MATH, External, Inline, Intrinsic, LlvmTarget, PerWidth
from .arch import PARALLEL_WORK_THRESHOLD
from .isa_levels import NATIVE, PORTABLE, check_cpu_target, check_cpu_targets, parse_cpu_targets

# Transcendental functions are branch-free IR of the lowering's own (llvm/inline_math.py), so
# that the loop vectoriser widens loops calling them; a call to the C math library keeps a
# loop scalar.
# Except f64 sin, cos and tan: fdlibm's branch-free reduction is exact below 2^53 only (NaN
# beyond, targets/fdlibm.py), where libm gives numpy's values; those stay libm calls.
CPU_MATH = {**PORTABLE_MATH, **{op: Inline(op) for op in INLINE_MATH_OPS},
            **{op: PerWidth(Inline(op), Intrinsic(f"llvm.{op}")) for op in ("sin", "cos")},
            "tan": PerWidth(Inline("tan"), External("tanf", "tan"))}
# The C math library's scalar functions, as before inline_math.py: LLVM's CPU backends lower
# these intrinsics to libm calls; the rest are libm's functions (f32 name, f64 name), -lm.
LIBM_MATH = {**PORTABLE_MATH,
             **{op: Intrinsic(f"llvm.{op}") for op in ("sin", "cos", "exp", "log", "pow")},
             **{op: External(op + "f", op) for op in ("tan", "asin", "acos", "atan", "tanh", "atan2")}}
# bench/bench_vector_math.py compiles kernels with LIBM_MATH everywhere to measure the difference
# (with compiler.driver.kernel.compile_kernel, which no cache is involved in).
_LIBM_FOR_BENCHMARK = False


class CpuTarget(LlvmTarget):
    arch = "cpu"
    capabilities = Capabilities()  # every IR type, adstacks included
    source_folders = ("llvm", "cpu")
    # Direct mode compiles for this machine, `qdc build` for any CPU of the architecture.
    options = (TargetOption("cpu_target", default=NATIVE, build_default=PORTABLE, keyed=True,
                            validate=check_cpu_target,
                            help="CPU code: portable (default: x86-64-v2/v3/v4, the best picked at load), native "
                                 "(this machine) or an ISA level / LLVM CPU name."),
               # Not keyed as a value: the target description names every platform's triple.
               TargetOption("cpu_targets", validate=check_cpu_targets,
                            help="ISA families to build CPU code for, comma-separated: x86_64, aarch64 (Linux and "
                                 "macOS), or one platform such as aarch64-linux. Default: this machine's; load picks "
                                 "the host's."))

    @property
    def math_table(self) -> dict:
        return LIBM_MATH if _LIBM_FOR_BENCHMARK else CPU_MATH

    # In a loop-carried chain (`v = sin(v)` in a serial loop) math is bound by latency, where
    # the C library's branchy scalar functions are shorter than the inline code.
    chain_math_table = LIBM_MATH

    def emit_slice_index(self, mb, builder):
        """The OpenMP thread number: a task with adstacks runs on at most as many threads as the
        heap has slices (codegen.py, `_dispatch`), and a serial run is thread 0."""
        from llvmlite import ir as ll
        thread_num = mb.declare("omp_get_thread_num", ll.IntType(32), [])
        return builder.zext(builder.call(thread_num, []), ll.IntType(64))

    def warm_up(self) -> None:
        from .codegen import _target_machine
        from .isa_levels import PORTABLE
        from .platforms import cpu_levels
        _target_machine(3)  # LLVM's native target, and the triple's data layout every module takes
        cpu_levels(PORTABLE)

    def cache_description(self, opts) -> str:
        from .platforms import target_description
        from .widen_plan import SCALAR_SWITCH, widening_mode
        mode = widening_mode()  # the code differs: so does the key
        return target_description(opts.effective("cpu_target"), parse_cpu_targets(opts.cpu_targets)) + \
            ("" if mode == "1" else f"/{SCALAR_SWITCH}={mode}")

    def launch_policy(self, task: ir.Task) -> dict:
        return {"policy": "cpu_chunks", "parallel_from": self.parallel_from(task)}

    def parallel_from(self, task: ir.Task) -> int:
        """The least trip count from which `task` runs on several threads (0: never): the
        native dispatch's rule (codegen.py, `_dispatch`), which CpuDevice.task_slices mirrors."""
        if task.kind == "serial" or task.serial:
            return 0
        from ..llvm.llvm_ir import KernelCodegen
        cost = max(KernelCodegen.task_cost(task), 1)
        return max(-(-PARALLEL_WORK_THRESHOLD // cost), 1)

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        from .codegen import compile_kernel
        artifacts = compile_kernel(kernel, meta, int(opts.opt_level), bool(opts.fast_math),
                                   opts.effective("cpu_target"), target=self,
                                   cpu_targets=parse_cpu_targets(opts.cpu_targets))
        meta.cpu_libraries = artifacts.pop("cpu_libraries")  # which library suits which CPU: the loader picks
        lowered = artifacts.pop("cpu_tasks")  # width-W or scalar, per task (widen_codegen.py)
        for record in meta.tasks:
            record.launch.update(lowered.get(record.name, {}))
        return artifacts


TARGET = CpuTarget()
