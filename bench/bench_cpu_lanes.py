"""CPU tasks run W iterations at a time (SIMD lanes) against the scalar code of the same kernels.

    python3 bench/bench_cpu_lanes.py [--threads 1] [--rounds 10]

Kernels the width-W lowering takes beyond the 1-D dynamic loop of bench_autodiff.py:
- fractal: Taichi's hello-world Julia set, a 2-D struct-for with a `while` that lanes leave at
  different iterations (640 x 320 pixels, at most 50 iterations);
- chain 2-D: `v = v * 0.9 + 0.1` repeated a dynamic 16 times over a 1024 x 1024 `qd.ndrange`
  (numpy, the same 16 whole-array steps, beside it);
- stencil 2-D: a 5-point-like update with a constant 4-trip inner loop over 1024 x 1024, the
  case where lanes must stay contiguous along rows;
- gather: G2P-like reads of a grid at cells computed from 2^18 positions (no inner loop).
Each kernel is compiled twice in this process, the second time with `QDC_CPU_WIDEN=0`; both
results must agree before anything is timed; rounds interleave the variants (each variant's time
in a round: the least of three calls in a row); best (median) of the rounds.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def timed_rounds(variants: dict, rounds: int) -> dict:
    """name -> {"best", "median"} seconds; rounds interleave the variants, and each variant's
    time in a round is the least of three calls in a row, so that every variant runs with its
    own data in the caches (else the one after another kernel's 4 MiB arrays pays for them)."""
    for run in variants.values():
        run()
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            best = None
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                took = time.perf_counter() - t0
                best = took if best is None else min(best, took)
            times[name].append(best)
    return {name: {"best": min(ts), "median": statistics.median(ts)} for name, ts in times.items()}

SOURCE = '''
import qdc as qd

n = 320
pixels = qd.field(dtype=qd.f32, shape=(n * 2, n))
A = qd.types.ndarray(dtype=qd.f32, ndim=2)
V = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.func
def complex_sqr(z):
    return qd.Vector([z[0] ** 2 - z[1] ** 2, z[1] * z[0] * 2])


@qd.kernel
def fractal(t: qd.f32):
    for i, j in pixels:
        c = qd.Vector([-0.8, qd.cos(t) * 0.2])
        z = qd.Vector([i / n - 1, j / n - 0.5]) * 2
        iterations = 0
        while z.norm() < 20 and iterations < 50:
            z = complex_sqr(z) + c
            iterations += 1
        pixels[i, j] = 1 - iterations * 0.02


@qd.kernel
def chain(a: A, out: A, steps: qd.i32):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        v = a[i, j]
        for _ in range(steps):
            v = v * 0.9 + 0.1
        out[i, j] = v


@qd.kernel
def stencil(a: A, out: A):
    for i, j in qd.ndrange((1, a.shape[0] - 1), (1, a.shape[1] - 1)):
        s = 0.0
        for k in range(4):
            s += a[i, j] * qd.cast(k, qd.f32) + a[i - 1, j] - a[i, j + 1]
        out[i, j] = s


@qd.kernel
def gather(pos: V, grid: A, out: V):
    for p in range(pos.shape[0]):
        base = qd.cast(pos[p] * 255.0 - 0.5, qd.i32)
        fx = pos[p] * 255.0 - qd.cast(base, qd.f32)
        acc = 0.0
        for i in qd.static(range(3)):
            w = 0.5 * (1.5 - fx) ** 2 if i == 0 else (0.75 - (fx - 1.0) ** 2 if i == 1 else 0.5 * (fx - 0.5) ** 2)
            acc += w * grid[base + i, p % 64]
        out[p] = acc
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    import qdc as qd
    from qdc.compiler.driver.kernel import compile_kernel
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
    from qdc.runtime import context
    from qdc.runtime.launcher import make_launcher

    folder = tempfile.mkdtemp(prefix="qdc-bench-lanes-")
    qd.init(arch=qd.cpu, cache_dir=os.path.join(folder, "cache"), cpu_max_num_threads=args.threads)
    Path(folder, "lanes_kernels.py").write_text(SOURCE, encoding="utf-8")
    sys.path.insert(0, folder)
    import lanes_kernels as k

    rng = np.random.default_rng(0)
    a = rng.random((1024, 1024), dtype=np.float32)
    pos = rng.uniform(0.01, 0.99, 1 << 18).astype(np.float32)
    grid = rng.random((258, 64), dtype=np.float32)
    outs = {name: np.zeros_like(a) for name in ("chain", "stencil")}
    gathered = np.zeros_like(pos)
    cases = {"fractal (2-D, while)": (k.fractal, (0.3,), lambda: k.pixels.to_numpy()),
             "chain 2-D (dynamic loop)": (k.chain, (a, outs["chain"], 16), lambda: outs["chain"].copy()),
             "stencil 2-D (4-trip loop)": (k.stencil, (a, outs["stencil"]), lambda: outs["stencil"].copy()),
             "gather (G2P-like)": (k.gather, (pos, grid, gathered), lambda: gathered.copy())}
    rt = context.current()
    variants, lanes = {}, {}
    for name, (kernel, kargs, result) in cases.items():
        kernel(*kargs)
        widened = result()
        lanes[name] = max(t.launch.get("lanes", 1) for t in kernel.compile(kargs).meta.tasks)
        os.environ[SCALAR_SWITCH] = "0"
        try:
            compiled = compile_kernel(kernel.fn, kernel._primal.params if hasattr(kernel, "_primal") else
                                      kernel.params, direct_options())
        finally:
            del os.environ[SCALAR_SWITCH]
        scalar = make_launcher(compiled.meta, rt.device, rt.device.load_kernel(compiled.artifacts, compiled.meta),
                               compiled.field_objects)
        scalar(*kargs)
        np.testing.assert_allclose(result(), widened, rtol=1e-5, atol=1e-5, err_msg=name)
        variants[(name, "lanes")] = lambda kernel=kernel, kargs=kargs: kernel(*kargs)
        variants[(name, "scalar")] = lambda scalar=scalar, kargs=kargs: scalar(*kargs)
    ref = a.copy()

    def numpy_chain():
        v = ref
        for _ in range(16):
            v = v * np.float32(0.9) + np.float32(0.1)
        return v
    variants[("chain 2-D (dynamic loop)", "numpy")] = numpy_chain
    t = timed_rounds(variants, args.rounds)

    def ms(key):
        return f"{t[key]['best'] * 1e3:.2f} ms ({t[key]['median'] * 1e3:.2f})" if key in t else ""
    print(f"qdc {qd.__version__}, {rt.device.num_threads} thread(s), {platform.machine()}, "
          f"{os.cpu_count()} logical CPUs; best (median) of {args.rounds} interleaved rounds\n")
    print("| kernel | lanes (W) | qdc, W lanes | qdc, scalar code | numpy | scalar / lanes |")
    print("|---|---|---|---|---|---|")
    for name in cases:
        ratio = t[(name, "scalar")]["best"] / t[(name, "lanes")]["best"]
        print(f"| {name} | {lanes[name]} | {ms((name, 'lanes'))} | {ms((name, 'scalar'))} | "
              f"{ms((name, 'numpy'))} | {ratio:.1f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
