"""Binding arguments into the launch context and launching: the per-call hot path.

For each compiled kernel, `make_launcher` generates a small Python function whose signature
is exactly the kernel's (so Python itself reports a missing, extra or unknown argument,
naming the kernel, at no cost to the launch) and whose body writes the arguments straight into
the ctx buffer (the word layout of runtime/contract/artifact.py) and makes one native call. For
`k(a: ndarray(f32, 1), s: f32, n: i32)` the generated source is:

    def k(a, s, n):
        if a is not _q_arr0 or _q_len(a) != _q_len0:
            _q_bind0(a)
        try:
            _q_pack1(_q_mem, 16, s, n)
        except _q_scalar_errors:
            _q_bad_scalars(1, (s, n,))
        _q_call(_q_arg)

What keeps it short (figures: docs/benchmarks.md):
- Scalars: each run of consecutive scalar slots is one `struct.pack_into`, which also type-checks;
  only when it raises does `_q_bad_scalars` work out which parameter to name.
- Ndarrays: full validation (type, dtype, ndim, C-contiguity, gradient buffer) and the data
  pointer happen in `_q_bind<i>` only when the argument is not the object passed last time. The
  launcher keeps a reference to that object, which keeps its memory alive and makes numpy refuse
  to `resize` it, so its pointer cannot change; a shape changed in place is caught by `len(a)`
  (ndim 1 and 2: the first dimension and the size fix the second) or by comparing `a.shape`.
  Not re-checked, since none can make the kernel touch memory outside the array: an in-place
  change of ndim keeping the first dimension, of dtype to one of the same item size, of strides.
  A numpy array the kernel writes (ParamMeta.writes) is re-tested for `flags.writeable` at every
  launch: nothing else reveals an array made read-only since it was bound.
- The launch code is specialised to whether each cached array is a numpy array (`body`'s
  `kinds`), so neither kind pays for the other's tests; in the numpy form another numpy array is
  bound by the launch code itself (`rebind_numpy`), anything else through `_q_bind<i>`.
- Where the kernel's library binds numpy arrays itself (the CPU's numpy_binding.py), the launch
  code writes only the array's address and a sentinel shape word; the entry checks and binds
  the array and returns nonzero, having run nothing, when it refuses one, and
  `_q_native_refused` binds in Python (raising, or accepting what the entry leaves to Python) and
  launches again. Where the library also has a Python entry, the whole launch is one builtin
  call, `if _q_fast(a, s, n) is not None: return _q_fast_refused((a, s, n))`, which checks and
  binds every argument at every call; anything it leaves to Python goes the generic way.
- The native call is `_q_call(_q_arg)` as the device hands it out (`Device.launch_call`).

Launch paths. Which way a launch goes (one fused call, with or without the library's binding or
Python entry; or task by task, as one graph, with slices fixed at load, or evaluated per launch)
is chosen once per launcher by runtime/launch_path.py, which says why; `qdc inspect` shows it.
Task by task (`launch_tasks`), each task is launched on its own (`Device.launch_task`) with the
thread slices the device dispatches for its trip count, the launch's own error slot is handed to
the device and errors surface at `Device.sync` (`report` hooks) instead of in `finish`. Kernel
temporaries live in device memory (one allocation per launcher).

Numpy arguments on a device without host memory (Vulkan, CUDA): each ndarray parameter has a
device buffer of its own (`DeviceCopies`, reused while the array fits); the launch code copies
the array in at every launch (the host data may have changed) and, for a parameter the kernel
writes, back out right after queueing the tasks, which makes such a launch synchronous.

Runtime changes (`qd.init`) are not tested per launch: the runtime calls every live launcher's
`invalidate` (`context.on_reset`), which swaps the function's `__code__` for a stub,
`def k(a, s, n): return _q_slow(a, s, n)`; the slow path rebinds, swaps the launch code back in
and launches. An exact signature also lets CPython inline the call into its caller's frame.

Owners. `make_launcher(..., function=f)` generates the code into `f.__globals__` and makes `f`,
a function the caller owns with the kernel's parameters (what `@qd.kernel` returns), the launch
function, so that a launch is a call of that one function. The owner provides `_q_slow` in that
namespace and may itself set `f.__code__` to a stub to see calls (a Tape records them).
`launch.__qdc_launcher__.launch` is the launch code (in its generic form) as a function of its
own, for the slow paths: it launches even while `f` has a stub for code.

Hooks. `make_launcher(..., hooks=LaunchHooks(prepare=..., finish=...))` adds `prepare(ctx)`
right before the native call and `finish()` right after it. `prepare` gets a `LaunchContext`
(the same object at every launch: `meta`, `device`, `fields`, this launch's `args`, and `words`,
a writable view of the ctx with every argument bound); it may read live data and write words of
its own (an adstack heap pointer), never argument words. `finish` may raise (AdStackOverflowError); on the CPU the work
is complete when it runs. A kernel without hooks has no trace of them in its code. Adstacks
(runtime/adstack.py), `qd.random`, debug checks (runtime/contract/bounds.py) and the print
buffer add theirs.

Vector and matrix arguments have one scalar record per element and one launch-function
parameter: the launch code turns the argument into its elements first (`_q_e3, _q_e4, _q_e5, =
_q_elements3(v)`, runtime/vector_arguments.py) and packs them as scalars, so an error names the
argument and the element. A kernel with `returns` ends with `return _q_result()`
(runtime/returns.py). Only identifiers that pass `str.isidentifier` and integers reach the
generated source, so metadata from a cache can never inject code. A launcher has one ctx
buffer: one kernel must not be launched from two Python threads at once.
"""
from __future__ import annotations

