"""A program whose kernels are instantiated from config objects at run time: first process
(compiling), second process (template arguments keyed by value: from the cache), and an offline
process (QDC_OFFLINE=1) from a cache built by `qdc build --manifest` in another process.

    python3 bench/bench_offline.py [--kernels N] [--rounds R]

The program makes N kernels, each taking a config object (a frozen dataclass of numbers, an
enum and a field) as a template argument, and launches each once. Timed inside each process:
from `qd.init` to the end of the first launches (the start-up a user waits for), and the whole
process as the parent sees it (interpreter, imports and exit included); min and median of R
fresh processes each. Also: whether the offline process imported llvmlite.
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

PROGRAM_HEADER = '''import dataclasses
import enum
import json
import sys
import time

import qdc as qd


class Mode(enum.Enum):
    PLAIN = 1
    DAMPED = 2


@dataclasses.dataclass(frozen=True)
class Config:
    n: int
    damping: float
    mode: Mode
    data: object
'''

KERNEL = '''

@qd.kernel
def step{i}(cfg: qd.template(), dt: qd.f32):
    for j in cfg.data:
        v = cfg.data[j] + {i}.0 * dt
        if qd.static(cfg.mode == Mode.DAMPED):
            v = v * (1.0 - cfg.damping)
        cfg.data[j] = v
'''

PROGRAM_MAIN = '''

if __name__ == "__main__":
    t0 = time.perf_counter()
    qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
    data = qd.field(qd.f32, shape=1024, name="data")
    cfg = Config(1024, 0.01, Mode.DAMPED, data)
    for k in KERNELS:
        k(cfg, 0.1)
    data.to_numpy()
    from qdc.compiler.jit.offline_cache import Counts
    print(json.dumps({"seconds": time.perf_counter() - t0, "compiled": Counts.compiled,
                      "llvmlite": "llvmlite" in sys.modules}))
'''


def write_program(folder: str, n: int) -> str:
    path = os.path.join(folder, "configured.py")
    body = PROGRAM_HEADER + "".join(KERNEL.format(i=i) for i in range(n))
    body += f"\n\nKERNELS = [{', '.join(f'step{i}' for i in range(n))}]\n" + PROGRAM_MAIN
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return path


def env(**extra) -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("QDC_OFFLINE", "QDC_RECORD")}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(ROOT), out.get("PYTHONPATH")) if p)
    return {**out, **extra}


def run(program: str, cache: str, **extra) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, program, cache], capture_output=True, text=True, env=env(**extra))
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process"] = wall
    return result


def qdc(*args, cwd: str) -> None:
    done = subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env=env())
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)


def summary(name: str, runs: list) -> dict:
    inside = [r["seconds"] for r in runs]
    process = [r["process"] for r in runs]
    return {"case": name, "compiled": runs[-1]["compiled"], "llvmlite": runs[-1]["llvmlite"],
            "start_min_s": min(inside), "start_median_s": statistics.median(inside),
            "process_min_s": min(process), "process_median_s": statistics.median(process)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        program = write_program(tmp, args.kernels)
        cold, warm = [], []
        for r in range(args.rounds):
            cache = os.path.join(tmp, f"direct{r}")
            cold.append(run(program, cache))
            warm.append(run(program, cache))
        manifest = os.path.join(tmp, "kernels.manifest")
        qdc("record", "-o", manifest, "--", sys.executable, program, os.path.join(tmp, "recording"), cwd=tmp)
        t0 = time.perf_counter()
        qdc("build", "--manifest", manifest, "--cache", os.path.join(tmp, "built"), "-j", "1", cwd=tmp)
        build_seconds = time.perf_counter() - t0
        offline = [run(program, os.path.join(tmp, "built"), QDC_OFFLINE="1") for _ in range(args.rounds)]
    rows = [summary("first process (compiles)", cold), summary("second process (from the cache)", warm),
            summary("offline, cache built from the manifest", offline)]
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"case": "qdc build --manifest (separate process, empty cache)", "seconds": build_seconds}))
    print(f"\n| case ({args.kernels} kernels) | compiled | start-up min / median | process min / median | llvmlite |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        start = f"{row['start_min_s'] * 1e3:.0f} / {row['start_median_s'] * 1e3:.0f} ms"
        print(f"| {row['case']} | {row['compiled']} | {start} "
              f"| {row['process_min_s'] * 1e3:.0f} / {row['process_median_s'] * 1e3:.0f} ms | "
              f"{'imported' if row['llvmlite'] else 'not imported'} |")


if __name__ == "__main__":
    main()
