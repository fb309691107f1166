"""Launches recorded once and replayed: a one-task kernel launched on an idle device (nothing
recorded, nothing in flight) is submitted as a command buffer of its own, recorded at such a
launch and submitted again, unchanged, by the next ones while what it recorded holds, as CUDA
graphs replay a launch. Only the "args" words are written per launch, into a slot of the args
ring that the replay's dynamic offset names. That keeps the one-element launch's recording (a
dozen driver calls) off the way from a launch to its sync: on an H200 the launch call went from
14-23 us to 6-7 us (docs/benchmarks.md).

A replay holds while the task's LaunchPlan (pipelines.py) is the one it was recorded with and
holds (same ctx words naming the bound buffers, no buffer freed nor descriptor pool reset
since: `bindings_epoch`), the ctx words of its error slots are the same, and the launch
dispatches as many invocations; otherwise the next such launch records it again. Launches
while the device is busy go into the open batch as before (device.py), so a loop of launches
still pays one submission per BATCH_COMMANDS.

A replay's command buffer is submitted only while nothing is in flight, so its previous
submission has completed and its args slot is free when the next launch writes it. The device
keeps the REPLAYS most recently recorded; recording another reuses the oldest one's command
buffer, fence and slot.
"""
from __future__ import annotations

import collections

import numpy as np

from ..submission import Submission
from .pipelines import planned_offsets, record_task, words_key

REPLAYS = 64             # replays kept per device
MAX_DYNAMIC_BINDINGS = 8  # dynamic offsets a replayed task may have (args, errors)
REPLAY_SLOT_BYTES = 1024  # args words a replayed launch may have: 256 (larger kernels record each launch)


class Replay:
    """One task's recorded launch: its command buffer and fence (and the submit info naming
    them, the Submission the device tracks it by), the plan, ctx words and slices it was recorded for, its dynamic offsets, its args
    slot (an np.uint32 view of the ring; None when the kernel has no args words), the buffers it
    uses."""
    __slots__ = ("command", "fence", "fence_handle", "submission", "commands", "submit_info", "offset", "plan",
                 "key_of", "key", "slices", "args", "uses", "dynamic")

    def __init__(self, ffi, vk, command, fence, offset):
        self.command, self.fence, self.fence_handle, self.offset = command, fence, fence[0], offset
        self.submission = Submission(0, None, fence, ())  # no command buffer: the replay keeps its own
        # cffi frees what a struct's pointer field was given from a temporary: both are kept.
        self.commands = ffi.new("VkCommandBuffer[1]", [command])
        self.submit_info = ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
                                                     "pCommandBuffers": self.commands})
        self.dynamic = ffi.new("uint32_t[]", MAX_DYNAMIC_BINDINGS)
        self.plan = self.key_of = self.key = self.slices = self.args = None
        self.uses = []


class Replays:
    """A device's replays, least recently recorded first, by task pipeline."""

    def __init__(self, dev, first_offset: int, slot_bytes: int):
        self.dev, self.first_offset, self.slot_bytes = dev, first_offset, slot_bytes
        self.by_task: collections.OrderedDict = collections.OrderedDict()

    def launch(self, loaded, tp, ctx, slices: int) -> bool:
        """Submit task `tp`'s launch with ctx words `ctx` as a replay (the device idle); False,
        with nothing done, when its plan does not hold yet (the launch then records as usual)."""
        dev = self.dev
        replay = self.by_task.get(tp)
        if (replay is None or replay.plan is not tp.plan or replay.plan.epoch != dev.bindings_epoch
                or replay.slices != slices or replay.key_of(ctx) != replay.key):
            replay = self._record(loaded, tp, ctx, slices)
            if replay is None:
                return False
        if replay.args is not None:
            loaded.args.pack_into(ctx, replay.args)
        dev.submit_replay(replay, loaded.meta.name)
        return True

    def _record(self, loaded, tp, ctx, slices: int):
        """(Re-)record `tp`'s replay for this launch; None where the plan does not hold or the
        args do not fit a slot."""
        dev, plan = self.dev, tp.plan
        if (plan is None or plan.addresses is not None  # a replay writes the args words alone
                or plan.epoch != dev.bindings_epoch or loaded.args.nbytes > self.slot_bytes
                or len(plan.dynamic) > MAX_DYNAMIC_BINDINGS):
            return None
        offsets = planned_offsets(plan, ctx)
        if offsets is None:
            return None
        replay = self.by_task.get(tp) or self._take_replay(tp)
        self.by_task.move_to_end(tp)
        replay.plan = None  # until it is recorded whole
        lib = dev.lib
        for j, (_p, base, end) in enumerate(plan.dynamic):
            if base is None and end is None:  # the args: the replay's own slot
                offsets[j] = replay.offset
        for j, offset in enumerate(offsets):
            replay.dynamic[j] = offset
        command = replay.command
        dev._check(lib.vkResetCommandBuffer(command, 0), "vkResetCommandBuffer")
        dev._check(lib.vkBeginCommandBuffer(command, dev._replay_begin_info), "vkBeginCommandBuffer")
        dev._barrier(command, dev._barrier_between)  # against everything submitted before
        record_task(dev, command, tp, replay.dynamic, slices)
        dev._barrier(command, dev._barrier_to_host, dev.vk.VK_PIPELINE_STAGE_HOST_BIT)
        dev._check(lib.vkEndCommandBuffer(command), "vkEndCommandBuffer")
        key_words = [p.word for p in tp.bindings if p.word is not None]
        replay.key_of = words_key(key_words)
        count = len(loaded.args.gather)
        ring = dev._args_ring.mapped
        replay.args = ring[replay.offset:replay.offset + 4 * count].view(np.uint32) if count else None
        replay.key, replay.slices, replay.uses = replay.key_of(ctx), slices, list(tp.uses)
        replay.plan = plan
        return replay

    def _take_replay(self, tp) -> Replay:
        """`tp`'s replay to record into: a new one (a command buffer and fence, the next slot)
        while fewer than REPLAYS exist, else the least recently recorded one's."""
        if len(self.by_task) >= REPLAYS:
            replay = self.by_task.popitem(last=False)[1]
        else:
            command, fence = self.dev._command_buffer()
            replay = Replay(self.dev.ffi, self.dev.vk, command, fence,
                            self.first_offset + len(self.by_task) * self.slot_bytes)
        self.by_task[tp] = replay
        return replay

    def release(self) -> list:
        """Forget every replay; their (command buffer, fence) pairs, for reuse or destruction."""
        pairs = [(r.command, r.fence) for r in self.by_task.values()]
        self.by_task.clear()
        return pairs
