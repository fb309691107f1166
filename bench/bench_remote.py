"""Sharded builds and the remote store: `python3 bench/bench_remote.py [--kernels 256] [--store s3|file]`.

Generates a project of K small kernels (an elementwise expression each, all different, in
modules of 16) and measures, for --arch cpu,vulkan (default):
  1. a one-machine build (`qdc build -j <CPUs>`, fresh cache);
  2. 4 shards (`--shard i/4 --remote URL -j 1`) in 4 processes at once, sharing one store:
     the slowest shard's wall time and the sum of the four;
  3. a second CI run from an empty local cache against the filled store: its wall time and
     the number of kernels compiled (0 expected: everything is pulled);
  4. `qdc.runtime.load` of one module from the store: cold (empty read-through cache) and warm.
The store is a local `moto_server` (S3 API on 127.0.0.1; --store file for a file:// folder).
Nothing leaves the machine. Prints a Markdown table with the CPU count.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PER_MODULE = 16
EXPRESSIONS = ["a[i] * {c} + b[i]", "qd.sin(a[i]) * {c}", "a[i] * a[i] - {c} * b[i]", "qd.sqrt(a[i] * a[i] + {c})"]


def write_project(folder: str, kernels: int) -> None:
    os.makedirs(folder)
    for m in range(0, kernels, PER_MODULE):
        lines = ["import qdc as qd", "F = qd.types.ndarray(dtype=qd.f32, ndim=1)"]
        for i in range(m, min(m + PER_MODULE, kernels)):
            expr = EXPRESSIONS[i % len(EXPRESSIONS)].format(c=f"{1 + i * 0.001:.3f}")
            lines += ["", "@qd.kernel", f"def k{i}(a: F, b: F, out: F):", "    for i in a:", f"        out[i] = {expr}"]
        with open(os.path.join(folder, f"mod{m // PER_MODULE}.py"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def qdc(args, env) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"qdc {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0, done.stdout


def start_moto() -> tuple[subprocess.Popen, dict, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT"), timeout=10)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    return proc, env, "s3://bench/kernels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=256)
    parser.add_argument("--arch", default="cpu,vulkan")
    parser.add_argument("--store", choices=["s3", "file"], default="s3")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="qdc-bench-remote-")
    server = None
    try:
        src = os.path.join(work, "kernels")
        write_project(src, args.kernels)
        env = dict(os.environ)
        if args.store == "s3":
            server, extra, url = start_moto()
            env.update(extra)
        else:
            url = f"file://{work}/store"
        cpus = os.cpu_count() or 1
        one, _ = qdc(["build", src, "--arch", args.arch, "--cache", f"{work}/one", "-j", str(cpus)], env)
        t0 = time.perf_counter()
        shards = [subprocess.Popen([sys.executable, "-m", "qdc.cli.main", "build", src, "--arch", args.arch,
                                    "--cache", f"{work}/shard{k}", "--shard", f"{k}/4", "--remote", url, "-j", "1"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                  for k in range(1, 5)]
        ends = {}
        while len(ends) < len(shards):  # each shard's own end, whatever order they finish in
            for i, p in enumerate(shards):
                if i not in ends and p.poll() is not None:
                    ends[i] = time.perf_counter()
                    if p.returncode != 0:
                        sys.exit(f"a shard failed:\n{p.stderr.read()[-2000:]}")
            time.sleep(0.05)
        walls = [end - t0 for end in ends.values()]
        second, out = qdc(["build", src, "--arch", args.arch, "--cache", f"{work}/fresh", "--remote", url,
                           "-j", str(cpus)], env)
        compiled = int(re.search(r"(\d+) built", out).group(1))
        probe = ("import sys, time; from qdc.runtime import load; t = time.perf_counter(); "
                 "load(sys.argv[1], 'mod0', arch='cpu', local_cache=sys.argv[2]); print(time.perf_counter() - t)")
        cold = float(subprocess.run([sys.executable, "-c", probe, url, f"{work}/deploy"], env=env,
                                    capture_output=True, text=True, check=True).stdout)
        warm = float(subprocess.run([sys.executable, "-c", probe, url, f"{work}/deploy"], env=env,
                                    capture_output=True, text=True, check=True).stdout)
        print(f"{args.kernels} kernels for {args.arch}, store {args.store}, {cpus} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}\n")
        print("| step | wall time |\n|---|---|")
        print(f"| one-machine build (-j {cpus}) | {one:.1f} s |")
        print(f"| 4 shards at once (-j 1 each): slowest | {max(walls):.1f} s |")
        print(f"| 4 shards at once: sum of the four | {sum(walls):.1f} s |")
        print(f"| second CI run, empty local cache ({compiled} compiled) | {second:.1f} s |")
        print(f"| `load` of a {PER_MODULE}-kernel module from the store, cold | {cold:.2f} s |")
        print(f"| `load` of the same module, warm | {warm:.2f} s |")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
