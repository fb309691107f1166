"""Adstacks at run time: the heap, its sizing before each launch, the overflow check after.

One heap per runtime serves every kernel (tasks run one after another, and so do kernels).
A kernel's metadata lists its stacks (`KernelMeta.adstack["stacks"]`, artifact.py): task,
dtype, and a capacity that is either a constant or a SizeExpr tree. Right before every
launch the trees are evaluated against the launch's arguments, fields and ndarrays
(adstack_sizing.py generates that code per kernel), and the stacks are laid out in a
per-thread slice, each as an 8-byte count followed by `capacity` entries (primal, plus its
adjoint when the record says `adjoint`), rounded up to 8 bytes. Stacks of different tasks
share slice space, since the tasks never run at the same time. The heap must then hold
`threads * stride` bytes for the threads the launch really uses (the most of any of its
tasks, from their trip counts and the CPU dispatch rule; at least one). That thread count
is a ctx word too, and the native dispatch runs a task with adstacks on at most that many
threads, so memory safety never rests on the evaluated trip counts. The heap grows by
amortised doubling, `max(required, 2 * current)`, retrying at exactly `required` when that
fails, and never shrinks. The layout reaches the kernel through ctx words (artifact.py),
never through compiled-in constants. When the evaluated inputs equal the previous launch's
and the heap did not move, nothing is recomputed or rewritten.

After a launch, a nonzero overflow word means a push found its stack full: the push was
skipped, so nothing was corrupted; `AdStackOverflowError` names the kernel, task, and the
allocated and required capacities, and the word is cleared for the next launch.
A kernel without adstacks gets no hooks: it allocates, evaluates and checks nothing.
"""
from __future__ import annotations

import os
import sys
import weakref

import numpy as np

from . import adstack_sizing as sizing
from . import context
from .contract import sizeexpr as se
from .contract.artifact import MAX_ADSTACK_CAPACITY, check_adstack_record
from .device import Device
from .contract.errors import AdStackOverflowError
from .contract.types import by_name

_heaps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Runtime -> AdStackHeap


def logging_enabled() -> bool:
    return "adstack" in os.environ.get("QDC_LOG", "").split(",")


def log(message: str) -> None:
    if logging_enabled():
        print(f"[qdc adstack] {message}", file=sys.stderr)


class AdStackHeap:
    """The adstack memory of one runtime, and its overflow word."""

    def __init__(self, device):
        self.device = device
        self.alloc = None
        self.nbytes = 0
        self.overflow = np.zeros(1, np.uint64)
        self.overflow_address = self.overflow.ctypes.data

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


class KernelStacks:
    """A kernel's stacks as its metadata describes them, checked and parsed once at load:
    per stack its task, entry size and capacity (an int, or a SizeExpr evaluated per launch);
    per task holding stacks its trip count (SizeExpr or None: unknown) and `parallel_from`."""

    def __init__(self, meta):
        d = meta.to_dict()
        records = meta.adstack.get("stacks") or []
        for i, r in enumerate(records):
            check_adstack_record(d, i, r)
        self.records = records
        self.task_order: list = []  # kernel task indices holding stacks, in first-use order
        self.tasks: list = []  # (iterations, parallel_from) per entry of task_order
        self.stack_task: list = []  # per stack: its position in task_order
        self.entry_bytes: list = []
        self.capacities: list = []  # int or SizeExpr
        for r in records:
            if r["task"] not in self.task_order:
                self.task_order.append(r["task"])
                self.tasks.append((se.from_nodes(r.get("iterations", [])), r.get("parallel_from", 0)))
            self.stack_task.append(self.task_order.index(r["task"]))
            self.entry_bytes.append(by_name(r["dtype"]).nbytes * (2 if r["adjoint"] else 1))
            tree = se.from_nodes(r.get("size_expr", []))
            self.capacities.append(r["max_size"] if tree is None else tree)


_UNSET = object()  # `_bound` before the first layout on a runtime: never a heap allocation

_FINISH = """
def finish():
    if _ovf[0]:
        _overflow()
"""


