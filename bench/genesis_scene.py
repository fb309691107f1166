"""One Genesis scene, timed: prints one JSON line with the seconds of `import genesis`, `gs.init`,
`scene.build()`, the first step and the mean later step, the positions after STEPS steps, and (on
qdc) how many kernels were compiled.

    python bench/genesis_scene.py {box,franka} STEPS [--qdc] [--backend cpu|cuda|gpu] [--arch ARCH] [--torch-cpu]
                                  [--profile-steps DIR]

`box`: a plane and a 0.2 m box dropped from z = 0.5; `franka`: the Franka arm of Genesis's bundled
assets, its joints driven to a fixed target. With --qdc, `import quadrants` resolves to qdc
(qdc.install_as_quadrants()); without, to Quadrants. GS_ENABLE_NDARRAY=0 in the environment
selects Genesis's field mode. Used by bench/bench_genesis.py, tests/integration/test_genesis.py
and tools/device/genesis_gpu.sh.

`--backend` is Genesis's backend (`gs.init(backend=...)`, default cpu): it picks Genesis's
algorithms (a GPU backend takes its GPU configuration: parallel setup loops, cooperative and
block-level kernels, graph do_while loops), torch's device and the arch `gs.init` gives `qd.init`.
`--arch` runs the kernels on another arch of Quadrants (or qdc) than the backend's own. Genesis 1.4.5
offers no Vulkan backend (`gs.backend` is cpu, gpu, cuda, amdgpu or metal, and `gs.init` calls
`qd.init(arch=getattr(qd, backend.name))`), so `--arch vulkan` keeps Genesis's configuration of
`--backend` and only gives `qd.init` `arch=vulkan`; torch's tensors then stay apart from the
kernels' arrays (`GS_ENABLE_ZEROCOPY=0`). Genesis's files are untouched.

`--profile-steps DIR` runs the steps after the first under cProfile and writes the functions
taking the most time of their own (the wait for the device included, in its synchronising call) to
DIR/SCENE-LIBRARY-BACKEND-PID.txt: where a step's time goes, launch by launch, on qdc or Quadrants.

`--torch-cpu` keeps torch on the CPU under a GPU backend, for machines without a torch GPU device:
with `--backend cuda --arch vulkan` on lavapipe (the CPU's Vulkan), Genesis's GPU configuration runs
on a machine that has no GPU.
"""
import json
import os
import sys
import time


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


t0 = time.perf_counter()
scene_name, steps = sys.argv[1], int(sys.argv[2])
backend = option("--backend", "cpu")
arch = option("--arch", None)
compiled = []
if "--qdc" in sys.argv:
    import qdc
    from qdc.compiler.driver import kernel as compiling
    qdc.install_as_quadrants()
    _compile = compiling.compile_kernel

    def counting_compile(fn, *args, **kwargs):
        compiled.append(fn.__name__)
        return _compile(fn, *args, **kwargs)

    compiling.compile_kernel = counting_compile  # the offline cache calls it on a miss
import genesis as gs  # noqa: E402
import numpy as np  # noqa: E402
import quadrants  # noqa: E402

if arch is not None and arch != backend:
    os.environ["GS_ENABLE_ZEROCOPY"] = "0"  # torch's tensors stay apart from the arrays on the arch
    _init = quadrants.init

    def init_on_arch(*args, **kwargs):
        kwargs["arch"] = getattr(quadrants, arch)
        return _init(*args, **kwargs)

    quadrants.init = init_on_arch
if "--torch-cpu" in sys.argv:
    _get_device = gs.get_device  # what gs.init asks for the backend's torch device

    def cpu_device(backend, device_idx=None):
        device, name, memory, _ = _get_device(gs.cpu)
        return device, name, memory, backend

    gs.get_device = cpu_device

t_import = time.perf_counter() - t0
t0 = time.perf_counter()
gs.init(backend=getattr(gs, backend), precision="32", logging_level="warning", seed=0)
t_init = time.perf_counter() - t0
scene = gs.Scene(show_viewer=False)
scene.add_entity(gs.morphs.Plane())
if scene_name == "box":
    body = scene.add_entity(gs.morphs.Box(pos=(0.0, 0.0, 0.5), size=(0.2, 0.2, 0.2)))
else:
    body = scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
t0 = time.perf_counter()
scene.build()
quadrants.sync()
t_build = time.perf_counter() - t0
if scene_name == "franka":
    body.control_dofs_position(np.array([1.0, 1.0, 0.0, -1.5, 0.0, 1.5, 0.5, 0.04, 0.04]))
t0 = time.perf_counter()
scene.step()
quadrants.sync()
t_first = time.perf_counter() - t0
profile_dir = option("--profile-steps", None)
if profile_dir is not None:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
t0 = time.perf_counter()
for _ in range(steps - 1):
    scene.step()
quadrants.sync()  # the launches of a GPU arch return before their work is done
t_steady = (time.perf_counter() - t0) / max(steps - 1, 1)
if profile_dir is not None:
    import io
    import pstats
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    library = "qdc" if "--qdc" in sys.argv else "quadrants"
    os.makedirs(profile_dir, exist_ok=True)
    with open(os.path.join(profile_dir, f"{scene_name}-{library}-{backend}-{os.getpid()}.txt"), "w", encoding="utf-8") as out:
        out.write(f"{steps - 1} steps, {t_steady * 1e3:.3f} ms a step without the profiler's cost\n")
        out.write(text.getvalue())
if scene_name == "box":
    pos = body.get_pos()
else:
    pos = body.get_links_pos()
compiles = len(compiled) if "--qdc" in sys.argv else None
print(json.dumps({"backend": gs.backend.name, "arch": arch or backend, "torch": str(gs.device),
                  "import": t_import, "init": t_init, "build": t_build, "first_step": t_first,
                  "step": t_steady, "compiles": compiles,
                  "pos": np.asarray(pos.cpu() if hasattr(pos, "cpu") else pos).tolist()}))
