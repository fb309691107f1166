"""Reverse mode through a dynamic loop on a GPU: qdc against Quadrants and PyTorch, same kernel.

    python3 bench/bench_gpu_autodiff.py --arch cuda [--log2n 20] [--rounds 10]
    python3 bench/bench_gpu_autodiff.py --arch vulkan --log2n 16      # lavapipe: a smaller size

The kernel is bench_autodiff.py's (2^N f32 elements, 64 iterations of `v = sin(v) * 0.95 + 0.01`
with the trip count read from a field, so `v` lives on an adstack; summed into a scalar), the
same source for qdc and Quadrants (`ad_stack_experimental_enabled`) on the same arch; PyTorch's
CUDA autograd (forward with the graph recorded, then backward) where the arch is cuda. Every
timing ends with the peer's own synchronisation. Each peer runs in a fresh process; within it
forward and grad are timed in interleaved rounds (best and median). Each gradient is checked
against a float64 reference before it is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_autodiff import ITERS, check, reference, timed_rounds  # noqa: E402  (the CPU benchmark's)

PEERS = ("qdc", "quadrants", "torch")


def inputs(n: int):
    import numpy as np
    return np.random.default_rng(0).random(n, dtype=np.float32)


def define(qd, n: int):
    x = qd.field(qd.f32, shape=n, needs_grad=True)
    trips = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def compute():
        for i in x:
            v = x[i]
            for _ in range(trips[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v
    return x, trips, y, compute


def measure_kernel_peer(qd, arch: str, n: int, rounds: int, peer: str, **init) -> dict:
    qd.init(arch=arch, **init)
    x, trips, y, compute = define(qd, n)
    xs = inputs(n)
    x.from_numpy(xs)
    trips[None] = ITERS

    def synced(fn):
        def run():
            fn()
            qd.sync()
        return run

    def grad():
        compute()
        y.grad[None] = 1.0
        compute.grad()
        qd.sync()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x.grad.fill(0)
        grad()
        check(x.grad.to_numpy(), reference(xs)[1], peer)
        t = timed_rounds({"forward": synced(compute), "grad": synced(compute.grad), "forward+grad": grad}, rounds)
    version = getattr(qd, "__version__", "?")
    return {"version": ".".join(map(str, version)) if isinstance(version, (list, tuple)) else str(version), **t}


def measure_qdc(arch: str, n: int, rounds: int) -> dict:
    import qdc as qd
    out = measure_kernel_peer(qd, arch, n, rounds, "qdc", cache_dir=tempfile.mkdtemp(prefix="qdc-bench-gpu-ad-"))
    from qdc.runtime import context
    dev = context.current().device
    out["device"] = str(getattr(dev, "name", None) or getattr(getattr(dev, "capabilities", None), "name", arch))
    out["heap_mib"] = qd.adstack_heap_bytes() / 2 ** 20
    return out


def measure_quadrants(arch: str, n: int, rounds: int) -> dict:
    try:
        import quadrants as qd
    except ImportError:
        return {"missing": "quadrants is not installed (pip install quadrants)"}
    return measure_kernel_peer(qd, getattr(qd, arch), n, rounds, "quadrants", ad_stack_experimental_enabled=True,
                               log_level="error")


def measure_torch(arch: str, n: int, rounds: int) -> dict:
    if arch != "cuda":
        return {"missing": f"PyTorch has no {arch} backend"}
    try:
        import torch
    except ImportError:
        return {"missing": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"missing": "torch has no CUDA device here"}
    xs = torch.from_numpy(inputs(n)).cuda()

    def forward(x):
        v = x
        for _ in range(ITERS):
            v = torch.sin(v) * 0.95 + 0.01
        return v.sum()

    def no_grad_forward():
        with torch.no_grad():
            forward(xs)
        torch.cuda.synchronize()

    def gradient():
        x = xs.clone().requires_grad_(True)
        forward(x).backward()
        torch.cuda.synchronize()
        return x.grad

    check(gradient().cpu().numpy(), reference(inputs(n))[1], "torch")
    t = timed_rounds({"forward": no_grad_forward, "forward+grad": gradient}, rounds)
    return {"version": torch.__version__, **t}


def run_worker(peer: str, args) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", peer, "--arch", args.arch,
                           "--log2n", str(args.log2n), "--rounds", str(args.rounds)], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"
        return {"missing": f"worker failed: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ms(t: dict | None) -> str:
    return "" if t is None else f"{t['best'] * 1e3:.2f} ms (median {t['median'] * 1e3:.2f})"


def table(r: dict, args) -> str:
    q = r["qdc"]
    if "missing" in q:
        return f"qdc could not be measured: {q['missing']}"
    lines = [f"{q['device']} ({args.arch}): 2^{args.log2n} f32 elements x {ITERS} iterations of "
             f"`v = sin(v) * 0.95 + 0.01` (dynamic trip count, adstack), summed; best of {args.rounds} interleaved "
             f"rounds (median); qdc's adstack heap {q['heap_mib']:.0f} MiB.", "",
             "| | forward | grad kernel | forward + grad |", "|---|---|---|---|"]
    for peer in PEERS:
        p = r[peer]
        if "missing" in p:
            lines.append(f"| {peer} | {p['missing']} | | |")
        else:
            lines.append(f"| {peer} {p['version']} | {ms(p['forward'])} | {ms(p.get('grad'))} | {ms(p['forward+grad'])} |")
    for peer in ("quadrants", "torch"):
        if "missing" not in r[peer]:
            ratio = q["forward+grad"]["best"] / r[peer]["forward+grad"]["best"]
            lines.append(f"\n- qdc forward+grad / {peer} forward+grad: {ratio:.2f} (below 1: qdc faster)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cuda", choices=("cuda", "vulkan"))
    parser.add_argument("--log2n", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--worker", choices=PEERS)
    args = parser.parse_args()
    if args.worker:
        measure = {"qdc": measure_qdc, "quadrants": measure_quadrants, "torch": measure_torch}[args.worker]
        print(json.dumps(measure(args.arch, 1 << args.log2n, args.rounds)))
        return
    print(table({peer: run_worker(peer, args) for peer in PEERS}, args))


if __name__ == "__main__":
    main()
