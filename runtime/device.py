"""The one protocol through which the runtime talks to every device.

A backend implements `Device`; nothing else about it is visible to the rest of the runtime.
The protocol is that of an asynchronous device with memory of its own (a GPU: work goes on a
queue, memory is reached by copies); the CPU is its simplest case (synchronous, host memory),
and says so through its `capabilities` rather than by what it overrides.

Memory. `allocate(nbytes)` returns zeroed memory: a promise every device keeps (fields and
ndarrays rely on it). `free(alloc)` frees now (nothing submitted may still use it);
`free_after_fence(alloc)` frees once the work submitted so far is done (a synchronous device
frees at once). `copy_to_device` / `copy_to_host` move `src.nbytes` / `dst.nbytes` bytes at a
byte `offset` of the allocation: ranged copies, so one element is read without copying the
array. `copy_to_host` waits for the submitted work first.

Launches. `load_kernel(artifacts, meta)` returns what the launches take. A device with
`capabilities.fused_launch` runs a whole kernel in one synchronous foreign call
(`launch_call`, the CPU's fast path). Every device launches one task at a time:
`launch_task(loaded, task, ctx_address, slices)` queues task `task` (its record's entry) with
`slices` thread slices (the grid), computed by `task_slices(launch_policy, iterations)`,
which adstack sizing also uses (the heap holds a slice per thread a launch really runs).

Errors. Each launch in flight has its own error slot (`acquire_error_slot`): ERROR_SLOT_WORDS
words of device memory holding the adstack overflow word and the bounds-check words (their
positions: runtime/contract/error_slot.py), which the kernel finds through its ctx
words. `watch(slot, report)` hands the slot to the device with the launch's `report(words)`
(an exception naming the kernel, or None); `sync()` waits for the queue, then reads every
watched slot, clears and releases it, and raises the first launch's error, so an error
raised at sync names the kernel that made it. Before that it prints what kernels wrote into
the device's print buffer (runtime/kernel_messages.py), where a failed assert is an error.
A synchronous fused launch reads its own slot
right after the call instead (the launcher's finish hooks).

What else the runtime may ask, all declared on `Device` with the answer of a device that has
nothing special to say: `num_threads` (the threads a launch may use: the ctx's threads word),
`sync_each_launch` (sync after every launch, so that its errors surface there), `has_graphs`
and `launch_graph` (every task of a kernel as one graph replay), `device_loops` (why
qd.graph.do_while loops cannot run as device-side loops, None where they can) and
`launch_graph_loops` (a kernel with such loops as one graph replay), `numpy_binding` (a kernel
library that binds numpy arguments itself), `copy_between` (device-to-device copies) and
`close` (release the driver objects and threads a device holds); `stream` and `device` (the
driver's, for ordering other libraries' work with this device's).

Loss. A GPU that reports device loss or a launch timeout (the driver's sticky errors) calls
`device_lost(reason)`: from then on the device is `lost` and every use (sync, launches, host
access to its fields) raises DeviceLostError naming the last RECENT_KERNELS kernels submitted
(`_note_submitted`); `close()` of a lost device releases what it can without waiting for it.
"""
from __future__ import annotations

import collections
import ctypes
from dataclasses import dataclass

import numpy as np

from .contract.error_slot import ERROR_SLOT_WORDS
from .contract.errors import DeviceLostError
from . import kernel_messages

_SLOTS_PER_BLOCK = 64
RECENT_KERNELS = 8  # distinct kernel runs a DeviceLostError names


@dataclass(frozen=True)
class DeviceCapabilities:
    # Allocations have a host view (`Allocation.host`) that is the device memory itself.
    host_memory: bool = False
    # Launches complete before they return: host views are current without a sync.
    synchronous: bool = False
    # `launch_call` runs a whole kernel (every task, in order) in one synchronous call.
    fused_launch: bool = False


