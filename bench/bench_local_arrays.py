"""Vector and matrix locals indexed at run time (local arrays: docs/design.md, "Vector locals
indexed at run time"): build and run time of kernels that read and write small matrices at
run-time indices in loops, with this checkout's qdc and, with --against REV, with qdc at git
revision REV (exported with `git archive`: the repository is left alone), in alternating worker
processes so that load drifts hit both alike.

    python3 bench/bench_local_arrays.py [--against REV] [--rounds 3] [--arch cpu|vulkan] [--n 65536]

Kernels (each checked against numpy before it is timed):
- invert: 4x4 matrix inverses by Gauss-Jordan elimination with partial pivoting, one per parallel
  iteration, on a 4x8 augmented matrix whose rows are picked and swapped at run-time indices;
- ring: a closed polygon of 16 2-D vertices smoothed in place (Gauss-Seidel) for a dynamic
  number of sweeps, each vertex read with its neighbours at run-time indices.
Each worker compiles into an empty cache: `build` is the first call's CPU seconds (compiling,
loading, one run), `run` the median over rounds of the least of three calls in a row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_build import export_tree  # noqa: E402

WORKER = r'''
import json, sys, tempfile, time
import numpy as np
import qdc as qd

arch, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
qd.init(arch=getattr(qd, arch), cache_dir=tempfile.mkdtemp())
M = qd.types.ndarray(qd.f32, ndim=3)


@qd.kernel
def invert(a: M, out: M):
    for p in range(a.shape[0]):
        m = qd.Matrix.zero(qd.f32, 4, 8)
        for r in qd.static(range(4)):
            for c in qd.static(range(4)):
                m[r, c] = a[p, r, c]
            m[r, 4 + r] = 1.0
        for col in range(4):
            pivot, best = col, qd.abs(m[col, col])
            for r in range(col + 1, 4):
                if qd.abs(m[r, col]) > best:
                    pivot, best = r, qd.abs(m[r, col])
            for c in range(8):
                t = m[col, c]
                m[col, c] = m[pivot, c]
                m[pivot, c] = t
            inverse = 1.0 / m[col, col]
            for c in range(8):
                m[col, c] *= inverse
            for r in range(4):
                if r != col:
                    f = m[r, col]
                    for c in range(8):
                        m[r, c] -= f * m[col, c]
        for r in qd.static(range(4)):
            for c in qd.static(range(4)):
                out[p, r, c] = m[r, 4 + c]


@qd.kernel
def ring(pts: M, out: M, sweeps: qd.i32):
    for p in range(pts.shape[0]):
        poly = qd.Matrix.zero(qd.f32, 16, 2)
        for k in qd.static(range(16)):
            poly[k, 0] = pts[p, k, 0]
            poly[k, 1] = pts[p, k, 1]
        for _ in range(sweeps):
            for k in range(16):
                for d in range(2):
                    poly[k, d] = 0.5 * poly[k, d] + 0.25 * (poly[(k + 15) % 16, d] + poly[(k + 1) % 16, d])
        for k in qd.static(range(16)):
            out[p, k, 0] = poly[k, 0]
            out[p, k, 1] = poly[k, 1]


rng = np.random.default_rng(0)
mats = (rng.uniform(-1, 1, (n, 4, 4)) + 4 * np.eye(4)).astype(np.float32)
pts = rng.uniform(-1, 1, (n, 16, 2)).astype(np.float32)
a, inv = qd.ndarray(qd.f32, shape=(n, 4, 4)), qd.ndarray(qd.f32, shape=(n, 4, 4))
p_in, p_out = qd.ndarray(qd.f32, shape=(n, 16, 2)), qd.ndarray(qd.f32, shape=(n, 16, 2))
a.from_numpy(mats)
p_in.from_numpy(pts)


def smoothed(x, sweeps):
    x = x.copy()
    for _ in range(sweeps):
        for k in range(16):
            x[:, k] = np.float32(0.5) * x[:, k] + np.float32(0.25) * (x[:, (k + 15) % 16] + x[:, (k + 1) % 16])
    return x


runs = {"invert": lambda: (invert(a, inv), qd.sync()), "ring": lambda: (ring(p_in, p_out, 8), qd.sync())}
out = {"build": {}, "run": {}}
for name, run in runs.items():
    t = time.process_time()
    run()
    out["build"][name] = time.process_time() - t
np.testing.assert_allclose(inv.to_numpy(), np.linalg.inv(mats.astype(np.float64)), rtol=1e-3, atol=1e-4)
np.testing.assert_allclose(p_out.to_numpy(), smoothed(pts, 8), rtol=1e-5, atol=1e-5)
sys.path.insert(0, sys.argv[4])  # this checkout's bench/
from bench_cpu_lanes import timed_rounds
out["run"] = {name: t["median"] for name, t in timed_rounds(runs, rounds).items()}
print(json.dumps(out))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--rounds", type=int, default=3, help="worker processes per tree, alternating")
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--n", type=int, default=65536, help="matrices / polygons per launch")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        this = os.path.join(folder, "this")
        os.makedirs(this)
        os.symlink(ROOT, os.path.join(this, "qdc"))
        trees = {"this checkout": this}
        if args.against:
            trees = {f"before ({args.against})": export_tree(args.against, os.path.join(folder, "before")), **trees}
        results = {name: [] for name in trees}
        worker = os.path.join(folder, "worker.py")  # a file: the front end reads the kernels' source
        with open(worker, "w", encoding="utf-8") as f:
            f.write(WORKER)
        for _ in range(args.rounds):
            for name, path in trees.items():
                env = dict(os.environ, PYTHONPATH=path)
                done = subprocess.run([sys.executable, worker, args.arch, str(args.n), "5", str(ROOT / "bench")], env=env,
                                      capture_output=True, text=True, cwd=folder)
                if done.returncode:
                    sys.exit(f"{name}: the worker failed:\n{done.stderr}")
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"arch {args.arch}, {args.n} per launch, {args.rounds} workers per tree; load {os.getloadavg()}")
    print(f"{'':24} {'build invert':>13} {'build ring':>11} {'run invert':>11} {'run ring':>10}")
    for name, rows in results.items():
        cells = [statistics.median(r["build"][k] for r in rows) for k in ("invert", "ring")]
        cells += [statistics.median(r["run"][k] for r in rows) * 1e3 for k in ("invert", "ring")]
        print(f"{name:24} {cells[0]:12.2f}s {cells[1]:10.2f}s {cells[2]:9.2f}ms {cells[3]:8.2f}ms")


if __name__ == "__main__":
    main()
