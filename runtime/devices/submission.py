"""The part of the asynchronous protocol (runtime/device.py) that the Vulkan and Metal devices
share: buffers at addresses of the device's own (runtime/address_space.py), and completion
tracked by submission serial numbers.

Each submission (a command buffer) takes the next serial; a buffer records the serial of the
last submission that may use it (`last_use`). A device that records several commands into one
command buffer before submitting it (a batch, Vulkan) gives the open batch its serial when it
opens it (`_recording`): buffers its commands use take that serial at once, and `_flush()`
submits it; `_wait_for` and `wait` flush first when they wait for the open batch. Finished
submissions are retired oldest first, so every submission up to `_completed` has completed and
a buffer whose last_use is at most that is idle. `free_after_fence` frees an idle allocation
at once, any other once the work recorded so far has completed; `free` of a buffer that
recorded or submitted work still uses releases its address at once and destroys the buffer
once that work has completed.

A subclass calls `_set_up_submissions()` and provides: `_new_zeroed_buffer(nbytes)` (an
object with `size`, `address` and `last_use`), `_destroy_buffer(buf)`, and per Submission
`_block_on(sub)` (wait for it), `_finished(sub)` (without waiting) and `_recycle(sub)` (what a
completed submission gives back; it may raise the error the submission ended in); a batching
subclass also `_flush()`.
"""
from __future__ import annotations

import collections
import ctypes
import itertools

import numpy as np

from ..address_space import AddressSpace
from ..device import Allocation, Device


class Submission:
    """One submitted command buffer: its serial, what the device waits on (the command buffer
    itself, or a fence), and the buffers it keeps alive until it has completed."""
    __slots__ = ("serial", "command", "fence", "keep")

    def __init__(self, serial, command, fence, keep):
        self.serial, self.command, self.fence, self.keep = serial, command, fence, keep


class QueuedKernel:
    """A loaded kernel: a task record per task, its args plan, its metadata."""

    def __init__(self, meta, tasks, args_plan):
        self.meta, self.tasks, self.args = meta, tasks, args_plan
        self.ctx_views: dict = {}  # ctx address -> np.uint64 view of the launcher's ctx words

    def ctx_words(self, ctx_address: int) -> np.ndarray:
        """The launcher's ctx words at `ctx_address` (a view made once per ctx buffer)."""
        ctx = self.ctx_views.get(ctx_address)
        if ctx is None:
            words = max(self.meta.ctx_words, 1)
            ctx = self.ctx_views[ctx_address] = np.frombuffer((ctypes.c_uint64 * words).from_address(ctx_address),
                                                              np.uint64)
        return ctx


class SubmissionDevice(Device):
    def _set_up_submissions(self) -> None:
        self._serials = itertools.count(1)
        self._addresses = AddressSpace()
        self._in_flight = collections.deque()  # Submissions, oldest first
        self._completed = 0                    # every submission up to this serial has completed
        self._last_submitted = 0
        self._recording = 0                    # the open batch's serial; 0 while none is open
        self._pending_frees: list = []         # (serial, Allocation): free once it has completed
        self._pending_destroys: list = []      # buffers freed while work still used them
        self.bindings_epoch = 0                # bumped by every free: what launches cached of buffers is stale

    # ---- memory --------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Allocation:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        buf = self._new_zeroed_buffer(nbytes)
        buf.address = self._addresses.reserve(buf.size)
        alloc = Allocation(buf.address, nbytes, None, buf)
        self._addresses.add(alloc)
        return alloc

    def free(self, alloc: Allocation) -> None:
        buf = alloc.handle
        if buf is None:
            return
        alloc.handle = None
        self.bindings_epoch += 1
        self._addresses.remove(buf.address)
        if buf.last_use <= self._completed:
            self._destroy_buffer(buf)
        else:  # a recorded command still binds it
            self._pending_destroys.append(buf)

    def free_after_fence(self, alloc: Allocation) -> None:
        self._retire()
        buf = alloc.handle
        if buf is None:
            return
        if buf.last_use <= self._completed:
            self.free(alloc)
        else:
            self._pending_frees.append((self._latest(), alloc))

    def lookup(self, address: int):
        """(Allocation, byte offset) of an address of this device; None if it is none."""
        return self._addresses.lookup(address, lambda alloc: alloc.handle.size)

    # ---- submissions ---------------------------------------------------------------------------
    def _latest(self) -> int:
        """The serial of the newest work recorded: the open batch's, else the last submission's."""
        return self._recording or self._last_submitted

    def _flush(self) -> None:
        """Submit the open batch, if any (a device that submits each command at once has none)."""

    def _track(self, command, fence, keep: list, uses, serial: int = 0) -> int:
        """Record a submission just made: its serial (a batch's own, else the next), which
        becomes the last use of `uses`."""
        serial = serial or next(self._serials)
        self._track_submission(Submission(serial, command, fence, keep), uses)
        return serial

    def _track_submission(self, sub: Submission, uses) -> None:
        """Record the submission `sub` just made, whose serial becomes the last use of `uses`."""
        serial = self._last_submitted = sub.serial
        for buf in uses:
            buf.last_use = serial
        self._in_flight.append(sub)

    def _retire(self, until: int = 0) -> None:
        """Retire finished submissions oldest first (blocking for those up to serial `until`),
        then free what waited for them."""
        if self.lost is not None:
            self.check_not_lost()
        while self._in_flight:
            sub = self._in_flight[0]
            if sub.serial <= until:
                self._block_on(sub)
            elif not self._finished(sub):
                break
            self._in_flight.popleft()
            self._completed = sub.serial
            self._recycle(sub)
        if not self._in_flight:
            self._completed = self._last_submitted
        if self._pending_frees:
            done = [a for s, a in self._pending_frees if s <= self._completed]
            self._pending_frees = [(s, a) for s, a in self._pending_frees if s > self._completed]
            for alloc in done:
                self.free(alloc)
        if self._pending_destroys:
            idle = [b for b in self._pending_destroys if b.last_use <= self._completed]
            self._pending_destroys = [b for b in self._pending_destroys if b.last_use > self._completed]
            for buf in idle:
                self._destroy_buffer(buf)

    def _wait_for(self, serial: int) -> None:
        if serial > self._last_submitted:
            self._flush()
        if serial > self._completed:
            self._retire(serial)

    def wait(self) -> None:
        self._flush()
        self._retire(self._last_submitted)

