"""Build time of `qdc build`: the demo kernels, DiffMPM, and a generated Genesis-sized module.

    python3 bench/bench_build.py [--rounds 3] [--genesis-kernels 300] [--against REV]
                                 [--workloads demo,diffmpm,kernels,genesis]

Workloads, each a cold build (a fresh cache folder) in a fresh process:
- demo: kernels/ but DiffMPM, `--cpu-target native`, -j1: each kernel variant's CPU time (goal:
  at most 40 ms each).
- diffmpm: kernels/diffmpm.py, portable (qdc build's default) and native, -j1: the slowest
  kernel variant (goal: at most 0.5 s).
- kernels: all of kernels/ (27 variants), portable, -j1: the whole build (goal: at most 2 s).
- genesis: one generated module of N small-to-medium kernels in the style of Genesis's rigid
  solver (batched `ndrange` loops over links and DOFs, quaternion and 3x3 matrix algebra, DOF
  ranges read from fields, gathers through index fields, contact forces scattered with atomics,
  per-batch reductions), portable, with qdc build's default -j (every core).

Per kernel variant the CPU time is that of the building thread plus its link's (the `ld` it ran,
or the link the LLD server answered with), measured around each job of a -j1 build, so older
trees without `--timings` are measured alike, the wall time beside it; per build, the process's
CPU time (its workers', ld's and the LLD server's included) and wall time. `--against REV` measures qdc at git revision REV too (exported with `git archive` into a
temporary folder; the repository is left alone), the two trees alternating round by round so
that the load of a shared machine hits both alike; the tables show the best round of each (the
least disturbed) with the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "kernels")
SMALL_KERNEL_GOAL_MS, DIFFMPM_GOAL_S, KERNELS_GOAL_S = 40.0, 0.5, 2.0

# ---- the generated Genesis-sized module ----------------------------------------------------------

GENESIS_HEADER = '''"""Generated: kernels in the style of a batched rigid-body solver (bench/bench_build.py)."""
import qdc as qd

L, D, G, C, B = 64, 96, 80, 128, 16   # links, DOFs, geometries, contacts, batched environments
link_pos = qd.Vector.field(3, qd.f32, shape=(L, B))
link_quat = qd.Vector.field(4, qd.f32, shape=(L, B))
link_vel = qd.Vector.field(3, qd.f32, shape=(L, B))
link_ang = qd.Vector.field(3, qd.f32, shape=(L, B))
link_force = qd.Vector.field(3, qd.f32, shape=(L, B))
link_inertia = qd.Matrix.field(3, 3, qd.f32, shape=L)
link_mass = qd.field(qd.f32, shape=L)
link_dof_start = qd.field(qd.i32, shape=L)
link_dof_end = qd.field(qd.i32, shape=L)
dof_vel = qd.field(qd.f32, shape=(D, B))
dof_acc = qd.field(qd.f32, shape=(D, B))
dof_pos = qd.field(qd.f32, shape=(D, B))
dof_limit = qd.Vector.field(2, qd.f32, shape=D)
geom_link = qd.field(qd.i32, shape=G)
geom_offset = qd.Vector.field(3, qd.f32, shape=G)
geom_pos = qd.Vector.field(3, qd.f32, shape=(G, B))
contact_link = qd.Vector.field(2, qd.i32, shape=(C, B))
contact_normal = qd.Vector.field(3, qd.f32, shape=(C, B))
contact_depth = qd.field(qd.f32, shape=(C, B))
energy = qd.field(qd.f32, shape=B)


@qd.func
def rotate(q, v):
    u = qd.Vector([q[1], q[2], q[3]])
    t = 2.0 * u.cross(v)
    return v + q[0] * t + u.cross(t)


@qd.func
def quat_to_matrix(q):
    w, x, y, z = q[0], q[1], q[2], q[3]
    return qd.Matrix([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                      [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                      [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
'''

GENESIS_KERNELS = [
    # forward kinematics of geometries: a gather through an index field, a quaternion rotation
    '''
@qd.kernel
def geom_kinematics_{k}():
    for i_g, i_b in qd.ndrange(G, B):
        l = geom_link[i_g]
        geom_pos[i_g, i_b] = link_pos[l, i_b] + rotate(link_quat[l, i_b], geom_offset[i_g] * {c})
''',
    # link velocity from its DOF range (a dynamic inner loop)
    '''
@qd.kernel
def link_velocity_{k}(dt: qd.f32):
    for i_l, i_b in qd.ndrange(L, B):
        acc = qd.Vector([0.0, 0.0, 0.0])
        for i_d in range(link_dof_start[i_l], link_dof_end[i_l]):
            acc += qd.Vector([dof_vel[i_d, i_b], dof_acc[i_d, i_b] * dt, {c}])
        link_vel[i_l, i_b] = acc
''',
    # world inertia R I R^T and the gyroscopic torque
    '''
@qd.kernel
def world_inertia_{k}():
    for i_l, i_b in qd.ndrange(L, B):
        R = quat_to_matrix(link_quat[i_l, i_b])
        I = R @ link_inertia[i_l] @ R.transpose() * {c}
        w = link_ang[i_l, i_b]
        link_force[i_l, i_b] = w.cross(I @ w) + link_mass[i_l] * qd.Vector([0.0, 0.0, -9.81])
''',
    # contact forces scattered onto both links with atomics
    '''
@qd.kernel
def contact_forces_{k}(stiffness: qd.f32):
    for i_c, i_b in qd.ndrange(C, B):
        d = contact_depth[i_c, i_b]
        if d > 0.0:
            f = contact_normal[i_c, i_b] * (stiffness * d + {c} * d * d)
            pair = contact_link[i_c, i_b]
            link_force[pair[0], i_b] += f
            link_force[pair[1], i_b] -= f
''',
    # a per-environment reduction over the links (a serial inner loop)
    '''
@qd.kernel
def kinetic_energy_{k}():
    for i_b in range(B):
        e = 0.0
        for i_l in range(L):
            v = link_vel[i_l, i_b]
            w = link_ang[i_l, i_b]
            e += 0.5 * link_mass[i_l] * v.norm_sqr() + 0.5 * w.dot(link_inertia[i_l] @ w) * {c}
        energy[i_b] = e
''',
    # semi-implicit Euler on the DOFs with joint limits
    '''
@qd.kernel
def integrate_dofs_{k}(dt: qd.f32):
    for i_d, i_b in qd.ndrange(D, B):
        v = dof_vel[i_d, i_b] + dt * dof_acc[i_d, i_b] * {c}
        p = dof_pos[i_d, i_b] + dt * v
        lim = dof_limit[i_d]
        if p < lim[0]:
            p, v = lim[0], 0.0
        elif p > lim[1]:
            p, v = lim[1], 0.0
        dof_pos[i_d, i_b] = p
        dof_vel[i_d, i_b] = v
''',
    # quaternion integration of the links' orientation, normalised
    '''
@qd.kernel
def integrate_links_{k}(dt: qd.f32):
    for i_l, i_b in qd.ndrange(L, B):
        q = link_quat[i_l, i_b]
        w = link_ang[i_l, i_b] * {c}
        dq = 0.5 * dt * qd.Vector([-w[0] * q[1] - w[1] * q[2] - w[2] * q[3], w[0] * q[0] + w[1] * q[3] - w[2] * q[2],
                                   w[1] * q[0] + w[2] * q[1] - w[0] * q[3], w[2] * q[0] + w[0] * q[2] - w[1] * q[1]])
        q = q + dq
        link_quat[i_l, i_b] = q / qd.sqrt(q.norm_sqr() + 1e-12)
        link_pos[i_l, i_b] += dt * link_vel[i_l, i_b]
''',
]


def genesis_module(kernels: int) -> str:
    """GENESIS_HEADER and `kernels` kernels, the templates in turn, each with its own constant."""
    parts = [GENESIS_HEADER]
    for k in range(kernels):
        template = GENESIS_KERNELS[k % len(GENESIS_KERNELS)]
        parts.append(template.format(k=k, c=f"{1.0 + k / 1000:.4f}"))
    return "\n".join(parts)


WARM_UP_MODULE = """import qdc as qd

