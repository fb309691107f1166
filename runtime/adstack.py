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
allocated and required capacities, and the word is cleared for the next launch. The word is
in the launch's error slot (runtime/device.py): the launcher's own for a synchronous fused
launch, read right after it (`finish`); a slot per launch on the asynchronous path, read at
sync (`report`). How many slices a task dispatches is the device's answer
(Device.task_slices) for its task record's trip count and launch policy; a trip count that
reads a kernel temporary has no value before the launch and counts as unknown.
A kernel without adstacks gets no hooks: it allocates, evaluates and checks nothing.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np

from . import adstack_sizing as sizing
from . import context, sizeexpr_eval
from .contract import sizeexpr as se
from .contract.artifact_schema import MAX_ADSTACK_CAPACITY, check_adstack_record
from . import device as device_mod
from .contract.error_slot import OVERFLOW_WORD
from .contract import adstack_layout as layout
from .contract.errors import AdStackOverflowError
from .contract.log import enabled as log_enabled, log
from .launch_hooks import LaunchHooks

_heaps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Runtime -> AdStackHeap


class AdStackHeap:
    """One adstack heap buffer of a runtime (`name`: which one, for messages)."""

    def __init__(self, device, name: str = "adstack heap"):
        self.device, self.name = device, name
        self.alloc = None
        self.nbytes = 0

    @property
    def ptr(self) -> int:
        return self.alloc.ptr if self.alloc is not None else 0

    def ensure(self, required: int, kernel: str, cost=None) -> bool:
        """Grow to at least `required` bytes: max(required, 2 * current), else exactly
        `required`; whether the allocation changed. `cost()`: the memory-cost breakdown for
        the error message."""
        if required <= self.nbytes:
            return False
        size = max(required, 2 * self.nbytes)
        alloc = self._try_allocate(size)
        if alloc is None and size > required:
            size = required
            alloc = self._try_allocate(size)
        if alloc is None:
            breakdown = f" Memory cost: {cost()}." if cost is not None else ""
            raise MemoryError(
                f"kernel '{kernel}': cannot allocate {required} bytes for its adstacks ({self.name} now {self.nbytes} "
                f"bytes).{breakdown} Remedies, in order: reduce the capacity (qd.init(ad_stack_size=N) or a smaller "
                f"default_ad_stack_size), the number of loop-carried variables in dynamic loops, or the "
                f"iterations launched at once (on the CPU the worker threads, qd.init(cpu_max_num_threads=N))")
        old, self.alloc, self.nbytes = self.alloc, alloc, size
        if old is not None:
            self.device.free_after_fence(old)  # launches in flight may still use it
        log("adstack", f"{self.name} grown to {size} bytes for kernel '{kernel}' (needed {required})")
        return True

    def _try_allocate(self, size: int):
        try:
            return self.device.allocate(size)
        except (MemoryError, ValueError, OverflowError):
            return None


class SpirvHeaps:
    """The float and int heaps of a SPIR-V runtime (adstack_layout.SPIRV_HEAP_*). `alloc` is a
    token replaced whenever either heap is, so the sizing code's `_heap.alloc is _bound` works
    as with one heap."""

    def __init__(self, device):
        self.heaps = tuple(AdStackHeap(device, name) for name in layout.SPIRV_HEAP_NAMES)
        self.alloc = None

    @property
    def ptr(self) -> int:
        return self.heaps[0].ptr

    @property
    def ptr1(self) -> int:
        return self.heaps[1].ptr

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.heaps)


def heap_for(rt, heap_layout=layout.LLVM_HEAP):
    """The runtime's heap(s) for code of `heap_layout`."""
    heaps = _heaps.get(rt)
    if heaps is None:
        heaps = _heaps[rt] = {}
    key = "spirv" if isinstance(heap_layout, layout.SpirvHeapLayout) else "llvm"
    heap = heaps.get(key)
    if heap is None:
        heap = heaps[key] = SpirvHeaps(rt.device) if key == "spirv" else AdStackHeap(rt.device)
    return heap


