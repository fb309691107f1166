"""How the CPU backend chooses, per task and per ISA level, between the width-W chunk
(widen.py) and today's scalar one (llvm/llvm_ir.py), and what it records about the choice.

W comes from the level: four vector registers' worth of lanes (128-bit SSE/NEON, 256-bit
AVX2, 512-bit AVX-512; four so that a loop-carried chain has independent work in flight,
widen_plan.REGISTERS_PER_STEP) of the widest float type the task computes with: x86-64-v2 16
f32 lanes, v3 32, v4 64 (f64: half). A portable build emits one chunk per distinct W and multiversion.py
gives each level the one of its width. The task's launch record says which: `lanes` (the most
of any level: a thread of the task takes that many adstack heap slices) or `scalar` (why the
task keeps the scalar code), both shown by `qdc inspect`.
"""
from __future__ import annotations

from ... import ir, timings
from ...ir.adstack import AdStackAlloca
from ..llvm.llvm_ir import KernelCodegen
from ..llvm.llvm_outline import emit_outlined, outlined_regions
from .isa_levels import CpuLevel
from .widen import emit_wide_chunk
from .widen_plan import WidenPlan, level_lanes, own_updates, plan


def level_features(level: CpuLevel) -> set:
    """The features the level's code may use."""
    return set(level.requires) | {f[1:] for f in level.llvm_features.split(",") if f.startswith("+")}


def has_gathers(level: CpuLevel) -> bool:
    """Whether the level gathers the lanes of a width-W chunk with vector instructions (AVX2,
    AVX-512). Not SVE: its vector length is unknown when compiling, so W is NEON-sized and LLVM
    lowers those fixed-length vectors with NEON (SVE registers only for a known length of 256
    bits or more), whose gathers and scatters load and store lane by lane, each behind a branch
    on its mask bit (DiffMPM's P2G gradient at armv8.2-a+sve: 3,800 lines of IR to emit, 4.7
    times the scalar code's)."""
    return bool(level_features(level) & {"avx2", "avx512f"})


def has_scatters(level: CpuLevel) -> bool:
    """Whether the level scatters the lanes of a width-W chunk with vector instructions, and
    gathers them with instructions LLVM's tuning of the level uses as they are: AVX-512 (not
    AVX2, whose generic tuning loads a gather's lanes one by one; not SVE, see has_gathers)."""
    return "avx512f" in level_features(level)


def vector_bits(level: CpuLevel) -> int:
    """The width of the level's vector registers, from the features its code may use."""
    features = level_features(level)
    if "avx512f" in features:
        return 512
    if "avx2" in features or "avx" in features:
        return 256
    return 128


def gathering_chunk_features(level: CpuLevel) -> str:
    """The LLVM features of a width-W chunk that gathers from data-dependent addresses, at
    `level`: the level's own, and `+fast-gather` where it has AVX2's gather instructions but not
    AVX-512's. LLVM's tuning of the generic x86-64-v3 CPU (and of AVX2 CPUs whose gathers it
    deems slow) lowers a masked gather to a branch and a load per lane, where such a task was
    widened for its gathers (widen_plan): DiffMPM's P2G gradient at x86-64-v3 was 4,600
    instructions (1,900 at x86-64-v4), 170 of its 240 ms of object emission, and ran its
    backward pass slower than with the gather instructions (5.33 against 5.09 ms, one thread,
    an AVX-512 host forced to x86-64-v3). Strided accesses alone (a vector field's components)
    keep LLVM's choice: there the lanes' loads were faster (n-body's kick: 0.100 against
    0.109 ms)."""
    features = level_features(level)
    if "avx2" in features and "avx512f" not in features:
        return ",".join(f for f in (level.llvm_features, "+fast-gather") if f)
    return level.llvm_features