class AdStackHooks:
    """The launcher's prepare/finish hooks for one kernel with adstacks: before each launch,
    evaluate the capacities (the generated `prepare`, adstack_sizing.py), lay the stacks out,
    grow the heap and write the ctx words; after it, check the overflow word."""

    def __init__(self, meta, prebuilt: bool = False):
        self.meta, self.prebuilt = meta, prebuilt
        self.stacks = KernelStacks(meta)
        self.slot = meta.adstack_slot
        gen = sizing.SizingSource(meta, self.stacks, self.slot, log=logging_enabled())
        self.max_overs = gen.max_overs
        self.fields_read, self.field_readers = sorted(gen.fields_read), gen.field_readers
        g = self.namespace = {
            "_hooks": self,  # the functions keep the hooks alive (context.on_reset holds them weakly)
            "_stale": True, "_rebind": self.rebind, "_grow": self.grow, "_overflow": self.raise_overflow,
            "_too_large": self.too_large, "_log": self.log_layout, "_mor": self.max_over, "_env": self.env,
            "_index": sizing.index, "_read": sizing.ndarray_read,
            "_heap": None, "_bound": _UNSET, "_nt": 1, "_ovf": None, "_w": None,
            "_caps": tuple(c if isinstance(c, int) else 0 for c in self.stacks.capacities)}
        g.update({f"_k{i}": None for i in range(len(gen.leaves))})
        exec(compile(gen.source + _FINISH, f"<qdc adstack sizing {meta.name}>", "exec"), g)  # noqa: S102
        self.prepare, self.finish = g["prepare"], g["finish"]
        self.prepare.__qdc_source__ = gen.source
        self.num_leaves = len(gen.leaves)
        context.on_reset(self)

    def invalidate(self) -> None:
        """A new runtime: another heap, thread count and field memory; rebind at the next launch."""
        self.namespace["_stale"] = True

    def rebind(self, lctx):
        """Bind the current runtime (heap, worker threads, field memory), then prepare."""
        rt = context.current()
        heap = heap_for(rt)
        g = self.namespace
        g["_heap"], g["_ovf"], g["_bound"] = heap, memoryview(heap.overflow), _UNSET
        g["_w"] = memoryview(lctx.words).cast("B").cast("Q")  # item writes: a tenth of numpy's cost
        g["_w"][self.slot + 2] = heap.overflow_address
        g["_nt"] = max(int(getattr(rt.device, "num_threads", 1)), 1)
        g.update({f"_k{i}": None for i in range(self.num_leaves)})
        host_memory = type(rt.device).sync is Device.sync  # host views are current without a sync
        for slot in self.fields_read:
            field, fm = lctx.fields[slot], self.meta.fields[slot]
            alloc = field.allocation()
            if host_memory and alloc.host is not None:
                view = memoryview(alloc.host).cast(sizing.FIELD_FORMAT[fm.dtype])
            else:
                view = _DeviceFieldReader(field)
            g[f"_f{slot}"] = view
            if slot in self.field_readers:
                g[f"_rf{slot}"] = sizing.field_reader(view, fm.shape)
        g["_stale"] = False
        return self.prepare(lctx)

    def env(self, lctx) -> se.LaunchEnv:
        return se.LaunchEnv(lctx.args, lctx.fields)

    def max_over(self, i: int, env) -> int:
        try:
            return se.evaluate(self.max_overs[i], env)
        except se.SizeExprError as e:
            raise se.SizeExprError(f"kernel '{self.meta.name}': {e}") from None

    def grow(self, required: int):
        """The heap, grown to `required` bytes if smaller; its allocation."""
        heap = self.namespace["_heap"]
        heap.ensure(required, self.meta.name)
        return heap.alloc

    def log_layout(self, capacities: tuple, threads: tuple, slices: int, stride: int) -> None:
        names = ", ".join(f"'{r['name']}' {c}" for r, c in zip(self.stacks.records, capacities))
        log(f"kernel '{self.meta.name}': adstack capacities {names} entries; threads per task {list(threads)}; "
            f"{slices} slices of {stride} bytes")

    def too_large(self, i: int, cap: int):
        r = self.stacks.records[i]
        names = [p.name for p in self.meta.params], [f.name for f in self.meta.fields]
        bound = se.to_text(self.stacks.capacities[i], *names)
        raise se.SizeExprError(
            f"kernel '{self.meta.name}': the adstack of '{r['name']}' (from {r.get('where', '?')}) would need "
            f"{cap} entries for this launch (bound `{bound}`), more than the {MAX_ADSTACK_CAPACITY} supported. "
            f"Check the data that bounds its loop")

    def raise_overflow(self) -> None:
        heap = self.namespace["_heap"]
        code = int(heap.overflow[0])
        heap.overflow[0] = 0
        raise self.overflow_error(code)

    def overflow_error(self, code: int) -> AdStackOverflowError:
        required, task, stack = code >> 32, (code >> 16) & 0xFFFF, code & 0xFFFF
        records = self.stacks.records
        r = records[stack] if stack < len(records) else {"name": "?", "where": "?"}
        caps = self.namespace["_caps"]
        allocated = caps[stack] if stack < len(caps) else 0
        task_name = self.meta.tasks[task].name if task < len(self.meta.tasks) else f"#{task}"
        err = AdStackOverflowError(
            f"kernel '{self.meta.name}', task '{task_name}': the adstack of '{r.get('name', '?')}' "
            f"(from {r.get('where', '?')}) overflowed: {allocated} entries allocated, {required} required. "
            f"No memory was corrupted; this launch's gradients are incomplete. {self._remedy(required)}")
        err.kernel, err.task, err.allocated, err.required = self.meta.name, task_name, allocated, required
        return err

    def _remedy(self, required: int) -> str:
        if self.prebuilt:  # loaded by qdc.runtime.load: the capacity was fixed when the module was built
            return (f"The module was built ahead of time: rebuild it with `qdc build --ad-stack-size {required}` "
                    f"(or a larger --default-ad-stack-size) and load it again")
        return f"Set qd.init(ad_stack_size={required}) (or raise default_ad_stack_size) and run it again"


