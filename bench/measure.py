"""One benchmark worker: `python bench/measure.py PEER LIBNOOP OUT.json`.

PEER is `together`, `numpy`, `qdc` or `quadrants`. `together` (bench/run.py's default) times
numpy, the copy reference, qdc and Quadrants in this one process, round by round (each round
runs every peer once per workload, in turn), so that a change of the machine's load hits
every peer alike; launches likewise (`interleaved_ns`). The other PEERs time one peer alone
(`run.py --separate`), so that no other peer's worker threads (qdc's libgomp pool, Quadrants'
own pool) are alive while it is timed. LIBNOOP is the no-op library that run.py built; every
worker times launches against it in the same process.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import itertools
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import make_kernels  # noqa: E402  (bench/ is not a package)

N = 1 << 24
GRID = 4096
REPEATS = 9          # timed runs per bandwidth figure (best and median)
LAUNCH_ROUNDS = 25   # rounds of interleaved batches per launch figure (min and median)
ALPHA = np.float32(0.5)
LAUNCHES = {"empty0": ("empty0()", None),
            "empty4_numpy": ("empty4(a, 1.0, 2, 3.0)", "numpy"),
            "empty4_alternating": ("empty4(next(a), 1.0, 2, 3.0)", "two"),  # two arrays in turn, next() timed too
            "empty4_fresh": ("empty4(next(a), 1.0, 2, 3.0)", "fresh"),  # a cycle of 64 arrays, next() timed too
            "empty4_device": ("empty4(a, 1.0, 2, 3.0)", "device")}
# Bytes each workload must move at least (read once, write once).
BYTES = {"saxpy": 3 * 4 * N, "stencil": 2 * 4 * GRID * GRID, "sum": 4 * N}


# ---- timing ----------------------------------------------------------------------------------

def interleaved_ns(stmts: dict, target_s: float = 0.01) -> dict:
    """`name -> {"ns", "ratio"}` for each `name -> (stmt, namespace)`.

    Batches of every statement alternate round by round, so that a change in machine load
    affects all of them alike: "ns" is the median per-call time, "ratio" the median over
    rounds of its time over the first statement's time in the same round."""
    timers, numbers = {}, {}
    for name, (stmt, namespace) in stmts.items():
        timers[name] = timeit.Timer(stmt, globals=namespace)
        number, took = timers[name].autorange()  # also the warm-up
        numbers[name] = max(1, int(number * target_s / took))
    rounds = {name: [] for name in stmts}
    for _ in range(LAUNCH_ROUNDS):
        for name, timer in timers.items():
            rounds[name].append(timer.timeit(numbers[name]) / numbers[name] * 1e9)
    first = rounds[next(iter(stmts))]
    result = {}
    for name, ts in rounds.items():
        ratios = [t / b for t, b in zip(ts, first)]
        result[name] = {"ns": statistics.median(ts), "ratio": statistics.median(ratios),
                        "ns_min": min(ts), "ratio_min": min(ratios)}
    return result


def timed_seconds(run, sync=lambda: None) -> list[float]:
    run()
    sync()  # warm-up (and, on a first call, compilation)
    return [_once(run, sync) for _ in range(REPEATS)]


def _once(run, sync) -> float:
    t0 = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - t0


def rate(nbytes: int, seconds: list[float]) -> dict:
    """GB/s of the median run, and of the best."""
    return {"gbps": nbytes / statistics.median(seconds) / 1e9, "gbps_best": nbytes / min(seconds) / 1e9}


def noop_calls(lib: str) -> dict:
    noop = ctypes.CDLL(lib).noop
    noop.restype, noop.argtypes = None, []
    ctx = (ctypes.c_uint64 * 8)()
    stmts = {"noop": ("noop()", {"noop": noop})}
    for name, loader in (("noop_ptr", ctypes.CDLL), ("noop_ptr_pydll", ctypes.PyDLL)):
        fn = loader(lib).noop_ptr  # PyDLL keeps the GIL during the call, as qdc's CPU launches do
        fn.restype, fn.argtypes = None, None
        stmts[name] = ("noop_ptr(ref)", {"noop_ptr": fn, "ref": ctypes.byref(ctx)})
    return stmts


# ---- workloads -------------------------------------------------------------------------------

