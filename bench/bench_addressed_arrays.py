"""Arrays reached by buffer device address against the same arrays bound as descriptors, on
whatever Vulkan driver is present. One kernel reads 16 f32 ndarrays at every step of a dynamic
inner loop (what Genesis's large tasks do with dozens of arrays); it is built both ways (the
address way as a task binding more than MAX_BOUND_BUFFERS is lowered), each in its own process
and kernel cache, rounds alternated. Prints per way the median time of one launch over 2^N
elements and the address way's ratio to the bound one: what reaching arrays through base pointers
made once in the entry block costs (on a GPU, registers held across the loop; on lavapipe, the
same code JIT-compiled for the CPU). Results are checked against numpy in each process.

    python3 bench/bench_addressed_arrays.py [--log2n 20] [--taps 8] [--rounds 3] [--repeat 9]
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

import numpy as np

import qdc as qd
from qdc.compiler.targets.vulkan import target

BATCH = 10  # launches back to back, then one sync
WEIGHTS = np.arange(1, 17, dtype=np.float32)


ND = qd.types.ndarray(qd.f32, 1)


@qd.kernel
def taps(a0: ND, a1: ND, a2: ND, a3: ND, a4: ND, a5: ND, a6: ND, a7: ND, a8: ND, a9: ND, a10: ND, a11: ND,
         a12: ND, a13: ND, a14: ND, a15: ND, count: qd.i32, out: ND):
    for i in out:
        n = out.shape[0]
        s = 0.0
        for t in range(count):
            j = (i + t) % n
            s += (a0[j] + 2.0 * a1[j] + 3.0 * a2[j] + 4.0 * a3[j] + 5.0 * a4[j] + 6.0 * a5[j] + 7.0 * a6[j]
                  + 8.0 * a7[j] + 9.0 * a8[j] + 10.0 * a9[j] + 11.0 * a10[j] + 12.0 * a11[j] + 13.0 * a12[j]
                  + 14.0 * a13[j] + 15.0 * a14[j] + 16.0 * a15[j])
        out[i] = s


def measure(way: str, n: int, count: int, repeat: int) -> dict:
    """One way's median launch time, in this process (its own kernel cache)."""
    if way == "address":
        target.MAX_BOUND_BUFFERS = 1  # every task reaches its arrays by address
    qd.init(arch=qd.vulkan, cache_dir=tempfile.mkdtemp(prefix="qdc-addressed-"))
    rng = np.random.default_rng(20)
    values = rng.standard_normal((16, n)).astype(np.float32)
    arrays = []
    for v in values:
        arrays.append(qd.ndarray(qd.f32, shape=(n,)))
        arrays[-1].from_numpy(v)
    out = qd.ndarray(qd.f32, shape=(n,))
    taps(*arrays, count, out)
    weighted = (WEIGHTS[:, None].astype(np.float64) * values).sum(0)
    expected = sum(np.roll(weighted, -t) for t in range(count))
    error = float(np.abs(out.to_numpy() - expected).max() / np.abs(expected).max())
    times = []
    for _ in range(repeat):
        qd.sync()
        t0 = time.perf_counter()
        for _ in range(BATCH):
            taps(*arrays, count, out)
        qd.sync()
        times.append((time.perf_counter() - t0) / BATCH)
    from qdc.runtime import context
    return {"way": way, "median_s": statistics.median(times), "relative_error": error,
            "device": context.current().device.capabilities.name}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log2n", type=int, default=20)
    parser.add_argument("--taps", type=int, default=8, help="inner-loop steps per element")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--way", choices=("bound", "address"), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    n = 1 << args.log2n
    if args.way:
        print(json.dumps(measure(args.way, n, args.taps, args.repeat)))
        return
    results = {"bound": [], "address": []}
    for _ in range(args.rounds):
        for way in ("bound", "address"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--way", way, "--log2n", str(args.log2n),
                                  "--taps", str(args.taps), "--repeat", str(args.repeat)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            assert r["relative_error"] < 1e-5, r
            results[way].append(r["median_s"])
    bytes_read = 16 * 4 * n * args.taps
    print(f"device: {r['device']}; 16 f32 ndarrays of 2^{args.log2n}, {args.taps} inner-loop steps; "
          f"median launch of {args.repeat} x {BATCH}, {args.rounds} alternated rounds")
    for way, label in (("bound", "bound as descriptors"), ("address", "by buffer device address")):
        ms = ", ".join(f"{t * 1e3:.3f}" for t in results[way])
        best = min(results[way])
        print(f"| arrays {label} | {ms} ms | {bytes_read / best / 1e9:.1f} GB/s of loads (best) |")
    ratio = min(results["address"]) / min(results["bound"])
    print(f"| by address / bound (best of each) | {ratio:.2f}x | |")


if __name__ == "__main__":
    main()
