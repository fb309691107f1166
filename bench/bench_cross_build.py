"""What a second CPU ISA family costs a build: `python3 bench/bench_cross_build.py [--rounds 5]`.

Builds the demo kernels (kernels/*.py: every kernel and gradient) cold, into a fresh cache
folder each time, in this process with one job, for `cpu_targets` x86_64 alone, x86_64 +
aarch64 (Linux and macOS libraries) and x86_64 + aarch64-linux, rounds interleaved so that
load drifts hit each alike. Times are CPU seconds of this process and its children (the
linkers), which the other processes of a shared machine disturb less than wall time; the
first round warms imports and LLVM up and is not counted. Each build ends the LLD servers it
started (compiler/targets/cpu/link_server.py), so that their time counts too. Reports per configuration the
median and best, and what the aarch64 libraries add over x86_64 alone as a multiple of the
x86_64 build: (both - x86_64) / x86_64 (the goal: at most 1.0).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIGS = [("x86_64", "x86_64"), ("x86_64,aarch64", "x86_64 + aarch64 (Linux, macOS)"),
           ("x86_64,aarch64-linux", "x86_64 + aarch64 Linux")]


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def build_once(sources: list, cpu_targets: str, folder: str) -> float:
    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver.options import resolve
    from qdc.compiler.targets.cpu.link_server import close_servers as close_lld_servers
    cache = os.path.join(folder, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    opts = resolve({"cpu_targets": cpu_targets}, {})
    start = cpu_seconds()
    report = build_mod.build(sources, ["cpu"], opts, cache, jobs=1, log=lambda text: None, out=lambda text: None)
    close_lld_servers()  # reaped: their CPU time and that of the links they forked count as children's
    took = cpu_seconds() - start
    if not report.ok or report.cached:
        raise SystemExit(f"the build failed or was not cold: {report.errors}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sources = [str(p) for p in sorted((HERE.parent / "kernels").glob("*.py")) if p.name != "run_example.py"]
    times = {key: [] for key, _ in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="qdc-cross-bench-") as folder:
        for key, _ in CONFIGS:  # warm-up: imports, LLVM's targets, the linkers' first runs
            build_once(sources, key, folder)
        for _ in range(args.rounds):
            for key, _ in CONFIGS:
                times[key].append(build_once(sources, key, folder))
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = Path("/proc/loadavg").read_text(encoding="utf-8").split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"demo kernels ({len(sources)} modules), -j1, {args.rounds} rounds, commit {commit}, "
          f"{platform.machine()} with {os.cpu_count()} CPUs, load {load}\n")
    print("| cpu_targets | CPU s median | best | added over x86_64 alone (x the x86_64 build) |\n|---|---|---|---|")
    base = statistics.median(times["x86_64"])
    for key, label in CONFIGS:
        median = statistics.median(times[key])
        added = "—" if key == "x86_64" else f"{(median - base) / base:.2f}x"
        print(f"| {label} | {median:.2f} | {min(times[key]):.2f} | {added} |")


if __name__ == "__main__":
    main()