class Data:
    """The inputs (same seed in every worker) and numpy's reference results."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.x, self.y0 = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
        self.grid = rng.random((GRID, GRID), dtype=np.float32)
        self.y, self.out = self.y0.copy(), np.zeros_like(self.grid)
        self.stencil_ref = np.zeros_like(self.grid)
        numpy_stencil(self.stencil_ref, self.grid)
        self.exact_sum = float(self.x.astype(np.float64).sum())

    def saxpy_ok(self, saxpy) -> bool:
        y = self.y0.copy()
        saxpy(y, self.x)
        return bool(np.allclose(y, ALPHA * self.x + self.y0, rtol=1e-5))

    def stencil_ok(self, stencil) -> bool:
        o = np.zeros_like(self.grid)
        stencil(o, self.grid)
        return bool(np.allclose(o[1:-1, 1:-1], self.stencil_ref[1:-1, 1:-1], rtol=1e-5, atol=1e-6))

    def sum_ok(self, total: float) -> bool:
        return abs(total - self.exact_sum) <= 1e-3 * self.exact_sum


def numpy_saxpy(y, x):
    y += ALPHA * x


def numpy_stencil(o, a):
    o[1:-1, 1:-1] = np.float32(0.2) * (a[1:-1, 1:-1] + a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:])


def workloads(d: Data, saxpy, stencil, total) -> tuple[dict, dict]:
    """The runs of the three workloads given as `saxpy(y, x)`, `stencil(o, a)`, `total(x)`, and
    whether each result is right (checked before anything is timed)."""
    checks = {"saxpy": d.saxpy_ok(saxpy), "stencil": d.stencil_ok(stencil), "sum": d.sum_ok(float(total(d.x)))}
    runs = {"saxpy": lambda: saxpy(d.y, d.x), "stencil": lambda: stencil(d.out, d.grid), "sum": lambda: total(d.x)}
    return runs, checks


def bandwidths(d: Data, saxpy, stencil, total, sync=lambda: None) -> dict:
    """GB/s and correctness of the three workloads, one workload after the other."""
    runs, checks = workloads(d, saxpy, stencil, total)
    return {name: dict(rate(BYTES[name], timed_seconds(run, sync)), ok=checks[name]) for name, run in runs.items()}


# ---- peers -----------------------------------------------------------------------------------

def measure_numpy() -> dict:
    d = Data()
    copy = rate(2 * d.x.nbytes, timed_seconds(lambda: np.copyto(d.y, d.x)))
    return {"version": np.__version__, "copy_gbps": copy["gbps"], "copy_gbps_best": copy["gbps_best"],
            "bandwidth": bandwidths(d, numpy_saxpy, numpy_stencil, np.sum)}


def import_peer(name: str):
    """The peer's module, initialised for the CPU, and its version (None if not installed)."""
    if name == "qdc":
        import qdc
        qdc.init(arch=qdc.cpu)
        return qdc, qdc.__version__
    try:
        with contextlib.redirect_stdout(io.StringIO()) as banner:  # Quadrants prints a banner
            import quadrants
            quadrants.init(arch=quadrants.cpu)
    except ImportError:
        return None, None
    return quadrants, banner.getvalue().split("version ", 1)[-1].split(",", 1)[0].strip() or "?"


def launch_statements(qd, kernels, prefix: str = "") -> dict:
    """`name -> (stmt, namespace)` of the launches of LAUNCHES, each compiled (run once) here."""
    small = np.zeros(16, np.float32)
    device_small = qd.ndarray(qd.f32, small.shape)
    stmts = {}
    for launch, (stmt, array) in LAUNCHES.items():
        arrays = {"numpy": small, "device": device_small, "two": itertools.cycle([small, small.copy()]),
                  "fresh": itertools.cycle([small.copy() for _ in range(64)])}
        namespace = dict(kernels, a=arrays.get(array), next=next)
        exec(stmt, namespace)  # compile outside the timing
        qd.sync()
        stmts[prefix + launch] = (stmt, namespace)
    return stmts


def kernel_workloads(d: Data, kernels) -> tuple[dict, dict]:
    saxpy = kernels["saxpy"]
    return workloads(d, lambda y, x: saxpy(y, x, ALPHA), kernels["stencil"], kernels["sum"])


def measure_kernels(name: str, lib: str) -> dict:
    qd, version = import_peer(name)
    if qd is None:
        return {"version": None}
    kernels = make_kernels(qd)
    launches = interleaved_ns(dict(noop_calls(lib), **launch_statements(qd, kernels)))
    runs, checks = kernel_workloads(Data(), kernels)
    return {"version": version, "launch": launches,
            "bandwidth": {w: dict(rate(BYTES[w], timed_seconds(run, qd.sync)), ok=checks[w]) for w, run in runs.items()}}


def measure_together(lib: str, peers: list[str]) -> dict:
    """Every peer in this process, interleaved: launches in one `interleaved_ns`, and for the
    workloads REPEATS rounds in which each peer (the copy reference first) runs each workload
    once, after a warm-up run. Returns run.py's `{"numpy": ..., peer: ...}`."""
    d = Data()
    loaded = {name: import_peer(name) for name in peers}
    kernels = {name: make_kernels(qd) for name, (qd, _) in loaded.items() if qd is not None}
    stmts = noop_calls(lib)
    for name in kernels:
        stmts.update(launch_statements(loaded[name][0], kernels[name], name + ":"))
    launches = interleaved_ns(stmts)
    runs = {"numpy": workloads(d, numpy_saxpy, numpy_stencil, np.sum)}
    runs.update({name: kernel_workloads(d, kernels[name]) for name in kernels})
    syncs = {name: (loaded[name][0].sync if name in kernels else (lambda: None)) for name in runs}
    copy = lambda: np.copyto(d.y, d.x)  # noqa: E731
    times = {(name, w): [] for name in runs for w in BYTES}
    copy_times = []
    for name, (work, _) in runs.items():  # warm-up (and, on a first call, compilation)
        for run in work.values():
            run()
            syncs[name]()
    for _ in range(REPEATS):
        copy_times.append(_once(copy, lambda: None))
        for w in BYTES:
            for name, (work, _) in runs.items():
                times[name, w].append(_once(work[w], syncs[name]))
    copy_rate = rate(2 * d.x.nbytes, copy_times)
    result = {"numpy": {"version": np.__version__, "copy_gbps": copy_rate["gbps"],
                        "copy_gbps_best": copy_rate["gbps_best"]}}
    for name in peers:
        if name not in kernels:
            result[name] = {"version": None}
            continue
        prefix = name + ":"
        result[name] = {"version": loaded[name][1],
                        "launch": dict({k[len(prefix):]: v for k, v in launches.items() if k.startswith(prefix)},
                                       **{k: v for k, v in launches.items() if ":" not in k})}
    for name, (_, checks) in runs.items():
        result[name]["bandwidth"] = {w: dict(rate(BYTES[w], times[name, w]), ok=checks[w]) for w in BYTES}
    return result


def main() -> int:
    peer, lib, out = sys.argv[1:4]
    if peer == "together":
        result = measure_together(lib, ["qdc", "quadrants"])
    else:
        result = measure_numpy() if peer == "numpy" else measure_kernels(peer, lib)
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
