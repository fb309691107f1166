"""Where a program's time goes on qdc's Vulkan device: every dispatch timed on the device by a
pair of timestamps (vkCmdWriteTimestamp around its vkCmdDispatch), summed per task.

    python bench/vulkan_dispatch_times.py {box,franka} STEPS [--top N]
    python bench/vulkan_dispatch_times.py [--top N] -- SCRIPT.py [ARGS...]

The first form runs bench/genesis_scene.py SCENE STEPS --qdc --arch vulkan, the second any
script (which must itself run on Vulkan, e.g. bench/bench_simt.py --arch vulkan), with the
timestamps recorded into every launch (batched and replayed alike), then prints, per task, its
dispatches, the device time of one and in all, largest first, and the device time of all
dispatches per scene step (per run of a script). The build's and the first step's dispatches are
counted too (a few per task). The timestamps add two commands per dispatch: use the program's
own times as the figure, this for where it goes.
"""
import atexit
import collections
import os
import runpy
import sys

QUERIES = 1 << 16


class DispatchTimes:
    def __init__(self, steps: int, top: int):
        self.pool, self.next, self.rows, self.dev = None, 0, [], None
        self.steps, self.top = steps, top

    def install(self):
        from qdc.runtime.devices.vulkan import pipelines, replays
        record_task = pipelines.record_task

        def timed(dev, command, tp, dynamic, slices):
            if self.next + 2 > QUERIES:
                return record_task(dev, command, tp, dynamic, slices)
            pool, first = self.query_pool(dev), self.next
            self.next += 2
            stage = dev.vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
            dev.lib.vkCmdWriteTimestamp(command, stage, pool, first)
            record_task(dev, command, tp, dynamic, slices)
            dev.lib.vkCmdWriteTimestamp(command, stage, pool, first + 1)
            self.rows.append((tp.name, "grid on the device" if tp.grid_temp is not None else slices, first))
        pipelines.record_task = replays.record_task = timed
        from qdc.runtime.devices.vulkan.device import VulkanDevice
        close = VulkanDevice.close

        def report_then_close(dev):  # a new qd.init (Genesis's exit) closes the device first
            if dev is self.dev:
                self.report()
            close(dev)
        VulkanDevice.close = report_then_close

    def query_pool(self, dev):
        if self.pool is None:
            vk, ffi = dev.vk, dev.ffi
            info = ffi.new("VkQueryPoolCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                                      "queryType": vk.VK_QUERY_TYPE_TIMESTAMP, "queryCount": QUERIES})
            out = ffi.new("VkQueryPool*")
            dev._check(dev.lib.vkCreateQueryPool(dev.device, info, ffi.NULL, out), "vkCreateQueryPool")
            dev.lib.vkResetQueryPool(dev.device, out[0], 0, QUERIES)  # hostQueryReset: Vulkan 1.2
            self.pool, self.period, self.dev = out[0], dev_timestamp_period(dev), dev
        return self.pool

    def report(self) -> None:
        if not self.rows or self.dev is None or self.dev.device is None:
            return
        steps, top, dev, rows = self.steps, self.top, self.dev, self.rows
        self.rows = []  # reported once
        dev.wait()
        ffi, vk = dev.ffi, dev.vk
        stamps = ffi.new("uint64_t[]", self.next)
        flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
        dev._check(dev.lib.vkGetQueryPoolResults(dev.device, self.pool, 0, self.next, 8 * self.next, stamps, 8, flags),
                   "vkGetQueryPoolResults")
        per_task = collections.defaultdict(lambda: [0, 0.0, set()])
        for name, slices, first in rows:
            entry = per_task[name]
            entry[0] += 1
            entry[1] += (stamps[first + 1] - stamps[first]) * self.period * 1e-9
            entry[2].add(slices)
        total = sum(t for _, t, _ in per_task.values())
        print(f"{len(rows)} dispatches, device time {total * 1e3:.1f} ms in all, "
              f"{total / steps * 1e3:.3f} ms per step ({steps} steps)")
        print(f"{'us each':>9} {'count':>6} {'ms all':>8}  task (invocations)")
        for name, (count, seconds, slices) in sorted(per_task.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"{seconds / count * 1e6:9.1f} {count:6d} {seconds * 1e3:8.2f}  {name} ({','.join(map(str, sorted(slices, key=str)))})")


def dev_timestamp_period(dev) -> float:
    props = dev.ffi.new("VkPhysicalDeviceProperties*")
    dev.lib.vkGetPhysicalDeviceProperties(dev.physical, props)
    return props.limits.timestampPeriod


def main() -> None:
    own, script = (sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]) if "--" in sys.argv \
        else (sys.argv[1:], None)
    top = int(own[own.index("--top") + 1]) if "--top" in own else 30
    if script is None:
        scene, steps = own[0], int(own[1])
        script = [os.path.join(os.path.dirname(__file__), "genesis_scene.py"), scene, str(steps), "--qdc", "--arch",
                  "vulkan"]
    else:
        steps = 1
    times = DispatchTimes(steps, top)
    times.install()
    atexit.register(times.report)  # after the program's own lines, where the device is still open
    sys.argv = script
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
