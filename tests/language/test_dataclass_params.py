"""Kernel and func parameters annotated with (nested, frozen) `dataclasses.dataclass` types, as
Quadrants programs write them (`state.dofs.vel[i]`): members that are fields, ndarrays, numpy
arrays, scalars, compile-time values and `()` placeholders, flattened into one parameter per
member the kernel uses; gradients through needs_grad members against float64 central
differences; arrays inside template arguments. Checked against numpy on random inputs."""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.jit.kernel import kernel_of


@dataclasses.dataclass(frozen=True)
class Dofs:
    vel: qd.types.ndarray()
    pos: qd.types.ndarray()
    n: qd.i32
    unused: qd.types.ndarray()


@dataclasses.dataclass(frozen=True)
class Links:
    mass: qd.template()
    placeholder: qd.template()  # a () field standing for a feature switched off


@dataclasses.dataclass(frozen=True)
class State:
    dofs: Dofs
    links: Links
    scale: float
    use_mass: qd.template()


@qd.func
def momentum(d: Dofs, links: Links, i):
    return d.vel[i] * links.mass[i]


@qd.kernel
def integrate(state: State, dt: qd.f32):
    for i in range(state.dofs.n):
        v = state.dofs.vel[i]
        if qd.static(state.use_mass):
            v = momentum(state.dofs, state.links, i)
        state.dofs.pos[i] += v * dt * state.scale


def _state(rng, n, pos, use_mass, numpy_arrays=False):
    vel = rng.standard_normal(n).astype(np.float32)
    mass = qd.field(qd.f32, shape=n)
    mass.from_numpy(rng.uniform(0.5, 2.0, n).astype(np.float32))
    if not numpy_arrays:
        v = qd.ndarray(qd.f32, shape=(n,))
        v.from_numpy(vel)
        vel_arg = v
    else:
        vel_arg = vel
    dofs = Dofs(vel_arg, pos, n, np.zeros(3, np.int64))
    return State(dofs, Links(mass, qd.field(qd.f32, shape=())), float(rng.uniform(0.5, 2)), use_mass), vel, mass


@pytest.mark.parametrize("use_mass", [False, True])
def test_members_are_read_where_the_kernel_uses_them(arch, rng, use_mass):
    n = 12
    pos = np.zeros(n, np.float32)
    state, vel, mass = _state(rng, n, pos, use_mass, numpy_arrays=True)
    integrate(state, 0.25)
    want = vel * (mass.to_numpy() if use_mass else 1) * np.float32(0.25) * np.float32(state.scale)
    np.testing.assert_allclose(pos, want, rtol=1e-6)
    # another instance of the same structure shares the compiled kernel; its values are read at launch
    pos2 = np.ones(n, np.float32)
    state2, vel2, mass2 = _state(rng, n, pos2, use_mass, numpy_arrays=True)
    integrate(state2, 0.5)
    want2 = 1 + vel2 * (mass2.to_numpy() if use_mass else 1) * np.float32(0.5) * np.float32(state2.scale)
    np.testing.assert_allclose(pos2, want2, rtol=1e-6)


def test_only_used_members_become_parameters_named_by_their_path(rng):
    n = 4
    state, _, _ = _state(rng, n, np.zeros(n, np.float32), True)
    compiled = kernel_of(integrate).compile((state, 1.0))
    names = [p.name for p in compiled.meta.params]
    assert names == ["dt", "state_dofs_n", "state_dofs_vel", "state_dofs_pos", "state_scale"]
    assert compiled.meta.members["state_dofs_vel"] == ["state", "dofs", "vel"]
    assert "state_dofs_unused" not in names


def test_a_qd_ndarray_member_and_a_wrong_argument(arch, rng):
    n = 6
    pos = qd.ndarray(qd.f32, shape=(n,))
    state, vel, _ = _state(rng, n, pos, False)
    integrate(state, 1.0)
    np.testing.assert_allclose(pos.to_numpy(), vel * np.float32(state.scale), rtol=1e-6)
    with pytest.raises(TypeError, match="kernel 'integrate', argument 'state': expected a State instance"):
        integrate(state.dofs, 1.0)


