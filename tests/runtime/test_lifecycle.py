"""The materialization step programs hook (runtime/lifecycle.py): with a hook installed, the
fields declared since the last materialization are materialized (the hook runs) before the next
launch, the next Python-scope access and qd.sync(); a hook that fills fields (as Genesis defers
the fills of its 0-d fields) makes the launch see the filled values."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import lifecycle


@pytest.fixture
def hook():
    events = []
    pending_fills = []

    def materialize():
        events.append("materialize")
        lifecycle.done()
        fills = pending_fills.copy()
        pending_fills.clear()
        for f, value in fills:
            f.fill(value)

    lifecycle.set_hook(materialize, lambda: events.append("clear"))
    yield events, pending_fills
    lifecycle.set_hook(None)


@qd.kernel
def integrate(x: qd.template(), v: qd.template(), dt: qd.template()):
    for i in x:
        x[i] += v[i] * dt[None]


def test_deferred_fills_reach_the_next_launch(hook, rng):
    events, pending_fills = hook
    x = qd.field(qd.f32, shape=8)
    v = qd.field(qd.f32, shape=8)
    dt = qd.field(qd.f32, shape=())
    pending_fills.append((dt, 0.25))  # filled by the hook, not before
    v0 = rng.standard_normal(8).astype(np.float32)
    v.from_numpy(v0)  # a Python-scope access: materializes first (and fills dt)
    assert events == ["materialize"]
    integrate(x, v, dt)
    np.testing.assert_allclose(x.to_numpy(), v0 * 0.25, rtol=1e-6)
    assert events == ["materialize"]  # nothing new was declared since

    dt2 = qd.field(qd.f32, shape=())
    pending_fills.append((dt2, 2.0))
    integrate(x, v, dt2)  # the launch materializes first: dt2 is 2, not 0
    np.testing.assert_allclose(x.to_numpy(), v0 * 2.25, rtol=1e-6)
    assert events == ["materialize", "materialize"]


def test_a_fast_launch_path_also_materializes_first(hook, rng):
    events, pending_fills = hook
    x, v, dt = qd.field(qd.f32, shape=4), qd.field(qd.f32, shape=4), qd.field(qd.f32, shape=())
    v.fill(1.0)
    dt[None] = 1.0
    for _ in range(3):  # the kernel function now launches on its own
        integrate(x, v, dt)
    extra = qd.field(qd.f32, shape=())
    pending_fills.append((extra, 7.0))
    integrate(x, v, dt)
    assert events.count("materialize") == 2 and extra.to_numpy() == 7.0
    np.testing.assert_array_equal(x.to_numpy(), 4.0)


def test_sync_and_init(hook):
    events, pending_fills = hook
    f = qd.field(qd.i32, shape=())
    pending_fills.append((f, 3))
    qd.sync()
    assert events == ["materialize"] and f[None] == 3
    qd.init(arch=qd.cpu)
    assert events[-1] == "clear"
    f.to_numpy()
    assert events[-1] == "materialize"


def test_without_a_hook_nothing_is_pending():
    lifecycle.set_hook(None)
    qd.field(qd.f32, shape=3)
    assert not lifecycle._pending
