"""Ahead-of-time figures: build throughput, cache hits, and load + first launch vs compiling.

    python3 bench/bench_aot.py [--kernels N] [--rounds R] [--only build|load]

1. `qdc build kernels/` into an empty cache (cold) and again (all hits): times, ratio, and
   kernels compiled per second cold.
2. A generated module of N kernels (default 50): in a fresh process, `qdc.runtime.load()` time
   and first-launch latency after it, against a cold direct-mode compile + first launch of the
   same module in another fresh process. Goal: load + first launches >= 50x faster. Both
   after import (the operation itself, timed inside the process) and as a whole process
   (interpreter start-up, imports and exit included, timed by the parent): min and median
   of --rounds fresh processes each. First launches wake the worker threads: on a machine
   busy with other work that can take scheduler ticks (ms), hence a second run with one
   worker thread, which shows the loader's own cost.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODULE_HEADER = '''import qdc as qd

out = qd.field(qd.f32, shape=1024)
'''

KERNEL_TEMPLATE = '''

@qd.kernel
def k{i}(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for j in range(a.shape[0]):
        v = a[j] * s + {i}.0
        for _ in range({reps}):
            v = v * 0.5 + qd.sqrt(abs(v)) * {c}
        out[j % 1024] = v
'''

LOAD_CHILD = '''
import time
t_start = time.perf_counter()
import json, sys
import numpy as np
from qdc.runtime import context, load
t_imported = time.perf_counter()
if sys.argv[3] != "all":
    context.reset("cpu", int(sys.argv[3]))
a = np.ones(4096, np.float32)
t0 = time.perf_counter()
mod = load(sys.argv[1], "fifty")
t1 = time.perf_counter()
mod.k0(a, 1.5)
t2 = time.perf_counter()
for i in range(1, int(sys.argv[2])):
    getattr(mod, f"k{i}")(a, 1.5)
t3 = time.perf_counter()
assert not any(m.startswith(("qdc.compiler", "llvmlite")) for m in sys.modules)
print(json.dumps({"import": t_imported - t_start, "load": t1 - t0, "first_launch": t2 - t1,
                  "all_first_launches": t3 - t1}))
'''

DIRECT_CHILD = '''
import time
t_start = time.perf_counter()
import importlib.util, json, sys
import numpy as np
import qdc as qd
t_imported = time.perf_counter()
qd.init(arch=qd.cpu, cache_dir=sys.argv[2])
spec = importlib.util.spec_from_file_location("fifty", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
a = np.ones(4096, np.float32)
t0 = time.perf_counter()
mod.k0(a, 1.5)
t1 = time.perf_counter()
for i in range(1, int(sys.argv[3])):
    getattr(mod, f"k{i}")(a, 1.5)
t2 = time.perf_counter()
print(json.dumps({"import": t_imported - t_start, "first_kernel": t1 - t0, "all": t2 - t0}))
'''


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return r


def timed_build(paths, cache, *extra):
    t0 = time.perf_counter()
    r = run([sys.executable, "-m", "qdc.cli.main", "build", *paths, "--cache", cache, *extra])
    return time.perf_counter() - t0, r.stdout.strip().splitlines()[-1]  # the summary


def child_json(code, *args):
    return timed_child(code, *args)[0]


def timed_child(code, *args):
    """The child's JSON line, and the wall time of the whole process (interpreter start-up,
    imports and exit included)."""
    t0 = time.perf_counter()
    out = run([sys.executable, "-c", code, *args]).stdout
    return json.loads(out.strip().splitlines()[-1]), time.perf_counter() - t0


def min_median(values) -> str:
    return f"{min(values) * 1e3:8.1f} / {statistics.median(values) * 1e3:8.1f} ms"


def bench_build(tmp):
    kernels = os.path.join(ROOT, "kernels")
    cache = os.path.join(tmp, "build-cache")
    cold, cold_line = timed_build([kernels], cache)
    hits, hits_line = timed_build([kernels], cache)
    n = int(cold_line.split(": ")[2].split(" built")[0])
    cold_j1, _ = timed_build([kernels], os.path.join(tmp, "build-cache-j1"), "-j", "1")
    native, native_line = timed_build([kernels], os.path.join(tmp, "build-cache-native"), "--cpu-target", "native")
    print("## qdc build kernels/ (wall time of the whole command, interpreter start-up included)")
    print(f"  cold  -j{os.cpu_count()}: {cold:6.2f} s   ({cold_line})")
    print(f"  cold  -j1: {cold_j1:6.2f} s   -> {n / cold_j1:.1f} kernels/s on one process, "
          f"{n / cold:.1f} kernels/s with -j{os.cpu_count()}")
    print(f"  cold, --cpu-target native (one library instead of one per ISA level): {native:6.2f} s   ({native_line})")
    print(f"  all hits : {hits:6.2f} s   ({hits_line})")
    inside = [float(line.rsplit(" in ", 1)[1].split()[0]) for line in (cold_line, hits_line)]
    print(f"  cold / all-hits ratio: {cold / hits:.1f}x for the whole command, "
          f"{inside[0] / max(inside[1], 0.01):.0f}x for the build itself (as the summaries time it)")


def bench_load(tmp, n_kernels, rounds):
    src_dir = os.path.join(tmp, "gen")
    os.makedirs(src_dir)
    path = os.path.join(src_dir, "fifty.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(MODULE_HEADER + "".join(KERNEL_TEMPLATE.format(i=i, reps=1 + i % 4, c=0.1 + 0.01 * i)
                                        for i in range(n_kernels)))
    cache = os.path.join(tmp, "fifty-cache")
    timed_build([src_dir], cache)
    # every round a cold compile: a cache of its own
    direct = [timed_child(DIRECT_CHILD, path, os.path.join(tmp, f"direct-cache-{r}"), str(n_kernels))
              for r in range(rounds)]
    direct_after_import = [d["all"] for d, _ in direct]
    direct_whole = [wall for _, wall in direct]
    print(f"\n## a module of {n_kernels} kernels: min / median of {rounds} fresh processes each")
    print(f"  direct mode, cold compile + first launch of all {n_kernels}:")
    print(f"    after import:   {min_median(direct_after_import)}   (import qdc: "
          f"{min_median([d['import'] for d, _ in direct])})")
    print(f"    whole process:  {min_median(direct_whole)}")
    for threads in ("all", "1"):
        loads = [timed_child(LOAD_CHILD, cache, str(n_kernels), threads) for _ in range(rounds)]
        after_import = [d["load"] + d["all_first_launches"] for d, _ in loads]
        whole = [wall for _, wall in loads]
        print(f"  AOT, worker threads: {threads}")
        print(f"    qdc.runtime.load():                 {min_median([d['load'] for d, _ in loads])}")
        print(f"    first launch after load (1 kernel): {min_median([d['first_launch'] for d, _ in loads])}")
        print(f"    import of qdc.runtime:              {min_median([d['import'] for d, _ in loads])}")
        print(f"    after import (load + first launch of all {n_kernels}): {min_median(after_import)}")
        print(f"    whole process:                      {min_median(whole)}")
        print(f"    speed-up over compiling, medians: after import "
              f"{statistics.median(direct_after_import) / statistics.median(after_import):.0f}x (goal >= 50x), "
              f"whole process {statistics.median(direct_whole) / statistics.median(whole):.1f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=int, default=50, help="kernels in the generated module (50)")
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per load figure (5)")
    ap.add_argument("--only", choices=("build", "load"), help="run one of the two parts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qdc-bench-aot-") as tmp:
        if args.only in (None, "build"):
            bench_build(tmp)
        if args.only in (None, "load"):
            bench_load(tmp, args.kernels, args.rounds)


if __name__ == "__main__":
    main()
