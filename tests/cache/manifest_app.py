"""A program in the style of a physics engine, for the manifest tests (test_manifest.py):
kernels instantiated from configuration objects decided at run time (a plain config object
holding a frozen dataclass of numbers, an enum, a numpy scalar and a tuple, and an unfrozen
dataclass of fields and a numpy array), a `@qd.data_oriented` instance as `self`, a dataclass
parameter (an ndarray, a launch-time scalar and a field), a module global set at run time, a
gradient, and an ndarray parameter whose dtype follows the argument.

    python manifest_app.py CACHE_DIR [DAMPING]

runs one step and prints a JSON line: the results, how many kernel variants this process
compiled and took from the cache, and whether llvmlite was imported."""
import dataclasses
import enum
import json
import sys

import numpy as np

import qdc as qd


class Integrator(enum.Enum):
    EULER = 1
    DAMPED = 2


@dataclasses.dataclass(frozen=True)
class Physics:
    damping: float
    integrator: Integrator
    gravity: tuple
    substeps: np.int32


@dataclasses.dataclass
class State:
    pos: object
    vel: object


@dataclasses.dataclass(frozen=True)
class Dofs:
    vel: qd.types.ndarray()
    n: qd.i32
    mass: qd.template()


class SolverConfig:
    """A configuration object as engines keep one: plain attributes, set at run time."""

    def __init__(self, n, physics, state):
        self.n, self.physics, self.state = n, physics, state
        self.dtype = qd.f32
        self.forces = np.full(n, 0.5, np.float32)  # an array: passed at every launch

    @property
    def double_damping(self):
        return self.physics.damping * 2


@qd.data_oriented
class Damper:
    """A Quadrants-style class whose kernel takes the instance (`self`) as a template argument."""

    def __init__(self, state, factor):
        self.state, self.factor = state, factor

    @qd.kernel
    def damp(self):
        for i in self.state.pos:
            self.state.pos[i] *= self.factor


@qd.kernel
def advance(cfg: qd.template(), dt: qd.f32):
    for i in cfg.state.pos:
        v = cfg.state.vel[i] + cfg.physics.gravity[2] * dt + cfg.forces[i] * dt
        if qd.static(cfg.physics.integrator == Integrator.DAMPED):
            v = v * (1.0 - cfg.double_damping)
        for _ in qd.static(range(int(cfg.physics.substeps))):
            cfg.state.pos[i] += v * dt


@qd.kernel
def energy(state: qd.template(), loss: qd.template()):
    for i in state.pos:
        loss[None] += state.pos[i] * state.pos[i]


GRAVITY_SCALE = None  # set by run(), as engines set module globals when they start


@qd.kernel
def kick(dofs: Dofs, cfg: qd.template(), dt: qd.f32):
    for i in range(dofs.n):
        dofs.vel[i] += cfg.physics.gravity[2] * dt * dofs.mass[i] * GRAVITY_SCALE / 2.0


@qd.kernel
def scale(a: qd.types.ndarray(), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s


def run(cache_dir: str, damping: float) -> dict:
    global GRAVITY_SCALE
    qd.init(arch=qd.cpu, cache_dir=cache_dir)
    GRAVITY_SCALE = 2.0
    n = 8
    state = State(qd.field(qd.f32, shape=n, needs_grad=True, name="pos"), qd.field(qd.f32, shape=n, name="vel"))
    loss = qd.field(qd.f32, shape=(), needs_grad=True, name="loss")
    state.vel.from_numpy(np.arange(n, dtype=np.float32))
    physics = Physics(damping, Integrator.DAMPED, (0.0, 0.0, -9.8), np.int32(2))
    cfg = SolverConfig(n, physics, state)
    advance(cfg, 0.01)
    Damper(state, 0.5).damp()
    energy(state, loss)
    loss.grad[None] = 1.0
    energy.grad(state, loss)
    a = np.ones(4, np.float64)
    scale(a, 3.0)
    mass = qd.field(qd.f32, shape=n, name="mass")
    mass.fill(2.0)
    dofs = Dofs(np.ones(n, np.float32), n, mass)
    kick(dofs, cfg, 0.5)
    from qdc.compiler.jit.offline_cache import Counts
    return {"pos": state.pos.to_numpy().tolist(), "loss": float(loss[None]), "grad": state.pos.grad.to_numpy().tolist(),
            "a": a.tolist(), "vel": dofs.vel.tolist(), "compiled": Counts.compiled, "from_cache": Counts.from_cache,
            "llvmlite": "llvmlite" in sys.modules}


def expected(damping: float) -> dict:
    """What run() computes, in numpy (float64)."""
    v = (np.arange(8) - 9.8 * 0.01 + 0.5 * 0.01) * (1 - 2 * damping)
    pos = 2 * v * 0.01 * 0.5
    return {"pos": pos, "loss": float((pos * pos).sum()), "grad": 2 * pos, "a": np.full(4, 3.0),
            "vel": np.full(8, 1 - 9.8 * 0.5 * 2)}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.1)))
