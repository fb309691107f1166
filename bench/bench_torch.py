"""PyTorch interop: kernel launches with torch tensors against numpy arrays, and a dynamic-loop
kernel as a PyTorch op (qdc.torch.function), forward + backward, against PyTorch autograd of the
same math.

    python3 bench/bench_torch.py [--arch cpu|cuda] [--log2n K] [--iters N] [--rounds R]

Launches (arch cpu): each statement is timed in interleaved batches (bench/measure.py's
`interleaved_ns`: the median per call, and the median over rounds of its ratio to numpy's in the
same round). `scale(a, 2.0)` on 16 f32 elements with a numpy array, a torch CPU tensor and a
qd.ndarray passed again and again (what a simulation step does), and with a new array or tensor
at every call; and a five-array kernel (`integrate`, the shape of a physics step's small kernels).

The op: `y[i] = v` after `n` iterations of `v = v - 0.1 v^3 + 0.01 x` per element (f32, 2^K
elements, `n` a kernel argument: the loop-carried `v` lives on an adstack in the gradient),
`y = op(x, y0, n); y.sum().backward()` against the same loop written with torch operations,
recorded by autograd and backpropagated. Both gradients are checked against a float64 one first.
On the CPU both use `--threads` threads (default 1: a shared machine's other load then stalls
no thread pool's barrier).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import interleaved_ns  # noqa: E402  (bench/ is not a package)

import qdc as qd  # noqa: E402

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)
F32_2D = qd.types.ndarray(dtype=qd.f32, ndim=2)
I32_1D = qd.types.ndarray(dtype=qd.i32, ndim=1)


def launches() -> dict:
    import torch

    @qd.kernel
    def scale(a: F32_1D, s: qd.f32):
        for i in range(a.shape[0]):
            a[i] = a[i] * s

    @qd.kernel
    def integrate(pos: F32_2D, vel: F32_2D, force: F32_2D, mass: F32_1D, active: I32_1D, dt: qd.f32, damping: qd.f32):
        for i in range(pos.shape[0]):
            if active[i]:
                for k in qd.static(range(3)):
                    vel[i, k] = vel[i, k] * damping + force[i, k] / mass[i] * dt
                    pos[i, k] = pos[i, k] + vel[i, k] * dt

    a, t, d = np.ones(16, np.float32), torch.ones(16), qd.ndarray(qd.f32, 16)
    arrays = itertools.cycle([np.ones(16, np.float32) for _ in range(64)])
    tensors = itertools.cycle([torch.ones(16) for _ in range(64)])
    n = 64
    np_step = [np.ones((n, 3), np.float32) for _ in range(3)] + [np.ones(n, np.float32), np.ones(n, np.int32)]
    torch_step = [torch.from_numpy(x.copy()) for x in np_step]
    ns = {"scale": scale, "integrate": integrate, "a": a, "t": t, "d": d, "arrays": arrays, "tensors": tensors,
          "np_step": np_step, "torch_step": torch_step}
    stmts = {
        "numpy array": ("scale(a, 2.0)", ns),
        "torch CPU tensor": ("scale(t, 2.0)", ns),
        "qd.ndarray": ("scale(d, 2.0)", ns),
        "new numpy array each call": ("scale(next(arrays), 2.0)", ns),
        "new torch tensor each call": ("scale(next(tensors), 2.0)", ns),
        "5 numpy arrays + 2 scalars": ("integrate(*np_step, 0.01, 0.99)", ns),
        "5 torch tensors + 2 scalars": ("integrate(*torch_step, 0.01, 0.99)", ns),
    }
    for stmt, namespace in stmts.values():  # compiled and warm before anything is timed
        for _ in range(100):
            exec(stmt, namespace)  # noqa: S102 (the statements above)
    return interleaved_ns(stmts)


def op_against_autograd(device: str, log2n: int, iters: int, rounds: int) -> dict:
    import torch
    import qdc.torch

    @qd.kernel
    def settle(x: F32_1D, y: F32_1D, n: qd.i32):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in range(n):
                v = v - 0.1 * v * v * v + 0.01 * x[i]
            y[i] = v

    op = qdc.torch.function(settle, inputs=("x",), outputs=("y",))
    rng = np.random.default_rng(0)
    x0 = torch.from_numpy(rng.random(1 << log2n, dtype=np.float32)).to(device)
    y0 = torch.zeros_like(x0)

    def by_qdc():
        x = x0.clone().requires_grad_()
        op(x, y0, iters).sum().backward()
        return x.grad

    def by_torch():
        x = x0.clone().requires_grad_()
        v = x
        for _ in range(iters):
            v = v - 0.1 * v * v * v + 0.01 * x
        v.sum().backward()
        return x.grad

    want = _reference_gradient(x0.cpu().numpy().astype(np.float64), iters)
    for name, run in (("qdc op", by_qdc), ("torch autograd", by_torch)):
        got = run().cpu().numpy()
        err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)))
        if err > 1e-3:
            raise SystemExit(f"{name}: wrong gradient (max relative error {err:.2e})")

    def synced(run):
        def timed():
            run()
            if device != "cpu":
                torch.cuda.synchronize()
        return timed
    variants = {"qdc op": synced(by_qdc), "torch autograd": synced(by_torch)}
    for run in variants.values():
        run()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: {"best": min(ts), "median": statistics.median(ts)} for name, ts in times.items()}


def _reference_gradient(x: np.ndarray, iters: int) -> np.ndarray:
    v, dv = x.copy(), np.ones_like(x)  # dv = dv/dx, forward mode in float64
    for _ in range(iters):
        dv, v = dv * (1 - 0.3 * v * v) + 0.01, v - 0.1 * v ** 3 + 0.01 * x
    return dv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--log2n", type=int, default=None, help="elements of the op: 2^K (default 16 cpu, 20 cuda)")
    parser.add_argument("--iters", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of qdc and torch for the op (0: all cores)")
    args = parser.parse_args()
    import torch
    print(f"torch {torch.__version__}, arch {args.arch}")
    if args.arch == "cpu":  # one thread: the launch's own cost, not the wake-up of a pool on a busy machine
        qd.init(arch="cpu", cpu_max_num_threads=1)
        print("\nlaunch | ns per call (median) | vs numpy (median ratio) | min ns | min ratio")
        for name, r in launches().items():
            print(f"{name} | {r['ns']:.0f} | {r['ratio']:.2f}x | {r['ns_min']:.0f} | {r['ratio_min']:.2f}x")
    if args.threads:
        torch.set_num_threads(args.threads)
    qd.init(arch=args.arch, **({"cpu_max_num_threads": args.threads} if args.threads else {}))
    log2n = args.log2n if args.log2n is not None else (16 if args.arch == "cpu" else 20)
    device = "cpu" if args.arch == "cpu" else "cuda"
    r = op_against_autograd(device, log2n, args.iters, args.rounds)
    threads = f", {torch.get_num_threads()} CPU thread(s)" if device == "cpu" else ""
    print(f"\nforward + backward, 2^{log2n} f32 x {args.iters} iterations on {device}{threads} | best ms | median ms")
    for name, t in r.items():
        print(f"{name} | {t['best'] * 1e3:.2f} | {t['median'] * 1e3:.2f}")
    print(f"qdc op / torch autograd (best): {r['qdc op']['best'] / r['torch autograd']['best']:.2f}")


if __name__ == "__main__":
    main()
