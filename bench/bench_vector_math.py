"""Elementwise transcendental functions on the CPU: `y[i] = f(x[i])` over 2^24 elements.

    python3 bench/bench_vector_math.py [--rounds N] [--n LOG2] [--dtypes f32,f64] [--functions sin,exp,...]

Variants, timed in interleaved rounds within one process (min and median of the rounds):
- `qdc`: the kernel as qdc compiles it now (compiler/targets/llvm/inline_math.py: branch-free
  math the loop vectoriser widens);
- `qdc_libm`: the same kernel compiled with the C math library's scalar functions, as before
  (the CPU target's private `_LIBM_FOR_BENCHMARK` switch; compile_kernel involves no cache);
- `numpy`: np.sin etc. into a preallocated output (numpy has SIMD f32/f64 sin, cos, exp, log);
- `torch`: torch.sin etc. with `out=`, if PyTorch is installed (optional).
Each thread count (1, and all of the machine's) runs in its own process, one after the other,
so that no thread pool competes with another: qdc with cpu_max_num_threads, torch with
set_num_threads; numpy is single-threaded. Every variant's result is checked against a float64
numpy reference before it is timed. The load average is printed before and after.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FUNCTIONS = ("sin", "exp", "log", "tanh", "pow")
POW_EXPONENT = 1.37


def inputs(np, fn: str, n: int, npt):
    rng = np.random.default_rng(0)
    lo, hi = {"sin": (-100, 100), "exp": (-80, 80), "log": (1e-3, 1e3), "tanh": (-5, 5), "pow": (1e-2, 1e2)}[fn]
    return rng.uniform(lo, hi, n).astype(npt)


def numpy_fn(np, fn: str):
    return {"sin": np.sin, "exp": np.exp, "log": np.log, "tanh": np.tanh,
            "pow": lambda x, out: np.power(x, x.dtype.type(POW_EXPONENT), out=out)}[fn]


def define_kernel(qd, fn: str, dtype):
    nd = qd.types.ndarray(dtype=dtype, ndim=1)
    if fn == "pow":
        @qd.kernel
        def k(x: nd, y: nd, e: dtype):
            for i in x:
                y[i] = qd.pow(x[i], e)
        return k
    f = getattr(qd, fn)

    @qd.kernel
    def k(x: nd, y: nd, e: dtype):  # e unused: every variant is called alike
        for i in x:
            y[i] = f(x[i])
    return k


def libm_launcher(kernel, args):
    """`kernel` compiled with the C math library's scalar functions, ready to launch."""
    from qdc.compiler.driver.kernel import compile_kernel
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.jit.kernel import kernel_of
    from qdc.compiler.targets.cpu import target as cpu_target
    from qdc.runtime import context
    from qdc.runtime.launcher import make_launcher
    k = kernel_of(kernel)
    cpu_target._LIBM_FOR_BENCHMARK = True
    try:
        compiled = compile_kernel(k.fn, k.specialise(args)[1], direct_options())
    finally:
        cpu_target._LIBM_FOR_BENCHMARK = False
    rt = context.current()
    return make_launcher(compiled.meta, rt.device, rt.device.load_kernel(compiled.artifacts, compiled.meta),
                         compiled.field_objects)


def timed_rounds(variants: dict, rounds: int) -> dict:
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: {"best": min(ts), "median": statistics.median(ts)} for name, ts in times.items()}


def worker(threads: int, rounds: int, n: int, dtypes, functions) -> dict:
    import tempfile

    import numpy as np

    import qdc as qd
    qd.init(arch=qd.cpu, cache_dir=tempfile.mkdtemp(prefix="qdc-bench-vm-"),
            **({"cpu_max_num_threads": threads} if threads else {}))
    try:
        import torch
        torch.set_num_threads(threads or os.cpu_count())
    except ImportError:
        torch = None
    results = {}
    for dname in dtypes:
        npt, dtype = {"f32": (np.float32, qd.f32), "f64": (np.float64, qd.f64)}[dname]
        tol = 2e-6 if npt is np.float32 else 1e-13
        for fn in functions:
            x = inputs(np, fn, n, npt)
            y = np.empty_like(x)
            e = npt(POW_EXPONENT)
            kernel = define_kernel(qd, fn, dtype)
            libm = libm_launcher(kernel, (x, y, e))
            nfn = numpy_fn(np, fn)
            variants = {"qdc": lambda: kernel(x, y, e), "qdc_libm": lambda: libm(x, y, e),
                        "numpy": lambda: nfn(x, out=y)}
            if torch is not None:
                tx, ty = torch.from_numpy(x), torch.from_numpy(y)
                tfn = {"sin": torch.sin, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh,
                       "pow": lambda a, out: torch.pow(a, POW_EXPONENT, out=out)}[fn]
                variants["torch"] = lambda: tfn(tx, out=ty)
            with np.errstate(all="ignore"):
                want = numpy_fn(np, fn)(x.astype(np.float64), out=np.empty(n))
            for name, run in variants.items():
                y.fill(np.nan)
                run()
                with np.errstate(all="ignore"):
                    err = float(np.nanmax(np.abs(y - want) / np.maximum(np.abs(want), np.finfo(npt).tiny)))
                if not np.isfinite(y[np.isfinite(want)]).all() or err > tol:
                    raise SystemExit(f"{name} {fn} {dname}: wrong result (max relative error {err:.2e})")
            results[f"{fn} {dname}"] = timed_rounds(variants, rounds)
    return {"threads": threads or os.cpu_count(), "results": results}


def loadavg() -> str:
    with open("/proc/loadavg", encoding="utf-8") as f:
        return " ".join(f.read().split()[:3])


def table(r: dict) -> str:
    names = list(next(iter(r["results"].values())))
    lines = [f"threads: {r['threads']}", "| y = f(x) | " + " | ".join(names) + " | libm / qdc | qdc / numpy |",
             "|---|" + "---|" * (len(names) + 2)]
    for key, t in r["results"].items():
        cells = [f"{t[v]['best'] * 1e3:.1f} ({t[v]['median'] * 1e3:.1f})" for v in names]
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {t['qdc_libm']['best'] / t['qdc']['best']:.2f}x"
                     f" | {t['qdc']['best'] / t['numpy']['best']:.2f}x |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=24, help="log2 of the element count")
    ap.add_argument("--dtypes", default="f32,f64")
    ap.add_argument("--functions", default=",".join(FUNCTIONS))
    ap.add_argument("--threads", default="1,0", help="thread counts, one process each (0: all)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    dtypes, functions = args.dtypes.split(","), args.functions.split(",")
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds, 1 << args.n, dtypes, functions)))
        return
    print(f"n = 2^{args.n}, {args.rounds} rounds; ms: best (median); load before: {loadavg()}")
    for threads in (int(t) for t in args.threads.split(",")):
        out = subprocess.run([sys.executable, __file__, "--worker", str(threads), "--rounds", str(args.rounds),
                              "--n", str(args.n), "--dtypes", args.dtypes, "--functions", args.functions],
                             check=True, capture_output=True, text=True).stdout
        print(table(json.loads(out.strip().splitlines()[-1])))
        print(f"load after: {loadavg()}")


if __name__ == "__main__":
    main()
