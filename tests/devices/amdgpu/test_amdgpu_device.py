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
from qdc.runtime.devices.stream import FILL64_ENTRY

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

    def __init__(self, gfx="gfx90a:sramecc+:xnack-", limit=1 << 26, deferred=False):
        self.gfx, self.limit = gfx, limit
        self.memory, self.freed, self.launches, self.events, self.loaded = {}, [], [], [], []
        # deferred: copies and memsets wait on the stream until a synchronise runs them in order
        self.deferred, self.queue, self.log, self.syncs = deferred, [], [], 0

    def _on_stream(self, name, op):
        self.log.append(name)
        if self.deferred:
            self.queue.append(op)
        else:
            op()
        return (0,)

    def _run_stream(self):
        queue, self.queue = self.queue, []
        for op in queue:
            op()

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
        return self._on_stream("memset8", lambda: ctypes.memset(ptr, value, n))

    def _memset_words(self, name, ptr, value, n, dtype):
        def op():
            np.frombuffer((ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(ptr), dtype)[:] = value
        return self._on_stream(name, op)

    def hipMemsetD16Async(self, ptr, value, n, stream):
        return self._memset_words("memset16", ptr, value, n, np.uint16)

    def hipMemsetD32Async(self, ptr, value, n, stream):
        return self._memset_words("memset32", ptr, value, n, np.uint32)

    def hipMemcpyHtoDAsync(self, dst, src, n, stream):
        return self._on_stream("copy", lambda: ctypes.memmove(dst, src, n))

    def hipMemcpyDtoDAsync(self, dst, src, n, stream):
        assert not (src < dst < src + n or dst < src < dst + n)  # a device copy's ranges never overlap
        return self._on_stream("dtod", lambda: ctypes.memmove(dst, src, n))

    def hipMemcpyDtoHAsync(self, dst, src, n, stream):
        return self._on_stream("read", lambda: ctypes.memmove(dst, src, n))

    def hipStreamSynchronize(self, stream):
        self.syncs += 1
        self._run_stream()
        return (0,)

    def hipEventCreateWithFlags(self, flags):
        self.events.append(FakeEvent())
        return 0, self.events[-1]

    def hipEventRecord(self, event, stream):
        return (0,)

    def hipEventQuery(self, event):
        return (0,) if event.done else (600,)

    def hipEventSynchronize(self, event):
        self._run_stream()
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
        if f == FILL64_ENTRY:  # the stream device's fill kernel: (u64 *ptr, u64 count, u64 value), run here
            ptr, count, value = (ctypes.c_uint64.from_address(p).value
                                 for p in (ctypes.c_void_p * 3).from_address(params))
            self.log.append("fill64")

            def fill():
                np.frombuffer((ctypes.c_char * (8 * count)).from_address(ptr), np.uint64)[:] = value
            self.queue.append(fill) if self.deferred else fill()
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


# ---- fills, element writes and copies on the stream (shared with CUDA) -----------------------------

FILL_DTYPES = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
               np.uint32, np.uint64)


def _random_value(rng, dtype):
    if np.dtype(dtype).kind == "f":
        return dtype(rng.uniform(-1e3, 1e3))
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, endpoint=True, dtype=dtype)


def _read(dev, alloc, dtype, count, offset=0):
    out = np.empty(count, dtype)
    dev.copy_to_host(alloc, out, offset)
    return out


