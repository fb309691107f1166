"""Launch overhead before and after a change: `python3 bench/launch_ab.py REV [--rounds 3]`.

Exports REV into a temporary folder (`git archive`: the repository is left alone) and times the same empty-kernel launches with
that qdc and with this checkout's, in alternating worker processes (so load drifts hit both
alike), each as a median ratio to a ctypes call of a no-op C function in the same process.
Rows: 0 args; 4 args with the same numpy array / qd.ndarray every call; 4 args alternating
two numpy arrays (per launch); 4 args with a different numpy array on every call (a cycle of
64, `next()` included in the time); the reference ctypes call keeping the GIL (PyDLL, as
qdc's launch does). The figure to compare is the ratio, not the nanoseconds. The load average
of the machine is printed with the table.
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r'''
import ctypes, itertools, statistics, sys, timeit
import numpy as np
import qdc as qd
qd.init(arch=qd.cpu, cache_dir=sys.argv[2])
noop = ctypes.CDLL(sys.argv[1]).noop
noop_gil = ctypes.PyDLL(sys.argv[1]).noop

@qd.kernel
def empty0():
    pass

@qd.kernel
def empty4(a: qd.types.ndarray(dtype=qd.f32, ndim=1), x: qd.f32, n: qd.i32, y: qd.f32):
    pass

a, b = np.zeros(16, np.float32), np.zeros(16, np.float32)
d = qd.ndarray(qd.f32, shape=(16,))
fresh = itertools.cycle([np.zeros(16, np.float32) for _ in range(64)])
empty0(); empty4(a, 1.0, 2, 3.0); empty4(d, 1.0, 2, 3.0); empty4(b, 1.0, 2, 3.0)
stmts = {"noop": "noop()", "noop keeping the GIL (PyDLL)": "noop_gil()", "0 args": "empty0()",
         "4 args, numpy": "empty4(a, 1.0, 2, 3.0)", "4 args, qd.ndarray": "empty4(d, 1.0, 2, 3.0)",
         "4 args, alternating arrays": "empty4(a, 1.0, 2, 3.0); empty4(b, 1.0, 2, 3.0)",
         "4 args, a different array every call": "empty4(next(fresh), 1.0, 2, 3.0)"}
timers = {k: timeit.Timer(s, globals=globals()) for k, s in stmts.items()}
rounds = {k: [] for k in stmts}
for _ in range(30):
    for k, t in timers.items():
        rounds[k].append(t.timeit(20000) / 20000 * 1e9)
ratio = {k: statistics.median(x / y for x, y in zip(v, rounds["noop"])) for k, v in rounds.items()}
ratio["4 args, alternating arrays"] /= 2
ratio["noop ns"] = statistics.median(rounds["noop"])
print(repr(ratio))
'''


def _worker(tmp: Path, qdc_parent: Path | None, cache: str) -> dict:
    env = dict(os.environ)
    if qdc_parent is not None:
        env["PYTHONPATH"] = str(qdc_parent) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, str(tmp / "worker.py"), str(tmp / "libnoop.so"), cache],
                         capture_output=True, text=True, env=env, check=True, cwd=tmp)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    load = Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "worker.py").write_text(WORKER, encoding="utf-8")
        (tmp / "noop.c").write_text("void noop(void) {}\n", encoding="utf-8")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(tmp / "libnoop.so"), str(tmp / "noop.c")], check=True)
        tree = tmp / "path" / "qdc"  # the package `qdc` is the checkout's root folder
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        results = {"before": [], "after": []}
        for _ in range(args.rounds):
            results["before"].append(_worker(tmp, tmp / "path", str(tmp / "cache-before")))
            results["after"].append(_worker(tmp, None, str(tmp / "cache-after")))
    print(f"load average before: {load}, after: {Path('/proc/loadavg').read_text(encoding='utf-8').split()[:3]}; "
          f"noop {statistics.median(r['noop ns'] for r in results['after']):.0f} ns")
    rows = [k for k in results["after"][0] if k not in ("noop", "noop ns")]
    print(f"| launch (median ratio to a ctypes no-op; min over {args.rounds} alternating rounds) "
          f"| before ({args.rev}) | after | after / before |\n|---|---|---|---|")
    for k in rows:
        b, a = min(r[k] for r in results["before"]), min(r[k] for r in results["after"])
        print(f"| {k} | {b:.2f}× | {a:.2f}× | {a / b:.2f} |")


if __name__ == "__main__":
    main()