x = qd.field(qd.f32, shape=8)


@qd.kernel
def warm_up():
    for i in x:
        x[i] = x[i] * 2.0 + 1.0
"""

# ---- one measured build (a worker process, importing the tree under test) -------------------------

def measure_build(paths: list, cpu_target: str, jobs: int) -> dict:
    """Build `paths` cold into a temporary cache in this process: the whole build's CPU and
    wall seconds, and with -j1 each kernel variant's (CPU: its thread's and its ld's)."""
    import resource

    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver import options
    per_kernel: dict = {}
    run_job = build_mod.run_job
    lld_cpu = _count_lld_server_cpu()

    def timed_job(src, job, *args, **kwargs):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0, c0 = time.perf_counter(), time.thread_time() + children.ru_utime + children.ru_stime + lld_cpu[0]
        result = run_job(src, job, *args, **kwargs)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.thread_time() + children.ru_utime + children.ru_stime + lld_cpu[0] - c0
        suffix = {"grad": ".grad", "forward_ad": ".fwd"}.get(job.variant, "")
        per_kernel[f"{job.module}.{job.kernel}{suffix}"] = [cpu, time.perf_counter() - t0, result["status"]]
        return result
    build_mod.run_job = timed_job
    opts = options.Options().update(cpu_target=cpu_target)
    with tempfile.TemporaryDirectory(prefix="qdc-bench-build-") as cache:
        # First a one-kernel build, untimed: imports and LLVM's set-up are paid once per process,
        # not per kernel (the first kernel of an older tree's build paid them).
        warm = os.path.join(cache, "warm_up_module.py")
        with open(warm, "w", encoding="utf-8") as f:
            f.write(WARM_UP_MODULE)
        build_mod.build([warm], ["cpu"], opts, os.path.join(cache, "warm"), 1, out=lambda text: None,
                        log=lambda text: None)
        per_kernel.clear()
        _close_lld_servers()  # the build starts its own, and its CPU counts once it is reaped
        t0, before = time.perf_counter(), os.times()
        report = build_mod.build(paths, ["cpu"], opts, os.path.join(cache, "built"), jobs, out=lambda text: None,
                                 log=lambda text: None)
        _close_lld_servers()
        after, wall = os.times(), time.perf_counter() - t0
    cpu = sum(after[:4]) - sum(before[:4])  # user, system, children's user and system
    return {"wall": wall, "cpu": cpu, "built": report.built, "failed": report.failed,
            "kernels": per_kernel if jobs == 1 else {}, "qdc": os.path.dirname(build_mod.__file__)}


