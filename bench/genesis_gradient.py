"""Genesis's differentiable MPM, timed and checked: an elastic cube thrown with initial velocity
v0, STEPS steps of `SimOptions(requires_grad=True)`, a weighted squared distance of its particles
from a point as the loss, and `loss.backward()` for dloss/dv0 (Genesis's autograd bridge runs
every kernel's `.grad` in reverse). Prints one JSON line: scene.build() seconds, forward+backward
seconds, the loss, the gradient and (with --fd H) the central differences of the loss in v0 with
step H, from forward rollouts of the same scene reset between them.

    python bench/genesis_gradient.py STEPS [--qdc] [--fd 0.01]

With --qdc `import quadrants` resolves to qdc; without, to Quadrants. Used by
tests/integration/test_genesis.py.
"""
import json
import sys
import time

V0 = (0.3, -0.2, 0.5)
TARGET, WEIGHTS = 0.1, (1.0, 2.0, -0.5)


def main() -> None:
    steps = int(sys.argv[1])
    if "--qdc" in sys.argv:
        import qdc
        qdc.install_as_quadrants()
    import genesis as gs
    import torch
    gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=0)
    scene = gs.Scene(sim_options=gs.options.SimOptions(dt=2e-3, substeps=10, requires_grad=True),
                     mpm_options=gs.options.MPMOptions(lower_bound=(-0.5, -0.5, 0.0), upper_bound=(0.5, 0.5, 1.0),
                                                       grid_density=32),
                     show_viewer=False)
    cube = scene.add_entity(material=gs.materials.MPM.Elastic(),
                            morph=gs.morphs.Box(pos=(0.0, 0.0, 0.3), size=(0.1, 0.1, 0.1)))
    t0 = time.perf_counter()
    scene.build()
    t_build = time.perf_counter() - t0
    weights = torch.tensor(WEIGHTS, dtype=gs.tc_float)

    def rollout(v0):
        scene.reset()
        cube.set_velocity(v0)
        for _ in range(steps):
            scene.step()
        return ((cube.get_state().pos - TARGET) ** 2 * weights).sum()

    t0 = time.perf_counter()
    v0 = torch.tensor(V0, dtype=gs.tc_float, device=gs.device, requires_grad=True)
    loss = rollout(v0)
    loss.backward()
    t_grad = time.perf_counter() - t0
    result = {"build": t_build, "forward_backward": t_grad, "loss": float(loss.detach()), "grad": v0.grad.tolist()}
    if "--fd" in sys.argv:
        h = float(sys.argv[sys.argv.index("--fd") + 1])
        fd = []
        for k in range(3):
            plus, minus = list(V0), list(V0)
            plus[k] += h
            minus[k] -= h
            with torch.no_grad():
                up = float(rollout(torch.tensor(plus, dtype=gs.tc_float)))
                down = float(rollout(torch.tensor(minus, dtype=gs.tc_float)))
            fd.append((up - down) / (2 * h))
        result["central_differences"] = fd
    print(json.dumps(result))


if __name__ == "__main__":
    main()