@dataclasses.dataclass(frozen=True)
class Arrays:
    x: qd.types.ndarray()
    y: qd.types.ndarray()


@dataclasses.dataclass(frozen=True)
class Loss:
    a: qd.template()
    total: qd.template()


@dataclasses.dataclass(frozen=True)
class Problem:
    arrays: Arrays
    loss: Loss
    w: qd.f32


@qd.kernel
def objective(p: Problem):
    for i in p.arrays.x:
        v = qd.sin(p.arrays.x[i]) * p.w + p.loss.a[i] ** 2
        p.arrays.y[i] = v
        p.loss.total[None] += v * v


def _objective64(x, a, w):
    v = np.sin(x) * w + a ** 2
    return (v * v).sum()


def test_gradients_through_needs_grad_members(arch, rng):
    n = 5
    x = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    y = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    a = qd.field(qd.f32, shape=n, needs_grad=True)
    total = qd.field(qd.f32, shape=(), needs_grad=True)
    xv = rng.uniform(-1, 1, n).astype(np.float32)
    av = rng.uniform(-1, 1, n).astype(np.float32)
    x.from_numpy(xv)
    a.from_numpy(av)
    w = float(rng.uniform(0.5, 2))
    problem = Problem(Arrays(x, y), Loss(a, total), w)
    with qd.ad.Tape(loss=total):
        objective(problem)
    x64, a64 = xv.astype(np.float64), av.astype(np.float64)
    np.testing.assert_allclose(total[None], _objective64(x64, a64, np.float32(w)), rtol=1e-5)
    h = 1e-6
    for i in range(n):
        e = np.zeros(n)
        e[i] = h
        dx = (_objective64(x64 + e, a64, np.float32(w)) - _objective64(x64 - e, a64, np.float32(w))) / (2 * h)
        da = (_objective64(x64, a64 + e, np.float32(w)) - _objective64(x64, a64 - e, np.float32(w))) / (2 * h)
        np.testing.assert_allclose(x.grad.to_numpy()[i], dx, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(a.grad.to_numpy()[i], da, rtol=1e-4, atol=1e-5)


class Solver:
    """A plain object holding arrays and settings, passed as a template argument."""

    def __init__(self, velocities, damping: float):
        self.velocities = velocities
        self.damping = damping


@qd.kernel
def damp(solver: qd.template(), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in out:
        out[i] = solver.velocities[i] * solver.damping


def test_arrays_inside_template_arguments(arch, rng):
    n = 7
    outs = []
    for damping in (0.5, 0.5, 0.25):
        v = rng.standard_normal(n).astype(np.float32)
        arr = qd.ndarray(qd.f32, shape=(n,))
        arr.from_numpy(v)
        out = np.zeros(n, np.float32)
        solver = Solver(arr, damping)
        damp(solver, out)
        np.testing.assert_allclose(out, v * np.float32(damping), rtol=1e-6)
        outs.append((solver, v, out))
    for solver, v, out in outs:  # each template object launches with its own array
        out[:] = 0
        damp(solver, out)
        np.testing.assert_allclose(out, v * np.float32(solver.damping), rtol=1e-6)


BUILT_MODULE = '''
import dataclasses
import subprocess
import sys
import qdc as qd

total = qd.field(qd.f32, shape=(), needs_grad=True)
weights = qd.field(qd.f32, shape=8, needs_grad=True)


@dataclasses.dataclass(frozen=True)
class Arrays:
    x: qd.types.ndarray(dtype=qd.f32, ndim=1)
    out: qd.types.ndarray(dtype=qd.f32, ndim=1)


@dataclasses.dataclass(frozen=True)
class State:
    arrays: Arrays
    w: qd.template()
    loss: qd.template()
    scale: qd.f32


@qd.kernel
def run(state: State, offset: qd.f32):
    for i in state.arrays.x:
        v = state.arrays.x[i] * state.w[i] * state.scale + offset
        state.arrays.out[i] = v
        state.loss[None] += v * v


example = State(Arrays(qd.ndarray(qd.f32, (8,)), qd.ndarray(qd.f32, (8,))), weights, total, 1.0)
run_state = qd.aot.instantiate(run, state=example)
'''

LOAD_BUILT = r"""
import dataclasses, sys
import numpy as np
from qdc.runtime import load

@dataclasses.dataclass(frozen=True)
class Arrays:
    x: object
    out: object

@dataclasses.dataclass(frozen=True)
class State:  # the structure the build was made for; its fields are the module's own
    arrays: Arrays
    scale: float

mod = load(sys.argv[1], "dcbuilt", arch=sys.argv[2])
rng = np.random.default_rng(int(sys.argv[3]))
x = rng.standard_normal(8).astype(np.float32)
w = rng.standard_normal(8).astype(np.float32)
out = np.zeros(8, np.float32)
mod.weights.from_numpy(w)
scale = float(rng.uniform(0.5, 2))
mod.run_state(State(Arrays(x, out), scale), 0.25)
want = x * w * np.float32(scale) + np.float32(0.25)
assert np.allclose(out, want, rtol=1e-5), (out, want)
assert np.isclose(mod.total[None], (want.astype(np.float64) ** 2).sum(), rtol=1e-5)
mod.total.grad[None] = 1.0
mod.run_state.grad(State(Arrays(x, out), scale), 0.25)
assert np.allclose(mod.weights.grad.to_numpy(), 2 * want * x * np.float32(scale), rtol=1e-4)
try:
    mod.run_state(Arrays(x, out), 0.25)
except TypeError as e:
    assert "kernel 'run', argument 'state': it has no member state.arrays" in str(e), e
else:
    raise AssertionError("an argument without the members was accepted")
leaked = sorted(n for n in sys.modules if n.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
"""


def test_dataclass_kernels_built_ahead_of_time(arch, tmp_path, rng):
    (tmp_path / "dcbuilt.py").write_text(BUILT_MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "dcbuilt.py"),
                        "--cache", cache, "--arch", arch], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    (tmp_path / "load.py").write_text(LOAD_BUILT, encoding="utf-8")
    r = subprocess.run([sys.executable, str(tmp_path / "load.py"), cache, arch, str(int(rng.integers(1 << 30)))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


def test_an_instantiation_needs_every_dataclass_example():
    with pytest.raises(TypeError, match="dataclass parameter 'state' needs an example instance"):
        qd.aot.instantiate(integrate)


@dataclasses.dataclass
class Mutable:
    src: qd.template()
    scale: qd.f32


def test_launches_dispatch_on_the_structure_and_stay_observable(rng):
    n = 6
    a, b = qd.field(qd.f32, shape=n, needs_grad=True), qd.field(qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    av, bv = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a.from_numpy(av)
    b.from_numpy(bv)

    @qd.kernel
    def total(m: Mutable):
        for i in range(n):
            loss[None] += m.src[i] * m.scale

    frozen = Problem(Arrays(np.zeros(n, np.float32), np.zeros(n, np.float32)), Loss(a, loss), 2.0)
    objective(frozen)
    objective(frozen)
    assert kernel_of(objective).launches_on_its_own()  # a frozen instance's structure is keyed once
    loss[None] = 0.0
    with qd.ad.Tape(loss=loss):  # a Tape still sees the launches
        total(Mutable(a, 3.0))
    np.testing.assert_allclose(a.grad.to_numpy(), 3.0, rtol=1e-6)
    m = Mutable(a, 1.0)
    total(m)
    m.src = b  # a mutable dataclass is keyed at every call: the new field is used
    loss[None] = 0.0
    total(m)
    np.testing.assert_allclose(loss[None], bv.sum(), rtol=1e-5)
