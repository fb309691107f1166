"""Recorded launches on the Vulkan device (runtime/devices/vulkan/replays.py): a one-task launch
on an idle device is a command buffer recorded once and submitted again while what it recorded
holds, and recorded again when it does not (other arrays, a freed buffer, another trip count,
another error slot, another kernel). Every test launches and syncs one launch at a time (each
launch finds the device idle), checks values against numpy, and counts recordings and replayed
submissions. Skipped without a Vulkan device."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.devices.vulkan import device as vulkan_device
from qdc.runtime.devices.vulkan import replays

from vulkan_util import hide_host_mapping, refuse_next_descriptor_set


class Counts:
    """How many replays were recorded and submitted since the test began."""

    def __init__(self, monkeypatch):
        self.recorded = self.submitted = 0
        record, submit = replays.Replays._record, vulkan_device.VulkanDevice.submit_replay

        def counted_record(this, *args):
            found = record(this, *args)
            self.recorded += found is not None
            return found

        def counted_submit(this, *args):
            self.submitted += 1
            return submit(this, *args)
        monkeypatch.setattr(replays.Replays, "_record", counted_record)
        monkeypatch.setattr(vulkan_device.VulkanDevice, "submit_replay", counted_submit)


@pytest.fixture(params=["host_visible", "device_local"])
def counts(request, vulkan_runtime, monkeypatch):
    """Counts on the Vulkan runtime, its allocations host-visible or, for "device_local", made
    without a host mapping (every write to them a command in the batch, as on a discrete GPU)."""
    if request.param == "device_local":
        hide_host_mapping(vulkan_runtime, monkeypatch)
    found = Counts(monkeypatch)
    # A discrete GPU may map none of its device-local memory: "host_visible" is then what it is.
    flags = vulkan_runtime._memory_flags[vulkan_runtime._device_type]
    found.host_visible = bool(flags & vulkan_runtime.vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    return found


@qd.kernel
def axpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] += a * x[i]


def _device_array(values: np.ndarray):
    d = qd.ndarray(qd.f32, shape=values.shape)
    d.from_numpy(values)
    return d


def test_changed_scalars_replay_one_recording(counts, rng):
    x, y = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    dx, dy = _device_array(x), _device_array(y)
    want = y.copy()
    for _ in range(30):
        a = np.float32(rng.standard_normal())
        axpy(float(a), dx, dy)
        qd.sync()
        want += a * x
        np.testing.assert_allclose(dy.to_numpy(), want, rtol=1e-5, atol=1e-5)
    # The first launch binds and records in a batch; the second records the replay; the rest replay it.
    assert counts.recorded == 1 and counts.submitted == 29


def test_narrow_and_64_bit_scalars_reach_a_replay(counts, rng):
    out = qd.ndarray(qd.i64, shape=(3,))

    @qd.kernel
    def store(a: qd.i8, b: qd.i16, c: qd.i64, o: qd.types.ndarray(qd.i64, ndim=1)):
        for i in range(1):
            o[0] = qd.cast(a, qd.i64)
            o[1] = qd.cast(b, qd.i64)
            o[2] = c

    for _ in range(6):
        a, b = int(rng.integers(-128, 128)), int(rng.integers(-32768, 32768))
        c = int(rng.integers(-(1 << 62), 1 << 62))
        store(a, b, c, out)
        qd.sync()
        np.testing.assert_array_equal(out.to_numpy(), [a, b, c])
    assert counts.submitted == 5


def test_other_arrays_and_a_freed_one_record_again(counts, rng):
    n = 24
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    ys = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    dxs, dys = [_device_array(v) for v in xs], [_device_array(v) for v in ys]
    want = [y.astype(np.float64) for y in ys]
    for step in range(24):  # each pair twice in a row, then the next
        j = (step // 2) % 3
        a = float(rng.standard_normal())
        axpy(a, dxs[j], dys[j])
        qd.sync()
        want[j] += np.float32(a) * xs[j].astype(np.float64)
        np.testing.assert_allclose(dys[j].to_numpy(), want[j], rtol=1e-5, atol=1e-5)
    assert counts.submitted > 0 and counts.recorded <= 12
    del dys[0]  # freed: no replay may bind its buffer again
    fresh = rng.standard_normal(n).astype(np.float32)
    dys.insert(0, _device_array(fresh))
    for _ in range(3):
        axpy(2.0, dxs[0], dys[0])
        qd.sync()
        fresh += np.float32(2.0) * xs[0]
    np.testing.assert_allclose(dys[0].to_numpy(), fresh, rtol=1e-5, atol=1e-5)


def test_numpy_arguments_of_changing_sizes(counts, rng):
    """Numpy arrays go through device copies; the trip count (and the dispatch) follows each size.
    Where the copies are commands in a batch (device-local memory), the launch joins that batch."""
    for n in (10, 10, 300, 10, 300, 300, 10, 7, 300):
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        want = y + np.float32(0.5) * x
        axpy(0.5, x, y)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert counts.recorded >= 4 if counts.host_visible else counts.submitted == 0


def test_fields_and_template_instances_interleaved(counts, rng):
    a, b = qd.field(qd.f32, shape=16), qd.field(qd.f32, shape=16)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def scale(f: qd.template(), s: qd.f32):
        for i in f:
            f[i] = f[i] * s + 1.0

    @qd.kernel
    def add_up(f: qd.template()):
        for i in f:
            total[None] += f[i]

    va, vb = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    a.from_numpy(va)
    b.from_numpy(vb)
    want_total = np.float64(0)
    for step in range(12):
        s = np.float32(rng.uniform(0.5, 1.5))
        f, v = (a, va) if step % 2 else (b, vb)
        scale(f, float(s))
        qd.sync()
        v *= s
        v += np.float32(1)
        add_up(f)
        qd.sync()
        want_total += v.astype(np.float64).sum()
    np.testing.assert_allclose(a.to_numpy(), va, rtol=1e-5)
    np.testing.assert_allclose(b.to_numpy(), vb, rtol=1e-5)
    np.testing.assert_allclose(total[None], want_total, rtol=1e-4)
    assert counts.submitted >= 16


def test_batched_launches_and_replays_keep_their_order(counts, rng):
    """Launches while the device is busy go into the batch; the replay of a launch on the idle
    device is ordered after everything submitted before it."""
    x = qd.field(qd.i32, shape=64)

    @qd.kernel
    def step(k: qd.i32):
        for i in x:
            x[i] = (x[i] * 3 + k + i) % 1000003

    ks = rng.integers(0, 1000, 40)
    want, i = np.zeros(64, np.int64), np.arange(64)
    for j, k in enumerate(ks):
        step(int(k))
        want = (want * 3 + k + i) % 1000003
        if j % 3 == 2:
            qd.sync()
    qd.sync()
    np.testing.assert_array_equal(x.to_numpy(), want)
    assert counts.submitted > 0


def test_more_kernels_than_replays_evict_the_oldest(counts, rng, monkeypatch):
    monkeypatch.setattr(replays, "REPLAYS", 2)
    x = qd.field(qd.f32, shape=8)

    def adder(c: float):
        @qd.kernel
        def add():
            for i in x:
                x[i] += c
        return add
    adders = [adder(c) for c in (1.0, 2.0, 3.0)]
    want = np.zeros(8, np.float32)
    for step in range(18):
        k = step % 3
        adders[k]()
        qd.sync()
        want += np.float32(k + 1)
        np.testing.assert_array_equal(x.to_numpy(), want)
    assert counts.recorded >= 6  # each kernel's replay recorded again after it was evicted


def test_an_error_in_a_replayed_launch_names_its_kernel(session_cache_dir, fresh_runtime, monkeypatch):
    from conftest import vulkan_unavailable_reason
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir, debug=True)
    try:
        counts = Counts(monkeypatch)
        w = qd.field(qd.f32, shape=4)

        @qd.kernel
        def overrun(o: qd.i32):
            for i in range(4):
                w[i + o] = 1.0

        for _ in range(4):
            overrun(0)
            qd.sync()
        assert counts.submitted >= 2
        overrun(2)
        with pytest.raises(IndexError, match="overrun"):
            qd.sync()
        overrun(0)
        qd.sync()  # reported once; the slot was cleared
        np.testing.assert_array_equal(w.to_numpy(), np.ones(4, np.float32))
    finally:
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_a_reset_descriptor_pool_records_again(counts, vulkan_runtime, rng, monkeypatch):
    n = 8
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy = _device_array(x), _device_array(y)
    for _ in range(3):  # recorded, then replayed
        axpy(1.0, dx, dy)
        qd.sync()
    recorded = counts.recorded
    z = rng.standard_normal(n).astype(np.float32)
    dz = _device_array(z)

    @qd.kernel
    def double(v: qd.types.ndarray(qd.f32, ndim=1)):
        for i in v:
            v[i] *= 2.0

    refuse_next_descriptor_set(vulkan_runtime, monkeypatch)
    double(dz)  # a new set: the pool is reset, and axpy's sets with it
    qd.sync()
    for _ in range(3):  # binds fresh sets and records again
        axpy(1.0, dx, dy)
        qd.sync()
    np.testing.assert_allclose(dy.to_numpy(), y + np.float32(6) * x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(dz.to_numpy(), z * np.float32(2))
    assert counts.recorded > recorded
