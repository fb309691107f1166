"""qd.graph.do_while on CUDA, side by side in one process (docs/benchmarks.md): a graph=True kernel
whose loop runs on the device (conditional WHILE nodes: launch path device_loops) against the same
kernel without graph=True, whose launches read the flag back after every pass (graph_loops). The
body is a Jacobi-style pass over 2^16 f32 and a counter decrement, as a solver's iteration; each
time is the best of 5 rounds of `launches` launches of `passes` passes, ended by a sync, rounds
alternating between the two kernels.
Run: python3 bench/bench_do_while.py [--passes 100] [--launches 20]"""
import argparse
import os
import time

import numpy as np

import qdc as qd

os.environ.setdefault("QDC_CUDA_DEVICE_LOOPS", "1")  # the device-side path is opt-in

N = 1 << 16


def make(decorator):
    @decorator
    def solve(x: qd.types.ndarray(qd.f32, ndim=1), counter: qd.types.ndarray(qd.i32, ndim=0),
              passes: qd.types.ndarray(qd.i32, ndim=0)):
        for i in range(1):
            counter[()] = passes[()]
        while qd.graph.do_while(counter):
            for i in range(x.shape[0]):
                x[i] = 0.5 * x[i] + 0.25
            counter[()] = counter[()] - 1
    return solve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--launches", type=int, default=20)
    args = parser.parse_args()
    qd.init(arch=qd.cuda)
    kernels = {"device loops (graph=True)": make(qd.kernel(graph=True)), "host loop": make(qd.kernel)}
    x, counter, passes = qd.ndarray(qd.f32, (N,)), qd.ndarray(qd.i32, ()), qd.ndarray(qd.i32, ())
    passes.from_numpy(np.array(args.passes, np.int32))
    best = {name: float("inf") for name in kernels}
    for name, kernel in kernels.items():  # compile, capture, and check the same result
        x.fill(1.0)
        kernel(x, counter, passes)
        qd.sync()
        print(f"{name}: launch path {kernel.__qdc_launcher__.path}; x[0] = {x.to_numpy()[0]:.6f}")
    for _ in range(5):
        for name, kernel in kernels.items():
            qd.sync()
            start = time.perf_counter()
            for _ in range(args.launches):
                kernel(x, counter, passes)
            qd.sync()
            best[name] = min(best[name], (time.perf_counter() - start) / args.launches)
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1e3:.3f} ms a launch of {args.passes} passes, "
              f"{seconds / args.passes * 1e6:.2f} us a pass")
    device, host = best["device loops (graph=True)"], best["host loop"]
    print(f"device loops: {host / device:.2f}x the host loop's speed")


if __name__ == "__main__":
    main()
