"""Adstacks at run time: the heap, its sizing before each launch, the overflow check after.

One heap per runtime serves every kernel (tasks run one after another, and so do kernels).
A kernel's metadata lists its stacks (`KernelMeta.adstack["stacks"]`: task, dtype, capacity);
here they are laid out in a per-thread slice, each as an 8-byte count followed by `capacity`
entries (primal, plus its adjoint when the record says `adjoint`). Stacks of different tasks share slice space, since
the tasks never run at the same time. Before a launch the heap must hold `threads * stride`
bytes; it grows by amortised doubling, `max(required, 2 * current)`, retrying at exactly
`required` when that fails. The layout reaches the kernel through ctx words
(artifact.py), never through compiled-in constants.

After a launch, a nonzero overflow word means a push found its stack full: the push was
skipped, so nothing was corrupted; `AdStackOverflowError` names the kernel, task, and the
allocated and required capacities, and the word is cleared for the next launch.
A kernel without adstacks gets no hooks: it allocates and checks nothing.
"""
from __future__ import annotations

import os
import sys
import weakref

import numpy as np

from . import context
from .artifact import DTYPE_NAMES
from .errors import AdStackOverflowError
from .types import by_name

HEADER_BYTES = 8
_MAX_CAPACITY = 1 << 40
_heaps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Runtime -> AdStackHeap


def log(message: str) -> None:
    if "adstack" in os.environ.get("QDC_LOG", "").split(","):
        print(f"[qdc adstack] {message}", file=sys.stderr)


class AdStackHeap:
    """The adstack memory of one runtime, and its overflow word."""

    def __init__(self, device):
        self.device = device
        self.alloc = None
        self.nbytes = 0
        self.overflow = np.zeros(1, np.uint64)

    @property
    def ptr(self) -> int:
        return self.alloc.ptr if self.alloc is not None else 0

    def ensure(self, required: int, kernel: str) -> None:
        if required <= self.nbytes:
            return
        size = max(required, 2 * self.nbytes)
        alloc = self._try_allocate(size)
        if alloc is None and size > required:
            size = required
            alloc = self._try_allocate(size)
        if alloc is None:
            raise MemoryError(
                f"kernel '{kernel}': cannot allocate {required} bytes for its adstacks (heap now {self.nbytes} "
                f"bytes). Reduce the capacity (qd.init(ad_stack_size=N) or a smaller default_ad_stack_size), "
                f"the number of loop-carried variables in dynamic loops, or the worker threads "
                f"(qd.init(cpu_max_num_threads=N))")
        old, self.alloc, self.nbytes = self.alloc, alloc, size
        if old is not None:
            self.device.free(old)  # CPU launches are synchronous: nothing still uses it
        log(f"heap grown to {size} bytes for kernel '{kernel}' (needed {required})")

    def _try_allocate(self, size: int):
        try:
            return self.device.allocate(size)
        except (MemoryError, ValueError, OverflowError):
            return None


def heap_for(rt) -> AdStackHeap:
    heap = _heaps.get(rt)
    if heap is None:
        heap = _heaps[rt] = AdStackHeap(rt.device)
    return heap


def adstack_heap_bytes() -> int:
    """Bytes held by the current runtime's adstack heap (0 until a kernel needs one)."""
    heap = _heaps.get(context.current())
    return heap.nbytes if heap is not None else 0


class StackLayout:
    """Where each stack of a kernel lives in a thread's slice, checked from the metadata."""

    def __init__(self, meta):
        stacks = meta.adstack.get("stacks") or []
        self.records = [_checked(meta, i, r) for i, r in enumerate(stacks)]
        used: dict = {}
        self.offsets = []
        for r in self.records:
            offset = used.get(r["task"], 0)
            self.offsets.append(offset)
            entry = by_name(r["dtype"]).nbytes * (2 if r["adjoint"] else 1)
            used[r["task"]] = offset + _align8(HEADER_BYTES + r["max_size"] * entry)
        self.stride = max(used.values(), default=0)

    def words(self) -> np.ndarray:
        """(offset, capacity) of every stack, as the ctx words after the first three."""
        out = np.empty(2 * len(self.records), np.uint64)
        out[0::2] = self.offsets
        out[1::2] = [r["max_size"] for r in self.records]
        return out


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _checked(meta, i: int, r) -> dict:
    ok = (isinstance(r, dict) and isinstance(r.get("task"), int) and 0 <= r["task"] < len(meta.tasks)
          and r.get("dtype") in DTYPE_NAMES and isinstance(r.get("max_size"), int)
          and isinstance(r.get("adjoint"), bool) and (not r["adjoint"] or by_name(r["dtype"]).is_float)
          and 1 <= r["max_size"] <= _MAX_CAPACITY and isinstance(r.get("name", ""), str))
    if not ok:
        raise ValueError(f"kernel '{meta.name}': malformed adstack record {i} in its metadata")
    return r


class AdStackHooks:
    """The launcher's prepare/finish hooks for one kernel with adstacks."""

    def __init__(self, meta):
        self.meta = meta
        self.layout = StackLayout(meta)
        self.slot = meta.adstack_slot
        self.static_words = self.layout.words()
        self.heap = None
        self.bound = None  # (heap, heap pointer) the ctx words were last written for

    def prepare(self, lctx) -> None:
        heap = self.heap = heap_for(context.current())
        threads = max(int(getattr(lctx.device, "num_threads", 1)), 1)
        heap.ensure(threads * self.layout.stride, self.meta.name)
        if self.bound != (heap, heap.ptr):
            w, s = lctx.words, self.slot
            w[s], w[s + 1], w[s + 2] = heap.ptr, self.layout.stride, heap.overflow.ctypes.data
            w[s + 3:s + 3 + len(self.static_words)] = self.static_words
            self.bound = (heap, heap.ptr)

    def finish(self) -> None:
        code = int(self.heap.overflow[0])
        if code:
            self.heap.overflow[0] = 0
            raise self.overflow_error(code)

    def overflow_error(self, code: int) -> AdStackOverflowError:
        required, task, stack = code >> 32, (code >> 16) & 0xFFFF, code & 0xFFFF
        records = self.layout.records
        r = records[stack] if stack < len(records) else {"max_size": 0, "name": "?", "where": "?"}
        task_name = self.meta.tasks[task].name if task < len(self.meta.tasks) else f"#{task}"
        err = AdStackOverflowError(
            f"kernel '{self.meta.name}', task '{task_name}': the adstack of '{r.get('name', '?')}' "
            f"(from {r.get('where', '?')}) overflowed: {r['max_size']} entries allocated, {required} required. "
            f"No memory was corrupted; this launch's gradients are incomplete. Set qd.init(ad_stack_size={required}) "
            f"(or raise default_ad_stack_size) and run it again")
        err.kernel, err.task, err.allocated, err.required = self.meta.name, task_name, r["max_size"], required
        return err


def launch_hooks(meta):
    """Launch hooks for `meta`, or None when the kernel has no adstacks."""
    if not meta.adstack.get("stacks"):
        return None
    from .launcher import LaunchHooks
    hooks = AdStackHooks(meta)
    return LaunchHooks(prepare=hooks.prepare, finish=hooks.finish)