def _count_lld_server_cpu() -> list:
    """[CPU seconds of the links this process's LLD server ran so far] (a tree that has one,
    compiler/targets/cpu/link_server.py): the server is no child reaped per link, as `ld` was."""
    total = [0.0]
    try:
        from qdc.compiler.targets.cpu import link_server
    except ImportError:
        return total
    run = link_server._Server.run

    def counted(self, command):
        done = run(self, command)
        if done is not None:
            total[0] += done[2]
        return done
    link_server._Server.run = counted
    return total


def _close_lld_servers() -> None:
    try:
        from qdc.compiler.targets.cpu import link_server
    except ImportError:
        return
    link_server.close_servers()


def worker(spec: dict) -> None:
    print(json.dumps(measure_build(spec["paths"], spec["cpu_target"], spec["jobs"])))


def run_worker(pythonpath: str | None, paths: list, cpu_target: str, jobs: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("QDC_CACHE_DIR", "QDC_LOG")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    spec = json.dumps({"paths": paths, "cpu_target": cpu_target, "jobs": jobs})
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec], capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"build worker failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["failed"]:
        raise SystemExit(f"{result['failed']} kernel variants failed to build in {paths}")
    return result


# ---- the driver ---------------------------------------------------------------------------------

def load_average() -> str:
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def workloads(names: list, folder: str, genesis_kernels: int) -> dict:
    """name -> (paths, cpu_target, jobs)."""
    demo = [os.path.join(KERNELS, f) for f in sorted(os.listdir(KERNELS))
            if f.endswith(".py") and f != "diffmpm.py"]
    genesis = os.path.join(folder, "genesis_like.py")
    with open(genesis, "w", encoding="utf-8") as f:
        f.write(genesis_module(genesis_kernels))
    every = {"demo": (demo, "native", 1),
             "diffmpm": ([os.path.join(KERNELS, "diffmpm.py")], "portable", 1),
             "diffmpm-native": ([os.path.join(KERNELS, "diffmpm.py")], "native", 1),
             "kernels": ([KERNELS], "portable", 1),
             "genesis": ([genesis], "portable", os.cpu_count() or 1)}
    chosen = {}
    for name in names:
        chosen.update({k: v for k, v in every.items() if k == name or k.startswith(name + "-")})
    return chosen


def best(results: list) -> dict:
    """The round with the least CPU time, and each kernel's least CPU time over the rounds."""
    top = min(results, key=lambda r: r["cpu"])
    kernels = {name: [min(r["kernels"][name][0] for r in results), min(r["kernels"][name][1] for r in results)]
               for name in top["kernels"]}
    return {**top, "kernels": kernels}


