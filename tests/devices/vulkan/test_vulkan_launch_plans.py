"""A task's launch plan on the Vulkan device (runtime/devices/vulkan/pipelines.py LaunchPlan):
a launch whose ctx words name the buffers the task's previous launch bound reuses that launch's
descriptor sets and checks; anything else (another array, a freed buffer, a reset descriptor
pool, an error slot of another block) resolves every binding again. Each test checks values
against numpy after launches that must and must not reuse a plan. Skipped without a Vulkan
device."""
from __future__ import annotations

import numpy as np

import qdc as qd

from vulkan_util import refuse_next_descriptor_set


@qd.kernel
def axpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] += a * x[i]


def _arrays(rng, count, n):
    host = [rng.standard_normal(n).astype(np.float32) for _ in range(count)]
    dev = []
    for h in host:
        d = qd.ndarray(qd.f32, shape=(n,))
        d.from_numpy(h)
        dev.append(d)
    return host, dev


def test_same_and_other_arrays_alternate(vulkan_runtime, rng):
    n = 33
    host_x, dev_x = _arrays(rng, 3, n)
    host_y, dev_y = _arrays(rng, 3, n)
    expected = [y.astype(np.float64) for y in host_y]
    for step in range(40):  # the same pair twice in a row, then another pair
        j, k = (step // 2) % 3, (step // 2 + 1) % 3
        a = float(rng.standard_normal())
        axpy(a, dev_x[j], dev_y[k])
        expected[k] += np.float32(a) * host_x[j].astype(np.float64)
    qd.sync()
    for got, want in zip(dev_y, expected):
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_freed_array_is_not_bound_again(vulkan_runtime, rng):
    n = 17
    host_x, dev_x = _arrays(rng, 1, n)
    host_y, dev_y = _arrays(rng, 1, n)
    axpy(2.0, dev_x[0], dev_y[0])
    qd.sync()
    want = host_y[0] + np.float32(2) * host_x[0]
    np.testing.assert_allclose(dev_y[0].to_numpy(), want, rtol=1e-6)
    del dev_y[0]  # freed; the plan's buffer must not be reused through a later launch
    host_z, dev_z = _arrays(rng, 1, n)
    axpy(3.0, dev_x[0], dev_z[0])
    qd.sync()
    np.testing.assert_allclose(dev_z[0].to_numpy(), host_z[0] + np.float32(3) * host_x[0], rtol=1e-6)


def test_a_reset_descriptor_pool_drops_every_plan(vulkan_runtime, rng, monkeypatch):
    n = 8
    host_x, dev_x = _arrays(rng, 1, n)
    host_y, dev_y = _arrays(rng, 1, n)
    axpy(1.0, dev_x[0], dev_y[0])  # the plan of axpy's task: these two arrays, their sets
    epoch = vulkan_runtime.bindings_epoch

    @qd.kernel
    def scale(z: qd.types.ndarray(qd.f32, ndim=1)):
        for i in z:
            z[i] *= 2.0

    host_z, dev_z = _arrays(rng, 1, n)
    refuse_next_descriptor_set(vulkan_runtime, monkeypatch)
    scale(dev_z[0])  # a new set: the pool is reset, axpy's sets with it
    monkeypatch.undo()
    assert vulkan_runtime.bindings_epoch > epoch
    axpy(1.0, dev_x[0], dev_y[0])  # must bind fresh sets, not the reset pool's
    qd.sync()
    np.testing.assert_allclose(dev_y[0].to_numpy(), host_y[0] + np.float32(2) * host_x[0], rtol=1e-6)
    np.testing.assert_array_equal(dev_z[0].to_numpy(), host_z[0] * np.float32(2))


def test_unchanged_args_keep_their_place_in_the_ring(vulkan_runtime, rng):
    """A batched launch whose args words equal its kernel's last ones reuses their place in the
    args ring; other words are written anew; values stay right across a wrap of the ring."""
    dev = vulkan_runtime
    n = 40
    host_x, (x,) = _arrays(rng, 1, n)
    host_y, (y,) = _arrays(rng, 1, n)
    want = host_y[0].astype(np.float64)
    axpy(0.5, x, y)  # may run on its own (a replay); the launches below are batched behind it
    want += np.float32(0.5) * host_x[0]
    axpy(0.5, x, y)
    want += np.float32(0.5) * host_x[0]
    used = dev._args_offset
    for _ in range(3):
        axpy(0.5, x, y)
        want += np.float32(0.5) * host_x[0]
    assert dev._args_offset == used  # the same words: nothing written
    axpy(-0.25, x, y)
    want += np.float32(-0.25) * host_x[0]
    assert dev._args_offset > used
    wraps = dev._args_wraps
    while dev._args_wraps == wraps:  # fill the ring to its end: the next words start it over
        dev.args_space(4096)
    dev._args_ring.mapped[:] = 0  # what a new round writes over them (the wrap waited for their readers)
    other = qd.ndarray(qd.f32, shape=(8,))
    other.fill(1.0)  # a command in a new batch: the launch below is batched, not replayed
    axpy(-0.25, x, y)  # the same words as before the wrap: written again
    want += np.float32(-0.25) * host_x[0]
    qd.sync()
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-5, atol=1e-5)
