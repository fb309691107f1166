"""DiffMPM (kernels/diffmpm.py): forward and backward time, qdc against Quadrants running the
same source with the import swapped (`import quadrants as qd`).

    python3 bench/bench_diffmpm.py [--rounds N] [--arch cpu] [--threads N] [--side S --grid G] [--graph]

`--graph` adds a third peer, qdc with the substep kernels (P2G, grid update, G2P) declared
`@qd.kernel(graph=True)`: on CUDA each of their launches and `.grad` launches is a graph replay.

`--side`/`--grid` scale the block (S x S particles) and the grid (G x G nodes) by rewriting
those two constants of the source, for both peers alike.

One round: the forward pass (every step's P2G, grid update and G2P, then the loss) and the
backward pass (`loss.grad = 1`, then each kernel's `.grad` in reverse order), each timed up to
a sync; setting up the particles and zeroing the gradients are not timed. Each peer runs in its
own process, one after the other; the first round (compilation) is dropped, and the table gives
the best and the median of the others. Both peers' gradients must agree before anything is shown.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "kernels", "diffmpm.py")
PEERS = ("qdc", "quadrants")
GRAPH_PEER = "qdc-graph"  # qdc, the substep kernels declared graph=True
SUBSTEPS = ("p2g", "grid_op", "g2p")


def load_module(peer: str, folder: str, sizes: dict):
    """kernels/diffmpm.py as a module, importing `peer` as qd, with the `sizes` given."""
    text = open(SOURCE, encoding="utf-8").read()
    if peer == "quadrants":
        text = text.replace("import qdc as qd", "import quadrants as qd")
    if peer == GRAPH_PEER:
        for name in SUBSTEPS:
            text, count = re.subn(rf"^@qd.kernel\ndef {name}\(", f"@qd.kernel(graph=True)\ndef {name}(", text, flags=re.M)
            assert count == 1, f"kernels/diffmpm.py has no '@qd.kernel' line above 'def {name}('"
    for name, value in sizes.items():
        text, count = re.subn(rf"^{name} = \d+\b", f"{name} = {value}", text, flags=re.M)
        assert count == 1, f"kernels/diffmpm.py has no line '{name} = <int>'"
    path = os.path.join(folder, f"diffmpm_{peer}.py")  # the kernels' source must be readable
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(f"diffmpm_{peer}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_round(m, qd, v0) -> tuple[float, float]:
    m.init_particles()
    vel = m.v.to_numpy()
    vel[0] = v0
    m.v.from_numpy(vel)
    m.clear_grid()
    m.loss[None] = 0.0
    qd.sync()
    t0 = time.perf_counter()
    m.forward()
    qd.sync()
    t1 = time.perf_counter()
    for f in (m.x, m.v, m.C, m.F, m.grid_v_in, m.grid_m_in, m.grid_v_out, m.loss):
        f.grad.fill(0)
    m.loss.grad[None] = 1.0
    qd.sync()
    t2 = time.perf_counter()
    m.compute_loss.grad()
    for s in reversed(range(m.steps)):
        m.g2p.grad(s)
        m.grid_op.grad(s)
        m.p2g.grad(s)
    qd.sync()
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2


def measure(peer: str, rounds: int, arch: str, threads: int | None, sizes: dict) -> dict:
    try:
        qd = __import__("qdc" if peer == GRAPH_PEER else peer)
    except ImportError:
        return {"missing": f"{peer} is not installed" + (" (pip install quadrants)" if peer == "quadrants" else "")}
    qd.init(arch=getattr(qd, arch), **({"cpu_max_num_threads": threads} if threads else {}))
    with tempfile.TemporaryDirectory() as folder:
        m = load_module(peer, folder, sizes)
        v0 = ((np.random.default_rng(0).random((m.n_particles, 2)) - 0.5) * 2).astype(np.float32)
        times = [one_round(m, qd, v0) for _ in range(rounds + 1)][1:]
        return {"forward": [t[0] for t in times], "backward": [t[1] for t in times],
                "loss": float(m.loss[None]), "grad": m.v.grad.to_numpy()[0].tolist(),
                "steps": m.steps, "particles": m.n_particles, "grid": m.n_grid}


def run_worker(peer: str, rounds: int, arch: str, threads: int | None, sizes: dict) -> dict:
    extra = [*(["--threads", str(threads)] if threads else []), *(f"--{k.replace('n_', '')}={v}" for k, v in sizes.items())]
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", peer, "--rounds", str(rounds),
                           "--arch", arch, *extra], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{peer} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ms(values) -> str:
    return f"{min(values) * 1e3:.2f} ms (median {statistics.median(values) * 1e3:.2f})"


def table(r: dict, arch: str, threads: int | None) -> str:
    q = r["qdc"]
    on = f"{arch}, {threads} thread(s)" if threads else arch
    lines = [f"DiffMPM on {on}: {q['particles']} particles, {q['grid']}x{q['grid']} grid, {q['steps']} steps",
             "", "| pass | qdc | Quadrants | Quadrants / qdc (best) |", "|---|---|---|---|"]
    for name in ("forward", "backward"):
        qu = r["quadrants"]
        if "missing" in qu:
            lines.append(f"| {name} | {ms(q[name])} | {qu['missing']} | |")
        else:
            lines.append(f"| {name} | {ms(q[name])} | {ms(qu[name])} | {min(qu[name]) / min(q[name]):.2f} |")
    if GRAPH_PEER in r:
        g = r[GRAPH_PEER]
        lines += ["", "| pass | qdc, plain launches | qdc, substeps graph=True | plain / graph (best) |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {ms(q[name])} | {ms(g[name])} | {min(q[name]) / min(g[name]):.2f} |"
                  for name in ("forward", "backward")]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--threads", type=int, help="cpu_max_num_threads for both peers (default: theirs)")
    ap.add_argument("--side", type=int, help="particles per side of the block (the source's `side`)")
    ap.add_argument("--grid", type=int, help="grid nodes per side (the source's `n_grid`)")
    ap.add_argument("--graph", action="store_true", help="also qdc with the substep kernels graph=True")
    ap.add_argument("--worker", choices=PEERS + (GRAPH_PEER,))
    args = ap.parse_args()
    sizes = {k: v for k, v in (("side", args.side), ("n_grid", args.grid)) if v}
    if args.worker:
        print(json.dumps(measure(args.worker, args.rounds, args.arch, args.threads, sizes)))
        return
    peers = PEERS + ((GRAPH_PEER,) if args.graph else ())
    results = {peer: run_worker(peer, args.rounds, args.arch, args.threads, sizes) for peer in peers}
    if args.graph:
        got, want = np.array(results[GRAPH_PEER]["grad"]), np.array(results["qdc"]["grad"])
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max()):
            raise SystemExit(f"the graph=True gradient differs from plain launches: max difference "
                             f"{np.abs(got - want).max():.3g}")
    if "missing" not in results["quadrants"]:
        got, want = np.array(results["qdc"]["grad"]), np.array(results["quadrants"]["grad"])
        if not np.allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max()):
            raise SystemExit(f"the gradients disagree: max difference {np.abs(got - want).max():.3g}")
    print(table(results, args.arch, args.threads))


if __name__ == "__main__":
    main()
