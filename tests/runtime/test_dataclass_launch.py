"""Launches of kernels with variants (dataclass, template and untyped ndarray parameters) go
through the kernel's dispatch (compiler/jit/variant_dispatch.py) once a variant is compiled:
the slow path runs once per new frozen instance, never again for it, while every launch reads
the members as they are now. Results against numpy on random inputs."""
import dataclasses

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.jit.kernel import kernel_of


@dataclasses.dataclass(frozen=True)
class Body:
    vel: qd.types.ndarray(dtype=qd.f32, ndim=1)
    mass: qd.template()  # a field
    n: qd.i32


@dataclasses.dataclass(frozen=True)
class World:
    body: Body
    pos: qd.types.ndarray()  # dtype and rank follow the array
    dt: qd.f32
    gravity: float


class Config:
    """A config object whose `==` says nothing about its values (Genesis's configs compare by
    value, this one equal to anything): the dispatch must key it by identity."""

    def __init__(self, damping):
        self.damping = damping

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


@qd.kernel
def step(world: World, cfg: qd.template(), out: qd.types.ndarray()):
    for i in range(world.body.n):
        v = world.body.vel[i] * world.body.mass[i] * qd.static(cfg.damping) + world.gravity * world.dt
        world.pos[i] += v
        out[i] = v


def _reference(world: World, mass: np.ndarray, cfg: Config, pos0: np.ndarray):
    vel = world.body.vel if isinstance(world.body.vel, np.ndarray) else world.body.vel.to_numpy()
    n = world.body.n
    v = vel[:n].astype(np.float32) * mass[:n] * np.float32(cfg.damping) + np.float32(world.gravity) * np.float32(world.dt)
    pos = pos0.copy()
    pos[:n] += v.astype(pos.dtype)
    return pos, v


@pytest.fixture
def counted(monkeypatch):
    """The number of launches of `step` that took its slow path."""
    calls = []
    k = kernel_of(step)
    slow = k._slow_call
    monkeypatch.setattr(k, "_slow_call", lambda *a, **kw: (calls.append(1), slow(*a, **kw))[1])
    return calls


def _world(rng, mass, n, pos_dtype=np.float32, qd_vel=False, dt=0.1, gravity=-9.8):
    vel = rng.standard_normal(n).astype(np.float32)
    if qd_vel:
        v = qd.ndarray(qd.f32, shape=(n,))
        v.from_numpy(vel)
        vel = v
    pos = rng.standard_normal(n).astype(pos_dtype)
    return World(Body(vel, mass, n), pos, dt, gravity)


def _check(world, mass_np, cfg, out_dtype=np.float32):
    pos0 = world.pos.copy()
    out = np.zeros(world.body.n, out_dtype)
    step(world, cfg, out)
    want_pos, want_v = _reference(world, mass_np, cfg, pos0)
    np.testing.assert_allclose(world.pos, want_pos, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, want_v, rtol=1e-5, atol=1e-5)


def test_repeated_launches_take_the_dispatch_and_see_the_members_of_now(rng, counted):
    n = 16
    mass = qd.field(qd.f32, shape=n)
    mass_np = rng.uniform(0.5, 2.0, n).astype(np.float32)
    mass.from_numpy(mass_np)
    cfg = Config(0.5)
    world = _world(rng, mass, n)
    for _ in range(3):
        _check(world, mass_np, cfg)
    assert len(counted) == 1 and kernel_of(step).launches_on_its_own()
    world.body.vel[:] = rng.standard_normal(n)  # data changed in place: read at every launch
    mass_np = rng.uniform(0.5, 2.0, n).astype(np.float32)
    mass.from_numpy(mass_np)
    _check(world, mass_np, cfg)
    assert len(counted) == 1
    # A new instance of the same structure (other arrays, other scalar values): its key is
    # computed once, by the slow path, and the same variant launches it from then on.
    other = _world(rng, mass, n - 5, dt=0.25, gravity=1.5)
    for _ in range(2):
        _check(other, mass_np, cfg)
    _check(world, mass_np, cfg)
    assert len(counted) == 2
    # A qd.ndarray member instead of a numpy array, and positions in float64: other structures.
    for w in (_world(rng, mass, n, qd_vel=True), _world(rng, mass, n, pos_dtype=np.float64)):
        _check(w, mass_np, cfg)
        _check(w, mass_np, cfg)
    assert len(counted) == 4
    # `out` is an untyped ndarray parameter: its dtype picks the variant, in the dispatch too.
    _check(world, mass_np, cfg, out_dtype=np.float64)
    _check(world, mass_np, cfg, out_dtype=np.float64)
    _check(world, mass_np, cfg)
    assert len(counted) == 5


