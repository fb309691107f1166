"""Run time of the demo kernels (kernels/), one thread: what LLVM options chosen for small modules
must not slow down.

    PYTHONPATH=<tree> python3 bench/bench_small_kernels.py [--rounds 30] [--threads 1]

Each kernel: one warm-up launch, then rounds of 20 launches and a sync; the best round's time per
launch. Also `x[i] += 2 * y[i]` over 2^20 floats, whose atomics a thread running the whole task
replaces with plain updates (the loop copy LLVM's unswitching makes for it vectorises). Compare
trees by running it with each tree's PYTHONPATH, alternating.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, KERNELS)
    import qdc as qd
    qd.init(arch=qd.cpu, cpu_max_num_threads=args.threads)
    import demo
    import heat
    import nbody
    import reduction
    import regression
    import saxpy

    rng = np.random.default_rng(1)
    heat.T.from_numpy(rng.random((heat.N, heat.N), dtype=np.float32))
    nbody.pos.from_numpy(rng.random((nbody.N, 3), dtype=np.float32))
    nbody.mass.from_numpy(rng.random(nbody.N, dtype=np.float32))
    demo.n[None] = 64
    n = 1 << 20
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    small_a, small_b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    x, y = qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n)

    @qd.kernel
    def accumulate():
        for i in x:
            x[i] += 2.0 * y[i]

    cases = {"heat.step (128²)": lambda: heat.step(0.1), "heat.commit": heat.commit,
             "nbody.kick (256 bodies)": lambda: nbody.kick(0.01), "nbody.drift": lambda: nbody.drift(0.01),
             "saxpy, 2^20": lambda: saxpy.saxpy(2.0, a, b), "saxpy, 1000": lambda: saxpy.saxpy(2.0, small_a, small_b),
             "reduction.dot, 2^20": lambda: reduction.dot(a, b), "reduction.max_abs, 2^20": lambda: reduction.max_abs(a),
             "reduction.sum_of, 1000": lambda: reduction.sum_of(small_a), "demo.compute": demo.compute,
             "demo.scale, 2^20": lambda: demo.scale(a, 1.0), "regression.mean_squared_error": regression.mean_squared_error,
             "x[i] += 2 * y[i], 2^20": accumulate}
    print(f"qdc from {os.path.dirname(qd.__file__)}, {args.threads} thread(s); best of {args.rounds} rounds "
          f"of 20 launches\n\n| kernel | per launch |\n|---|---|")
    for name, launch in cases.items():
        launch()
        qd.sync()
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(20):
                launch()
            qd.sync()
            best = min(best, (time.perf_counter() - t0) / 20)
        print(f"| {name} | {best * 1e6:.2f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