def report(results: dict, trees: list, rounds: int, load: tuple, genesis_kernels: int) -> str:
    cols = " | ".join(trees)
    lines = [f"{os.cpu_count()} CPUs; load average {load[0]} before, {load[1]} after; best of {rounds} "
             f"round(s) per tree; CPU includes ld (and a parallel build's workers).", ""]
    b = {tree: {w: best(rs) for w, rs in per.items()} for tree, per in results.items()}
    first = next(iter(b.values()))
    lines += [f"| build | {cols} |", "|---|" + "---|" * len(trees)]
    titles = {"demo": "kernels/ but DiffMPM, native, -j1", "diffmpm": "DiffMPM, portable, -j1",
              "diffmpm-native": "DiffMPM, native, -j1", "kernels": "kernels/ (all), portable, -j1",
              "genesis": f"generated module of {genesis_kernels} kernels, portable, -j{os.cpu_count()}"}
    for w in first:
        cells = [f"{b[t][w]['cpu']:.2f} s CPU, {b[t][w]['wall']:.2f} s wall ({b[t][w]['built']} variants)"
                 for t in trees]
        lines.append(f"| {titles[w]} | " + " | ".join(cells) + " |")
    if "demo" in first:
        lines += ["", f"Small kernels (native, -j1), CPU ms per variant, largest first (goal <= {SMALL_KERNEL_GOAL_MS:.0f}):",
                  "", f"| kernel | {cols} |", "|---|" + "---|" * len(trees)]
        last = trees[-1]
        for name, _ in sorted(b[last]["demo"]["kernels"].items(), key=lambda kv: -kv[1][0]):
            lines.append(f"| {name} | " + " | ".join(f"{1e3 * b[t]['demo']['kernels'][name][0]:.1f}" for t in trees) + " |")
        for t in trees:
            over = [n for n, (cpu, _) in b[t]["demo"]["kernels"].items() if 1e3 * cpu > SMALL_KERNEL_GOAL_MS]
            lines.append(f"- {t}: {len(over)} of {len(b[t]['demo']['kernels'])} over {SMALL_KERNEL_GOAL_MS:.0f} ms"
                         + (f" ({', '.join(sorted(over))})" if over else ""))
    for w in ("diffmpm", "diffmpm-native"):
        if w in first:
            lines += ["", f"{titles[w]}: slowest kernel variant (goal <= {DIFFMPM_GOAL_S} s):"]
            for t in trees:
                name, (cpu, wall) = max(b[t][w]["kernels"].items(), key=lambda kv: kv[1][0])
                lines.append(f"- {t}: {name} {cpu:.2f} s CPU, {wall:.2f} s wall")
    if "kernels" in first:
        lines.append("")
        lines += [f"- {t}: kernels/ portable -j1 {b[t]['kernels']['cpu']:.2f} s CPU, {b[t]['kernels']['wall']:.2f} s "
                  f"wall (goal <= {KERNELS_GOAL_S} s)" for t in trees]
    return "\n".join(lines)


def export_tree(rev: str, folder: str) -> str:
    """qdc at `rev` as a package folder; the folder to put on PYTHONPATH."""
    tree = os.path.join(folder, "qdc")  # the package `qdc` is the checkout's root folder
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--genesis-kernels", type=int, default=300)
    ap.add_argument("--workloads", default="demo,diffmpm,kernels,genesis")
    ap.add_argument("--against", metavar="REV", help="also measure qdc at git revision REV, alternating")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    folder = tempfile.mkdtemp(prefix="qdc-bench-build-")
    try:
        chosen = workloads(args.workloads.split(","), folder, args.genesis_kernels)
        trees = {"this tree": _link_as_qdc(folder)}
        if args.against:
            trees = {f"before ({args.against})": export_tree(args.against, os.path.join(folder, "before")),
                     "after": trees["this tree"]}
        load_before = load_average()
        results = {tree: {w: [] for w in chosen} for tree in trees}
        names = list(trees)
        for r in range(args.rounds):
            for tree in (names if r % 2 == 0 else names[::-1]):
                for w, (paths, cpu_target, jobs) in chosen.items():
                    results[tree][w].append(run_worker(trees[tree], paths, cpu_target, jobs))
        print(report(results, names, args.rounds, (load_before, load_average()), args.genesis_kernels))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _link_as_qdc(folder: str) -> str:
    """A folder in which `qdc` is this checkout (whatever its folder is named)."""
    link_folder = os.path.join(folder, "this")
    os.makedirs(link_folder)
    os.symlink(ROOT, os.path.join(link_folder, "qdc"))
    return link_folder


if __name__ == "__main__":
    sys.exit(main())