import ctypes
import keyword
import struct
import sys
import types

import numpy as np

from . import context, external_arrays, sizeexpr_eval
from . import random_stream
from .adstack import launch_hooks
from .contract import sizeexpr as se
from .contract.artifact import KernelMeta
from .contract.bounds import ERROR_WORDS
from .contract.foreign_arrays import is_external
from .contract.error_slot import BOUNDS_WORD, OVERFLOW_WORD
from .fields import Field, Ndarray
from .returns import ResultReader
from .vector_arguments import element_reader
from .contract.types import by_name
from . import kernel_messages
from .launch_hooks import LaunchContext, LaunchHooks, with_finish, with_prepare
from .device_copies import DeviceCopies, host_array
from .launch_path import choose_launch_path
from . import tensor_watch
from .graph_loops import GraphLoops, loop_steps
from .sizeexpr_eval import simple_trip_count
from .argument_checks import (PACK_CODE, argument_name, built_without_its_gradient, check_extent, check_ndarray,
                              explain_scalar, extent_limits, numpy_address)

_SCALAR_ERRORS = (struct.error, TypeError, ValueError, OverflowError)
_RESERVED = "_q_"
_UNBOUND = object()  # the cached array of a parameter before its first launch: matches nothing
_PACK_OBJECT = struct.Struct("=Qq").pack_into  # an array's address, and -1 (numpy_binding.SENTINEL) for its shape


