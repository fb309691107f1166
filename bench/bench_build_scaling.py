"""`qdc build` throughput and `-j` scaling: `python3 bench/bench_build_scaling.py [--kernels 64]`.

Generates one module of small kernels (an elementwise expression each, all different, so
nothing is shared between cache entries) in a temporary folder and builds it cold (a fresh
cache folder every run) with `qdc build -j N` for N in 1, 2, 4, 8, 16 (capped at the CPU
count), rounds interleaved so that load drifts hit every N alike. Reports per N the whole
command's wall time, min and median of the rounds, and the speed-up over -j1 (from the
minima), of the whole command and of its build phase (less the one-kernel build); per kernel at -j1: (whole command - a build of the same module with one kernel)
/ (kernels - 1), so interpreter start-up and imports are not counted per kernel. Needs no
network; prints a table with the machine's CPU count and load average.

Options: --kernels K (default 64), --rounds R (default 5), --cpu-target (default: qdc's,
portable), --jobs 1,2,4 (which N). `--phases`: instead, build the module once in this process
(after a one-kernel warm-up build) and print the CPU time per kernel of each phase (front end
and driver, passes, llvmlite IR, LLVM parse/optimise/emit, ld, cache key), `ld`'s own CPU
time included.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPRESSIONS = ["a[i] * {c} + b[i]", "qd.sin(a[i]) * {c}", "a[i] * a[i] - {c} * b[i]", "qd.sqrt(a[i] * a[i] + {c})",
               "max(a[i], b[i]) * {c}", "qd.exp(-a[i] * {c})", "(a[i] + b[i]) / ({c} + abs(b[i]))",
               "qd.floor(a[i] * {c})"]


def module_source(kernels: int) -> str:
    lines = ["import qdc as qd", "", "F = qd.types.ndarray(dtype=qd.f32, ndim=1)", ""]
    for k in range(kernels):
        expr = EXPRESSIONS[k % len(EXPRESSIONS)].format(c=f"{1.0 + k / 8:.3f}")
        lines += ["@qd.kernel", f"def k{k}(out: F, a: F, b: F):", "    for i in range(out.shape[0]):",
                  f"        out[i] = {expr}", ""]
    return "\n".join(lines)


def build_seconds(folder: Path, kernels: int, jobs: int, cpu_target: str | None) -> float:
    cache = folder / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cmd = [sys.executable, "-c", "from qdc.cli.main import main; main()", "build", str(folder / f"mod{kernels}"),
           "--cache", str(cache), "-j", str(jobs)]
    if cpu_target:
        cmd += ["--cpu-target", cpu_target]
    env = {k: v for k, v in os.environ.items() if k != "QDC_CACHE_DIR"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if out.returncode or f"{kernels} built" not in out.stdout + out.stderr:
        raise SystemExit(f"qdc build failed or built too little:\n{out.stdout}\n{out.stderr}")
    return seconds


def phases(kernels: int, cpu_target: str | None) -> None:
    """CPU time per kernel of each phase of an in-process build (see the module docstring)."""
    import collections
    import functools

    import llvmlite.binding as llvm

    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver import cache_key, options
    from qdc.compiler.passes import pipeline
    from qdc.compiler.targets.cpu import codegen
    spent: collections.Counter = collections.Counter()
    nested: list = []

    def timed(label, fn):  # self time: what nested timed calls spend is theirs
        @functools.wraps(fn)
        def run(*a, **k):
            t0 = time.process_time()
            nested.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                took, inner = time.process_time() - t0, nested.pop()
                spent[label] += took - inner
                if nested:
                    nested[-1] += took
        return run
    for owner, name, label in [(build_mod, "run_job", "front end, driver, cache write"),
                               (cache_key, "kernel_key", "cache key"), (pipeline, "run_pipeline", "passes"),
                               (codegen, "generate_llvm", "llvmlite IR"), (codegen, "multiversioned_ir", "IR text"),
                               (llvm, "parse_assembly", "LLVM parse"), (codegen, "optimise", "LLVM optimise"),
                               (codegen, "link_shared_library", "link (this process)")]:
        if hasattr(owner, name):  # older revisions lack some (compared with PYTHONPATH=<checkout>)
            setattr(owner, name, timed(label, getattr(owner, name)))
    machine = type(codegen._target_machine(3))
    machine.emit_object = timed("LLVM emit", machine.emit_object)
    opts = build_mod._options_for(options.Options().update(cpu_target=cpu_target), "cpu")
    with tempfile.TemporaryDirectory() as d:
        for k, name in ((1, "warm"), (kernels, "mod")):
            (Path(d) / name).mkdir()
            (Path(d) / name / f"{name}.py").write_text(module_source(k).replace("def k", f"def {name}_k"), encoding="utf-8")
        build_mod.build([f"{d}/warm"], ["cpu"], opts, f"{d}/cache", out=lambda text: None)
        spent.clear()
        c0, t0 = os.times(), time.perf_counter()
        build_mod.build([f"{d}/mod"], ["cpu"], opts, f"{d}/cache", out=lambda text: None)
        c1, wall = os.times(), time.perf_counter() - t0
    spent["ld (child processes)"] = c1.children_user + c1.children_system - c0.children_user - c0.children_system
    total = c1.user + c1.system - c0.user - c0.system + spent["ld (child processes)"]
    load = Path("/proc/loadavg").read_text(encoding="utf-8").split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"cpu_target {opts.cpu_target}, {kernels} kernels, load {load}: per kernel {1e3 * total / kernels:.1f} ms "
          f"CPU, {1e3 * wall / kernels:.1f} ms wall\n\n| phase | CPU ms per kernel |\n|---|---|")
    for label, seconds in spent.most_common():
        print(f"| {label} | {1e3 * seconds / kernels:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu-target", default=None)
    ap.add_argument("--jobs", default=None, help="comma-separated N (default 1,2,4,8,16 up to the CPU count)")
    ap.add_argument("--phases", action="store_true", help="CPU time per phase of one in-process -j1 build")
    args = ap.parse_args()
    if args.phases:
        phases(args.kernels, args.cpu_target)
        return 0
    cpus = os.cpu_count() or 1
    jobs = [int(n) for n in args.jobs.split(",")] if args.jobs else [n for n in (1, 2, 4, 8, 16) if n <= cpus]
    load_before = Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3] if Path("/proc/loadavg").exists() else "?"
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for k in (1, args.kernels):
            (folder / f"mod{k}").mkdir()
            (folder / f"mod{k}" / f"gen{k}.py").write_text(module_source(k), encoding="utf-8")
        times: dict = {n: [] for n in jobs}
        one: list = []
        for _ in range(args.rounds):
            one.append(build_seconds(folder, 1, 1, args.cpu_target))
            for n in jobs:
                times[n].append(build_seconds(folder, args.kernels, n, args.cpu_target))
    load_after = Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3] if Path("/proc/loadavg").exists() else "?"
    base = min(times[jobs[0]]) if jobs[0] == 1 else None
    print(f"{cpus} CPUs, load average {load_before} before, {load_after} after; "
          f"cpu_target {args.cpu_target or 'default (portable)'}; {args.kernels} kernels; "
          f"min / median of {args.rounds} rounds\n")
    fixed = min(one)  # start-up, imports and one kernel: what -j cannot spread
    print("| -j N | whole command (s) | speed-up over -j1 | speed-up / N | build phase: speed-up / N |\n"
          "|---|---|---|---|---|")
    for n in jobs:
        best = min(times[n])
        cells = [f"{base / best:.2f}", f"{base / best / n:.2f}",
                 f"{(base - fixed) / max(best - fixed, 1e-9) / n:.2f}"] if base else ["—"] * 3
        print(f"| {n} | {best:.2f} / {statistics.median(times[n]):.2f} | " + " | ".join(cells) + " |")
    print(f"\nbuild phase: the whole command less the build of a one-kernel module ({fixed:.2f} s: "
          f"interpreter start-up, imports, one kernel), which no number of workers shortens.")
    if base:
        per_kernel = (base - fixed) / (args.kernels - 1) * 1e3
        print(f"per kernel at -j1: {per_kernel:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
