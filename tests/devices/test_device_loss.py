"""Device loss (runtime/device.py, "Loss"): when a GPU reports device loss or a launch timeout,
the next sync or host read raises a DeviceLostError naming the kernels submitted last, every
later use of that runtime (its fields, its kernels, qd.sync) raises it again, and qd.init
starts a new runtime in the same process. Vulkan on lavapipe with the driver's calls made to
report VK_ERROR_DEVICE_LOST; CUDA and AMDGPU on stand-ins for their bindings whose sticky
errors persist until the context is reset."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.contract.errors import DeviceLostError, QdcError
from qdc.runtime.devices.amdgpu import driver as hip_driver
from qdc.runtime.devices.amdgpu.device import AmdgpuDevice
from qdc.runtime.devices.cuda import driver as cuda_driver

from backend_util import compile_saxpy, saxpy_ctx
from conftest import vulkan_unavailable_reason
from test_amdgpu_device import FakeHip, _amdgpu_kernel


def test_the_error_is_a_qdc_error_and_a_runtime_error_naming_the_kernels():
    e = DeviceLostError("cuda", "cuStreamSynchronize: CUDA_ERROR_LAUNCH_TIMEOUT", ["a", "b"])
    assert isinstance(e, QdcError) and isinstance(e, RuntimeError)
    assert "'a', 'b'" in str(e) and "CUDA_ERROR_LAUNCH_TIMEOUT" in str(e) and "qd.init" in str(e)
    assert qd.DeviceLostError is DeviceLostError


# ---- vulkan --------------------------------------------------------------------------------------

# A lost device answers VK_ERROR_DEVICE_LOST from every fence query: a sync on a GPU polls
# vkGetFenceStatus before it blocks in vkWaitForFences, and either may see the loss first.
FENCE_CALLS = ("vkWaitForFences", "vkGetFenceStatus")


class _LostDevice:
    """The Vulkan binding's functions, with `lost_call` (and, for a fence wait, every fence
    query) answering VK_ERROR_DEVICE_LOST."""

    def __init__(self, lib, lost_call: str, status: int):
        self.lib, self.status = lib, status
        self.lost_calls = FENCE_CALLS if lost_call in FENCE_CALLS else (lost_call,)

    def __getattr__(self, name):
        if name in self.lost_calls:
            return lambda *args: self.status
        return getattr(self.lib, name)


@pytest.fixture
def on_vulkan(session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    from qdc.runtime.devices.vulkan import driver
    devices_before = driver.live_objects()["devices"]
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    yield context.current().device
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    assert driver.live_objects()["devices"] == devices_before  # the lost device was destroyed too


def _two_kernels(x):
    @qd.kernel
    def scale_by(k: qd.f32):
        for i in x:
            x[i] = x[i] * k

    @qd.kernel
    def shift_by(d: qd.f32):
        for i in x:
            x[i] = x[i] + d
    return scale_by, shift_by


@pytest.mark.parametrize("poll", [False, True], ids=["blocking_wait", "polling_wait"])
@pytest.mark.parametrize("lost_call", ["vkWaitForFences", "vkQueueSubmit"])
def test_a_lost_vulkan_device_names_its_kernels_and_qd_init_recovers(on_vulkan, lost_call, poll, rng,
                                                                     session_cache_dir):
    if poll:  # as a sync on a GPU waits (lavapipe's never polls)
        on_vulkan._spin_seconds = 1e-3
    x = qd.field(qd.f32, shape=257)
    scale_by, shift_by = _two_kernels(x)
    x.from_numpy(rng.standard_normal(257).astype(np.float32))
    scale_by(2.0)  # submitted at once (the device is idle)
    shift_by(1.0)  # in the open batch: the loss shows at its submission or its fence
    dev = on_vulkan
    dev.lib = _LostDevice(dev.lib, lost_call, dev.vk.VK_ERROR_DEVICE_LOST)
    seen_by = "|".join(dev.lib.lost_calls)
    with pytest.raises(DeviceLostError, match=f"({seen_by}).*'scale_by', 'shift_by'") as lost:
        qd.sync()
    assert lost.value.kernels[-2:] == ("scale_by", "shift_by") and lost.value.arch == "vulkan"
    # Everything of the lost runtime raises it again; nothing hangs.
    with pytest.raises(DeviceLostError, match="'shift_by'"):
        qd.sync()
    with pytest.raises(DeviceLostError):
        x.to_numpy()
    with pytest.raises(DeviceLostError):
        x[3] = 1.0
    with pytest.raises(DeviceLostError):
        shift_by(1.0)
    # A new runtime in the same process; the lost device's close neither hangs nor raises.
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    assert context.current().device is not dev and dev.device is None
    np.testing.assert_array_equal(x.to_numpy(), np.zeros(257, np.float32))  # fields start zeroed
    values = rng.standard_normal(257).astype(np.float32)
    x.from_numpy(values)
    scale_by(3.0)
    shift_by(-0.5)
    np.testing.assert_allclose(x.to_numpy(), values * np.float32(3.0) - np.float32(0.5), rtol=1e-6, atol=1e-6)


def test_a_loss_found_by_qd_init_raises_once_the_new_runtime_is_active(on_vulkan, rng, session_cache_dir):
    x = qd.field(qd.f32, shape=64)
    scale_by, shift_by = _two_kernels(x)
    shift_by(1.0)
    dev = on_vulkan
    dev.lib = _LostDevice(dev.lib, "vkWaitForFences", dev.vk.VK_ERROR_DEVICE_LOST)
    with pytest.raises(DeviceLostError, match="'shift_by'"):
        qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    assert context.current().device is not dev and dev.device is None
    values = rng.standard_normal(64).astype(np.float32)
    x.from_numpy(values)
    shift_by(2.0)
    np.testing.assert_allclose(x.to_numpy(), values + np.float32(2.0), rtol=1e-6)


def test_a_fence_status_reporting_loss_is_a_loss():
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    from qdc.runtime.devices.vulkan.device import VulkanDevice
    dev = VulkanDevice()
    try:
        alloc = dev.allocate(64)
        dev.fill(alloc, 0, 64, b"\x01\x00\x00\x00")  # a command in the batch
        dev._flush()
        dev.lib = _LostDevice(dev.lib, "vkGetFenceStatus", dev.vk.VK_ERROR_DEVICE_LOST)
        with pytest.raises(DeviceLostError, match="vkGetFenceStatus"):
            dev.free_after_fence(alloc)  # looks at the fence without waiting
        with pytest.raises(DeviceLostError):
            dev.sync()
    finally:
        dev.close()
    assert dev.device is None


# ---- stand-ins for the CUDA and HIP bindings -----------------------------------------------------

class StickyBinding:
    """A stand-in binding whose device can be lost: after `lose(status)` every call returns that
    status, as a sticky error does, until the context is reset (`resets`). Logs every call."""

    def __init__(self, binding, resets: tuple):
        self.binding, self.resets, self.status, self.log = binding, resets, None, []

    def lose(self, status) -> None:
        self.status = status

    def __getattr__(self, name):
        value = getattr(self.binding, name)
        if isinstance(value, type) or not callable(value):
            return value

        def call(*args):
            self.log.append(name)
            if name in self.resets:
                self.status = None
            elif self.status is not None and not name.endswith("GetErrorName"):
                return (self.status,)
            return value(*args)
        return call


class FakeCuda:
    """cuda.bindings.driver's calls that the CUDA device makes, over FakeHip's host memory."""

    class CUresult:
        CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NOT_READY = 0, 2, 600
        CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_FAILED = 700, 702, 719

    class CUevent_flags:
        CU_EVENT_DISABLE_TIMING = 2

    class CUstream_flags:
        CU_STREAM_NON_BLOCKING = 1

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 63, 57
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 29

    _SAME_AS_HIP = {"cuMemAlloc": "hipMalloc", "cuMemFree": "hipFree", "cuMemsetD8Async": "hipMemsetD8Async",
                    "cuMemcpyHtoDAsync": "hipMemcpyHtoDAsync", "cuMemcpyDtoHAsync": "hipMemcpyDtoHAsync",
                    "cuStreamSynchronize": "hipStreamSynchronize", "cuEventCreate": "hipEventCreateWithFlags",
                    "cuEventRecord": "hipEventRecord", "cuEventQuery": "hipEventQuery",
                    "cuEventSynchronize": "hipEventSynchronize", "cuEventDestroy": "hipEventDestroy",
                    "cuModuleLoadData": "hipModuleLoadData", "cuModuleGetFunction": "hipModuleGetFunction",
                    "cuLaunchKernel": "hipModuleLaunchKernel", "cuMemHostAlloc": "hipHostMalloc",
                    "cuMemFreeHost": "hipHostFree", "cuDeviceGetAttribute": "hipDeviceGetAttribute",
                    "cuStreamDestroy": "hipStreamDestroy", "cuMemsetD16Async": "hipMemsetD16Async",
                    "cuMemsetD32Async": "hipMemsetD32Async", "cuMemcpyDtoDAsync": "hipMemcpyDtoDAsync"}

    def __init__(self):
        self.hip = FakeHip()

    def cuGetErrorName(self, err):
        names = {v: k for k, v in vars(self.CUresult).items() if k.startswith("CUDA")}
        return 0, names.get(err, "CUDA_ERROR_UNKNOWN").encode()

    def __getattr__(self, name):
        if name in self._SAME_AS_HIP:
            return getattr(self.hip, self._SAME_AS_HIP[name])
        simple = {"cuInit": (0,), "cuDeviceGetCount": (0, 1), "cuDeviceGet": (0, 0), "cuCtxSetCurrent": (0,),
                  "cuDevicePrimaryCtxRetain": (0, "context"), "cuDevicePrimaryCtxRelease": (0,),
                  "cuDevicePrimaryCtxReset": (0,), "cuStreamCreate": (0, "stream"),
                  "cuDeviceGetName": (0, b"stand-in GPU\0")}
        if name in simple:
            return lambda *args: simple[name]
        raise AttributeError(name)


@pytest.fixture
def fake_cuda(monkeypatch):
    cu = StickyBinding(FakeCuda(), resets=("cuDevicePrimaryCtxReset",))
    monkeypatch.setattr(cuda_driver, "load_binding", lambda: cu)
    return cu


def test_a_sticky_cuda_error_is_a_loss_and_qd_init_resets_the_context_first(fake_cuda, session_cache_dir):
    qd.init(arch=qd.cuda, cache_dir=session_cache_dir)
    try:
        a, b = qd.ndarray(qd.f32, 300), qd.ndarray(qd.f32, 300)

        @qd.kernel
        def axpy(k: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
            for i in x:
                y[i] += k * x[i]
        axpy(2.0, a, b)
        fake_cuda.lose(FakeCuda.CUresult.CUDA_ERROR_LAUNCH_TIMEOUT)
        with pytest.raises(DeviceLostError, match="CUDA_ERROR_LAUNCH_TIMEOUT.*'axpy'") as lost:
            qd.sync()
        assert lost.value.kernels == ("axpy",) and "cuda" in str(lost.value)
        with pytest.raises(DeviceLostError):
            b.to_numpy()
        with pytest.raises(DeviceLostError):
            axpy(1.0, a, b)
        qd.init(arch=qd.cuda, cache_dir=session_cache_dir)
        log = fake_cuda.log
        reset = log.index("cuDevicePrimaryCtxReset")
        assert log.index("cuDevicePrimaryCtxRelease", 0) < reset < log.index("cuDevicePrimaryCtxRetain", reset)
        axpy(1.0, a, b)  # the new runtime launches (the stand-in runs no code)
        qd.sync()
    finally:
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


class LosableHip(FakeHip):
    """FakeHip with a sticky status of its own and hipDeviceReset."""

    class hipError_t(FakeHip.hipError_t):
        hipErrorIllegalAddress = 700

    def hipDeviceReset(self):
        return (0,)


def test_a_sticky_hip_error_is_a_loss_and_the_device_is_reset_on_close():
    compiled = _amdgpu_kernel()
    hip = StickyBinding(LosableHip(), resets=("hipDeviceReset",))
    dev = AmdgpuDevice(driver=hip_driver.Driver(hip=hip))
    loaded = dev.load_kernel(compiled.artifacts, compiled.meta)
    ctx, xs, ys = saxpy_ctx(dev, compiled.meta, 100)
    dev.launch_task(loaded, 0, ctypes.addressof(ctx), dev.task_slices(compiled.meta.tasks[0].launch, 100))
    hip.lose(LosableHip.hipError_t.hipErrorIllegalAddress)
    with pytest.raises(DeviceLostError, match="amdgpu: the device was lost.*'saxpy'"):
        dev.sync()
    with pytest.raises(DeviceLostError, match="'saxpy'"):
        dev.allocate(64)
    dev.close()  # waits for nothing, raises nothing
    assert "hipDeviceReset" in hip.log and hip.status is None