def test_config_objects_are_keyed_by_identity_whatever_their_eq(rng, counted):
    n = 8
    mass = qd.field(qd.f32, shape=n)
    mass_np = rng.uniform(0.5, 2.0, n).astype(np.float32)
    mass.from_numpy(mass_np)
    world = _world(rng, mass, n)
    halves, doubles = Config(0.5), Config(2.0)  # equal and of one hash, yet compiled apart
    for cfg in (halves, doubles, halves, doubles):
        _check(world, mass_np, cfg)
    assert len(counted) == 2 and kernel_of(step).launches_on_its_own()


def test_a_mutable_dataclass_is_keyed_at_every_launch(rng):
    @dataclasses.dataclass
    class Loose:
        src: qd.types.ndarray(dtype=qd.f32, ndim=1)
        scale: qd.f32

    @qd.kernel
    def scaled(m: Loose, out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(out.shape[0]):
            out[i] = m.src[i] * m.scale

    a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    m, out = Loose(a, 2.0), np.zeros(5, np.float32)
    scaled(m, out)
    np.testing.assert_allclose(out, a * 2, rtol=1e-6)
    m.src, m.scale = b, 3.0  # reassigned: seen, since the instance's key is not kept
    scaled(m, out)
    np.testing.assert_allclose(out, b * 3, rtol=1e-6)


def test_the_variant_behind_the_dispatch_binds_in_the_library(rng):
    """What the dispatch finds is the member launch of an ordinary launcher, whose path is the
    fastest there is on the CPU (runtime/launch_path.py)."""
    n = 4
    mass = qd.field(qd.f32, shape=n)
    mass.from_numpy(np.ones(n, np.float32))
    world = _world(rng, mass, n)
    step(world, Config(1.0), np.zeros(n, np.float32))
    paths = {entry[1].__qdc_launcher__.path.name for entry in kernel_of(step)._launchers.values()}
    assert paths == {"python_entry"}, paths


@qd.kernel
def doubled(src: qd.types.ndarray(), out: qd.types.ndarray()):
    for i in qd.grouped(src):
        out[i] = src[i] * 2


def test_untyped_arrays_of_every_kind_in_turn_pick_their_variant(rng):
    """The dispatch keys an untyped ndarray parameter by the argument's dtype and rank (a
    qd.ndarray's element shape too), remembered per kind of array: arrays of every kind in
    turn, each launched twice, each checked against numpy."""
    def qd_array(values, element=None):
        a = qd.ndarray(qd.math.vec3 if element else qd.types.f64 if values.dtype == np.float64 else qd.f32,
                       values.shape[:-1] if element else values.shape)
        a.from_numpy(values)
        return a

    kinds = [rng.random(5).astype(np.float32), rng.random((3, 4)), rng.random(6).astype(np.float64),
             (rng.random(7) * 100).astype(np.int32), rng.random((2, 3, 2)).astype(np.float32)]
    for _ in range(2):
        for values in kinds:
            for twice in range(2):
                out = np.zeros_like(values)
                doubled(values, out)
                np.testing.assert_array_equal(out, values * values.dtype.type(2))
        for values, element in ((rng.random((4, 3)).astype(np.float32), True), (rng.random(5), False),
                                (rng.random(3).astype(np.float32), False)):
            src, out = qd_array(values, element), qd_array(np.zeros_like(values), element)
            doubled(src, out)
            doubled(src, out)
            np.testing.assert_allclose(out.to_numpy(), values * 2, rtol=1e-6)
    assert kernel_of(doubled).launches_on_its_own()