class _Launcher(GraphLoops):
    """The state behind one generated launch function: ctx buffer, caches, runtime binding."""

    def __init__(self, meta: KernelMeta, device, loaded, fields: list, hooks, function, graph: bool = False,
                 hooked_by: tuple = ()):
        self.meta, self.device, self.fields, self.loaded = meta, device, fields, loaded
        # numpy arrays bound by the kernel's own entry (runtime/devices/cpu/numpy_binding.py):
        # not with hooks, which read the bound words before the call
        self.binding = device.numpy_binding(loaded, meta) if hooks is None and device.capabilities.fused_launch \
            and device.capabilities.host_memory and not meta.graph_loops else None
        self.buf = (ctypes.c_uint64 * max(meta.ctx_words, 1, self.binding.ctx_words if self.binding else 0))()
        # every argument bound by the library itself, in one builtin call (numpy_binding.py)
        self.python = self.binding.python_entry(getattr(loaded, "lib", None), self.buf) if self.binding else None
        self.words = np.frombuffer(self.buf, np.uint64)
        self.temps = device.allocate(8 * max(meta.num_temps, 1))  # values crossing tasks: device memory
        # Where a synchronous launch writes its errors; an asynchronous one gets a slot per launch.
        self.errors = device.acquire_error_slot() if hooks is not None and hooks.report is not None else None
        # qd.graph.do_while replays tasks from the host: one task at a time, on every device
        self.fused = device.capabilities.fused_launch and not meta.graph_loops
        if not self.fused:
            self.plan_task_slices()
        self.path = choose_launch_path(device, list(hooked_by), graph, self.binding, self.python,
                                       not self.fused and None not in self.fixed_slices,
                                       graph_loops=bool(meta.graph_loops))
        call, arg = self.call_of(self.path.name)
        self.function = function  # the launch function: its code is fast_code or, while stale, stale_code
        # What runs once this launch is queued, from binding its arguments (external_arrays.py,
        # non-contiguous arrays): write-backs of copies, stream joins; cleared by `run_after`.
        self.after: list = []
        self.launch = self.fast_code = self.stale_code = None
        self.kinds = {i: None for i, p in enumerate(meta.params) if p.kind == "ndarray"}  # see `body`
        # The launch function takes one argument per ArgumentMeta; the launch code binds one value
        # per record: a vector/matrix argument's elements as locals `_q_e<record>`.
        self.argument_names = [a.name for a in meta.arguments]
        self.vectors = {a.first: a for a in meta.arguments if a.element_shape}
        self.value_names = [f"_q_e{i}" if p.is_element else p.name for i, p in enumerate(meta.params)]
        self.variants: dict = {}  # tuple of kinds -> launch code specialised for them
        self.g = {"_q_slow": self.slow} if function is None else function.__globals__
        if "_q_slow" not in self.g:
            raise ValueError("the owner of a launch function must provide _q_slow in its globals")
        # pack_into a memoryview: with the ctypes array itself as target, getting its buffer
        # costs more than the packing.
        self.g.update({"_q_mem": memoryview(self.buf).cast("B"), "_q_call": call, "_q_arg": arg,
                       "_q_scalar_errors": _SCALAR_ERRORS, "_q_bad_scalars": self.bad_scalars,
                       "_q_len": len, "_q_bool": bool,  # builtins by names no parameter can shadow
                       "_q_ndarray": np.ndarray, "_q_address": ctypes.addressof, "_q_from_buffer": ctypes.c_char.from_buffer,
                       "_q_buffer_errors": (TypeError, ValueError, BufferError),
                       "_q_id": id, "_q_pack_object": _PACK_OBJECT, "_q_native_refused": self.native_refused,
                       "_q_after": self.after, "_q_run_after": self.run_after})
        if self.python is not None:
            self.g["_q_fast"], self.g["_q_fast_refused"] = self.python.function, self.fast_refused
        self.watches = tensor_watch.Watches(self.words, meta.ctx_words, len(meta.params))  # what the Python entry checks
        self.hooks = hooks
        self.copies = None if device.capabilities.host_memory else DeviceCopies(device)
        if self.copies is not None:
            self.g["_q_copy_in"], self.g["_q_copy_out"] = self.copies.copy_in, self.copies.copy_out
        if hooks is not None:
            self.g["_q_prepare"], self.g["_q_finish"] = hooks.prepare, hooks.finish
            self.g["_q_lctx"] = LaunchContext(meta, device, fields, self.words, self.errors)
        if meta.returns:  # only kernels that return have this in their launch code
            self.g["_q_result"] = ResultReader(meta.returns, device, self.temps)

    def plan_task_slices(self) -> None:
        """What launching task by task needs: each task's trip count, and its thread slices where
        they are the same at every launch (None: evaluated per launch)."""
        self.iterations = [_iterations(t) for t in self.meta.tasks]
        no_args = sizeexpr_eval.LaunchEnv((), self.fields, self.read_temp)  # a constant (or unknown) trip count
        on_device = self.bounds_on_device()
        self.fixed_slices = [self.device.task_slices(t.launch, None) if i in on_device
                             else self.device.task_slices(t.launch, self.trip_count(i, no_args))
                             if self.iterations[i] is None or isinstance(self.iterations[i], se.Const) else None
                             for i, t in enumerate(self.meta.tasks)]
        self.sync_each_launch = self.device.sync_each_launch
        # slices_now runs only for the tasks whose slices are not fixed
        self.simple_trips = [simple_trip_count(tree) if fixed is None else None
                             for tree, fixed in zip(self.iterations, self.fixed_slices)]

    def bounds_on_device(self) -> set:
        """The tasks whose trip count, in device memory the host does not share, is not read
        back (a read waits for every queued launch): they run on the grid their module computes
        on the device (a Vulkan task's "grid_temp") or on the grid cap (design.md, "The grid
        cap"). Not tasks holding adstacks, whose heaps are sized for the launch's slices."""
        if self.device.capabilities.host_memory:
            return set()
        stacks = {r["task"] for r in self.meta.adstack.get("stacks") or []}
        return {i for i, (t, tree) in enumerate(zip(self.meta.tasks, self.iterations))
                if "grid_temp" in t.launch or (i not in stacks and se.reads_memory(tree))}

    def call_of(self, path: str) -> tuple:
        """`(call, arg)`: the native call of a launch on launch path `path` (launch_path.py)."""
        if path in ("python_entry", "native_binding", "fused"):
            call, arg = self.device.launch_call(self.loaded, self.buf)
            if self.binding is not None:
                self.binding.fill(self.words)
                call = self.binding.call
            return call, arg
        if path == "graph":
            # A graph replays every task without the host in between: a trip count that an
            # earlier task computes (a temporary) is not read back; the task runs on the grid
            # cap and its grid-stride loop reads the bound on the device (design.md, "Graphs").
            self.fixed_slices = [self.device.task_slices(t.launch, None)
                                 if fixed is None and se.reads_temps(self.iterations[i]) else fixed
                                 for i, (t, fixed) in enumerate(zip(self.meta.tasks, self.fixed_slices))]
            return self.launch_graph, None
        if path in ("graph_loops", "device_loops"):
            self.steps = loop_steps(self.meta.graph_loops, 0, len(self.meta.tasks))
            return (self.launch_loops if path == "graph_loops" else self.launch_device_loops), None
        if path == "fixed_tasks":
            self.fixed_launches = [(i, n) for i, n in enumerate(self.fixed_slices) if n > 0]
            self.ctx_address = ctypes.addressof(self.buf)
            return self.launch_fixed, None
        return self.launch_tasks, None

    # ---- slow paths -----------------------------------------------------------------------

    def bind_runtime(self) -> None:
        """Point the ctx at the current runtime's field memory, temporaries and thread count;
        the function launches again."""
        m, w = self.meta, self.words
        for i, f in enumerate(self.fields):
            w[m.field_slot0 + i] = f.allocation().ptr
        w[m.temps_slot] = self.temps.ptr
        w[m.threads_slot] = context.current().device.num_threads
        for i, p in enumerate(m.params):
            if p.kind == "ndarray":
                self.g[f"_q_arr{i}"] = _UNBOUND
        self.function.__code__ = self.fast_code

    def invalidate(self) -> None:
        """Called by `context.reset`: the next launch takes the slow path."""
        self.function.__code__ = self.stale_code
        for i, p in enumerate(self.meta.params):
            if p.kind == "ndarray":
                self.g[f"_q_arr{i}"] = _UNBOUND  # also drops the reference to the caller's array

    def slow(self, *args):
        self.bind_runtime()
        return self.launch(*args)

    # ---- the asynchronous path: one launch per task, errors reported at sync ------------------

    def launch_tasks(self, args: tuple) -> None:
        """Queue every task with the slices the device dispatches for its trip count, then hand
        the launch's own error slot to the device (`sync` reports from it)."""
        device = self.device
        slot = self.own_error_slot()
        env = None
        ctx = ctypes.addressof(self.buf)
        for i, slices in enumerate(self.fixed_slices):
            if slices is None:  # evaluated now, after the earlier tasks were queued (a temporary waits for them)
                slices, env = self.slices_now(i, args, env)
            device.launch_task(self.loaded, i, ctx, slices)
        self.watch_errors(slot)
        if self.sync_each_launch:
            device.sync()

    def launch_fixed(self, args: tuple) -> None:
        """`launch_tasks` of a kernel whose tasks' slices never change and that has no hooks."""
        launch, loaded, ctx = self.device.launch_task, self.loaded, self.ctx_address
        for task, slices in self.fixed_launches:
            launch(loaded, task, ctx, slices)

    def launch_graph(self, args: tuple) -> None:
        """`launch_tasks` as one graph replay (Device.launch_graph): the same slices per task,
        the same error slot, errors at sync."""
        slot = self.own_error_slot()
        slices, env = list(self.fixed_slices), None
        for i, fixed in enumerate(slices):
            if fixed is None:
                slices[i], env = self.slices_now(i, args, env)
        self.device.launch_graph(self.loaded, ctypes.addressof(self.buf), slices)
        self.watch_errors(slot)

    def slices_now(self, task: int, args: tuple, env):
        """The slices task `task` dispatches at this launch, and the evaluation environment
        (`env`, made on first need and reused by the launch's later tasks)."""
        trips = self.simple_trips[task]
        if trips is not None:  # an ndarray's extent or an integer argument: read directly
            return self.device.task_slices(self.meta.tasks[task].launch, trips(args)), env
        if env is None:
            env = sizeexpr_eval.LaunchEnv(args, self.fields, self.read_temp)
        return self.device.task_slices(self.meta.tasks[task].launch, self.trip_count(task, env)), env

    def own_error_slot(self):
        """A slot of this launch's own for the kernel's errors, the ctx pointing into it (None
        for a kernel that reports none)."""
        if self.errors is None:
            return None
        slot = self.device.acquire_error_slot()
        self.point_errors_at(slot)
        return slot

    def watch_errors(self, slot) -> None:
        """Hand this launch's error slot to the device, which reports from it at sync."""
        if slot is not None:
            self.device.watch(slot, self.reporter())

    def trip_count(self, task: int, env) -> int | None:
        """Task `task`'s trip count for this launch (a temporary read waits for the earlier
        tasks: copy_to_host does), None when its record has none or it cannot be evaluated."""
        tree = self.iterations[task]
        if tree is None:
            return None
        try:
            return sizeexpr_eval.evaluate(tree, env)
        except se.SizeExprError:
            return None

    def read_temp(self, slot: int, dtype: str) -> int:
        """Kernel temporary `slot` (its low bytes, as `dtype`): a ranged read of its word."""
        word = np.zeros(1, np.uint64)
        self.device.copy_to_host(self.temps, word, 8 * slot)
        return int(word.view(by_name(dtype).np_dtype)[0])

    def point_errors_at(self, slot) -> None:
        """Make the ctx's error words (adstack overflow, bounds checks) point into `slot`."""
        m = self.meta
        if m.adstack_slot is not None:
            self.words[m.adstack_slot + 2] = slot.word_address(OVERFLOW_WORD)
        if m.debug_slot is not None:
            self.words[m.debug_slot] = slot.word_address(BOUNDS_WORD)

    def reporter(self):
        """`report(words)` for this launch's slot; the ctx words (ndarray shapes, for bounds
        messages) as they are now, since later launches rewrite them."""
        report, ctx_words = self.hooks.report, self.words.copy()
        return lambda words: report(words, ctx_words)

    def native_params(self) -> list:
        return self.binding.params if self.binding is not None else []

    def native_refused(self, args: tuple) -> None:
        """The kernel's entry refused a numpy array and ran nothing: bind each array it was to
        bind in Python (which raises naming what is wrong, or accepts what the entry leaves to
        it: a subclass, an equal dtype that is not the builtin one, a read-only array the kernel
        only reads) and launch again."""
        for i in self.binding.params:
            if self.words[self.meta.params[i].slot + 1] == self.binding.sentinel:
                self.g[f"_q_arr{i}"] = _UNBOUND  # a refused array must not stay cached
                self.g[f"_q_bind{i}"](args[i])
        if self.binding.call(self.g["_q_arg"]):
            raise AssertionError(f"kernel '{self.meta.name}': an argument bound in Python was refused")

    def run_after(self) -> None:
        actions = self.after[:]
        self.after.clear()
        for action in actions:
            action()

    def bad_scalars(self, first: int, values: tuple):
        for i, v in enumerate(values):
            explain_scalar(self.meta, first + i, v)
        raise AssertionError("a scalar was rejected but none of them is invalid")  # unreachable

    def binder(self, index: int):
        """`bind(a)` for ndarray parameter `index`: validate, write pointer/shape/grad words, cache.
        It accepts exactly what `check_ndarray` does, testing the common case in one condition."""
        meta, g, mem = self.meta, self.g, self.g["_q_mem"]
        p = meta.params[index]
        ndim, np_dtype = p.ndim, by_name(p.dtype).np_dtype
        # A gradient word in the metadata means the code uses it (compiler/driver/kernel.py, build_meta):
        # then only a qd.ndarray with .grad, since a null gradient pointer would crash.
        grad_kernel_needs_grad = bool(p.needs_grad)
        refuse_grad = built_without_its_gradient(meta, p)  # then only arrays without one
        writes = bool(p.writes)  # then only writable numpy arrays
        element_axes = slice(ndim - len(p.element_shape), ndim) if p.element_shape else None  # vectors: their shape
        # pointer, shape..., [gradient pointer]: one pack into consecutive ctx words
        pack = struct.Struct("=" + "Q" * (1 + ndim + bool(p.needs_grad))).pack_into
        offset, with_grad = 8 * p.slot, bool(p.needs_grad)
        arr, probe = f"_q_arr{index}", f"_q_len{index}" if ndim in (1, 2) else f"_q_shape{index}"
        numpy_flag, tensor_flag = f"_q_numpy{index}", f"_q_tensor{index}"
        copies, device_buffer = self.copies, f"_q_dev{index}"
        uncached = self.python is not None
        can_watch, watchable = self.python is not None and self.python.watches, tensor_watch.watchable
        limits, arch = extent_limits(self.device), self.device.arch
        after, watches = self.after, self.watches

        def bind(a):
            if index in watches:  # whatever comes now, the words stop being the watched tensor's
                watches.unwatch(index)
            if not isinstance(a, (np.ndarray, Ndarray, Field)) and is_external(a):
                return bind_external(a)
            g[tensor_flag] = False
            if limits is not None and isinstance(a, (np.ndarray, Ndarray, Field)):  # before a device copy is allocated
                check_extent(meta, index, a.shape if isinstance(a, np.ndarray) else a.storage_shape, limits, arch)
            if isinstance(a, np.ndarray):
                flags = a.flags
                if grad_kernel_needs_grad or a.dtype != np_dtype or a.ndim != ndim \
                        or writes and not flags.writeable \
                        or element_axes is not None and a.shape[element_axes] != p.element_shape:
                    check_ndarray(meta, index, a)  # raises, naming what is wrong
                if copies is None and not flags.c_contiguous:
                    return bind_copy(a)
                if copies is None:
                    ptr, grad = numpy_address(a), 0
                else:  # the launch code copies it in (and out) at every launch
                    try:
                        alloc = g[device_buffer] = copies.buffer(index, a.nbytes)
                    except MemoryError as e:
                        raise MemoryError(f"{argument_name(meta, index)}: the {arch} device has no room for a copy of "
                                          f"this array of shape {a.shape} ({a.nbytes} bytes): {e}") from None
                    ptr, grad = alloc.ptr, 0
            elif isinstance(a, (Ndarray, Field)) and a.layout == p.layout and a.dtype.name == p.dtype and len(a.storage_shape) == ndim and (
                    a.grad is not None or not grad_kernel_needs_grad) and (a.grad is None or not refuse_grad) and (
                    element_axes is None or a.storage_shape[element_axes] == p.element_shape):
                ptr = a.allocation().ptr
                grad = a.grad.allocation().ptr if a.grad is not None else 0
            else:
                check_ndarray(meta, index, a)
                raise AssertionError(f"{argument_name(meta, index)}: {a!r} passed no check")  # check_ndarray raises
            shape = a.shape if isinstance(a, np.ndarray) else a.storage_shape
            if with_grad:
                pack(mem, offset, ptr, *shape, grad)
            else:
                pack(mem, offset, ptr, *shape)
            numpy = isinstance(a, np.ndarray)
            # the Python entry rewrites a numpy array's words at its next launch: not cached
            g[arr], g[probe], g[numpy_flag] = _UNBOUND if numpy and uncached else a, \
                (shape[0] if ndim in (1, 2) else shape), numpy
            set_kind(numpy)

        def set_kind(kind) -> None:
            if kind is not self.kinds[index]:
                self.kinds[index] = kind
                self.specialise()

        def bind_copy(a: np.ndarray) -> None:
            """A numpy array that is not C-contiguous: the kernel works on a contiguous copy, written
            back once the launch is done where it writes the parameter (every launch copies)."""
            copy = np.ascontiguousarray(a)
            after.append((lambda: np.copyto(a, copy)) if writes else (lambda: copy))  # keeps the copy alive
            pack(mem, offset, numpy_address(copy), *copy.shape)
            g[arr], g[numpy_flag] = _UNBOUND, True
            set_kind("always")

        def bind_external(a) -> None:
            """A torch tensor or DLPack array (runtime/external_arrays.py)."""
            bound = external_arrays.bind(meta, index, a, self.device, after, with_grad, refuse_grad, writes)
            if bound.host is not None:  # host memory that the launch treats as a numpy array
                bind(bound.host)
                g[arr] = _UNBOUND  # the next launch binds `a` again
                return
            if limits is not None:
                check_extent(meta, index, bound.shape, limits, arch)
            if with_grad:
                pack(mem, offset, bound.ptr, *bound.shape, bound.grad_ptr)
            else:
                pack(mem, offset, bound.ptr, *bound.shape)
            g[numpy_flag] = False
            if bound.cacheable:  # the launch code (or the Python entry) compares the address before skipping this
                g[arr], g[f"_q_ptr{index}"] = a, bound.ptr
                g["_q_data_ptr"], g[tensor_flag] = type(a).data_ptr, True
                set_kind("watch-next" if can_watch and watchable(a) else "tensor")
            else:
                g[arr], g[tensor_flag] = _UNBOUND, False
                set_kind("always")

        def watch(a) -> None:
            """The cached tensor came again: from now on the Python entry checks it itself
            (runtime/tensor_watch.py; a new tensor at every launch costs no handle)."""
            watches.watch(index, a)
            set_kind("watched")
        g[f"_q_watch{index}"] = watch
        return bind

    def bool_converter(self, index: int):
        def as_bool(v):
            explain_scalar(self.meta, index, v)
            return bool(v)
        return as_bool

    # ---- code generation --------------------------------------------------------------------

    def fill_namespace(self) -> None:
        """Put the per-parameter helpers the launch code calls into the namespace."""
        g = self.g
        for i, p in enumerate(self.meta.params):
            if p.kind == "ndarray":
                g[f"_q_arr{i}"], g[f"_q_bind{i}"], g[f"_q_tensor{i}"] = _UNBOUND, self.binder(i), False
                g[f"_q_dtype{i}"] = by_name(p.dtype).np_dtype
                g[f"_q_pack_array{i}"] = struct.Struct("=" + "Q" * (1 + p.ndim)).pack_into  # see rebind_numpy
            elif p.dtype == "u1":
                g[f"_q_as_bool{i}"] = self.bool_converter(i)
            if i in self.vectors:
                g[f"_q_elements{i}"] = element_reader(self.meta, self.vectors[i])
        for first, run in self.scalar_runs():
            fmt = "=" + "".join(PACK_CODE[p.dtype] + "x" * (8 - by_name(p.dtype).nbytes) for p in run)
            g[f"_q_pack{first}"] = struct.Struct(fmt).pack_into
        # A STORE_GLOBAL looks its name up at every launch: keyed by the very (interned) string
        # the code holds, the lookup compares no characters (~40 ns less for a new array)
        for i in self.kinds:
            for name in (f"_q_arr{i}", self.probe_name(i)):
                g[sys.intern(name)] = g.pop(name, None)

    def body(self, kinds: dict) -> list[str]:
        """The launch statements. `kinds[i]` says whether the array cached for ndarray parameter
        i is a numpy array (True: test its shape too), not one (False) or either (None)."""
        if self.uses_python_entry(kinds):
            return self.python_entry_body(kinds)
        body = []
        values = self.value_names
        for i, p in enumerate(self.meta.params):
            if i in self.vectors:  # its elements into locals, packed and checked as scalars below
                elements = "".join(values[k] + ", " for k in range(i, i + self.vectors[i].count))
                body += [f"    {elements}= _q_elements{i}({p.name})"]
            if p.kind == "ndarray" and kinds[i] in ("tensor", "watch-next", "watched", "always"):  # external_arrays.py
                body += self.tensor_statements(i, kinds[i])
                if self.copies is not None:
                    body += [f"    if _q_numpy{i}:", f"        _q_copy_in(_q_dev{i}, {p.name})"]
            elif p.kind == "ndarray":
                probe = f"_q_len({p.name}) != _q_len{i}" if p.ndim in (1, 2) else f"{p.name}.shape != _q_shape{i}"
                if p.writes:  # a numpy array made read-only in place since it was bound: bind refuses it
                    probe += f" or not {p.name}.flags.writeable"
                # the generic code (kind None) rebinds a cached tensor at every launch: it serves the
                # launches the fast code refused or never sees (a Tape's), and a watched tensor's words
                # may have been rewritten by the Python entry since
                probe = {True: f" or {probe}", False: "",
                         None: f" or _q_numpy{i} and ({probe}) or _q_tensor{i}"}[kinds[i]]
                body += [f"    if {p.name} is not _q_arr{i}{probe}:"]
                if kinds[i] and i in self.native_params():
                    body += self.native_statements(i)
                    continue
                body += self.rebind_numpy(i) if kinds[i] and self.inline_rebind(i) else [f"        _q_bind{i}({p.name})"]
                if self.copies is not None:  # not specialised: a bind in this very call may change the kind
                    body += [f"    if _q_numpy{i}:", f"        _q_copy_in(_q_dev{i}, {p.name})"]
            elif p.dtype == "u1":
                body += [f"    if {values[i]}.__class__ is not _q_bool:",
                         f"        {values[i]} = _q_as_bool{i}({values[i]})"]
        for first, run in self.scalar_runs():
            packed = ", ".join(values[first:first + len(run)])
            body += ["    try:", f"        _q_pack{first}(_q_mem, {8 * run[0].slot}, {packed})",
                     "    except _q_scalar_errors:", f"        _q_bad_scalars({first}, ({packed},))"]
        rebound = [i for i in kinds if kinds[i] is True and (self.inline_rebind(i) or i in self.native_params())]
        if rebound:  # rebind_numpy and the native path update the cache
            body.insert(0, "    global " + ", ".join(f"_q_arr{i}, {self.probe_name(i)}" for i in rebound))
        hooks = self.hooks  # not looked up in the namespace: an owner's may hold an earlier launcher's names
        args = f"({''.join(n + ', ' for n in values)})"  # one value per record: what size expressions index
        if hooks is not None and hooks.prepare is not None:
            body += [f"    _q_lctx.args = {args}", "    _q_prepare(_q_lctx)"]
        if not self.fused:  # the asynchronous path: the error hooks report at sync, not from `finish`
            body.append(f"    _q_call({args})")
            body += self.copy_out_statements() + self.after_statements()
            if hooks is not None and hooks.finish is not None and hooks.report is None:
                body.append("    _q_finish()")  # a hook of the caller's own: run once the tasks are queued
            return body + self.return_statements()
        if self.binding is not None:
            body += ["    if _q_call(_q_arg):", f"        _q_native_refused({args})"]
        else:
            body.append("    _q_call(_q_arg)")
        body += self.after_statements()
        if hooks is not None and hooks.finish is not None:
            body.append("    _q_finish()")
        return body + self.return_statements()

    @staticmethod
    def after_statements() -> list[str]:
        """Run what binding queued for after the launch (`after`): nothing, unless an argument
        was copied or is an external array."""
        return ["    if _q_after:", "        _q_run_after()"]

    def uses_python_entry(self, kinds: dict) -> bool:
        """Whether the launch code for these kinds is one call of the library's Python entry:
        when every cached array is a numpy array (a qd.ndarray keeps its cached words)."""
        if self.python is None or None in kinds.values():
            return False
        return self.python.keeps_bound or all(kind is True for kind in kinds.values())

    def python_entry_body(self, kinds: dict) -> list[str]:
        """One call of the library's Python entry. A numpy array goes to it as it is, and so does
        a watched tensor (the entry checks its address: runtime/tensor_watch.py); any other array
        is bound by the launch code while it is not the cached one (`tensor_statements`) and goes
        as KEPT (None for a library built before it), which leaves its words as they are."""
        body, passed = [], []
        for i, p in enumerate(self.meta.params):
            if p.kind != "ndarray" or kinds[i] is True or kinds[i] == "watched":
                passed.append(p.name)
                continue
            passed.append("..." if self.python.watches else "None")  # `...`: KEPT (see `define`)
            if kinds[i] is False:
                body += [f"    if {p.name} is not _q_arr{i}:", f"        _q_bind{i}({p.name})"]
            else:
                body += self.tensor_statements(i, kinds[i])
        args = f"({''.join(n + ', ' for n in self.argument_names)})"
        body += [f"    if _q_fast({''.join(n + ', ' for n in passed)}) is not None:", f"        return _q_fast_refused({args})"]
        if body[0].startswith("    if _q_fast"):  # every array a numpy array: nothing was bound here
            return body + self.return_statements()
        return body + self.after_statements() + self.return_statements()

    def tensor_statements(self, index: int, kind: str) -> list[str]:
        """Binding an external array (a tensor) or a copied one: a cached tensor (kind "tensor")
        again only when it is another one or its address changed (`resize_`, `set_`, `.data = `),
        and one the Python entry can watch (kind "watch-next") watched once it comes again;
        anything else (kind "always", and a watched tensor in the code that runs when the Python
        entry refused a launch) at every launch."""
        a = self.meta.params[index].name
        if kind in ("tensor", "watch-next"):
            check = [f"    if {a} is not _q_arr{index} or _q_data_ptr({a}) != _q_ptr{index}:", f"        _q_bind{index}({a})"]
            return check + (["    else:", f"        _q_watch{index}({a})"] if kind == "watch-next" else [])
        return [f"    _q_bind{index}({a})"]

    def fast_refused(self, args: tuple):
        """The Python entry ran nothing (an argument it does not bind, or a wrong one): launch
        through the generic code, which binds in Python and raises naming what is wrong."""
        return self.launch(*args)

    def native_statements(self, index: int) -> list[str]:
        """Binding a numpy-cached parameter's new argument where the kernel's library binds numpy
        arrays: a numpy array's address goes into the words (which then hold it, so it is
        cached); anything else goes to `_q_bind<i>`."""
        a, slot = self.meta.params[index].name, self.meta.params[index].slot
        return [f"        if {a}.__class__ is _q_ndarray:",
                f"            _q_pack_object(_q_mem, {8 * slot}, _q_id({a}), -1)",
                f"            _q_arr{index}, {self.probe_name(index)} = {a}, {self.probe_value(index)}",
                "        else:", f"            _q_bind{index}({a})"]

    def return_statements(self) -> list[str]:
        """A kernel with a return value reads it back (runtime/returns.py) once the launch is done."""
        return ["    return _q_result()"] if self.meta.returns else []

    def inline_rebind(self, index: int) -> bool:
        """Whether a numpy array other than the cached one is bound by the launch code itself
        (`rebind_numpy`) rather than by a call of `_q_bind<i>`: on host-memory devices, for
        parameters whose gradient the kernel does not use (a numpy array has none)."""
        p = self.meta.params[index]
        return self.copies is None and not p.needs_grad and not p.element_shape  # vectors: bind checks their shape

    def probe_name(self, index: int) -> str:
        return f"_q_len{index}" if self.meta.params[index].ndim in (1, 2) else f"_q_shape{index}"

    def probe_value(self, index: int) -> str:
        a = self.meta.params[index].name
        return f"_q_len({a})" if self.meta.params[index].ndim in (1, 2) else f"{a}.shape"

    def rebind_numpy(self, index: int) -> list[str]:
        """Statements binding a numpy array `a` other than the cached one, in the code specialised
        to a cached numpy array: a launch with a different array every call (double buffers,
        arrays made per call) then costs about a third of a `_q_bind<i>` call. Every check of
        `bind` is kept: the class (a subclass goes to `_q_bind<i>`), the dtype by identity (the
        builtin dtypes are singletons; any other equal dtype goes to `_q_bind<i>`), ndim, and
        the pointer through the buffer protocol, which also refuses an array that is not
        C-contiguous, a read-only one and an empty one (TypeError/ValueError: then `_q_bind<i>`
        accepts what it should and names what is wrong otherwise)."""
        p = self.meta.params[index]
        a = p.name
        shape = {0: "", 1: f", _q_len({a})"}.get(p.ndim, f", *{a}.shape")
        probe = f"_q_len({a})" if p.ndim in (1, 2) else f"{a}.shape"
        return [f"        if {a}.__class__ is _q_ndarray and {a}.dtype is _q_dtype{index} and {a}.ndim == {p.ndim}:",
                "            try:",
                f"                _q_pack_array{index}(_q_mem, {8 * p.slot}, _q_address(_q_from_buffer({a})){shape})",
                "            except _q_buffer_errors:",
                f"                _q_bind{index}({a})",
                "            else:",
                f"                _q_arr{index}, {self.probe_name(index)} = {a}, {probe}",
                "        else:",
                f"            _q_bind{index}({a})"]

    def copy_out_statements(self) -> list[str]:
        """Copy each numpy array the kernel writes back from its device buffer (waits for the launch)."""
        if self.copies is None:
            return []
        return [line for i, p in enumerate(self.meta.params) if p.kind == "ndarray" and p.writes
                for line in (f"    if _q_numpy{i}:", f"        _q_copy_out(_q_dev{i}, {p.name})")]

    def build(self) -> None:
        """Generate `launch`, the stale stub's code, and (unless the owner gave one) `function`."""
        names = self.argument_names
        self.fill_namespace()
        self.launch = self.define(names, self.body(self.kinds))
        self.fast_code = self.launch.__code__
        self.stale_code = self.define(names, [f"    return _q_slow({', '.join(names)})"]).__code__
        if self.function is None:  # the same code in a function of its own (its code is swapped while stale)
            launch = self.launch
            self.function = types.FunctionType(launch.__code__, self.g, launch.__name__, launch.__defaults__)
            self.function.__kwdefaults__ = launch.__kwdefaults__
        self.function.__qdc_source__, self.function.__qdc_launcher__ = self.launch.__qdc_source__, self

    def specialise(self) -> None:
        """Make `fast_code` the launch code for the kinds of arrays now cached (see `body`). While
        some array was never bound (the first launch binding them one by one), the generic code
        serves: specialising at each bind would generate the code once per ndarray parameter."""
        if None in self.kinds.values():
            return
        key = tuple(self.kinds.values())
        if self.uses_python_entry(self.kinds):  # arrays cached by other code: their words get rewritten
            for i in self.kinds:
                self.g[f"_q_arr{i}"] = _UNBOUND
        code = self.variants.get(key)
        if code is None:
            code = self.variants[key] = self.define(self.argument_names, self.body(self.kinds)).__code__
        if self.function.__code__ is self.fast_code:  # not while stale, nor while the owner holds a stub
            self.function.__code__ = code
        self.fast_code = code

    def define(self, params: list[str], body: list[str]):
        src = f"def {self.meta.name}({', '.join(params)}):\n" + "\n".join(body) + "\n"
        code = compile(src, f"<qdc launcher {self.meta.name}>", "exec")
        namespace = {}
        exec(code, self.g, namespace)  # noqa: S102 (only checked identifiers reach the source)
        fn = namespace[self.meta.name]
        if self.python is not None:  # `...` in the source is the Python entry's KEPT: a constant, as None is
            kept = self.python.kept
            fn.__code__ = fn.__code__.replace(co_consts=tuple(kept if c is Ellipsis else c for c in fn.__code__.co_consts))
        fn.__qdc_source__ = src
        fn.__qdc_launcher__ = self
        return fn

    def scalar_runs(self):
        """(index of first param, [params]) for each run of scalar params in consecutive slots."""
        runs = []
        for i, p in enumerate(self.meta.params):
            if p.kind != "scalar":
                continue
            if runs and runs[-1][1][-1].slot + 1 == p.slot:
                runs[-1][1].append(p)
            else:
                runs.append((i, [p]))
        return runs