def adstack_heap_bytes(name: str | None = None) -> int:
    """Bytes held by the current runtime's adstack heaps (0 until a kernel needs one); `name`
    ("adstack_float", "adstack_int"): that SPIR-V heap only."""
    heaps = _heaps.get(context.current()) or {}
    if name is None:
        return sum(h.nbytes for h in heaps.values())
    spirv = heaps.get("spirv")
    if spirv is None:
        return 0
    return spirv.heaps[layout.SPIRV_HEAP_NAMES.index(name)].nbytes


class KernelStacks:
    """A kernel's stacks as its metadata describes them, checked and parsed once at load:
    per stack its task, entry size and capacity (an int, or a SizeExpr evaluated per launch);
    per task holding stacks its trip count (SizeExpr or None: unknown, or known only during
    the launch) and launch policy, from its task record."""

    def __init__(self, meta):
        d = meta.to_dict()
        records = meta.adstack.get("stacks") or []
        for i, r in enumerate(records):
            check_adstack_record(d, i, r)
        # code laid out as this runtime sizes it
        self.layout = layout.layout_of_record(meta.adstack.get("layout"), meta.name)
        self.records = records
        self.task_order: list = []  # kernel task indices holding stacks, in first-use order
        self.tasks: list = []  # (iterations, launch policy) per entry of task_order
        self.stack_task: list = []  # per stack: its position in task_order
        self.entry_bytes: list = []
        self.heap_of: list = []  # per stack: its heap's position in layout.heaps
        self.capacities: list = []  # int or SizeExpr
        for r in records:
            if r["task"] not in self.task_order:
                self.task_order.append(r["task"])
                task = meta.tasks[r["task"]]
                iterations = se.from_nodes(task.iterations)
                self.tasks.append((None if se.reads_temps(iterations) else iterations, task.launch))
            self.stack_task.append(self.task_order.index(r["task"]))
            self.entry_bytes.append(self.layout.entry_bytes(r["dtype"], r["adjoint"]))
            self.heap_of.append(self.layout.heap_of(r["dtype"]))
            tree = se.from_nodes(r.get("size_expr", []))
            self.capacities.append(r["max_size"] if tree is None else tree)


