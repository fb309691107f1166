"""Where compiling a kernel variant spends its time: `qdc build --timings` and, in direct mode,
`QDC_LOG=timings`.

The stages mark their phases (`with phase("LLVM optimisation"):`); `recording()` collects them
for one kernel variant. Each phase counts its own time only: a phase inside another (the passes
that autodiff runs) is taken out of the outer one, so the phases of a kernel add up to its
compile time. Time is measured twice: wall time, and CPU time of the compiling thread plus that
of the programs it ran through `run_tool` (`ld`), which on a busy machine says more than wall
time does. Nothing is recorded outside `recording()`: a phase then costs two attribute lookups.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time

# The order in which a table shows the phases (others after these, in the order they ran).
ORDER = ("front end", "passes", "autodiff", "IR generation", "IR multiversioning", "IR text", "LLVM parse",
         "LLVM optimisation", "object emission", "linking", "PTX emission", "SPIR-V generation",
         "SPIR-V validation", "SPIR-V to MSL", "artifacts", "cache key", "cache write")

_local = threading.local()


class KernelTimings:
    """Phase name -> [wall seconds, CPU seconds], in the order the phases first ran."""

    def __init__(self, phases: dict | None = None):
        self.phases: dict = {name: list(pair) for name, pair in (phases or {}).items()}

    def add(self, name: str, wall: float, cpu: float) -> None:
        pair = self.phases.setdefault(name, [0.0, 0.0])
        pair[0] += wall
        pair[1] += cpu

    @property
    def wall(self) -> float:
        return sum(w for w, _ in self.phases.values())

    @property
    def cpu(self) -> float:
        return sum(c for _, c in self.phases.values())

    def ordered(self) -> list[tuple[str, float, float]]:
        """(phase, wall, CPU) in the order of ORDER; each ISA level's IR generation after the
        shared one, unknown phases last."""
        def rank(name: str) -> float:
            if name in ORDER:
                return ORDER.index(name)
            return ORDER.index("IR generation") + 0.5 if name.startswith("IR generation ") else len(ORDER)
        return [(n, *self.phases[n]) for n in sorted(self.phases, key=rank)]

    def to_wire(self) -> dict:
        """JSON-able (a build worker sends it with its result)."""
        return {name: [round(w, 6), round(c, 6)] for name, (w, c) in self.phases.items()}


@contextlib.contextmanager
def recording(into: KernelTimings | None = None):
    """Collect the phases run by this thread inside the block into `into` (a new one if None)."""
    timings = into if into is not None else KernelTimings()
    saved = getattr(_local, "frames", None)
    _local.frames = [timings]  # the first frame is the recorder; the others are open phases
    try:
        yield timings
    finally:
        _local.frames = saved


class _Frame:
    __slots__ = ("name", "wall0", "cpu0", "inner_wall", "inner_cpu")

    def __init__(self, name: str):
        self.name, self.inner_wall, self.inner_cpu = name, 0.0, 0.0
        self.wall0, self.cpu0 = time.perf_counter(), time.thread_time()


@contextlib.contextmanager
def phase(name: str):
    """Time the block as phase `name` of the kernel variant being recorded, if any."""
    frames = getattr(_local, "frames", None)
    if not frames:
        yield
        return
    frame = _Frame(name)
    frames.append(frame)
    try:
        yield
    finally:
        frames.pop()
        wall, cpu = time.perf_counter() - frame.wall0, time.thread_time() - frame.cpu0
        frames[0].add(name, wall - frame.inner_wall, cpu - frame.inner_cpu)
        if len(frames) > 1:
            frames[-1].inner_wall += wall
            frames[-1].inner_cpu += cpu


def run_tool(command: list) -> tuple[int, str]:
    """Run a program to completion: (exit code, its stdout and stderr together). Its CPU time
    counts to the phase being recorded (this process's other children, such as build workers,
    are not counted: the child is reaped here, by its pid)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with proc:
        output = proc.stdout.read()
        if not hasattr(os, "wait4"):  # Windows: the tool's time is not counted
            return proc.wait(), output
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    count_tool_cpu(usage.ru_utime + usage.ru_stime)
    return proc.returncode, output


def count_tool_cpu(seconds: float) -> None:
    """Count the CPU time of a program run for the phase being recorded to that phase."""
    frames = getattr(_local, "frames", None)
    if frames and len(frames) > 1:
        frames[0].add(frames[-1].name, 0.0, seconds)


def count_threads(steps: list[dict], wall: float) -> None:
    """Count the phases other threads ran for the variant being recorded, each thread's
    `steps` {phase: [wall, CPU seconds]}, while this one waited `wall` seconds for them: their
    CPU time as it is, their wall time in proportion to that (so that the phases still add up
    to the variant's wall time)."""
    frames = getattr(_local, "frames", None)
    if not frames:
        return
    total = sum(w for thread in steps for w, _ in thread.values()) or 1.0
    for thread in steps:
        for name, (w, c) in thread.items():
            frames[0].add(name, w * wall / total, c)
    if len(frames) > 1:
        frames[-1].inner_wall += wall


def level_phase(level_name: str) -> str:
    """The phase of generating the code of one ISA level (its width-W task bodies)."""
    return f"IR generation {level_name}"


def table(rows: list[tuple[str, str, KernelTimings]], limit: int | None = None) -> str:
    """A text table, largest kernels first: one line per (kernel variant, arch) with its total
    CPU and wall milliseconds and the CPU time of each phase, costliest first; then the phases
    summed over all rows."""
    rows = sorted(rows, key=lambda r: (-r[2].cpu, r[0], r[1]))
    lines = ["qdc build: where the time went (CPU ms / wall ms; CPU includes the linker's)",
             f"  {'kernel':<40} {'arch':<7} {'CPU':>8} {'wall':>8}  phases (CPU ms)"]
    for name, arch, t in rows[:limit]:
        phases = ", ".join(f"{p} {1e3 * c:.1f}" for p, _, c in sorted(t.ordered(), key=lambda x: -x[2]))
        lines.append(f"  {name:<40} {arch:<7} {1e3 * t.cpu:8.1f} {1e3 * t.wall:8.1f}  {phases}")
    if limit is not None and len(rows) > limit:
        lines.append(f"  ... and {len(rows) - limit} more")
    total = KernelTimings()
    for _, _, t in rows:
        for p, w, c in t.ordered():
            total.add(p, w, c)
    lines.append(f"  {'all ' + str(len(rows)) + ' kernel variants':<48} {1e3 * total.cpu:8.1f} {1e3 * total.wall:8.1f}")
    for p, w, c in total.ordered():
        lines.append(f"    {p:<46} {1e3 * c:8.1f} {1e3 * w:8.1f}")
    return "\n".join(lines)


def describe(name: str, arch: str, t: KernelTimings) -> str:
    """One line for QDC_LOG=timings: a kernel variant's phases in the order they run."""
    phases = ", ".join(f"{p} {1e3 * c:.1f}/{1e3 * w:.1f}" for p, w, c in t.ordered())
    return f"{name} ({arch}): {1e3 * t.cpu:.1f} ms CPU, {1e3 * t.wall:.1f} ms wall; CPU/wall ms: {phases}"
