"""The AMDGPU (HIP) device (runtime/devices/amdgpu) where no AMD GPU is: it fails cleanly
without hip-python or without the ROCm runtime (qd.init, load); on a stand-in for hip-python
(device memory in host memory, events that complete when told) it runs the stream device
shared with CUDA (runtime/devices/stream.py, exercised on a real GPU by test_cuda_device.py):
zeroed allocations and ranged copies, the code object of the GPU's own processor (a kernel
without one is refused naming amdgpu_targets), grids of whole blocks, the shared heap growth
retrying at exactly the required size, and never freeing a buffer a launch in flight may use
(seed 001's AMDGPU lesson: a recycled address corrupted the next kernel's context)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.targets.amdgpu import linker
from qdc.runtime.adstack import AdStackHeap
from qdc.runtime.devices.amdgpu import driver
from qdc.runtime.devices.amdgpu.device import AmdgpuDevice, UnsupportedKernelError

from backend_util import build_kernels, check_zeroed_ranged_copies, compile_saxpy, hide_package, saxpy_ctx


def _no_hip_here() -> bool:
    try:
        driver.load_binding()
    except driver.AmdgpuUnavailableError:
        return True
    return False


# ---- failing cleanly ---------------------------------------------------------------------------

def test_missing_binding_names_the_package(monkeypatch):
    hide_package(monkeypatch, "hip")
    with pytest.raises(driver.AmdgpuUnavailableError, match="pip install hip-python"):
        driver.load_binding()


@pytest.mark.skipif(not _no_hip_here(), reason="this machine has a HIP runtime and an AMD GPU")
def test_qd_init_and_load_fail_cleanly_without_rocm(tmp_path):
    with pytest.raises(driver.AmdgpuUnavailableError, match="arch 'amdgpu'"):
        qd.init(arch=qd.amdgpu)
    if not linker.find_lld():
        return
    from qdc.runtime import load
    cache = str(tmp_path / "cache")
    built = build_kernels(cache, "amdgpu", "--amdgpu-targets", "gfx90a")
    assert built.exit_code == 0, built.output
    with pytest.raises(driver.AmdgpuUnavailableError, match="arch 'amdgpu'"):
        load(cache, "saxpy", arch="amdgpu")


# ---- a stand-in for hip-python -------------------------------------------------------------------

class FakeEvent:
    def __init__(self):
        self.done = False


class FakeProps:
    gcnArchName = b""


class FakeHip:
    """hip.hip's calls used by the device, over host memory; hipMalloc fails above `limit`."""

    class hipError_t:
        hipSuccess, hipErrorOutOfMemory, hipErrorNotReady = 0, 2, 600

    class hipDeviceAttribute_t:
        hipDeviceAttributeMultiprocessorCount, hipDeviceAttributeMaxThreadsPerMultiProcessor = 63, 57
        hipDeviceAttributeMaxGridDimX = 29

    hipEventDisableTiming, hipStreamNonBlocking = 2, 1
    hipDeviceProp_t = FakeProps

    def __init__(self, gfx="gfx90a:sramecc+:xnack-", limit=1 << 26):
        self.gfx, self.limit = gfx, limit
        self.memory, self.freed, self.launches, self.events, self.loaded = {}, [], [], [], []

    def _buffer(self, size):
        buf = ctypes.create_string_buffer(b"\xab" * size, size)  # not zeroed: the device must zero it
        self.memory[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def hipSetDevice(self, d):
        return (0,)

    def hipGetDeviceProperties(self, props, d):
        props.gcnArchName = self.gfx.encode()
        return (0,)

    def hipDeviceGetAttribute(self, attr, d):
        return 0, {63: 104, 57: 2048, 29: 2 ** 31 - 1}[attr]

    def hipStreamCreateWithFlags(self, flags):
        return 0, "stream"

    def hipMalloc(self, size):
        return (2, None) if size > self.limit else (0, self._buffer(size))

    def hipFree(self, address):
        self.freed.append(address)
        del self.memory[address]
        return (0,)

    def hipMemsetD8Async(self, ptr, value, n, stream):
        ctypes.memset(ptr, value, n)
        return (0,)

    def hipMemcpyHtoDAsync(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return (0,)

    hipMemcpyDtoHAsync = hipMemcpyHtoDAsync

    def hipStreamSynchronize(self, stream):
        return (0,)

    def hipEventCreateWithFlags(self, flags):
        self.events.append(FakeEvent())
        return 0, self.events[-1]

    def hipEventRecord(self, event, stream):
        return (0,)

    def hipEventQuery(self, event):
        return (0,) if event.done else (600,)

    def hipEventSynchronize(self, event):
        event.done = True
        return (0,)

    def hipEventDestroy(self, event):
        return (0,)

    def hipModuleLoadData(self, image):
        self.loaded.append(image)
        return 0, "module"

    def hipModuleGetFunction(self, module, name):
        return 0, name.decode()

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((f, gx, bx, params))
        return (0,)

    def hipHostMalloc(self, n, flags):
        return 0, self._buffer(n)

    def hipHostFree(self, address):
        return (0,)

    def hipStreamDestroy(self, stream):
        return (0,)

    def hipGetErrorName(self, err):
        return b"hipErrorFake"


def _device(**kw) -> AmdgpuDevice:
    return AmdgpuDevice(driver=driver.Driver(hip=FakeHip(**kw)))


def _amdgpu_kernel(targets="gfx90a,gfx1100"):
    if not linker.find_lld():
        pytest.skip(f"no ld.lld to link code objects ({linker.INSTALL_HINT})")
    return compile_saxpy("amdgpu", amdgpu_targets=targets)


def test_allocations_are_zeroed_and_copies_are_ranged():
    dev = _device()
    assert dev.gfx == "gfx90a"
    check_zeroed_ranged_copies(dev)
    with pytest.raises(MemoryError, match="out of device memory"):
        dev.allocate(1 << 27)


def test_the_code_object_of_the_gpus_processor_is_loaded():
    compiled = _amdgpu_kernel()
    dev = _device(gfx="gfx1100")
    loaded = dev.load_kernel(compiled.artifacts, compiled.meta)
    assert dev.hip.loaded == [compiled.artifacts["hsaco_gfx1100"]]
    assert [t.function for t in loaded.tasks] == [t.entry for t in compiled.meta.tasks]
    with pytest.raises(UnsupportedKernelError, match=r"no code object for this GPU \(gfx942\).*gfx1100,gfx90a,gfx942"):
        _device(gfx="gfx942:sramecc+:xnack-").load_kernel(compiled.artifacts, compiled.meta)


def test_launches_are_whole_blocks_and_in_flight_buffers_are_never_freed(rng):
    compiled = _amdgpu_kernel()
    meta, dev = compiled.meta, _device()
    loaded = dev.load_kernel(compiled.artifacts, meta)
    n = 1000
    ctx, xs, ys = saxpy_ctx(dev, meta, n)
    block = meta.tasks[0].launch["block_dim"]
    slices = dev.task_slices(meta.tasks[0].launch, n)
    assert slices == -(-n // block) * block and dev.task_slices(meta.tasks[0].launch, 0) == 0
    dev.launch_task(loaded, 0, ctypes.addressof(ctx), slices)
    ((entry, groups, threads, params),) = dev.hip.launches
    assert (entry, groups, threads) == (meta.tasks[0].entry, -(-n // block), block)
    copy = next(iter(loaded.ctx_copies.values()))
    words = np.zeros(meta.ctx_words, np.uint64)
    dev.copy_to_host(copy.alloc, words)
    assert list(words) == list(ctx)  # the kernel's pointer argument holds the launch's ctx words
    # the launch may still use xs: a fenced free waits for its event, whatever the allocator wants
    dev.free_after_fence(xs)
    dev.free_after_fence(dev.allocate(64))
    assert xs.handle is not None and xs.ptr not in dev.hip.freed
    dev.sync()
    assert xs.handle is None and xs.ptr in dev.hip.freed


def test_heap_growth_retries_at_exactly_required():
    """The shared heap (runtime/adstack.py) on HIP: at 100 KiB, 120 KiB required, the doubled
    240 KiB fails and the retry allocates exactly 120 KiB; the old heap waits for the fence."""
    kib = 1024
    dev = _device(limit=150 * kib)
    heap = AdStackHeap(dev)
    heap.ensure(100 * kib, "k")
    first = heap.alloc
    assert heap.ensure(120 * kib, "k") and heap.nbytes == 120 * kib
    assert first.handle is not None  # freed only after the fence
    dev.sync()
    assert first.handle is None
    with pytest.raises(MemoryError, match="cannot allocate"):
        heap.ensure(200 * kib, "k")
