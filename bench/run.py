"""`make bench`: qdc beside numpy and Quadrants, every figure measured in one run.

Prints a markdown table and writes it to bench/results/latest.md. By default every peer is
measured in one worker process (bench/measure.py `together`), interleaved round by round, so
that a change of the machine's load hits every peer alike; `--separate` measures each peer in
a process of its own instead, one after the other, so that no peer's thread pool is alive
while another is timed. Figures are medians and bests of repeated runs after a warm-up (launches: median and
minimum ratio to the no-op over interleaved rounds); results are checked against numpy before
being timed, and a wrong one is marked in the table.
Quadrants (`pip install quadrants`) compiles the very same kernel source (bench/kernels.py);
when it is not installed the table says so.

- Launch overhead: an empty kernel with 0 and with 4 arguments, as a multiple of a ctypes
  call of a no-op C function built here with `cc` (`void noop(void) {}`, through
  `ctypes.CDLL`), timed in the same process, interleaved with the launches. For context the
  table also shows the call shape of a launch (`void noop_ptr(void *)` given a byref),
  plain and through `ctypes.PyDLL`, which keeps the GIL during the call as qdc's CPU
  launches (and Quadrants') do.
- Bandwidth: saxpy over 2^24 f32, a 5-point stencil over 4096x4096 f32 and a sum of 2^24
  f32, in GB/s of the bytes each must move at least, and as a multiple of the bandwidth of
  `np.copyto` on 64 MiB. numpy is single-threaded; qdc and Quadrants use every core.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOOP_C = "void noop(void) {}\nvoid noop_ptr(void *ctx) { (void)ctx; }\n"
PEERS = [("qdc", "qdc"), ("quadrants", "Quadrants")]

REFERENCES = [("noop", "ctypes call of `void noop(void)` (**the launch reference**)"),
              ("noop_ptr", "ctypes call of `void noop_ptr(void *)` with a byref argument (a launch's call shape)"),
              ("noop_ptr_pydll", "the same through `ctypes.PyDLL` (keeps the GIL: qdc's own launch call)")]
LAUNCH_ROWS = [("empty0", "launch, empty kernel, 0 args"),
               ("empty4_numpy", "launch, empty kernel, 4 args (numpy array + 3 scalars)"),
               ("empty4_alternating", "the same with two numpy arrays in turn"),
               ("empty4_fresh", "the same with a different numpy array every call (a cycle of 64)"),
               ("empty4_device", "launch, empty kernel, 4 args (qd.ndarray + 3 scalars)")]
BANDWIDTH_ROWS = [("saxpy", "saxpy y = a*x + y, 2^24 f32 (192 MiB moved)"),
                  ("stencil", "5-point stencil, 4096x4096 f32 (128 MiB moved)"),
                  ("sum", "sum, 2^24 f32 (64 MiB read)")]


def build_noop(tmp: Path) -> Path:
    src, lib = tmp / "noop.c", tmp / "libnoop.so"
    src.write_text(NOOP_C, encoding="utf-8")
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def run_together(lib: Path) -> dict:
    """numpy's and every peer's results (display names), measured in one process."""
    result = run_worker("together", lib)
    return {"numpy": result["numpy"], **{display: result[peer] for peer, display in PEERS}}


def run_worker(peer: str, lib: Path) -> dict:
    print(f"measuring {peer} ...", file=sys.stderr, flush=True)
    out = lib.with_name(f"{peer}.json")
    subprocess.run([sys.executable, str(HERE / "measure.py"), peer, str(lib), str(out)],
                   stdout=subprocess.DEVNULL, check=True)  # Quadrants talks on stdout
    return json.loads(out.read_text(encoding="utf-8"))


# ---- report ----------------------------------------------------------------------------------

def fmt_ns(ns: float) -> str:
    return f"{ns:.0f} ns" if ns < 1000 else f"{ns / 1000:.2f} µs"


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    llc = ""
    with contextlib.suppress(OSError):  # the working sets here are 64-192 MiB: L3 size matters
        llc = ", L3 " + Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text(encoding="utf-8").strip()
    return f"{model}, {os.cpu_count()} logical cores{llc}, {platform.system()} {platform.release()}"


def _load() -> str:
    """The 1, 5 and 15 minute load averages (bandwidth and launch figures move with them)."""
    with contextlib.suppress(OSError, AttributeError):
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return "unknown"


def table(numpy: dict, peers: dict) -> list[str]:
    """`peers`: display name -> worker result, qdc first."""
    names = list(peers)
    others = names[1:]
    head = ["benchmark", "numpy / reference", *names, "qdc vs numpy", *(f"qdc vs {n}" for n in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    blank = [""] * (len(head) - 2)

    def row(cells):
        lines.append("| " + " | ".join(cells) + " |")

    refs = peers["qdc"]["launch"]
    for key, title in REFERENCES:
        ratio = "" if key == "noop" else f" = {refs[key]['ratio']:.2f}× noop"
        row([title, fmt_ns(refs[key]["ns"]) + ratio] + blank)
    for key, title in LAUNCH_ROWS:
        cells = {n: peers[n]["launch"][key] for n in names}
        row([title, "—", *(f"{fmt_ns(c['ns'])} = **{c['ratio']:.2f}× noop** (min {c['ratio_min']:.2f}×)"
                           for c in cells.values()), "—",
             *(f"{cells[n]['ratio'] / cells['qdc']['ratio']:.1f}×" for n in others)])
    copy = numpy["copy_gbps"]
    row(["`np.copyto` of 64 MiB (bandwidth reference)", f"{copy:.1f} GB/s (best {numpy['copy_gbps_best']:.1f})"] + blank)

    def bw(c: dict) -> str:
        return f"{c['gbps']:.1f} GB/s ({c['gbps'] / copy:.2f}× copy; best {c['gbps_best']:.1f})" \
            + ("" if c["ok"] else " **WRONG RESULT**")

    for key, title in BANDWIDTH_ROWS:
        q = peers["qdc"]["bandwidth"][key]["gbps"]
        row([title, bw(numpy["bandwidth"][key]), *(bw(peers[n]["bandwidth"][key]) for n in names),
             f"{q / numpy['bandwidth'][key]['gbps']:.2f}×",
             *(f"{q / peers[n]['bandwidth'][key]['gbps']:.2f}×" for n in others)])
    return lines


def main() -> int:
    separate = "--separate" in sys.argv[1:]
    t0 = time.perf_counter()
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="qdc-bench-") as tmp:
        lib = build_noop(Path(tmp))
        if separate:
            numpy = run_worker("numpy", lib)
            results = {display: run_worker(peer, lib) for peer, display in PEERS}
        else:
            results = run_together(lib)
            numpy = results.pop("numpy")
    peers = {name: r for name, r in results.items() if r["version"] is not None}
    notes = [f"{name} is not installed (`pip install {name.lower()}`): its column is left out."
             for name, r in results.items() if r["version"] is None]
    versions = ", ".join([f"Python {platform.python_version()}", f"numpy {numpy['version']}"] +
                         [f"{name} {r['version']}" for name, r in peers.items()])
    report = [
        "# qdc benchmarks", "",
        f"Machine: {machine()}. {versions}.",
        f"qdc and Quadrants use all {os.cpu_count()} cores (CPU backend); numpy is single-threaded. "
        + ("Each peer runs in its own process. " if separate else
           "Every peer runs in one process, interleaved round by round. ")
        + "Launches: medians (and minimum) of 25 rounds of interleaved batches "
        "(ratios taken per round, against the no-op call in the same process); bandwidth: medians "
        "(and best) of 9 runs after a warm-up. 'qdc vs X': how many times faster qdc is (medians).", "",
        *table(numpy, peers), "",
        *(f"Note: {n}" for n in notes),
        f"Measured by `make bench` (bench/run.py) in {time.perf_counter() - t0:.0f} s; load average "
        f"{load_before} before, {_load()} after.",
    ]
    text = "\n".join(report) + "\n"
    print(text)
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / "latest.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
