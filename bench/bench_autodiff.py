"""Reverse mode through a dynamic loop: qdc against Quadrants and PyTorch, on one kernel.

    python3 bench/bench_autodiff.py [--rounds N] [--threads T] [--against REV [--processes P]]

The kernel (2^16 f32 elements, 64 iterations of `v = sin(v) * 0.95 + 0.01` per element, the
results summed into a scalar) is the same source for qdc and Quadrants; its trip count comes
from a field, so the loop-carried `v` lives on an adstack in both. Figures:
- forward and grad (`kernel.grad()`) times, qdc and Quadrants (`ad_stack_experimental_enabled`);
- the cost of qdc's always-on adstack overflow check: the grad kernel against the same kernel
  compiled without the check (a private codegen flag, for this measurement only);
- qdc's scalar code (one iteration at a time, QDC_CPU_WIDEN=0) against its width-W code
  (W iterations at a time in SIMD lanes, compiler/targets/cpu/widen.py), in the same process;
- the same gradient by PyTorch CPU autograd, vectorised over the elements (forward with the
  graph recorded, then backward), as a ratio to qdc's grad.
Each peer runs in its own process, one after the other, so no thread pool competes with
another. Within a process the variants are timed in interleaved rounds; the table shows the
best round (the least disturbed by other work on the machine) and the median. Every peer's
gradient is checked against a float64 reference before it is timed.

`--against REV` compares qdc with itself at another revision instead: REV is exported with
`git archive` into a temporary folder (the repository is left alone) and the qdc worker runs
P times with each tree, alternating old and new processes so that load drifts hit both alike;
the table shows each variant's best over all processes and the median of the processes' bests,
with the load average before and after.
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
import warnings

N, ITERS = 1 << 16, 64
PEERS = ("qdc", "quadrants", "torch")
THREADS = int(os.environ.get("QDC_BENCH_THREADS", "0"))  # --threads, passed on to the workers (0: all cores)


def reference(xs):
    import numpy as np
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for _ in range(ITERS):
        d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
    return v.sum(), d


def inputs():
    import numpy as np
    return np.random.default_rng(0).random(N, dtype=np.float32)


def timed_rounds(variants: dict, rounds: int) -> dict:
    """name -> {"best", "median"} seconds, the variants interleaved round by round."""
    for run in variants.values():
        run()  # warm-up (and compilation)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: {"best": min(ts), "median": statistics.median(ts)} for name, ts in times.items()}


def check(grad, want, peer: str) -> None:
    import numpy as np
    err = float(np.max(np.abs(grad - want) / np.maximum(np.abs(want), 1e-3)))
    if err > 1e-3:
        raise SystemExit(f"{peer}: wrong gradient (max relative error {err:.2e})")


def define_kernel(qd, x, n, y):
    @qd.kernel
    def compute():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v
    return compute


def kernel_fields(qd):
    x = qd.field(qd.f32, shape=N, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    return x, n, y


def measure_qdc(rounds: int) -> dict:
    import qdc as qd
    from qdc.compiler.targets.llvm import llvm_adstack
    from qdc.compiler.driver.kernel import compile_kernel
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
    from qdc.runtime import context
    from qdc.runtime.launcher import make_launcher
    qd.init(arch=qd.cpu, cache_dir=tempfile.mkdtemp(prefix="qdc-bench-ad-"), **({"cpu_max_num_threads": THREADS}
                                                                              if THREADS else {}))
    x, n, y = kernel_fields(qd)
    compute = define_kernel(qd, x, n, y)
    xs = inputs()
    x.from_numpy(xs)
    n[None] = ITERS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic trip count's default-capacity warning
        compute()
        compute.grad()
        llvm_adstack._UNCHECKED_FOR_BENCHMARK = True
        try:
            unchecked = compile_kernel(compute.fn, compute._primal.params, direct_options(), variant="grad")
        finally:
            llvm_adstack._UNCHECKED_FOR_BENCHMARK = False
        # the scalar code, one iteration at a time (the width-W lowering switched off)
        os.environ[SCALAR_SWITCH] = "0"
        try:
            scalar = {v: compile_kernel(compute.fn, compute._primal.params, direct_options(), variant=v)
                      for v in ("forward", "grad")}
        finally:
            del os.environ[SCALAR_SWITCH]
    rt = context.current()

    def launcher(compiled):
        return make_launcher(compiled.meta, rt.device, rt.device.load_kernel(compiled.artifacts, compiled.meta),
                             compiled.field_objects)
    grad_unchecked, forward_scalar, grad_scalar = (launcher(unchecked), launcher(scalar["forward"]),
                                                   launcher(scalar["grad"]))
    for grad in (compute.grad, grad_unchecked, grad_scalar):
        x.grad.fill(0)
        y.grad[None] = 1.0
        grad()
        check(x.grad.to_numpy(), reference(xs)[1], "qdc")
    lanes = max(t.launch.get("lanes", 1) for t in compute.grad.compile().meta.tasks)
    t = timed_rounds({"forward": compute, "grad": compute.grad, "grad_unchecked": grad_unchecked,
                      "forward_scalar": forward_scalar, "grad_scalar": grad_scalar}, rounds)
    return {"version": qd.__version__, "threads": rt.device.num_threads, "path": os.path.dirname(qd.__file__),
            "lanes": lanes, **t}


def measure_quadrants(rounds: int) -> dict:
    try:
        import quadrants as qd
    except ImportError:
        return {"missing": "quadrants is not installed (pip install quadrants)"}
    qd.init(arch=qd.cpu, ad_stack_experimental_enabled=True, log_level="error",
            **({"cpu_max_num_threads": THREADS} if THREADS else {}))
    x, n, y = kernel_fields(qd)
    compute = define_kernel(qd, x, n, y)
    xs = inputs()
    x.from_numpy(xs)
    n[None] = ITERS
    compute()
    x.grad.fill(0)
    y.grad[None] = 1.0
    compute.grad()
    check(x.grad.to_numpy(), reference(xs)[1], "quadrants")

    def synced(fn):
        def run():
            fn()
            qd.sync()
        return run
    t = timed_rounds({"forward": synced(compute), "grad": synced(compute.grad)}, rounds)
    version = getattr(qd, "__version__", "?")
    return {"version": ".".join(map(str, version)) if isinstance(version, (list, tuple)) else str(version), **t}


def measure_torch(rounds: int) -> dict:
    try:
        import torch
    except ImportError:
        return {"missing": "torch is not installed (pip install torch==2.13.0)"}
    torch.set_num_threads(THREADS or os.cpu_count() or 1)
    xs = torch.from_numpy(inputs())

    def forward(x):
        v = x
        for _ in range(ITERS):
            v = torch.sin(v) * 0.95 + 0.01
        return v.sum()

    def no_grad_forward():
        with torch.no_grad():
            forward(xs)

    def gradient():
        x = xs.clone().requires_grad_(True)
        forward(x).backward()
        return x.grad

    check(gradient().numpy(), reference(xs.numpy())[1], "torch")
    t = timed_rounds({"forward": no_grad_forward, "grad": gradient}, rounds)
    return {"version": torch.__version__, "threads": torch.get_num_threads(), **t}


def run_worker(peer: str, rounds: int, qdc_parent: str | None = None) -> dict:
    """Measure one peer in a fresh process (`qdc_parent`: a folder holding another `qdc` tree to import)."""
    env = dict(os.environ)
    if qdc_parent is not None:
        env["PYTHONPATH"] = qdc_parent + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", peer, "--rounds", str(rounds)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"missing": f"worker failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ms(t: dict) -> str:
    return f"{t['best'] * 1e3:.1f} ms (median {t['median'] * 1e3:.1f})"


def table(r: dict) -> str:
    q, qu, to = r["qdc"], r["quadrants"], r["torch"]
    if "missing" in q:
        return f"qdc could not be measured: {q['missing']}"
    lines = [f"Kernel: 2^16 f32 elements x {ITERS} iterations of `v = sin(v) * 0.95 + 0.01` (dynamic trip "
             f"count, adstack), summed into a scalar. Best of the interleaved rounds (median).", "",
             "| | forward | grad | grad / forward |", "|---|---|---|---|"]
    lines.append(f"| qdc {q['version']}, {q.get('lanes', 1)} iterations at a time | {ms(q['forward'])} | "
                 f"{ms(q['grad'])} | {q['grad']['best'] / q['forward']['best']:.2f} |")
    if "grad_scalar" in q:
        lines.append(f"| qdc, scalar code (QDC_CPU_WIDEN=0) | {ms(q['forward_scalar'])} | {ms(q['grad_scalar'])} | "
                     f"{q['grad_scalar']['best'] / q['forward_scalar']['best']:.2f} |")
    if "missing" in qu:
        lines.append(f"| Quadrants | {qu['missing']} | | |")
    else:
        lines.append(f"| Quadrants {qu['version']} | {ms(qu['forward'])} | {ms(qu['grad'])} | "
                     f"{qu['grad']['best'] / qu['forward']['best']:.2f} |")
    if "missing" in to:
        lines.append(f"| PyTorch | {to['missing']} | | |")
    else:
        lines.append(f"| PyTorch {to['version']} autograd, vectorised | {ms(to['forward'])} | "
                     f"{ms(to['grad'])} (forward + backward) | {to['grad']['best'] / to['forward']['best']:.2f} |")
    lines.append("")
    check_cost = q["grad"]["best"] / q["grad_unchecked"]["best"] - 1
    lines.append(f"- qdc grad without the overflow check: {ms(q['grad_unchecked'])}; the check costs "
                 f"{check_cost * 100:+.1f}% of grad time (goal <= 5%).")
    if "missing" not in qu:
        lines.append(f"- qdc grad / Quadrants grad: {q['grad']['best'] / qu['grad']['best']:.2f} (goal <= 1); "
                     f"qdc forward / Quadrants forward: {q['forward']['best'] / qu['forward']['best']:.2f}.")
    if "missing" not in to:
        lines.append(f"- PyTorch autograd time / qdc grad time: {to['grad']['best'] / q['grad']['best']:.2f}; "
                     f"qdc grad / PyTorch fwd+bwd: {q['grad']['best'] / to['grad']['best']:.2f} (goal <= 1); qdc "
                     f"forward / PyTorch forward: {q['forward']['best'] / to['forward']['best']:.2f} (goal <= 0.5).")
    if "grad_scalar" in q:
        lines.append(f"- width-W / scalar code: forward {q['forward']['best'] / q['forward_scalar']['best']:.2f}, "
                     f"grad {q['grad']['best'] / q['grad_scalar']['best']:.2f}.")
    lines.append(f"- CPU threads: qdc {q['threads']}" + (f", PyTorch {to['threads']}" if "missing" not in to else "")
                 + f"; machine: {os.cpu_count()} logical CPUs.")
    return "\n".join(lines)


def load_average() -> str:
    with open("/proc/loadavg", encoding="utf-8") as f:
        return " ".join(f.read().split()[:3])


def against(rev: str, rounds: int, processes: int) -> str:
    """qdc at `rev` against this checkout, in alternating worker processes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = load_average()
    results: dict = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="qdc-bench-ad-rev-") as d:
        tree = os.path.join(d, "qdc")  # the package `qdc` is the checkout's root folder
        os.mkdir(tree)
        archive = subprocess.run(["git", "-C", root, "archive", rev], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        for i in range(processes):
            order = (("before", d), ("after", None)) if i % 2 == 0 else (("after", None), ("before", d))
            for name, parent in order:
                r = run_worker("qdc", rounds, parent)
                if "missing" in r:
                    return f"qdc ({name}) could not be measured: {r['missing']}"
                if (r["path"] == tree) != (name == "before"):
                    return f"the {name} worker imported qdc from {r['path']}"
                results[name].append(r)
    lines = [f"Load average before: {load_before}; after: {load_average()}. qdc threads: "
             f"{results['after'][0]['threads']}; {processes} processes per side, {rounds} rounds each.", "",
             f"| | before ({rev}) | after | after / before |", "|---|---|---|---|"]
    for variant in ("forward", "grad", "grad_unchecked"):
        best = {k: min(r[variant]["best"] for r in v) for k, v in results.items()}
        median = {k: statistics.median(r[variant]["best"] for r in v) for k, v in results.items()}
        lines.append(f"| {variant} | {best['before'] * 1e3:.1f} ms (median {median['before'] * 1e3:.1f}) | "
                     f"{best['after'] * 1e3:.1f} ms (median {median['after'] * 1e3:.1f}) | "
                     f"{best['after'] / best['before']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--worker", choices=PEERS)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of every peer (default: all cores)")
    parser.add_argument("--against", metavar="REV", help="compare qdc with qdc at git revision REV")
    parser.add_argument("--processes", type=int, default=6, help="with --against: worker processes per side")
    args = parser.parse_args()
    if args.threads:
        os.environ["QDC_BENCH_THREADS"] = str(args.threads)
    if args.worker:
        measure = {"qdc": measure_qdc, "quadrants": measure_quadrants, "torch": measure_torch}[args.worker]
        print(json.dumps(measure(args.rounds)))
        return
    if args.against:
        print(against(args.against, args.rounds, args.processes))
        return
    print(table({peer: run_worker(peer, args.rounds) for peer in PEERS}))


if __name__ == "__main__":
    main()