@pytest.mark.parametrize("dtype", FILL_DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("with_fill_kernel", [False, True], ids=["hip", "cuda-like"])
def test_fills_of_every_dtype_and_range_leave_the_rest_alone(rng, dtype, with_fill_kernel):
    """A fill writes exactly its range on the stream, no wait, for elements of every dtype and
    vectors of them: element 0 to n, and a range starting at element 1; the byte before and
    after keep their values. A memset of the pattern's period where one exists (D8 for equal
    bytes, D16, D32), the device's fill kernel for an 8-byte period where it has one (CUDA),
    else the pattern doubled by device copies."""
    dev = _device(deferred=True)
    if with_fill_kernel:
        dev.fill64_image = lambda: b"a module with qdc_fill64"
    size = np.dtype(dtype).itemsize
    for n, element in ((1, 1), (3, 1), (1000, 1), (4097, 1), (700, 3), (2000, 4)):
        value = np.array([_random_value(rng, dtype) for _ in range(element)], dtype)
        total = (n + 2) * element
        alloc = dev.allocate(total * size)
        background = np.array([_random_value(rng, dtype) for _ in range(total)], dtype)
        for start in (0, element):  # from the first element, and from the second (an offset)
            dev.copy_to_device(alloc, background)
            dev.hip.log.clear()
            syncs = dev.hip.syncs
            dev.fill(alloc, start * size, n * element * size, value.tobytes())
            assert dev.hip.syncs == syncs  # queued, not waited for
            got = _read(dev, alloc, dtype, total)
            want = background.copy()
            want[start:start + n * element] = np.tile(value, n)
            np.testing.assert_array_equal(got, want)
            log = [c for c in dev.hip.log if c != "read"]
            raw = value.tobytes()
            period = min(p for p in range(1, len(raw) + 1) if raw == raw[:p] * (len(raw) // p))
            aligned = (alloc.ptr + start * size) % period == 0
            if period == 1:
                assert log == ["memset8"]
            elif period in (2, 4) and aligned:
                assert log == [f"memset{8 * period}"]
            elif period == 8 and aligned and with_fill_kernel:
                assert log == ["fill64"]
            else:
                assert log[0] == "copy" and set(log[1:]) <= {"dtod"}
        dev.free(alloc)


def test_a_fill_refuses_a_partial_pattern_and_a_range_past_the_end():
    dev = _device()
    a = dev.allocate(64)
    with pytest.raises(ValueError, match="whole number of repetitions"):
        dev.fill(a, 0, 10, b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="does not fit"):
        dev.fill(a, 8, 64, b"\x01\x02\x03\x04")


def test_element_writes_are_ordered_on_the_stream_and_outlive_their_source(rng):
    """Small copies to the device (element writes) are staged in the pinned ring and queued
    without a wait: thousands of them, more than the ring holds at once, between reads and
    fills, each land in order, whatever the caller does with its source array afterwards."""
    dev = _device(deferred=True)
    n = 5000
    alloc = dev.allocate(4 * n)
    want = np.zeros(n, np.int32)
    syncs = dev.hip.syncs
    for step in range(3):
        for i in rng.permutation(n):
            value = np.array([rng.integers(-2**31, 2**31)], np.int32)
            dev.copy_to_device(alloc, value, 4 * int(i))
            want[i] = value[0]
            value[0] = 12345  # the caller's array changes at once: the queued copy has its own bytes
        assert dev.hip.queue  # still queued (the ring waited only for copies of earlier halves)
        np.testing.assert_array_equal(_read(dev, alloc, np.int32, n), want)
        dev.fill(alloc, 0, 4 * n, np.int32(step).tobytes())
        dev.copy_to_device(alloc, np.array([7], np.int32), 4 * 3)
        want[:] = step
        want[3] = 7
        np.testing.assert_array_equal(_read(dev, alloc, np.int32, n), want)
    assert dev.hip.syncs - syncs < 3 * n // 100  # a sync per ring half entered and per read, not per write
    big = rng.integers(0, 255, 1 << 16, dtype=np.uint8)  # past the staged size: copied and waited for
    dev.copy_to_device(alloc, big[:4 * n])
    assert not dev.hip.queue
    np.testing.assert_array_equal(_read(dev, alloc, np.uint8, 4 * n), big[:4 * n])


def test_copy_between_is_one_device_copy(rng):
    dev = _device(deferred=True)
    data = rng.integers(0, 2**32, 300, dtype=np.uint32)
    src, dst = dev.allocate(data.nbytes), dev.allocate(data.nbytes + 16)
    dev.copy_to_device(src, data)
    dev.hip.log.clear()
    dev.copy_between(src, dst, data.nbytes)
    assert dev.hip.log == ["dtod"] and dev.hip.queue
    dev.copy_to_device(src, np.zeros(4, np.uint32))  # queued after the copy: the copy keeps the old data
    np.testing.assert_array_equal(_read(dev, dst, np.uint32, 300), data)
    assert not _read(dev, dst, np.uint32, 4, data.nbytes).any()
    with pytest.raises(ValueError, match="does not fit"):
        dev.copy_between(dst, src, data.nbytes + 16)
