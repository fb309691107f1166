"""What checking signatures costs a deployment: `qdc.runtime.load` of a module of N kernels
(default 50) with trusted keys (every entry's and the module record's Ed25519 signature checked)
against the same load without (no signature read). Goal: at most 1.1x.

    python3 bench/bench_signed_load.py [--kernels N] [--rounds R]

The module is the one of bench_aot.py, built once with `qdc build --sign`: loading checks the
module record's signature and its signed statement of the entries' digests, then each entry
by its digest (runtime/signing.py). Both loads run in this
one process, alternating round by round, each on a fresh CPU runtime (so every kernel library is
really loaded again, as in a new process); min and median of R rounds each. The reading and
checking part alone (records, hashes, signatures: what precedes the dlopen of each library) is
timed the same way, and as it would be with one signature check per entry instead.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_aot import KERNEL_TEMPLATE, MODULE_HEADER  # noqa: E402  (bench/ is not a package)


def build(tmp: str, n_kernels: int) -> tuple[str, str]:
    """(cache folder, public key file) of the generated module built and signed."""
    src = os.path.join(tmp, "gen")
    os.makedirs(src)
    with open(os.path.join(src, "fifty.py"), "w", encoding="utf-8") as f:
        f.write(MODULE_HEADER + "".join(KERNEL_TEMPLATE.format(i=i, reps=1 + i % 4, c=0.1 + 0.01 * i)
                                        for i in range(n_kernels)))
    key, cache = os.path.join(tmp, "ci.key"), os.path.join(tmp, "cache")
    qdc = [sys.executable, "-m", "qdc.cli.main"]
    subprocess.run(qdc + ["keygen", key], check=True, capture_output=True)
    subprocess.run(qdc + ["build", src, "--cache", cache, "--sign", key], check=True, capture_output=True)
    return cache, key + ".pub"


def read_and_check(cache: str, trust, per_entry: bool = False) -> None:
    """What `load` does before any library is loaded: the module record and every entry, read
    and verified; `per_entry`: each entry by its own signature, not by the module's statement."""
    from qdc.runtime.cache import DirStore, read_entry, read_module
    store = DirStore(cache)
    record = read_module(store, "fifty", "cpu", trust)
    attested = trust.attested(record) if trust is not None and not per_entry else {}
    for key in record["kernels"].values():
        read_entry(store, key, trust, attested.get(key))


def min_median(values) -> str:
    return f"{min(values) * 1e3:7.2f} / {statistics.median(values) * 1e3:7.2f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=int, default=50, help="kernels in the generated module (50)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of each load (30)")
    args = ap.parse_args()
    from qdc.runtime import context, load, signing
    with tempfile.TemporaryDirectory(prefix="qdc-bench-signed-") as tmp:
        cache, public = build(tmp, args.kernels)
        trust = signing.trust_from([public])
        times = {"unsigned": [], "signed": [], "check unsigned": [], "check signed": [], "check per entry": []}
        for _ in range(args.rounds):
            for name, keys in (("unsigned", None), ("signed", [public])):
                context.reset("cpu")
                t0 = time.perf_counter()
                load(cache, "fifty", arch="cpu", trusted_keys=keys)
                times[name].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                read_and_check(cache, trust if keys else None)
                times[f"check {name}"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            read_and_check(cache, trust, per_entry=True)
            times["check per entry"].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    least = {k: min(v) for k, v in times.items()}
    print(f"## qdc.runtime.load of {args.kernels} kernels, min / median of {args.rounds} rounds, "
          f"fresh runtime each, alternating")
    print(f"  without trusted keys:          {min_median(times['unsigned'])}")
    print(f"  with trusted keys (checked):   {min_median(times['signed'])}")
    print(f"  ratio of medians (of minima):  {median['signed'] / median['unsigned']:.3f}x "
          f"({least['signed'] / least['unsigned']:.3f}x); goal <= 1.1x")
    print(f"  records + hashes alone:        {min_median(times['check unsigned'])}")
    print(f"  ... + signatures (as load):    {min_median(times['check signed'])}")
    print(f"  ... + each entry's signature:  {min_median(times['check per entry'])}   "
          f"({(least['check per entry'] - least['check unsigned']) / args.kernels * 1e6:.0f} µs per entry, minima; "
          f"what the module's signed statement of digests saves)")


if __name__ == "__main__":
    main()
