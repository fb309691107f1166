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
portable), --jobs 1,2,4 (which N).
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu-target", default=None)
    ap.add_argument("--jobs", default=None, help="comma-separated N (default 1,2,4,8,16 up to the CPU count)")
    args = ap.parse_args()
    cpus = os.cpu_count() or 1
    jobs = [int(n) for n in args.jobs.split(",")] if args.jobs else [n for n in (1, 2, 4, 8, 16) if n <= cpus]
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else "?"
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for k in (1, args.kernels):
            (folder / f"mod{k}").mkdir()
            (folder / f"mod{k}" / f"gen{k}.py").write_text(module_source(k))
        times: dict = {n: [] for n in jobs}
        one: list = []
        for _ in range(args.rounds):
            one.append(build_seconds(folder, 1, 1, args.cpu_target))
            for n in jobs:
                times[n].append(build_seconds(folder, args.kernels, n, args.cpu_target))
    load_after = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else "?"
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
