"""Genesis on qdc against Quadrants, in one run on one machine: import, gs.init, scene.build()
(cold: empty kernel caches; warm: the second process), first step and steady-state step, for the
scenes of bench/genesis_scene.py (by default the plane+box and the Franka arm; also `stack`, `go2`,
`mpm`, `sph`, `pbd`), each in Genesis's field mode (GS_ENABLE_NDARRAY=0) and its default ndarray
mode; and the largest difference of the positions after STEPS steps.

    python bench/bench_genesis.py [--steps 100] [--scenes box,franka,...] [--modes field,ndarray] [--arch vulkan]

`--arch vulkan` runs Genesis's kernels on the Vulkan arch, Quadrants' and qdc's alike
(bench/genesis_scene.py says how). Needs genesis-world (1.4.5), torch and quadrants in the
running Python. Each measurement is a fresh process (bench/genesis_scene.py); the kernel caches
are temporary folders.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from genesis_scene import SCENES  # noqa: E402  (its module level imports neither Genesis nor qdc)


def run_scene(scene: str, steps: int, qdc: bool, mode: str, cache: str, arch: str = "cpu") -> dict:
    env = dict(os.environ, GS_ENABLE_NDARRAY="0" if mode == "field" else "1",
               QDC_CACHE_DIR=cache, QD_OFFLINE_CACHE_FILE_PATH=cache)
    args = ([sys.executable, os.path.join(HERE, "genesis_scene.py"), scene, str(steps), "--arch", arch]
            + (["--qdc"] if qdc else []))
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def max_difference(a, b) -> float:
    import numpy as np
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--scenes", default="box,franka", help=f"comma-separated, of {','.join(SCENES)}")
    parser.add_argument("--modes", default="field,ndarray")
    parser.add_argument("--arch", default="cpu", help="the arch Genesis's kernels run on (cpu, vulkan)")
    args = parser.parse_args()
    unknown = [scene for scene in args.scenes.split(",") if scene not in SCENES]
    if unknown:
        parser.error(f"unknown scene {', '.join(unknown)}; the scenes are {', '.join(SCENES)}")
    rows = []
    for scene in args.scenes.split(","):
        for mode in args.modes.split(","):
            results = {}
            for name, qdc in (("quadrants", False), ("qdc", True)):
                with tempfile.TemporaryDirectory(prefix=f"bench-genesis-{name}-") as cache:
                    cold = run_scene(scene, args.steps, qdc, mode, cache, args.arch)
                    warm = run_scene(scene, args.steps, qdc, mode, cache, args.arch)
                results[name] = (cold, warm)
            (q_cold, q_warm), (c_cold, c_warm) = results["quadrants"], results["qdc"]
            diff = max_difference(q_warm["pos"], c_warm["pos"])
            rows.append((scene, mode, q_cold, q_warm, c_cold, c_warm, diff))
            print(f"{scene}/{mode}: positions differ by at most {diff:.2e}", flush=True)
    print()
    print("| scene | mode | what | Quadrants | qdc | qdc / Quadrants |")
    print("| --- | --- | --- | --- | --- | --- |")
    for scene, mode, q_cold, q_warm, c_cold, c_warm, diff in rows:
        for what, q, c, unit in (("import genesis", q_warm["import"], c_warm["import"], "s"),
                                 ("gs.init", q_warm["init"], c_warm["init"], "s"),
                                 ("scene.build() cold", q_cold["build"], c_cold["build"], "s"),
                                 ("scene.build() warm", q_warm["build"], c_warm["build"], "s"),
                                 ("first step (warm)", q_warm["first_step"], c_warm["first_step"], "s"),
                                 ("step (steady state)", q_warm["step"] * 1e3, c_warm["step"] * 1e3, "ms")):
            print(f"| {scene} | {mode} | {what} | {q:.3f} {unit} | {c:.3f} {unit} | {c / q:.2f} |")
        print(f"| {scene} | {mode} | kernels compiled cold / warm | | {c_cold['compiles']} / {c_warm['compiles']} | |")
        print(f"| {scene} | {mode} | max position difference after {args.steps} steps | | {diff:.1e} | |")


if __name__ == "__main__":
    main()