class TaskChoice:
    """One task's lowering: its plan (None: scalar, `reason` says why) and W per level."""

    def __init__(self, task: ir.Task, levels: tuple):
        found = plan(task)
        self.plan: WidenPlan | None = found if isinstance(found, WidenPlan) else None
        self.reason = None if self.plan else found
        self.lanes = tuple(level_lanes(self.plan, vector_bits(level)) for level in levels) if self.plan else ()
        if self.plan and self.plan.gathers_only:
            # The lowest levels without gather instructions keep the scalar code (lanes 1): their
            # lanes would load one by one, and emitting that code was a fifth of the build time
            # (DiffMPM's P2G gradient: 0.75 -> 0.61 s portable). Only CPUs without AVX2 run that
            # level: there G2P's scalar code is faster (0.073 against 0.079 ms), P2G.grad's 1.3x
            # slower (0.26 against 0.20 ms).
            scalar = 0
            while scalar < len(levels) and not has_gathers(levels[scalar]):
                scalar += 1
            self.lanes = (1,) * scalar + self.lanes[scalar:]
            if scalar == len(levels):
                self.plan, self.reason = None, "no inner loop, and no gather instructions at the ISA level"
            elif scalar:
                reasons = [self.plan.registers_reason] if self.plan.registers_reason else []
                reasons.append(f"scalar code at {', '.join(level.name for level in levels[:scalar])} (no gathers)")
                self.plan.registers_reason = "; ".join(reasons)
        self.level_names = tuple(level.name for level in levels)
        # Per level, how the loads read once before a loop and the updates of an iteration's own
        # elements (widen_plan) touch memory: True, vector gathers and scatters; False, a loop of
        # scalar accesses over the running lanes (a masked gather or scatter that LLVM does not
        # lower to one instruction is a branch and an access per lane: more code, once per step);
        # None where the task has neither, so that its chunks are shared by the levels of one W.
        uses = self.plan and (self.plan.invariant_loads or self.plan.own_updates)
        self.vector_memory = tuple(has_scatters(level) if uses else None for level in levels)

    @property
    def max_lanes(self) -> int:
        return max(self.lanes) if self.lanes else 1

    def record(self) -> dict:
        """What the task's launch record adds."""
        if self.plan is None:
            return {"scalar": self.reason[:200]}
        return {"lanes": self.max_lanes, **({"lanes_reason": self.plan.registers_reason[:200]}
                                             if self.plan.registers_reason else {})}


class CpuKernelCodegen(KernelCodegen):
    """The shared lowering, with the width-W chunk for the tasks `choices` widens. The chunk
    of level i > 0 whose W differs from level 0's is emitted as `overrides[(chunk, i)]`."""

    def __init__(self, *args, choices: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = choices
        self.overrides: dict = {}
        self.gathering_chunks: set = set()  # width-W chunks compiled with gathering_chunk_features

    # A huge scalar task body's large regions are functions of their own, which the module's
    # parts compile in parallel (llvm_outline.py, cpu/module_split.py).
    outlined_regions = staticmethod(outlined_regions)
    emit_outlined = staticmethod(emit_outlined)

    def emit_chunk(self, task: ir.Task):
        choice = self.choices.get(task)
        # Updates of elements no other iteration writes need no atomics: in a scalar chunk,
        # whoever runs it, the loop vectoriser widens their plain read-modify-writes, with no copy
        # of the loop for a thread that runs alone (nbody.drift portable: 62 -> 46 ms of CPU)
        self.plain_updates = choice.plan.own_updates if choice is not None and choice.plan else own_updates(task)
        if choice is None or choice.plan is None:
            return super().emit_chunk(task)
        name = task.task_name + "_chunk"
        forms = tuple(zip(choice.lanes, choice.vector_memory))
        made = {forms[0]: name}
        with timings.phase(timings.level_phase(choice.level_names[0])):
            if choice.lanes[0] == 1:  # this level keeps the scalar code (TaskChoice)
                fn = super().emit_chunk(task)
            else:
                fn = emit_wide_chunk(self, task, choice.plan, *forms[0], name)
        for i, form in enumerate(forms[1:], start=1):
            if form not in made:
                lanes, vector_memory = form
                made[form] = f"{name}.lanes{lanes}" + {None: "", True: ".vector", False: ".by_lane"}[vector_memory]
                with timings.phase(timings.level_phase(choice.level_names[i])):
                    emit_wide_chunk(self, task, choice.plan, lanes, vector_memory, made[form])
            if made[form] != name:
                self.overrides[(name, i)] = made[form]
        if choice.plan.data_dependent_loads:
            self.gathering_chunks.update(made[form] for form in made if form[0] > 1)
        return fn


def task_choices(kernel: ir.KernelIR, levels: tuple) -> dict:
    return {task: TaskChoice(task, levels) for task in kernel.tasks if task.kind == "range_for"}


def has_adstacks(task: ir.Task) -> bool:
    return any(isinstance(s, AdStackAlloca) for s in task.body.stmts)
