"""The dynamic-loop gradient at full scale on every arch, compared elementwise with the CPU's.

    python3 bench/check_large_gradients.py --archs vulkan,cuda --log2n 20,24,26 [--calls 3]

README's kernel (`v = x[i]; for _ in range(n[None]): v = qd.sin(v) * 0.95 + 0.01; y[None] += v`,
n = 64) over 2^N f32 elements: its gradient, accumulated over `--calls` calls of
`y.grad[None] = 1; loop.grad()` as a user would, on the CPU and on each arch; prints the largest
relative difference to the CPU's (goal: within rtol 1e-4 elementwise), the first two elements,
the adstack heap bytes and the time of one grad launch + sync. Exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

import qdc as qd
from qdc.runtime import adstack

TRIPS = 64


def gradient(arch: str, xs: np.ndarray, calls: int) -> tuple:
    qd.init(arch=arch)
    x = qd.field(qd.f32, shape=len(xs), needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def loop():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v

    x.from_numpy(xs)
    n[None] = TRIPS
    loop()
    seconds = []
    for _ in range(calls):
        y.grad[None] = 1.0
        start = time.perf_counter()
        loop.grad()
        qd.sync()
        seconds.append(time.perf_counter() - start)
    return x.grad.to_numpy() / calls, adstack.adstack_heap_bytes(), min(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="vulkan", help="comma-separated, besides the cpu reference")
    parser.add_argument("--log2n", default="20", help="comma-separated sizes (log2 of the element count)")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=1e-4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    bad = 0
    for log2n in (int(v) for v in args.log2n.split(",")):
        xs = np.random.default_rng(log2n).uniform(-1.0, 1.0, 1 << log2n).astype(np.float32)
        want, _, cpu_s = gradient("cpu", xs, args.calls)
        print(f"2^{log2n}: cpu x.grad[:2] = {want[:2]} (grad {cpu_s * 1e3:.1f} ms)", flush=True)
        scale = np.abs(want).max()
        for arch in args.archs.split(","):
            try:
                got, heap, s = gradient(arch, xs, args.calls)
            except Exception as e:  # report and go on to the next arch
                print(f"  {arch}: FAILED: {type(e).__name__}: {e}", flush=True)
                bad += 1
                continue
            close = np.abs(got - want) <= args.rtol * np.abs(want) + 1e-6 * scale
            worst = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))
            verdict = "ok" if close.all() else f"MISMATCH at {np.count_nonzero(~close)} elements"
            bad += not close.all()
            print(f"  {arch}: x.grad[:2] = {got[:2]}, max rel diff {worst:.2e}: {verdict}; adstack heap "
                  f"{heap / 2**20:.1f} MiB; grad + sync {s * 1e3:.2f} ms", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
