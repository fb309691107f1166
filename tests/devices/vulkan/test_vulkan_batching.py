"""Batched submission on the Vulkan device (lavapipe in CI): launches, fills and element writes
are commands recorded into one command buffer, submitted at a sync, a host read or every
BATCH_COMMANDS commands; errors still name their kernel at sync; fills and element writes run
on the device, in order with the launches around them. The Vulkan tests run on host-visible
memory (lavapipe's only kind) and on memory made to look device-local (staged copies, as on a
discrete GPU), and are skipped without a Vulkan device; the last ones check `fill` on the CPU
device (the generic copy) and on the stream device (a memset, through the HIP stand-in)."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context

from conftest import vulkan_unavailable_reason
from vulkan_util import hide_host_mapping

MEMORY = ["host_visible", "device_local"]


@pytest.fixture(params=MEMORY)
def vulkan(request, session_cache_dir, monkeypatch):
    """A Vulkan runtime whose allocations are host-visible or, for "device_local", made without
    a host mapping (every copy staged)."""
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    dev = context.current().device
    if request.param == "device_local":
        hide_host_mapping(dev, monkeypatch)
    yield dev
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


@pytest.fixture
def raw_device():
    """A VulkanDevice of its own (host-visible memory), closed after the test."""
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    from qdc.runtime.devices.vulkan.device import VulkanDevice
    dev = VulkanDevice()
    yield dev
    dev.close()


def test_a_thousand_launches_are_a_few_submissions_in_order(vulkan, rng):
    from qdc.runtime.devices.vulkan.device import BATCH_COMMANDS
    x = qd.field(qd.i32, shape=37)

    @qd.kernel
    def step(k: qd.i32):
        for i in x:
            x[i] = (x[i] * 3 + k + i) % 1000003

    start = rng.integers(0, 1000003, 37).astype(np.int32)
    x.from_numpy(start)
    ks = rng.integers(0, 1000, 1000)
    qd.sync()
    before = vulkan._last_submitted
    for k in ks:
        step(int(k))
    # The first launch finds the device idle and is submitted at once; the rest go in batches,
    # the last of which waits, open, for the sync.
    assert vulkan._last_submitted - before <= 1 + 1000 // BATCH_COMMANDS
    qd.sync()
    expected, i = start.astype(np.int64), np.arange(37)
    for k in ks:
        expected = (expected * 3 + k + i) % 1000003
    np.testing.assert_array_equal(x.to_numpy(), expected)


@pytest.fixture(params=MEMORY)
def debug_vulkan(request, session_cache_dir, monkeypatch):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir, debug=True)
    dev = context.current().device
    if request.param == "device_local":
        hide_host_mapping(dev, monkeypatch)
    yield dev
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_an_error_in_the_500th_launch_is_raised_at_sync_naming_it(debug_vulkan):
    z = qd.field(qd.f32, shape=4)
    w = qd.field(qd.f32, shape=4)

    @qd.kernel
    def count():
        for i in range(4):
            z[i] += 1.0

    @qd.kernel
    def overrun(o: qd.i32):
        for i in range(4):
            w[i + o] = 1.0

    for launch in range(1, 1001):
        if launch == 500:
            overrun(3)
        else:
            count()
    before = debug_vulkan._last_submitted
    with pytest.raises(IndexError, match="overrun"):
        qd.sync()
    assert debug_vulkan._last_submitted - before == 1  # the slots are read in place, without a copy each
    qd.sync()  # reported once
    count()  # the next launch, and the next batch, work
    np.testing.assert_array_equal(z.to_numpy(), np.full(4, 1000.0, np.float32))


def test_a_failed_submission_leaves_the_next_batch_working(vulkan, monkeypatch, rng):
    x = qd.field(qd.f32, shape=16)

    @qd.kernel
    def bump():
        for i in x:
            x[i] += 1.0

    values = rng.standard_normal(16).astype(np.float32)
    x.from_numpy(values)
    qd.sync()
    bump()  # the device is idle: submitted at once
    bump()  # recorded in the open batch, which the sync submits

    class FailingSubmit:  # the driver refusing the submission, as on an out-of-memory device
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            return getattr(self.lib, name)

        def vkQueueSubmit(self, *args):
            return vulkan.vk.VK_ERROR_OUT_OF_DEVICE_MEMORY

    monkeypatch.setattr(vulkan, "lib", FailingSubmit(vulkan.lib))
    with pytest.raises(MemoryError, match=r"submitting \d+ recorded commands"):
        qd.sync()
    monkeypatch.undo()
    bump()  # the refused batch's launch never ran
    np.testing.assert_array_equal(x.to_numpy(), values + np.float32(1) + np.float32(1))


def _random_value(rng, dtype):
    if np.issubdtype(dtype, np.floating):
        return float(rng.standard_normal() * 100)
    info = np.iinfo(dtype)
    return int(rng.integers(info.min, info.max, endpoint=True))


FILL_TYPES = [(qd.f32, np.float32), (qd.i32, np.int32), (qd.f64, np.float64), (qd.i8, np.int8), (qd.u16, np.uint16)]


@pytest.mark.parametrize("container", ["field", "ndarray", "field.grad", "ndarray.grad"])
@pytest.mark.parametrize("qtype,dtype", FILL_TYPES, ids=[str(t[1].__name__) for t in FILL_TYPES])
def test_fills_match_numpy(vulkan, rng, container, qtype, dtype):
    shape = (3001,) if dtype is np.float64 else (7, 143)  # f64: past the fill seed; odd byte counts for i8/u16
    make = qd.field if container.startswith("field") else qd.ndarray
    arr = make(qtype, shape=shape, needs_grad=container.endswith("grad"))
    target = arr.grad if container.endswith("grad") else arr
    info = np.finfo(dtype) if np.issubdtype(dtype, np.floating) else np.iinfo(dtype)
    target.from_numpy(rng.uniform(max(info.min, -1e6), min(info.max, 1e6), shape).astype(dtype))
    qd.sync()
    for value in (_random_value(rng, dtype), 0):
        before = vulkan._last_submitted
        target.fill(value)
        assert vulkan._last_submitted == before  # recorded in the batch, nothing submitted yet
        np.testing.assert_array_equal(target.to_numpy(), np.full(shape, value, dtype))


@pytest.mark.parametrize("memory", MEMORY)
def test_device_fill_of_ranges_and_patterns(raw_device, monkeypatch, rng, memory):
    if memory == "device_local":
        hide_host_mapping(raw_device, monkeypatch)
    size = 9000
    alloc = raw_device.allocate(size)
    before = rng.integers(0, 256, size).astype(np.uint8)
    raw_device.copy_to_device(alloc, before)
    expected = before.copy()
    for length in (1, 2, 3, 4, 8, 12):
        pattern = rng.integers(0, 256, length).astype(np.uint8).tobytes()
        offset = int(rng.integers(0, 64))
        nbytes = length * int(rng.integers(1, (size - offset) // length))
        raw_device.fill(alloc, offset, nbytes, pattern)
        expected[offset:offset + nbytes] = np.tile(np.frombuffer(pattern, np.uint8), nbytes // length)
    raw_device.fill(alloc, size - 5, 5, b"\x07")  # the end of an allocation not a multiple of 4
    expected[size - 5:] = 7
    out = np.empty(size, np.uint8)
    raw_device.copy_to_host(alloc, out)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="whole number"):
        raw_device.fill(alloc, 0, 10, b"\x01\x02\x03")
    raw_device.free(alloc)


def test_element_writes_are_ordered_with_launches(vulkan, rng):
    x = qd.field(qd.f32, shape=5)
    small = qd.ndarray(qd.i8, shape=(7,))

    @qd.kernel
    def affine(c: qd.f32, s: qd.types.ndarray(qd.i8, ndim=1)):
        for i in x:
            x[i] = 2.0 * x[i] + c
        for j in range(s.shape[0]):
            s[j] = s[j] + 1

    start = rng.standard_normal(5).astype(np.float32)
    x.from_numpy(start)
    small.from_numpy(np.zeros(7, np.int8))
    a, b, c1, c2 = (np.float32(v) for v in rng.standard_normal(4))
    expected, bytes_ = start.copy(), np.zeros(7, np.int8)
    x[1] = a
    small[3] = 40  # an element at an odd byte offset
    expected[1], bytes_[3] = a, 40
    affine(c1, small)
    expected, bytes_ = np.float32(2) * expected + c1, bytes_ + 1
    x[3] = b
    small[5] = -9
    expected[3], bytes_[5] = b, -9
    affine(c2, small)
    expected, bytes_ = np.float32(2) * expected + c2, bytes_ + 1
    np.testing.assert_array_equal(x.to_numpy(), expected)
    np.testing.assert_array_equal(small.to_numpy(), bytes_)


def test_freeing_an_array_a_recorded_launch_uses_is_safe(vulkan, rng):
    out = qd.field(qd.f32, shape=64)

    @qd.kernel
    def copy(a: qd.types.ndarray(qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            out[i] = a[i] * 2.0

    values = rng.standard_normal(64).astype(np.float32)
    a = qd.ndarray(qd.f32, shape=(64,))
    a.from_numpy(values)
    copy(a)
    alloc = a.allocation()
    vulkan.free(alloc)  # before the batch that binds it was even submitted
    assert alloc.handle is None and vulkan._pending_destroys
    later = qd.ndarray(qd.f32, shape=(64,))
    later.from_numpy(values + 1)
    copy(later)
    np.testing.assert_array_equal(out.to_numpy(), (values + 1) * 2)
    assert not vulkan._pending_destroys  # destroyed once the batch completed


# ---- the same `fill` on the other devices ----------------------------------------------------------

def _check_fills(dev, rng) -> None:
    size = 1000
    alloc = dev.allocate(size)
    start = rng.integers(0, 256, size).astype(np.uint8)
    dev.copy_to_device(alloc, start)
    expected = start.copy()
    for pattern in (b"\x00", bytes([int(rng.integers(1, 256))]) * 4, rng.integers(0, 256, 8).astype(np.uint8).tobytes()):
        offset = int(rng.integers(0, 16))
        nbytes = len(pattern) * int(rng.integers(1, (size - offset) // len(pattern)))
        dev.fill(alloc, offset, nbytes, pattern)
        expected[offset:offset + nbytes] = np.tile(np.frombuffer(pattern, np.uint8), nbytes // len(pattern))
    out = np.empty(size, np.uint8)
    dev.sync()
    dev.copy_to_host(alloc, out)
    np.testing.assert_array_equal(out, expected)
    dev.free(alloc)


def test_the_generic_fill_copies_the_pattern(rng):
    _check_fills(context.current().device, rng)  # the CPU device: Device.fill through copy_to_device


def test_the_stream_device_fills_byte_patterns_with_a_memset(rng, monkeypatch):
    from test_amdgpu_device import _device
    dev = _device()
    memsets = []
    real = dev.calls.memset_d8_async
    monkeypatch.setattr(dev.calls, "memset_d8_async", lambda *a: memsets.append(a[1:3]) or real(*a))
    _check_fills(dev, rng)
    # the allocation's zeroing, the zero fill, the repeated byte; the 8-byte pattern through the host
    assert len(memsets) == 3 and memsets[1][0] == 0 and memsets[2][0] != 0
