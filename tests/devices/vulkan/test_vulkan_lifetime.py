"""Vulkan object lifetimes: drivers cap how many instances and devices a process may create
(NVIDIA's stops creating instances after a few dozen create/destroy cycles), so every
qd.init, probe and failed start must leave at most one instance (the process's, shared) and
one device (the active runtime's). Counted by driver.live_objects(). Skipped without a
Vulkan device."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.devices.vulkan import driver

CYCLES = 12  # well past the point where the NVIDIA driver ran out, and still fast on lavapipe


def _vulkan_device():
    from qdc.runtime.devices.vulkan.device import VulkanDevice
    try:
        return VulkanDevice()
    except driver.VulkanUnavailableError as e:
        pytest.skip(f"no Vulkan device: {e}")


@pytest.fixture
def devices_before():
    """Devices live before the test (another module's fixture may hold one)."""
    _vulkan_device().close()
    return driver.live_objects()["devices"]


def test_init_cycles_and_probes_keep_one_instance_and_one_device(devices_before, session_cache_dir):
    for _ in range(CYCLES):
        qd.init(arch="vulkan", cache_dir=session_cache_dir)
        x = qd.field(qd.f32, shape=8)
        x.from_numpy(np.arange(8, dtype=np.float32))
        assert driver.live_objects() == {"instances": 1, "devices": devices_before + 1}
        qd.init(arch="cpu", cache_dir=session_cache_dir)
        _vulkan_device().close()  # a probe, as tests/conftest.py's
        assert driver.live_objects() == {"instances": 1, "devices": devices_before}


def test_devices_share_the_process_instance():
    first = _vulkan_device()
    second = _vulkan_device()
    try:
        assert first.instance == second.instance
        assert driver.live_objects()["instances"] == 1
    finally:
        first.close()
        second.close()
    assert driver.live_objects()["instances"] == 1  # kept for the next device, never recreated


def test_a_device_whose_setup_fails_destroys_itself(devices_before, monkeypatch):
    from qdc.runtime.devices.vulkan.device import VulkanDevice

    def fail(self):
        raise MemoryError("vulkan: vkCreateDescriptorPool: out of memory (VkResult -2)")
    monkeypatch.setattr(VulkanDevice, "_create_descriptor_pool", fail)
    with pytest.raises(MemoryError, match="vkCreateDescriptorPool"):
        VulkanDevice()
    assert driver.live_objects() == {"instances": 1, "devices": devices_before}


def test_close_destroys_the_device_even_when_releasing_its_children_fails(devices_before, monkeypatch):
    from qdc.runtime.devices.vulkan import pipelines
    device = _vulkan_device()
    device.allocate(64)

    def fail(dev):
        raise RuntimeError("vulkan: destroying pipelines failed")
    monkeypatch.setattr(pipelines, "destroy_pipelines", fail)
    with pytest.raises(RuntimeError, match="destroying pipelines"):
        device.close()
    assert device.device is None
    assert driver.live_objects() == {"instances": 1, "devices": devices_before}
    device.close()  # a second close does nothing


def test_qd_gpu_raises_the_replaced_devices_error_and_keeps_the_gpu(devices_before, session_cache_dir, monkeypatch):
    """An error still pending on the replaced device is that device's, not a sign that the GPU
    failed to start: it raises, and the GPU runtime (not a CPU fallback) is active."""
    def pending_error():
        raise RuntimeError("kernel 'k': a pending error of the replaced device")
    monkeypatch.setattr(context.current().device, "sync", pending_error)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "no GPU backend works" fallback
        with pytest.raises(RuntimeError, match="pending error of the replaced device"):
            qd.init(arch=qd.gpu, cache_dir=session_cache_dir)
    assert context.current().arch != "cpu"
    qd.init(arch="cpu", cache_dir=session_cache_dir)
    assert driver.live_objects() == {"instances": 1, "devices": devices_before}


def test_a_failing_close_does_not_hide_the_replaced_devices_error(devices_before, session_cache_dir, monkeypatch):
    from qdc.runtime.devices.vulkan import pipelines
    qd.init(arch="vulkan", cache_dir=session_cache_dir)

    def pending_error():
        raise RuntimeError("kernel 'k': a pending error of the replaced device")

    def fail(dev):
        raise RuntimeError("vulkan: destroying pipelines failed")
    monkeypatch.setattr(context.current().device, "sync", pending_error)
    monkeypatch.setattr(pipelines, "destroy_pipelines", fail)
    with pytest.raises(RuntimeError, match="pending error of the replaced device"):
        qd.init(arch="cpu", cache_dir=session_cache_dir)
    assert context.current().arch == "cpu"
    assert driver.live_objects() == {"instances": 1, "devices": devices_before}
