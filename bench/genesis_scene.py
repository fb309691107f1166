"""One Genesis scene on the CPU, timed: prints one JSON line with the seconds of `import genesis`,
`gs.init`, `scene.build()`, the first step and the mean later step, the positions after STEPS
steps, and (on qdc) how many kernels were compiled.

    python bench/genesis_scene.py {box,franka} STEPS [--qdc] [--arch vulkan]

`box`: a plane and a 0.2 m box dropped from z = 0.5; `franka`: the Franka arm of Genesis's bundled
assets, its joints driven to a fixed target. With --qdc, `import quadrants` resolves to qdc
(qdc.install_as_quadrants()); without, to Quadrants. GS_ENABLE_NDARRAY=0 in the environment
selects Genesis's field mode. Used by bench/bench_genesis.py and tests/integration/test_genesis.py.

`--arch vulkan` runs Genesis's kernels on Quadrants' (or qdc's) Vulkan arch. Genesis 1.4.5 offers
no Vulkan backend (`gs.backend` is cpu, gpu, cuda, amdgpu or metal, and `gs.init` calls
`qd.init(arch=getattr(qd, backend.name))`), so Genesis is initialised for the CPU (its CPU
algorithms, torch on the CPU, no zero-copy) and `qd.init` is given `arch=vulkan` instead:
Genesis's files are untouched, only the arch its kernels run on changes.
"""
import json
import os
import sys
import time

t0 = time.perf_counter()
scene_name, steps = sys.argv[1], int(sys.argv[2])
arch = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "cpu"
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

if arch != "cpu":
    os.environ["GS_ENABLE_ZEROCOPY"] = "0"  # torch stays on the CPU, the arrays on the device
    _init = quadrants.init

    def init_on_arch(*args, **kwargs):
        kwargs["arch"] = getattr(quadrants, arch)
        return _init(*args, **kwargs)

    quadrants.init = init_on_arch

t_import = time.perf_counter() - t0
t0 = time.perf_counter()
gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=0)
t_init = time.perf_counter() - t0
scene = gs.Scene(show_viewer=False)
scene.add_entity(gs.morphs.Plane())
if scene_name == "box":
    body = scene.add_entity(gs.morphs.Box(pos=(0.0, 0.0, 0.5), size=(0.2, 0.2, 0.2)))
else:
    body = scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
t0 = time.perf_counter()
scene.build()
t_build = time.perf_counter() - t0
if scene_name == "franka":
    body.control_dofs_position(np.array([1.0, 1.0, 0.0, -1.5, 0.0, 1.5, 0.5, 0.04, 0.04]))
t0 = time.perf_counter()
scene.step()
t_first = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(steps - 1):
    scene.step()
t_steady = (time.perf_counter() - t0) / max(steps - 1, 1)
if scene_name == "box":
    pos = body.get_pos()
else:
    pos = body.get_links_pos()
compiles = len(compiled) if "--qdc" in sys.argv else None
print(json.dumps({"arch": arch, "import": t_import, "init": t_init, "build": t_build, "first_step": t_first,
                  "step": t_steady, "compiles": compiles,
                  "pos": np.asarray(pos.cpu() if hasattr(pos, "cpu") else pos).tolist()}))