UNLIMITED = 1 << 62  # the heap span of a device whose bindings only memory limits (max_binding_bytes None)
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
        self.range_limit = UNLIMITED
        gen = sizing.SizingSource(meta, self.stacks, self.slot, log=log_enabled("adstack"))
        self.max_overs = gen.max_overs
        self.fields_read, self.field_readers = sorted(gen.fields_read), gen.field_readers
        g = self.namespace = {
            "_hooks": self,  # the functions keep the hooks alive (context.on_reset holds them weakly)
            "_stale": True, "_rebind": self.rebind, "_overflow": self.raise_overflow,
            "_grow": self.grow if len(self.stacks.layout.heaps) == 1 else self.grow_heaps,
            "_fit": self.fit_invocations,
            "_too_large": self.too_large, "_log": self.log_layout, "_mor": self.max_over, "_env": self.env,
            "_index": sizing.index, "_read": sizing.ndarray_read,
            "_heap": None, "_bound": _UNSET, "_ovf": None, "_errors": None, "_w": None,
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
        heap = heap_for(rt, self.stacks.layout)
        g = self.namespace
        errors = lctx.errors  # the launcher's error slot: word OVERFLOW_WORD is the overflow word
        g["_heap"], g["_bound"], g["_errors"] = heap, _UNSET, errors
        self.range_limit = rt.device.max_binding_bytes() or UNLIMITED
        g["_ovf"] = memoryview(errors.host) if errors.host is not None else None
        g["_w"] = memoryview(lctx.words).cast("B").cast("Q")  # item writes: a tenth of numpy's cost
        g["_w"][self.slot + 2] = errors.word_address(OVERFLOW_WORD)
        for pos, (_, launch) in enumerate(self.stacks.tasks):
            g[f"_slices{pos}"] = functools.partial(rt.device.task_slices, launch)
        g.update({f"_k{i}": None for i in range(self.num_leaves)})
        host_memory = device_mod.host_memory(rt.device)  # host views are current without a sync
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

    def env(self, lctx) -> sizeexpr_eval.LaunchEnv:
        return sizeexpr_eval.LaunchEnv(lctx.args, lctx.fields)

    def max_over(self, i: int, env) -> int:
        try:
            return sizeexpr_eval.evaluate(self.max_overs[i], env)
        except se.SizeExprError as e:
            raise se.SizeExprError(f"kernel '{self.meta.name}': {e}") from None

    def grow(self, required: int):
        """The heap, grown to `required` bytes if smaller; its allocation."""
        heap = self.namespace["_heap"]
        heap.ensure(required, self.meta.name)
        return heap.alloc

    def fit_invocations(self, stride: int, stride1: int, slices: int) -> int:
        """The invocations the SPIR-V heaps hold for a launch dispatching `slices`: lowered so
        that neither heap (`stride`/`stride1` bytes an invocation) spans more than one binding
        of the device may (Device.max_binding_bytes: Vulkan's maxStorageBufferRange) or, without
        Int64, than a 32-bit element index reaches. The shader runs every iteration on the
        invocations the heaps hold (grid-stride), so a lower count is slower, never wrong."""
        widest = max(stride, stride1)
        if widest == 0 or slices == 0:
            return slices
        limit = self.range_limit
        if self.stacks.layout.index_bits == 32:
            limit = min(limit, layout.U32_INDEX_LIMIT * 4)
        fit = limit // widest
        if fit < 1:
            raise ValueError(f"kernel '{self.meta.name}': one invocation's adstacks need {widest} bytes, more than "
                             f"an adstack heap may span on this device ({limit} bytes): lower the adstack "
                             f"capacity (qd.init(ad_stack_size=N)) or bound the loops that push")
        return min(slices, fit)

    def grow_heaps(self, stride: int, stride1: int, slices: int):
        """The SPIR-V heaps grown for `slices` invocations of the strides (bytes); their token."""
        heaps = self.namespace["_heap"]
        changed = False
        for which, (heap, stride_bytes) in enumerate(zip(heaps.heaps, (stride, stride1))):
            changed |= heap.ensure(stride_bytes * slices, self.meta.name,
                                   lambda which=which: self.memory_cost(which, slices))
        if changed or heaps.alloc is None:
            heaps.alloc = object()
        return heaps.alloc

    def memory_cost(self, heap: int, invocations: int) -> str:
        """invocations x capacity x element bytes x stacks, for the stacks of `heap`."""
        caps = self.namespace["_caps"]
        terms = [f"{c} x {e}" for i, (c, e) in enumerate(zip(caps, self.stacks.entry_bytes))
                 if self.stacks.heap_of[i] == heap]
        per = sum(c * e for i, (c, e) in enumerate(zip(caps, self.stacks.entry_bytes)) if self.stacks.heap_of[i] == heap)
        return (f"invocations x capacity x element bytes x stacks = {invocations} x ({' + '.join(terms) or '0'}) "
                f"= {invocations * per} bytes (the largest task's stacks; stacks of different tasks share space)")

    def log_layout(self, capacities: tuple, threads: tuple, slices: int, stride: int) -> None:
        names = ", ".join(f"'{r['name']}' {c}" for r, c in zip(self.stacks.records, capacities))
        log("adstack", f"kernel '{self.meta.name}': adstack capacities {names} entries; threads per task "
            f"{list(threads)}; {slices} slices of {stride} bytes")

    def too_large(self, i: int, cap: int):
        r = self.stacks.records[i]
        names = self.meta.record_names(), [f.name for f in self.meta.fields]
        bound = se.to_text(self.stacks.capacities[i], *names)
        raise se.SizeExprError(
            f"kernel '{self.meta.name}': the adstack of '{r['name']}' (from {r.get('where', '?')}) would need "
            f"{cap} entries for this launch (bound `{bound}`), more than the {MAX_ADSTACK_CAPACITY} supported. "
            f"Check the data that bounds its loop")

    def raise_overflow(self) -> None:
        words = self.namespace["_errors"].host
        code = int(words[OVERFLOW_WORD])
        words[OVERFLOW_WORD] = 0
        raise self.overflow_error(code)

    def report(self, words, ctx_words=None):
        """The AdStackOverflowError of an error slot's words (asynchronous launches), or None."""
        code = int(words[OVERFLOW_WORD])
        return self.overflow_error(code) if code else None

    def overflow_error(self, code: int) -> AdStackOverflowError:
        required, task, stack = layout.decode_overflow(code)
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
    """Field elements by flat index, for memory the host cannot view directly: a ranged read
    of the one element."""

    def __init__(self, field):
        self.field = field

    def __getitem__(self, flat: int) -> int:
        idx = tuple(int(i) for i in np.unravel_index(flat, self.field.shape)) if self.field.shape else ()
        return min(int(self.field._read_element(idx)), se.INT64_MAX)


def launch_hooks(meta, prebuilt: bool = False):
    """Launch hooks for `meta`, or None when the kernel has no adstacks. `prebuilt`: the kernel
    was loaded from a `qdc build` (its overflow error says how to rebuild)."""
    if not meta.adstack.get("stacks"):
        return None
    hooks = AdStackHooks(meta, prebuilt)
    return LaunchHooks(prepare=hooks.prepare, finish=hooks.finish, report=hooks.report)


def describe_launch(launch: dict) -> str:
    """A task's launch policy, readable."""
    if launch.get("policy") == "cpu_chunks":
        pf = launch.get("parallel_from", 0)
        threads = "one thread" if pf == 0 else f"several threads from {pf} iterations"
        if "lanes" in launch:
            why = f" ({launch['lanes_reason']})" if "lanes_reason" in launch else ""
            return f"{threads}, up to {launch['lanes']} iterations at a time (SIMD lanes; fewer at lower ISA " \
                   f"levels){why}"
        return threads + (f", scalar code: {launch['scalar']}" if "scalar" in launch else "")
    if launch.get("policy") == "grid":
        block = launch.get("block_dim")
        return f"a grid of blocks of {block} threads" if block else "a grid of blocks of the device's default size"
    return str(launch)


def describe_stacks(meta) -> str:
    """The kernel's adstacks and how each is sized, readable (`qdc inspect --size-expr`)."""
    stacks = KernelStacks(meta)
    if not stacks.records:
        return f"kernel '{meta.name}' has no adstacks"
    names = meta.record_names(), [f.name for f in meta.fields]
    lines = [f"kernel '{meta.name}': {len(stacks.records)} adstack(s); capacities in entries, evaluated before "
             f"every launch"]
    for pos, ti in enumerate(stacks.task_order):
        iterations, launch = stacks.tasks[pos]
        trip = "unknown: every worker thread" if iterations is None else se.to_text(iterations, *names)
        lines.append(f"  task {meta.tasks[ti].name}: {trip} iterations, on {describe_launch(launch)}")
        for i, r in enumerate(stacks.records):
            if stacks.stack_task[i] != pos:
                continue
            cap = stacks.capacities[i]
            text = str(cap) if isinstance(cap, int) else se.to_text(cap, *names)
            entry = f"{r['dtype']}{' + adjoint' if r['adjoint'] else ''}"
            lines.append(f"    stack {i} '{r['name']}' ({entry}) from {r.get('where', '?')}: {text}  "
                         f"[{r.get('source', '?')}]")
    return "\n".join(lines)
