"""The Metal device (runtime/devices/metal) where Metal cannot run: it fails cleanly off macOS
(qd.init, load) and without PyObjC; on a stand-in for PyObjC's MTLDevice (buffers in host
memory, command buffers that complete when told) it follows the device protocol:
allocations are zeroed and copied by range, a nil `newBufferWithLength:` is an out-of-memory
error (never a nil bound later), the shared adstack heap growth retries at exactly the
required size past maxBufferLength, a failed pipeline creation or MSL compile raises naming the
task, a launch binds every buffer at the index its task record gives and dispatches
ceil(N / block_dim) threadgroups of block_dim, and a buffer freed after the fence outlives the
command buffers that use it."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.targets.metal import msl
from qdc.runtime.adstack import AdStackHeap
from qdc.runtime.devices.metal import driver
from qdc.runtime.devices.metal.device import MetalDevice, UnsupportedKernelError

from backend_util import build_kernels, check_zeroed_ranged_copies, compile_saxpy, hide_package, saxpy_ctx


# ---- failing cleanly ---------------------------------------------------------------------------

@pytest.mark.skipif(os.uname().sysname == "Darwin", reason="this checks the refusal off macOS")
def test_qd_init_and_load_refuse_metal_off_macos(tmp_path):
    with pytest.raises(driver.MetalUnavailableError, match="runs only on macOS"):
        qd.init(arch=qd.metal)
    if msl.spirv_cross_path() is None:
        return
    from qdc.runtime import load
    cache = str(tmp_path / "cache")
    built = build_kernels(cache, "metal")
    assert built.exit_code == 0, built.output
    with pytest.raises(driver.MetalUnavailableError, match="runs only on macOS"):
        load(cache, "saxpy", arch="metal")


def test_missing_pyobjc_names_the_package(monkeypatch):
    hide_package(monkeypatch, "Metal")
    with pytest.raises(driver.MetalUnavailableError, match="pip install pyobjc-framework-Metal"):
        driver.load_metal("darwin")


# ---- a stand-in for PyObjC's Metal ---------------------------------------------------------------

class FakeContents:
    def __init__(self, memory):
        self.memory = memory

    def as_buffer(self, n):
        return memoryview(self.memory)[:n]


class FakeBuffer:
    def __init__(self, size):
        self.memory = bytearray(b"\xab" * size)  # not zeroed: the device must zero it

    def contents(self):
        return FakeContents(self.memory)


class FakeEncoder:
    def __init__(self, log):
        self.log = log

    def setComputePipelineState_(self, p):
        self.log.append(("pipeline", p))

    def setBuffer_offset_atIndex_(self, buf, offset, index):
        self.log.append(("buffer", index, buf, offset))

    def setBytes_length_atIndex_(self, data, n, index):
        self.log.append(("bytes", index, bytes(data[:n])))

    def dispatchThreadgroups_threadsPerThreadgroup_(self, groups, threads):
        self.log.append(("dispatch", groups, threads))

    def endEncoding(self):
        self.log.append(("end",))


class FakeCommandBuffer:
    def __init__(self, queue):
        self.queue, self.log, self.state = queue, [], 0

    def computeCommandEncoder(self):
        return FakeEncoder(self.log)

    def commit(self):
        self.state = 2
        self.queue.committed.append(self)

    def status(self):
        return self.state

    def waitUntilCompleted(self):
        self.state = max(self.state, driver.COMMAND_BUFFER_COMPLETED)

    def error(self):
        return "fake GPU fault"


class FakeQueue:
    def __init__(self):
        self.committed = []

    def commandBuffer(self):
        return FakeCommandBuffer(self)


class FakePipeline:
    def __init__(self, name):
        self.name = name

    def maxTotalThreadsPerThreadgroup(self):
        return 1024


class FakeLibrary:
    def __init__(self, source):
        self.source = source

    def newFunctionWithName_(self, name):
        return name if f"kernel void {name}(" in self.source else None


class FakeMTLDevice:
    """Buffers up to `memory` bytes each (beyond: nil, as Metal answers), maxBufferLength `limit`."""

    def __init__(self, limit=1 << 20, memory=1 << 30, pipelines_fail=False):
        self.limit, self.memory, self.pipelines_fail = limit, memory, pipelines_fail
        self.requests = []

    def name(self):
        return "Fake Apple GPU"

    def maxBufferLength(self):
        return self.limit

    def newCommandQueue(self):
        return FakeQueue()

    def newBufferWithLength_options_(self, size, options):
        self.requests.append(size)
        return FakeBuffer(size) if size <= self.memory else None

    def newLibraryWithSource_options_error_(self, source, options, error):
        if "kernel void" not in source:
            return None, "error: no kernel in this source"
        return FakeLibrary(source), None

    def newComputePipelineStateWithFunction_error_(self, function, error):
        if self.pipelines_fail:
            return None, "XPC_ERROR_CONNECTION_INTERRUPTED"
        return FakePipeline(function), None


class FakeMetal:
    @staticmethod
    def MTLSizeMake(x, y, z):
        return (x, y, z)


def _device(**kw) -> MetalDevice:
    return MetalDevice(metal=FakeMetal, mtl_device=FakeMTLDevice(**kw))


# ---- the protocol on the stand-in ----------------------------------------------------------------

def test_allocations_are_zeroed_and_copies_are_ranged():
    dev = _device()
    a = check_zeroed_ranged_copies(dev)
    assert dev.lookup(a.ptr + 500) == (a, 500) and dev.lookup(a.ptr - 1) is None


def test_a_nil_buffer_is_an_out_of_memory_error():
    dev = _device(memory=4096)
    with pytest.raises(MemoryError, match=r"returned nil.*maxBufferLength"):
        dev.allocate(8192)
    with pytest.raises(MemoryError, match="maxBufferLength"):
        _device(limit=1024).allocate(2048)


def test_heap_growth_past_max_buffer_length_retries_at_exactly_required():
    """The shared heap (runtime/adstack.py) on Metal: at 100 KiB, 120 KiB required, the doubled
    240 KiB is above maxBufferLength (150 KiB) and the retry asks for exactly 120 KiB."""
    kib = 1024
    dev = _device(limit=150 * kib)
    heap = AdStackHeap(dev)
    heap.ensure(100 * kib, "k")
    first = heap.alloc
    assert heap.ensure(120 * kib, "k") and heap.nbytes == 120 * kib
    assert dev.mtl.requests[-1] == 120 * kib and first.handle is None  # nothing in flight: freed at once
    with pytest.raises(MemoryError, match="cannot allocate"):
        heap.ensure(200 * kib, "k")


def _metal_kernel(variant="forward"):
    if msl.spirv_cross_path() is None:
        pytest.skip(f"spirv-cross not installed ({msl.INSTALL_HINT})")
    return compile_saxpy("metal", variant)


def test_a_failed_pipeline_or_msl_compile_raises_naming_the_task():
    compiled = _metal_kernel()
    with pytest.raises(RuntimeError, match=r"compute pipeline of task 0 \('saxpy_t0_\w+'\).*XPC_ERROR"):
        _device(pipelines_fail=True).load_kernel(compiled.artifacts, compiled.meta)
    broken = dict(compiled.artifacts, msl_t0=b"#include <metal_stdlib>\n")
    with pytest.raises(RuntimeError, match="compiling the MSL of task 0"):
        _device().load_kernel(broken, compiled.meta)
    with pytest.raises(UnsupportedKernelError, match="no MSL"):
        _device().load_kernel({"spirv_t0": b""}, compiled.meta)


def test_a_launch_binds_as_the_metadata_says_and_dispatches_whole_threadgroups(rng):
    compiled = _metal_kernel()
    meta, dev = compiled.meta, _device()
    loaded = dev.load_kernel(compiled.artifacts, meta)
    n = 1000
    ctx, xs, ys = saxpy_ctx(dev, meta, n, a=2.5)
    _a, x, y = meta.params
    slices = dev.task_slices(meta.tasks[0].launch, n)
    dev.launch_task(loaded, 0, ctypes.addressof(ctx), slices)
    (command,) = dev.queue.committed
    log = command.log
    bound = {entry[1]: entry for entry in log if entry[0] in ("buffer", "bytes")}
    bindings = meta.tasks[0].bindings
    assert sorted(bound) == sorted(b for _set, b, _res, _i in bindings)  # every binding, at its own index
    for _set, b, res, index in bindings:
        if res == "args":
            words = np.frombuffer(bound[b][2], np.uint32)
            assert words[0] == np.float32(2.5).view(np.uint32) and n in words  # the scalar, then extents
        else:
            assert res == "ndarray" and meta.params[index] in (x, y)
            assert bound[b][2] is (xs if meta.params[index] is x else ys).handle.buffer and bound[b][3] == 0
    block = meta.tasks[0].launch["block_dim"]
    assert ("dispatch", (-(-n // block), 1, 1), (block, 1, 1)) in log and log[-1] == ("end",)
    # a buffer freed after the fence outlives the command buffer that uses it
    dev.free_after_fence(xs)
    assert xs.handle is not None
    dev.sync()
    assert xs.handle is None and command.status() == driver.COMMAND_BUFFER_COMPLETED


def test_a_command_buffer_in_error_raises_at_sync():
    compiled = _metal_kernel()
    dev = _device()
    loaded = dev.load_kernel(compiled.artifacts, compiled.meta)
    ctx, _xs, _ys = saxpy_ctx(dev, compiled.meta, 16)
    dev.launch_task(loaded, 0, ctypes.addressof(ctx), 16)
    dev.queue.committed[0].state = driver.COMMAND_BUFFER_ERROR
    with pytest.raises(RuntimeError, match="fake GPU fault"):
        dev.sync()


def test_heap_indices_must_fit_32_bits():
    """The Metal code indexes the adstack heaps in 32 bits: a launch whose stride x invocations
    would wrap is refused before it runs (seed 001)."""
    class Meta:
        name, adstack_slot, adstack_threads_slot = "k", 0, 5
        adstack = {"stacks": [{"task": 0, "dtype": "f32", "adjoint": True, "max_size": 1 << 20, "name": "v",
                               "where": "", "source": "", "size_expr": []}],
                   "layout": None}
    from qdc.runtime.contract.adstack_layout import spirv_heap
    Meta.adstack["layout"] = spirv_heap(False).record()
    ctx = np.zeros(8, np.uint64)
    ctx[3], ctx[4], ctx[5] = 0, 1 << 20, 1 << 12  # offset 0, capacity 2^20 entries of 8 bytes, 4096 invocations
    with pytest.raises(ValueError, match="32-bit heap indices"):
        _device()._adstack_words(Meta, ctx, "k_t0")
    ctx[5] = 16
    assert _device()._adstack_words(Meta, ctx, "k_t0")[2] == 16


def test_launches_are_grid_capped_and_a_heap_binding_is_one_buffer():
    """As on Vulkan: at most GRID_CAP_INVOCATIONS invocations (the grid-stride loop does the rest),
    and the adstack sizing lowers the invocations its heaps hold to what one MTLBuffer spans."""
    from qdc.runtime.devices.metal import device as metal_device
    dev = _device(limit=150 * 1024)
    launch = {"policy": "grid", "block_dim": 256}
    cap = metal_device.GRID_CAP_INVOCATIONS
    assert dev.task_slices(launch, 1 << 30) == cap and dev.task_slices(launch, 1000) == 1000
    assert dev.task_slices(launch, 0) == 0 and dev.max_binding_bytes() == 150 * 1024


def test_copy_between_waits_for_the_launches_using_either_buffer_then_copies_on_the_device(rng):
    """Deep copies of arrays: the shared-storage contents copied once the command buffers that
    use the source or the destination completed, never through a host array of the caller's."""
    compiled = _metal_kernel()
    dev = _device()
    loaded = dev.load_kernel(compiled.artifacts, compiled.meta)
    ctx, xs, ys = saxpy_ctx(dev, compiled.meta, 64)
    dev.launch_task(loaded, 0, ctypes.addressof(ctx), 64)
    (command,) = dev.queue.committed
    data = rng.integers(0, 2**32, 64, dtype=np.uint32)
    copy = dev.allocate(4 * 64)
    ys.handle.view[:4 * 64] = data.view(np.uint8)  # what the stand-in's "kernel" wrote
    dev.copy_between(ys, copy, 4 * 64)
    assert command.status() == driver.COMMAND_BUFFER_COMPLETED  # waited for the launch writing ys
    out = np.empty(64, np.uint32)
    dev.copy_to_host(copy, out)
    np.testing.assert_array_equal(out, data)
    with pytest.raises(ValueError, match="does not fit"):
        dev.copy_between(ys, copy, 4 * 65)