class _DeviceFieldReader:
    """Field elements by flat index, for memory the host cannot view directly (copied, synced)."""

    def __init__(self, field):
        self.field = field

    def __getitem__(self, flat: int) -> int:
        return min(int(self.field.to_numpy().reshape(-1)[flat]), se.INT64_MAX)


def launch_hooks(meta, prebuilt: bool = False):
    """Launch hooks for `meta`, or None when the kernel has no adstacks. `prebuilt`: the kernel
    was loaded from a `qdc build` (its overflow error says how to rebuild)."""
    if not meta.adstack.get("stacks"):
        return None
    from .launcher import LaunchHooks
    hooks = AdStackHooks(meta, prebuilt)
    return LaunchHooks(prepare=hooks.prepare, finish=hooks.finish)


def describe_stacks(meta) -> str:
    """The kernel's adstacks and how each is sized, readable (`qdc inspect --size-expr`)."""
    stacks = KernelStacks(meta)
    if not stacks.records:
        return f"kernel '{meta.name}' has no adstacks"
    names = [p.name for p in meta.params], [f.name for f in meta.fields]
    lines = [f"kernel '{meta.name}': {len(stacks.records)} adstack(s); capacities in entries, evaluated before "
             f"every launch"]
    for pos, ti in enumerate(stacks.task_order):
        iterations, parallel_from = stacks.tasks[pos]
        trip = "unknown: every worker thread" if iterations is None else se.to_text(iterations, *names)
        spread = "one thread" if parallel_from == 0 else f"several threads from {parallel_from} iterations"
        lines.append(f"  task {meta.tasks[ti].name}: {trip} iterations, on {spread}")
        for i, r in enumerate(stacks.records):
            if stacks.stack_task[i] != pos:
                continue
            cap = stacks.capacities[i]
            text = str(cap) if isinstance(cap, int) else se.to_text(cap, *names)
            entry = f"{r['dtype']}{' + adjoint' if r['adjoint'] else ''}"
            lines.append(f"    stack {i} '{r['name']}' ({entry}) from {r.get('where', '?')}: {text}  "
                         f"[{r.get('source', '?')}]")
    return "\n".join(lines)
