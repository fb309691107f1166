"""One Genesis scene, timed: prints one JSON line with the seconds of `import genesis`, `gs.init`,
`scene.build()`, the first step and the mean later step, the positions after STEPS steps, and (on
qdc) how many kernels were compiled.

    python bench/genesis_scene.py SCENE STEPS [--qdc] [--backend cpu|cuda|gpu] [--arch ARCH] [--torch-cpu]
                                  [--profile-steps DIR]

The scenes (SCENES below), each on a plane:
- `box`: a 0.2 m box dropped from z = 0.5 (its position);
- `franka`: the Franka arm of Genesis's bundled assets, its joints driven to a fixed target (its
  links' positions);
- `stack`: three 0.2 m boxes stacked with small offsets, a sphere and a cylinder beside them (their
  positions);
- `go2`: the Unitree Go2 quadruped of Genesis's bundled URDF assets, dropped from z = 0.42, its
  joints not driven (its links' positions);
- `mpm`, `sph`, `pbd`: a 0.1 m cube of particles dropped from z = 0.3 into a 1 m box: an elastic
  solid on the MPM solver (grid density 32), a liquid on the SPH solver and a liquid on the PBD
  solver (particle size 0.02); 4 ms steps of 10 substeps (the particles' positions).

With --qdc, `import quadrants` resolves to qdc (qdc.install_as_quadrants()); without, to
Quadrants. GS_ENABLE_NDARRAY=0 in the environment selects Genesis's field mode. Used by
bench/bench_genesis.py (which takes the scene names from SCENES), tests/integration/test_genesis.py
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

# The particle solvers simulate inside a box; their scenes step 4 ms in 10 substeps.
PARTICLE_BOUNDS = dict(lower_bound=(-0.5, -0.5, 0.0), upper_bound=(0.5, 0.5, 1.0))
FRANKA_TARGET = [1.0, 1.0, 0.0, -1.5, 0.0, 1.5, 0.5, 0.04, 0.04]
# The Go2's standing joint angles, held by PD control (kp 20, kv 0.5) as in Genesis's locomotion
# examples. Undriven, its calves start outside their joint limits (qpos0 = 0) and press against
# them, where a difference in the last bit decides the step a limit lets go: Quadrants itself,
# started 1e-7 m higher, is 1e-3 m apart 15 steps later.
GO2_STANCE = {f"{leg}_{part}_joint": angle for leg in ("FL", "FR", "RL", "RR")
              for part, angle in (("hip", 0.0), ("thigh", 0.8 if leg[0] == "F" else 1.0), ("calf", -1.5))}


def on_plane(gs, **options):
    scene = gs.Scene(show_viewer=False, **options)
    scene.add_entity(gs.morphs.Plane())
    return scene


def box(gs):
    scene = on_plane(gs)
    body = scene.add_entity(gs.morphs.Box(pos=(0.0, 0.0, 0.5), size=(0.2, 0.2, 0.2)))
    return scene, body.get_pos, None


def franka(gs):
    import numpy as np
    scene = on_plane(gs)
    arm = scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
    return scene, arm.get_links_pos, lambda: arm.control_dofs_position(np.array(FRANKA_TARGET))


def stack(gs):
    import torch
    scene = on_plane(gs)
    bodies = [scene.add_entity(gs.morphs.Box(pos=(0.01 * i, 0.0, 0.1 + 0.21 * i), size=(0.2, 0.2, 0.2)))
              for i in range(3)]
    bodies.append(scene.add_entity(gs.morphs.Sphere(pos=(0.3, 0.0, 0.2), radius=0.1)))
    bodies.append(scene.add_entity(gs.morphs.Cylinder(pos=(-0.3, 0.0, 0.3), radius=0.08, height=0.2)))
    return scene, lambda: torch.stack([body.get_pos() for body in bodies]), None


def go2(gs):
    import numpy as np
    scene = on_plane(gs)
    robot = scene.add_entity(gs.morphs.URDF(file="urdf/go2/urdf/go2.urdf", pos=(0.0, 0.0, 0.42)))

    def stand():
        dofs = [robot.get_joint(name).dofs_idx_local[0] for name in GO2_STANCE]
        angles = np.array(list(GO2_STANCE.values()))
        robot.set_dofs_kp(np.full(len(dofs), 20.0), dofs)
        robot.set_dofs_kv(np.full(len(dofs), 0.5), dofs)
        robot.set_dofs_position(angles, dofs)
        robot.control_dofs_position(angles, dofs)
    return scene, robot.get_links_pos, stand


def particle_cube(gs, material, **solver_options):
    scene = on_plane(gs, sim_options=gs.options.SimOptions(dt=4e-3, substeps=10), **solver_options)
    cube = scene.add_entity(material=material, morph=gs.morphs.Box(pos=(0.0, 0.0, 0.3), size=(0.1, 0.1, 0.1)))
    return scene, cube.get_particles_pos, None


def mpm(gs):
    return particle_cube(gs, gs.materials.MPM.Elastic(),
                         mpm_options=gs.options.MPMOptions(**PARTICLE_BOUNDS, grid_density=32))


def sph(gs):
    return particle_cube(gs, gs.materials.SPH.Liquid(),
                         sph_options=gs.options.SPHOptions(**PARTICLE_BOUNDS, particle_size=0.02))


def pbd(gs):
    return particle_cube(gs, gs.materials.PBD.Liquid(),
                         pbd_options=gs.options.PBDOptions(**PARTICLE_BOUNDS, particle_size=0.02))


# Each builder takes the genesis module and returns the unbuilt scene, a function giving the
# positions to compare, and what to do once the scene is built (or None).
SCENES = {"box": box, "franka": franka, "stack": stack, "go2": go2, "mpm": mpm, "sph": sph, "pbd": pbd}


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    t0 = time.perf_counter()
    scene_name, steps = sys.argv[1], int(sys.argv[2])
    if scene_name not in SCENES:
        sys.exit(f"genesis_scene.py: unknown scene {scene_name!r}; one of {', '.join(SCENES)}")
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
    import genesis as gs
    import numpy as np
    import quadrants

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
    scene, positions, after_build = SCENES[scene_name](gs)
    t0 = time.perf_counter()
    scene.build()
    quadrants.sync()
    t_build = time.perf_counter() - t0
    if after_build is not None:
        after_build()
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
        with open(os.path.join(profile_dir, f"{scene_name}-{library}-{backend}-{os.getpid()}.txt"), "w",
                  encoding="utf-8") as out:
            out.write(f"{steps - 1} steps, {t_steady * 1e3:.3f} ms a step without the profiler's cost\n")
            out.write(text.getvalue())
    pos = positions()
    compiles = len(compiled) if "--qdc" in sys.argv else None
    print(json.dumps({"backend": gs.backend.name, "arch": arch or backend, "torch": str(gs.device),
                      "import": t_import, "init": t_init, "build": t_build, "first_step": t_first,
                      "step": t_steady, "compiles": compiles,
                      "pos": np.asarray(pos.cpu() if hasattr(pos, "cpu") else pos).tolist()}))


if __name__ == "__main__":
    main()
