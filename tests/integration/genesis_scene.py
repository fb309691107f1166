"""Runs a Genesis scene on the CPU and prints the timings and positions as JSON (one line).

Usage: python genesis_scene.py {box,franka} STEPS [--qdc]
With --qdc, `import quadrants` resolves to qdc (qdc.install_as_quadrants()) before Genesis loads.
"""
import json
import sys
import time

t0 = time.perf_counter()
scene_name, steps = sys.argv[1], int(sys.argv[2])
if "--qdc" in sys.argv:
    import qdc
    qdc.install_as_quadrants()
import genesis as gs  # noqa: E402
import numpy as np  # noqa: E402

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
print(json.dumps({"import": t_import, "init": t_init, "build": t_build, "first_step": t_first,
                  "step": t_steady, "pos": np.asarray(pos.cpu() if hasattr(pos, "cpu") else pos).tolist()}))