def _check_names(name: str, params: list[str]) -> None:
    for n in [name] + params:
        if not n.isidentifier() or keyword.iskeyword(n):
            raise ValueError(f"invalid identifier {n!r} in kernel metadata")
    for n in params:
        if n.startswith(_RESERVED):
            raise ValueError(f"kernel '{name}': parameter names starting with '{_RESERVED}' "
                             f"are reserved for qdc (rename '{n}')")


def stub_function(name: str, params: list[str] | None, slow):
    """`def name(*params): return slow(*params)`, in a namespace of its own (`slow` is its
    `_q_slow`): the function an owner hands to `make_launcher` (see "Owners"). With params
    None it takes any arguments."""
    _check_names(name, params or [])
    head = call = "*_q_args, **_q_kwargs" if params is None else ", ".join(params)
    namespace = {}
    exec(f"def {name}({head}):\n    return _q_slow({call})\n", {"_q_slow": slow}, namespace)  # noqa: S102
    return namespace[name]


def make_launcher(meta: KernelMeta, device, loaded, fields: list, hooks: LaunchHooks | None = None,
                  function=None, graph: bool = False):
    """Return `launch(*args)` for `meta`; `fields` are the Field objects of meta.fields, in order.
    With `function`, that function of the caller's becomes the launch function (see "Owners").
    With `graph` (`@qd.kernel(graph=True)`), a device with graphs (`Device.launch_graph`: CUDA)
    replays the kernel's tasks as one graph; elsewhere it changes nothing."""
    _check_names(meta.name, [a.name for a in meta.arguments])
    hooked_by = ["the caller's"] if hooks is not None else []  # what puts hooks around it (launch_path.py)
    if hooks is None and meta.adstack.get("stacks"):  # the heap sizing and overflow check
        hooks = launch_hooks(meta)
        hooked_by.append("adstacks")
    if meta.random_slot is not None:  # the seed and the launch counter qd.random() draws from
        hooks = with_prepare(hooks, random_stream.STREAM.writer(meta.random_slot, meta.name, meta.is_grad))
        hooked_by.append("qd.random")
    checks = None
    if meta.debug_checks:  # debug=True: report the first out-of-range index after the launch
        from .contract.bounds import BoundsChecks
        checks = BoundsChecks(meta)
        hooks = with_finish(hooks, checks.finish, checks.report)
        hooked_by.append("debug checks")
    printer = None
    if meta.messages:  # print, assert, debug checks: the device's print buffer, read after the launch
        printer = kernel_messages.print_buffer(device)
        if device.capabilities.synchronous:  # an asynchronous device reads it at sync
            hooks = with_finish(hooks, printer.drain, None)
            hooked_by.append("print")
    if hooks is not None and hooks.prepare is None and hooks.finish is None:
        hooks, hooked_by = None, []
    state = _Launcher(meta, device, loaded, fields, hooks, function, graph, tuple(hooked_by))
    if printer is not None:
        state.words[meta.print_slot] = printer.register(meta)
    if checks is not None:
        slot = state.errors
        checks.attach(state.words, slot.host[BOUNDS_WORD:BOUNDS_WORD + ERROR_WORDS] if slot.host is not None else None,
                      slot.word_address(BOUNDS_WORD))
    state.build()
    state.bind_runtime()
    context.on_reset(state)
    return state.function


def _iterations(task):
    """A task record's trip count as a SizeExpr (None: not expressible)."""
    return se.from_nodes(task.iterations)
