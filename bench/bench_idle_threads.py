"""What qdc's idle worker threads cost the rest of the process: `python3 bench/bench_idle_threads.py`.

For each libgomp setting (qdc's default, and libgomp's own default: `GOMP_SPINCOUNT` unset, as
qdc's default before it capped the spin) a fresh worker process measures, min and median of rounds:
- spin after a launch: the CPU time the process burns in the 20 ms after a parallel launch
  while the launching thread sleeps (only idle workers run then), per worker thread;
- a numpy copy (64 MiB) right after each parallel launch, in GB/s, against the same copy with
  no qdc launch before it (the copy's own thread competes with spinning workers);
- back-to-back launches of a small parallel kernel (2^16 f32 saxpy) and of a larger one
  (2^20), so that a shorter spin is seen not to slow them.
Prints a table with the machine's load average.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 7

WORKER = r'''
import json, statistics, sys, time
import numpy as np
import qdc as qd
qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
f32 = qd.types.ndarray(dtype=qd.f32, ndim=1)

@qd.kernel
def saxpy(y: f32, x: f32, a: qd.f32):
    for i in range(y.shape[0]):
        y[i] = a * x[i] + y[i]

small = [np.ones(1 << 16, np.float32) for _ in range(2)]
big = [np.ones(1 << 20, np.float32) for _ in range(2)]
src, dst = np.ones(1 << 24, np.float32), np.zeros(1 << 24, np.float32)
saxpy(*small, 0.5); saxpy(*big, 0.5)
threads = qd.cpu_threads() if hasattr(qd, "cpu_threads") else None
out = {"spin_ms": [], "copy_after_launch": [], "copy_alone": [], "launch_small_us": [], "launch_big_us": []}
for _ in range(int(sys.argv[2])):
    saxpy(*big, 0.5)
    c0 = time.process_time(); time.sleep(0.02); spin = time.process_time() - c0
    out["spin_ms"].append(spin * 1e3)
    for key, launch in (("copy_alone", False), ("copy_after_launch", True)):
        times = []
        for _ in range(8):
            if launch:
                saxpy(*small, 0.5)
            else:
                time.sleep(0.0001)  # stands in for the launch's time, so that both copies start alike
            t0 = time.perf_counter(); np.copyto(dst, src); times.append(time.perf_counter() - t0)
            time.sleep(0.0002)
        out[key].append(2 * src.nbytes / statistics.median(times) / 1e9)
    for key, arrays, n in (("launch_small_us", small, 2000), ("launch_big_us", big, 200)):
        t0 = time.perf_counter()
        for _ in range(n):
            saxpy(*arrays, 0.5)
        out[key].append((time.perf_counter() - t0) / n * 1e6)
print(json.dumps(out))
'''

SETTINGS = {"qdc's default": {}, "libgomp's default (GOMP_SPINCOUNT unset, before)": {"QDC_GOMP_SPINCOUNT": "libgomp"}}


def run_worker(folder: Path, env_extra: dict, rounds: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, str(folder / "worker.py"), str(folder / "cache"), str(rounds)],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"the worker failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    load = Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3] if Path("/proc/loadavg").exists() else "?"
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "worker.py").write_text(WORKER, encoding="utf-8")
        results = {name: {} for name in SETTINGS}
        for _ in range(2):  # alternate the settings, so that load drifts hit both alike
            for name, env in SETTINGS.items():
                for key, values in run_worker(folder, env, (ROUNDS + 1) // 2).items():
                    results[name].setdefault(key, []).extend(values)
    print(f"{os.cpu_count()} CPUs, load average {load}; min / median of {2 * ((ROUNDS + 1) // 2)} rounds\n")
    rows = [("CPU time burnt in the 20 ms after a launch (ms)", "spin_ms", min),
            ("64 MiB numpy copy right after a small launch (GB/s)", "copy_after_launch", max),
            ("the same copy with no launch before it (GB/s)", "copy_alone", max),
            ("back-to-back launches, saxpy 2^16 (µs)", "launch_small_us", min),
            ("back-to-back launches, saxpy 2^20 (µs)", "launch_big_us", min)]
    names = list(SETTINGS)
    print("| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for label, key, best in rows:
        cells = [f"{best(results[n][key]):.2f} / {statistics.median(results[n][key]):.2f}" for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
