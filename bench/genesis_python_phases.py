"""The Python side of compiling Genesis's plane+box scene, kernel by kernel: the CPU seconds of
the front end, the pass pipeline, the LLVM IR generation (the module's text included) and the
printing of the IR that a build keeps, best of ROUNDS, with a digest of the IR and LLVM text made
(equal digests: the same code).

    QDC_CACHE_DIR=DIR python bench/genesis_python_phases.py [--profile FILE] ROUNDS [KERNEL ...]

The scene is built once (from DIR's cache when warm) to learn each kernel's arguments; its
kernels (or those named) are then compiled again in this process, up to the LLVM IR, ROUNDS
times, each compile with the cycle collector kept to its own objects as a build's compile is
(driver/kernel.py). Run it on two trees (PYTHONPATH) to compare them; the cold build's own phases are
printed by `QDC_LOG=timings python bench/genesis_scene.py box 2 --qdc`. `--profile FILE` writes
a cProfile of the re-compiles (not of the scene's build) to FILE, for `python -m pstats FILE`.
"""
import cProfile
import hashlib
import json
import sys
import time

import qdc
from qdc.compiler.jit import offline_cache

args = sys.argv[1:]
profile_path = None
if args[:1] == ["--profile"]:
    profile_path, args = args[1], args[2:]
rounds, only = int(args[0]), set(args[1:])
qdc.install_as_quadrants()
captured = []
_obtain = offline_cache.obtain


def recording_obtain(fn, params, opts, arch, variant="forward", templates=None):
    captured.append((fn, params, opts, arch, variant, templates))
    return _obtain(fn, params, opts, arch, variant, templates)


offline_cache.obtain = recording_obtain
import genesis as gs  # noqa: E402

from qdc.compiler import targets  # noqa: E402
from qdc.compiler.driver import kernel as compiling  # noqa: E402
from qdc.compiler.frontend.ast_to_ir import FrontEnd  # noqa: E402
from qdc.compiler.ir import print_kernel  # noqa: E402
from qdc.compiler.passes.pipeline import run_pipeline  # noqa: E402
from qdc.compiler.targets.cpu import codegen  # noqa: E402
from qdc.compiler.targets.llvm.llvm_text import module_text  # noqa: E402

gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=0)
scene = gs.Scene(show_viewer=False)
scene.add_entity(gs.morphs.Plane())
scene.add_entity(gs.morphs.Box(pos=(0.0, 0.0, 0.5), size=(0.2, 0.2, 0.2)))
scene.build()
scene.step()

kernels, names = [], set()
for c in captured:  # the forward variant of each kernel, once
    name = c[0].__name__
    if c[4] == "forward" and c[3] == "cpu" and (not only or name in only) and name not in names:
        names.add(name)
        kernels.append(c)
times, digest = {}, hashlib.sha256()
profiler = cProfile.Profile() if profile_path else None
if profiler:
    profiler.enable()
for r in range(rounds):
    for fn, params, opts, arch, variant, templates in kernels:
        with compiling._collecting_new_objects_only():  # as a build's compile_kernel does
            t0 = time.process_time()
            fe = FrontEnd(fn, params, opts, templates.values if templates else None, arch=arch)
            kir = fe.build()
            t1 = time.process_time()
            run_pipeline(kir)
            t2 = time.process_time()
            target = targets.get(arch)
            meta = compiling.build_meta(kir, "qdc_" + kir.name, False, None, bool(opts.debug), target.launch_policy)
            module = codegen.generate_llvm(kir, meta, bool(opts.fast_math), target=target)
            text = module_text(module)  # the text a build gives LLVM
            t3 = time.process_time()
            printed = print_kernel(kir)  # a build's artifacts keep the IR's text
            t4 = time.process_time()
        if r == 0:
            digest.update(printed.encode() + text.encode())
        for phase, t in (("front end", t1 - t0), ("passes", t2 - t1), ("IR generation", t3 - t2),
                         ("IR printing", t4 - t3)):
            times.setdefault(fn.__name__, {}).setdefault(phase, []).append(t)
if profiler:
    profiler.disable()
    profiler.dump_stats(profile_path)
best = {k: {p: min(v) for p, v in phases.items()} for k, phases in times.items()}
total = {p: round(sum(b[p] for b in best.values()), 3) for p in ("front end", "passes", "IR generation", "IR printing")}
print(json.dumps({"kernels": len(best), "total": total, "digest": digest.hexdigest()[:16],
                  "largest": {k: {p: round(v, 3) for p, v in b.items()}
                              for k, b in sorted(best.items(), key=lambda kv: -sum(kv[1].values()))[:4]}}))