class Allocation:
    """Device memory: `ptr` is the device address; `host` is a host-visible numpy byte view when
    the device shares memory with the host (CPU), else None."""
    __slots__ = ("ptr", "nbytes", "host", "handle")

    def __init__(self, ptr: int, nbytes: int, host: np.ndarray | None = None, handle=None):
        self.ptr, self.nbytes, self.host, self.handle = ptr, nbytes, host, handle


class ErrorSlot:
    """ERROR_SLOT_WORDS words of device memory at byte `offset` of `alloc`; `address` is their
    device address, `host` a writable np.uint64 view of them on host-memory devices."""
    __slots__ = ("alloc", "offset", "address", "host")

    def __init__(self, alloc: Allocation, offset: int):
        self.alloc, self.offset, self.address = alloc, offset, alloc.ptr + offset
        self.host = None if alloc.host is None else alloc.host[offset:offset + 8 * ERROR_SLOT_WORDS].view(np.uint64)

    def word_address(self, word: int) -> int:
        return self.address + 8 * word


class Device:
    arch: str = "?"
    capabilities = DeviceCapabilities()
    lost: DeviceLostError | None = None  # set at a device loss (see the module docstring)
    num_threads: int = 1  # the worker threads a launch may use (the CPU's; a GPU says 1)
    sync_each_launch: bool = False  # launchers sync after every launch (errors raised at the launch)
    has_graphs: bool = False  # launch_graph replays a kernel as one graph (else task by task)
    print_buffer = None  # what kernels print, the runtime's (kernel_messages.PrintBuffer, made on first use)
    # Where other libraries' arrays meet this device's work (runtime/external_arrays.py), on the
    # devices that have them (CUDA): the driver's stream launches are queued on, and its device.
    stream = None
    device = None

    # ---- memory ----------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Allocation:
        """`nbytes` of zeroed device memory."""
        raise NotImplementedError

    def free(self, alloc: Allocation) -> None:
        """Free now: no submitted work may still use `alloc`."""
        raise NotImplementedError

    def free_after_fence(self, alloc: Allocation) -> None:
        """Free once the work submitted so far is done (e.g. a heap replaced by a larger one
        while launches that use it are in flight)."""
        if self.capabilities.synchronous:
            self.free(alloc)
        else:
            self._fenced_frees().append(alloc)

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        """Write `src`'s bytes at byte `offset` of `alloc`."""
        raise NotImplementedError

    def fill(self, alloc: Allocation, offset: int, nbytes: int, pattern: bytes) -> None:
        """Write `pattern` repeated over `nbytes` bytes (a whole number of repetitions) at byte
        `offset` of `alloc`, ordered with the work around it as `copy_to_device` is. This
        generic form copies the repeated bytes from the host; devices override it with a fill
        on the device."""
        check_fill_pattern(pattern, nbytes)
        if nbytes:
            self.copy_to_device(alloc, np.tile(np.frombuffer(pattern, np.uint8), nbytes // len(pattern)), offset)

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        """Fill `dst` with `dst.nbytes` bytes from byte `offset` of `alloc`, once the work
        submitted so far is done."""
        raise NotImplementedError

    def copy_between(self, src: Allocation, dst: Allocation, nbytes: int) -> None:
        """Copy the first `nbytes` bytes of `src` to `dst`, ordered with the work around it. This
        generic form goes through the host; GPUs override it with a copy on the device."""
        if host_memory(self):
            dst.host[:nbytes] = src.host[:nbytes]
            return
        data = np.empty(nbytes, np.uint8)
        self.copy_to_host(src, data)
        self.copy_to_device(dst, data)

    # ---- kernels ---------------------------------------------------------------------------
    def load_kernel(self, artifacts: dict, meta) -> object:
        """Turn a kernel's artifacts into something `launch_call` / `launch_task` accept."""
        raise NotImplementedError

    def launch_call(self, loaded, ctx: ctypes.Array) -> tuple:
        """`(call, arg)` such that `call(arg)` runs every task of `loaded` on the ctx buffer
        `ctx`, synchronously (only with capabilities.fused_launch). Launchers make exactly this
        call once per launch, so a backend whose launch is a single foreign call returns that
        foreign function itself (see CpuDevice)."""
        raise NotImplementedError

    def launch_task(self, loaded, task: int, ctx_address: int, slices: int) -> None:
        """Queue task `task` of `loaded` on `slices` thread slices, reading the ctx at
        `ctx_address` (its words must stay as they are until the task ran)."""
        raise NotImplementedError

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The thread slices a task with launch policy `launch` (its record's) dispatches for
        `iterations` trip count (None: unknown, the most the device would run)."""
        raise NotImplementedError

    def launch_graph(self, loaded, ctx_address: int, slices: list) -> None:
        """Every task of `loaded` in order, task i on `slices[i]` thread slices, as one replay
        of a graph where the device `has_graphs`; this generic form launches task by task."""
        for task, n in enumerate(slices):
            self.launch_task(loaded, task, ctx_address, n)

    def device_loops(self) -> str | None:
        """None where `launch_graph_loops` runs qd.graph.do_while loops on the device, else why
        not (their launches then read each loop's flag back after every pass)."""
        return f"the {self.arch} device has no conditional graphs"

    def launch_graph_loops(self, loaded, ctx_address: int, slices: list, steps: list, flags: dict) -> None:
        """A kernel with qd.graph.do_while loops as one graph replay where `device_loops()` is
        None: `steps` as runtime/graph_loops.py's loop_steps, task i on `slices[i]` thread
        slices, loop flags at device addresses `flags` (flag parameter -> address)."""
        raise NotImplementedError(self.device_loops())

    def numpy_binding(self, loaded, meta):
        """An object through which `loaded`'s own library binds numpy arguments (the CPU's
        runtime/devices/cpu/numpy_binding.py), or None: the launcher binds them."""
        return None

    # ---- completion and errors --------------------------------------------------------------
    def max_binding_bytes(self) -> int | None:
        """The most bytes one buffer a kernel binds may span (Vulkan's maxStorageBufferRange,
        Metal's maxBufferLength); None where a binding is limited only by memory."""
        return None

    def allocate_host_read(self, nbytes: int) -> Allocation:
        """Zeroed memory the host reads at every sync (error slots, the print buffer): where the
        device can, host-visible, so that reading it needs no copy through a submission."""
        return self.allocate(nbytes)

    def acquire_error_slot(self) -> ErrorSlot:
        """A zeroed error slot for one launch (or for the synchronous launches of one launcher)."""
        free = self._error_state()["free"]
        if not free:
            alloc = self.allocate_host_read(8 * ERROR_SLOT_WORDS * _SLOTS_PER_BLOCK)
            self._error_state()["blocks"].append(alloc)
            free.extend(ErrorSlot(alloc, 8 * ERROR_SLOT_WORDS * i) for i in reversed(range(_SLOTS_PER_BLOCK)))
        return free.pop()

    def release_error_slot(self, slot: ErrorSlot) -> None:
        """Give back a zeroed slot."""
        self._error_state()["free"].append(slot)

    def watch(self, slot: ErrorSlot, report) -> None:
        """The launch just submitted writes its errors into `slot`: `sync` reads it and raises
        `report(words)` (an exception or None) for a nonzero slot, then releases it."""
        self._error_state()["watched"].append((slot, report))

    def wait(self) -> None:
        """Block until every submitted launch and copy is done (a synchronous device: no-op)."""

    def sync(self) -> None:
        """Wait for the submitted work, free what waited for it, and report the first error of
        the launches watched since the last sync (each slot is cleared and released)."""
        if self.lost is not None:
            self.check_not_lost()
        self.wait()
        frees = getattr(self, "_fenced", None)
        while frees:
            self.free(frees.pop())
        failed_assert = None
        if self.print_buffer is not None:
            try:
                kernel_messages.drain(self)  # print output first, then the launches' errors
            except AssertionError as e:
                failed_assert = e
        state = getattr(self, "_errors", None)
        if state is None or not state["watched"]:
            if failed_assert is not None:
                raise failed_assert
            return
        watched, state["watched"] = state["watched"], []
        first = None
        words = np.zeros(ERROR_SLOT_WORDS, np.uint64)
        for slot, report in watched:
            self.copy_to_host(slot.alloc, words, slot.offset)
            if words.any():
                error = report(words.copy())
                first = first or error
                self.copy_to_device(slot.alloc, np.zeros(ERROR_SLOT_WORDS, np.uint64), slot.offset)
            self.release_error_slot(slot)
        first = first or failed_assert
        if first is not None:
            raise first

    def close(self) -> None:
        """Release what the device holds (driver objects, threads) once it is replaced; a lost
        device's close waits for nothing."""

    # ---- loss -------------------------------------------------------------------------------
    def _note_submitted(self, kernel: str) -> None:
        """Remember `kernel` among the last kernels submitted (a repeat of the last one is one run)."""
        recent = self.__dict__.get("_recent_kernels")
        if recent is None:
            recent = self._recent_kernels = collections.deque(maxlen=RECENT_KERNELS)
        if not recent or recent[-1] != kernel:
            recent.append(kernel)

    def device_lost(self, reason: str) -> DeviceLostError:
        """Mark the device lost (`reason`: the call that found it and the driver's status) and
        return the error to raise; a later loss keeps the first reason."""
        if self.lost is None:
            self.lost = DeviceLostError(self.arch, reason, self.__dict__.get("_recent_kernels", ()))
        return self._lost_again()

    def check_not_lost(self) -> None:
        if self.lost is not None:
            raise self._lost_again()

    def _lost_again(self) -> DeviceLostError:
        """A fresh DeviceLostError like the first (raising one object again would pile up tracebacks)."""
        return DeviceLostError(self.lost.arch, self.lost.reason, self.lost.kernels)

    def _error_state(self) -> dict:
        state = getattr(self, "_errors", None)
        if state is None:
            state = self._errors = {"blocks": [], "free": [], "watched": []}
        return state

    def _fenced_frees(self) -> list:
        frees = getattr(self, "_fenced", None)
        if frees is None:
            frees = self._fenced = []
        return frees


def host_memory(device: Device) -> bool:
    """Whether host views of `device`'s allocations are current without a sync."""
    caps = device.capabilities
    return caps.host_memory and caps.synchronous


def check_copy_range(alloc: Allocation, offset: int, nbytes: int):
    """The allocation's handle, once a copy of `nbytes` bytes at byte `offset` is known to fit
    the (not freed) allocation."""
    if alloc.handle is None:
        raise ValueError("a copy to or from a freed allocation")
    if offset < 0 or offset + nbytes > alloc.nbytes:
        raise ValueError(f"a copy of {nbytes} bytes at offset {offset} does not fit an allocation of "
                         f"{alloc.nbytes} bytes")
    return alloc.handle


FILL_SEED_BYTES = 4096  # a fill no device command writes: this much of the pattern written, then doubled by copies


def check_fill_pattern(pattern: bytes, nbytes: int) -> None:
    """Raise the ValueError for a fill of `nbytes` that is not a whole number of `pattern`s."""
    if not pattern or nbytes % len(pattern):
        raise ValueError(f"a fill of {nbytes} bytes with a pattern of {len(pattern)} bytes: not a whole number "
                         f"of repetitions")


def pattern_period(pattern: bytes) -> int:
    """The length of the shortest prefix of which `pattern` is a repetition."""
    n = len(pattern)
    for unit in range(1, n):
        if n % unit == 0 and pattern[:unit] * (n // unit) == pattern:
            return unit
    return n


def fill_seed(pattern: bytes, nbytes: int) -> np.ndarray:
    """The first min(FILL_SEED_BYTES, nbytes) bytes (whole patterns) of a fill, from which copies
    doubling the written part cover the rest."""
    return np.frombuffer(pattern * max(FILL_SEED_BYTES // len(pattern), 1), np.uint8)[:nbytes]


__all__ = ["Allocation", "Device", "DeviceCapabilities", "ErrorSlot", "check_copy_range", "check_fill_pattern",
           "fill_seed", "host_memory", "pattern_period"]
