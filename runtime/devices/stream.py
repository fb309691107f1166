"""The asynchronous protocol (runtime/device.py) on a GPU driver API of the CUDA shape: one
stream, device pointers, events, modules of task entries taking one pointer. The CUDA device
(cuda-bindings) and the HIP device (hip-python) are this class with their driver's calls.

Memory. `allocate` is a device allocation plus a memset on the stream (zeroed, ordered before
any later launch); `ptr` is the real device address, written into ctx words as is.
`copy_to_host` is a ranged asynchronous copy on the stream followed by a stream synchronise,
so the destination is complete when it returns. `copy_to_device` of at most SMALL_COPY_BYTES
(an element write, an error slot's reset) is staged in the pinned ring and copied on the stream
without a wait (the ring half is reused only after an event says the copy ran, so the source may
change at once); a larger one is copied and waited for. `fill` is a memset on the stream
(D8/D16/D32 for patterns of period 1, 2, 4 bytes; an 8-byte period by the device's fill kernel
where it has one, `fill64_image`: CUDA's two strided cuMemsetD2D32 were 75x slower than a memset
on an H200), else the pattern staged once and doubled by device-to-device copies;
`copy_between` (deep copies of arrays) is one device-to-device copy. None of them waits.
`free_after_fence` records an event: the allocation is freed once the event completed
(checked at every later free_after_fence and at `wait`), so a buffer replaced while launches
that use it are in flight (an adstack heap) is never freed under them: an allocator could hand
its address out again, as the adstack heap's, to a kernel still running (seed 001's AMDGPU
lesson).

Launches. A kernel's module is loaded once, with one function per task (its record's entry).
The kernel reads its ctx words from device memory: each (kernel, ctx buffer) pair has a device
copy, re-uploaded only when the words changed since the last upload (staged through a pinned
ring whose two halves are reused only after an event says the copies reading them ran).
Stream order makes the overwrite safe: the copy runs after the launches before it. Grid =
slices / block_dim blocks; `task_slices` is min(ceil(N / block_dim), a cap) blocks, and the
task's grid-stride loop covers the rest.

Graphs (`@qd.kernel(graph=True)`, where the driver has graph calls: CUDA). `launch_graph`
uploads the ctx words as a launch does, then replays one executable graph holding the
kernel's tasks in order, each a kernel node with the task's grid, captured from the stream the
first time that grid tuple is launched (up to GRAPHS_PER_KERNEL tuples a kernel, the least
recently used destroyed after a fence). The nodes' one argument is the ctx copy's device address,
which never changes: every argument, the adstack heap pointer and the thread slices it holds
reach the replay through the uploaded words, so a replay with new arguments rebuilds nothing.

Adstacks. The kernel indexes the heap by the global thread id, so a launch needs a slice per
thread it really runs. The launcher's prepare hook (runtime/adstack.py) sizes the runtime's
heap before the tasks are queued, for the slices `task_slices` gives each task holding
stacks, and writes the heap pointer and the slices it holds into the ctx words; a task
launched on more threads than that word says is refused rather than run past the heap.

Loss. A driver's sticky statuses (a launch timeout, an illegal address, a failed launch: every
later call of the context returns them) mark the device lost (runtime/device.py, "Loss"),
naming the kernels launched last; `close_stream` of a lost device waits for nothing.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..device import (Allocation, Device, DeviceCapabilities, check_copy_range, check_fill_pattern, fill_seed,
                      pattern_period)

WAVES = 16                       # grid cap: this many waves of resident blocks on every multiprocessor
RING_BYTES = 1 << 20             # pinned staging for ctx uploads and small copies (two halves)
GRAPHS_PER_KERNEL = 8            # executable graphs kept per kernel (one per grid tuple launched)
SMALL_COPY_BYTES = 1 << 14       # copies to the device up to this size are staged, not waited for
FILL64_ENTRY, FILL64_BLOCK = "qdc_fill64", 256
CTX_ALIGN = 256
# The driver calls a stream device makes, by role; each returns (status, values...) as the
# cuda-bindings and hip-python functions do. `event_create` takes no arguments (its flags bound).
CALLS = ("mem_alloc", "mem_free", "memset_d8_async", "memset_d16_async", "memset_d32_async", "memcpy_htod_async",
         "memcpy_dtoh_async", "memcpy_dtod_async", "stream_synchronize",
         "event_create", "event_record", "event_query", "event_synchronize", "event_destroy", "module_load_data",
         "module_get_function", "launch_kernel", "host_alloc", "host_free")
# Optional, the graph calls: `begin_capture(stream)`, `end_capture(stream)` -> graph, `graph_instantiate(graph)` ->
# executable graph, `graph_launch(exec, stream)`, `graph_destroy(graph)`, `graph_exec_destroy(exec)`.
OPTIONAL_CALLS = ("begin_capture", "end_capture", "graph_instantiate", "graph_launch",
                  "graph_destroy", "graph_exec_destroy")


class StatusDriver:
    """`check` and `fail` for a binding whose calls return (status, values...): a subclass sets
    `arch`, its `ok`, `not_ready` and `out_of_memory` statuses, `lost` (the sticky statuses
    after which the context is unusable) and `error_name(status)`. `on_lost(reason)`, set by
    the device, turns a sticky status into the error to raise."""
    arch = ""
    ok = not_ready = out_of_memory = None
    lost: frozenset = frozenset()
    on_lost = None

    @staticmethod
    def statuses(enum, names) -> frozenset:
        """The members of `enum` called `names` (those this binding's version has)."""
        return frozenset(getattr(enum, name) for name in names if hasattr(enum, name))

    def error_name(self, err) -> str:
        return str(err)

    def check(self, result, what: str):
        """The call's values after its status (one value, a tuple of several, or None)."""
        err = result[0]
        if err != self.ok:
            self.fail(err, what)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def fail(self, err, what: str):
        name = self.error_name(err)
        if err in self.lost and self.on_lost is not None:
            raise self.on_lost(f"{what}: {name}")
        if err == self.out_of_memory:
            raise MemoryError(f"{self.arch}: {what}: out of device memory ({name})")
        raise RuntimeError(f"{self.arch}: {what} failed ({name})")


def load_status_binding(import_binding, error: type, *, arch: str, package: str, init: str, device_count: str,
                        success, error_name: str, no_runtime: str, unusable: str, no_gpu: str):
    """The driver binding `import_binding()` returns, initialised by its `init` call (flags 0)
    and seeing a GPU through `device_count`; else `error` saying which of the package, the
    native runtime or a GPU is missing. `success(binding)` is its success status, `error_name`
    the call naming a status; the messages after "arch '<arch>': " are `no_runtime` (its {}
    the binding's own error), `unusable` (after the failed init) and `no_gpu`."""
    try:
        binding = import_binding()
    except ImportError as e:
        raise error(f"arch '{arch}' needs the '{package}' package: pip install {package}  "
                    f"(or pip install 'qdc[{arch}]') ({e})") from None
    try:
        (err,) = getattr(binding, init)(0)
    except Exception as e:  # the binding raises its own error when the native library is absent
        raise error(f"arch '{arch}': " + no_runtime.format(f"{type(e).__name__}: {e}")) from None
    if err != success(binding):
        raise error(f"arch '{arch}': {init} failed ({status_name(binding, error_name, err)}): {unusable}")
    err, count = getattr(binding, device_count)()
    if err != success(binding) or count == 0:
        raise error(f"arch '{arch}': {no_gpu}")
    return binding


def status_name(binding, error_name: str, err) -> str:
    """The text the binding's `error_name` call gives `err` (alone or after a status), or
    `err` itself where the call fails."""
    try:
        text = getattr(binding, error_name)(err)
        text = text[-1] if isinstance(text, tuple) else text
        return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - only for the message
        return str(err)


class StreamTask:
    """One task's function, block size, name and, when it holds adstacks, the ctx word of the
    thread slices their heap holds (KernelMeta.adstack_threads_slot)."""
    __slots__ = ("function", "block_dim", "heap_threads_word", "name")

    def __init__(self, function, block_dim, heap_threads_word, name):
        self.function, self.block_dim, self.heap_threads_word, self.name = function, block_dim, heap_threads_word, name


class CtxCopy:
    """The device copy of one ctx buffer: its allocation, the bytes last uploaded, the
    kernel-parameter array (void* to a u64 holding the device address) and its address, a numpy
    view of the host words."""
    __slots__ = ("alloc", "last", "param", "params", "params_address", "words", "nbytes", "host")

    def __init__(self, alloc, nbytes, host_address):
        self.alloc, self.nbytes, self.last = alloc, nbytes, b""
        self.param = ctypes.c_uint64(alloc.ptr)
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.param))
        self.params_address = ctypes.addressof(self.params)  # taken once: launches pass it
        host = (ctypes.c_uint64 * (nbytes // 8)).from_address(host_address)
        self.words = np.frombuffer(host, np.uint64)
        self.host = memoryview(host).cast("B")  # compared with `last` in place: no copy per launch


class StreamKernel:
    """A loaded kernel: its module, a StreamTask per task, its ctx copies."""

    def __init__(self, meta, module, tasks):
        self.meta, self.module, self.tasks = meta, module, tasks
        self.ctx_copies: dict = {}  # host ctx address -> CtxCopy
        self.graphs: dict = {}  # (host ctx address, slices per task) -> executable graph, oldest use first
        self.ctx_bytes = 8 * max(meta.ctx_words, 1)


class StreamDevice(Device):
    """Subclasses set `arch`, `default_block_dim`, `module_artifact(artifacts, meta)`, and call
    `_set_up_stream` once their context and stream exist."""
    capabilities = DeviceCapabilities(host_memory=False, synchronous=False, fused_launch=False)
    default_block_dim = 256

    def _set_up_stream(self, driver, calls, stream, sm_count: int, threads_per_sm: int, max_grid_x: int) -> None:
        """`driver`: check(result, what) / fail(status, what) / ok; `calls`: the CALLS by role."""
        self.driver, self.calls, self.stream = driver, calls, stream
        driver.on_lost = self.device_lost
        self._last_launched = None
        self.sm_count, self.threads_per_sm, self.max_grid_x = sm_count, threads_per_sm, max_grid_x
        self._pending_frees: list = []  # (event, Allocation or a function releasing something)
        self.graph_replays = 0  # graph launches (replays) so far
        self._ring_host = driver.check(calls.host_alloc(RING_BYTES, 0), "allocating pinned host memory")
        self._ring_offset = 0
        self._ring_events = [None, None]  # per half: recorded when the ring last left it
        self._ring_half = 0
        self._launch = calls.launch_kernel
        self._upload = calls.memcpy_htod_async
        self._grid_caps: dict = {}
        self._closed = False

    # ---- memory --------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Allocation:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        c, d = self.calls, self.driver
        size = max(-(-nbytes // 8) * 8, 8)
        ptr = d.check(c.mem_alloc(size), f"allocating {nbytes} bytes of device memory")
        d.check(c.memset_d8_async(ptr, 0, size, self.stream), "zeroing new device memory")
        return Allocation(int(ptr), nbytes, None, ptr)

    def free(self, alloc: Allocation) -> None:
        if alloc.handle is None:
            return
        handle, alloc.handle = alloc.handle, None
        self.driver.check(self.calls.mem_free(handle), "freeing device memory")

    def free_after_fence(self, alloc: Allocation) -> None:
        self._retire()
        if alloc.handle is None:
            return
        self._pending_frees.append((self._record_event(), alloc))

    def copy_to_device(self, alloc: Allocation, src: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)  # 1-d first: a 0-d array has no byte view
        check_copy_range(alloc, offset, data.size)
        if data.size == 0:
            return
        if data.size <= SMALL_COPY_BYTES:
            self._staged_copy(alloc.ptr + offset, data)
            return
        d = self.driver
        d.check(self.calls.memcpy_htod_async(alloc.ptr + offset, data.ctypes.data, data.size, self.stream),
                "copying to the device")
        d.check(self.calls.stream_synchronize(self.stream), "synchronising the stream (after a copy to the device)")

    def _staged_copy(self, ptr: int, data: np.ndarray) -> None:
        """`data` copied into the pinned ring, then from there to `ptr` on the stream (no wait)."""
        host = int(self._ring_host) + self._stage(-(-data.size // CTX_ALIGN) * CTX_ALIGN)
        ctypes.memmove(host, data.ctypes.data, data.size)
        self.driver.check(self.calls.memcpy_htod_async(ptr, host, data.size, self.stream), "copying to the device")

    def fill(self, alloc: Allocation, offset: int, nbytes: int, pattern: bytes) -> None:
        """`pattern` repeated over the range, on the stream (no wait): a memset of the pattern's
        period where the driver has one and the range is aligned to it, else the pattern staged
        once and doubled by device-to-device copies (each reads what the ones before wrote)."""
        check_fill_pattern(pattern, nbytes)
        check_copy_range(alloc, offset, nbytes)
        if nbytes == 0:
            return
        c, d, ptr = self.calls, self.driver, alloc.ptr + offset
        unit = pattern_period(pattern)
        word = pattern[:unit]
        if unit == 1:
            d.check(c.memset_d8_async(ptr, word[0], nbytes, self.stream), "filling device memory")
        elif unit == 2 and ptr % 2 == 0:
            d.check(c.memset_d16_async(ptr, int.from_bytes(word, "little"), nbytes // 2, self.stream),
                    "filling device memory")
        elif unit == 4 and ptr % 4 == 0:
            d.check(c.memset_d32_async(ptr, int.from_bytes(word, "little"), nbytes // 4, self.stream),
                    "filling device memory")
        elif unit == 8 and ptr % 8 == 0 and self._fill64() is not None:
            self._launch_fill64(ptr, nbytes // 8, int.from_bytes(word, "little"))
        else:
            self._fill_by_doubling(ptr, nbytes, word)

    def fill64_image(self) -> bytes | None:
        """A module with FILL64_ENTRY(u64 *ptr, u64 count, u64 value) storing `value` at ptr[0..count),
        grid-stride; None where the device has none (fills of 8-byte periods are then doubled)."""
        return None

    def _fill64(self):
        fn = getattr(self, "_fill64_function", False)
        if fn is False:
            image = self.fill64_image()
            fn = None
            if image is not None:
                c, d = self.calls, self.driver
                module = d.check(c.module_load_data(image), "loading the fill kernel")
                fn = d.check(c.module_get_function(module, FILL64_ENTRY.encode()), "the fill kernel")
            self._fill64_function = fn
        return fn

    def _launch_fill64(self, ptr: int, count: int, value: int) -> None:
        args = (ctypes.c_uint64 * 3)(ptr, count, value)
        params = (ctypes.c_void_p * 3)(*(ctypes.addressof(args) + 8 * i for i in range(3)))
        block = FILL64_BLOCK
        blocks = min(-(-count // block), self.grid_cap(block))
        self.driver.check(self._launch(self._fill64(), blocks, 1, 1, block, 1, 1, 0, self.stream,
                                       ctypes.addressof(params), 0), "filling device memory")  # params copied here

    def _fill_by_doubling(self, ptr: int, nbytes: int, word: bytes) -> None:
        seed = fill_seed(word, nbytes)
        self._staged_copy(ptr, seed)
        done = seed.size
        while done < nbytes:
            size = min(done, nbytes - done)
            self.driver.check(self.calls.memcpy_dtod_async(ptr + done, ptr, size, self.stream),
                              "filling device memory")
            done += size

    def copy_between(self, src: Allocation, dst: Allocation, nbytes: int) -> None:
        """The first `nbytes` of `src` onto `dst`: one device-to-device copy on the stream."""
        check_copy_range(src, 0, nbytes)
        check_copy_range(dst, 0, nbytes)
        if nbytes:
            self.driver.check(self.calls.memcpy_dtod_async(dst.ptr, src.ptr, nbytes, self.stream),
                              "copying between device buffers")

    def copy_to_host(self, alloc: Allocation, dst: np.ndarray, offset: int = 0) -> None:
        out = dst.reshape(-1).view(np.uint8)  # a view of `dst` (contiguous), 1-d first as above
        check_copy_range(alloc, offset, out.size)
        if out.size == 0:
            return
        d = self.driver
        d.check(self.calls.memcpy_dtoh_async(out.ctypes.data, alloc.ptr + offset, out.size, self.stream),
                "copying to the host")
        d.check(self.calls.stream_synchronize(self.stream), "synchronising the stream (a copy to the host)")

    # ---- events and completion -----------------------------------------------------------------
    def _record_event(self):
        d = self.driver
        event = d.check(self.calls.event_create(), "creating an event")
        d.check(self.calls.event_record(event, self.stream), "recording an event")
        return event

    def _event_done(self, event, block: bool = False) -> bool:
        if block:
            self.driver.check(self.calls.event_synchronize(event), "waiting for an event")
            return True
        (err,) = self.calls.event_query(event)
        if err == self.driver.not_ready:
            return False
        if err != self.driver.ok:
            self.driver.fail(err, "querying an event")
        return True

    def _retire(self, block: bool = False) -> None:
        """Free what waited for events that completed (all of them when `block`)."""
        keep = []
        for event, alloc in self._pending_frees:
            if self._event_done(event, block):
                self.calls.event_destroy(event)
                if callable(alloc):
                    alloc()
                else:
                    self.free(alloc)
            else:
                keep.append((event, alloc))
        self._pending_frees = keep

    def wait(self) -> None:
        self.driver.check(self.calls.stream_synchronize(self.stream), "synchronising the stream (a kernel failed)")
        self._retire(block=True)

    # ---- kernels -------------------------------------------------------------------------------
    def module_image(self, artifacts: dict, meta) -> bytes:
        """The artifact the driver loads as this kernel's module."""
        raise NotImplementedError

    def load_kernel(self, artifacts: dict, meta) -> StreamKernel:
        c, d = self.calls, self.driver
        module = d.check(c.module_load_data(self.module_image(artifacts, meta)),
                         f"loading the module of kernel '{meta.name}'")
        stack_tasks = {r["task"] for r in (meta.adstack.get("stacks") or [])}
        tasks = []
        for i, t in enumerate(meta.tasks):
            fn = d.check(c.module_get_function(module, t.entry.encode()), f"kernel '{meta.name}': entry {t.entry}")
            threads_word = meta.adstack_threads_slot if i in stack_tasks else None
            tasks.append(StreamTask(fn, self.block_dim(t.launch), threads_word, t.name))
        return StreamKernel(meta, module, tasks)

    def block_dim(self, launch: dict) -> int:
        return launch.get("block_dim") or self.default_block_dim

    def grid_cap(self, block_dim: int) -> int:
        """The most blocks a launch of `block_dim`-thread blocks gets: WAVES waves of the blocks
        every multiprocessor holds at once (the grid-stride loop covers larger ranges)."""
        cap = self._grid_caps.get(block_dim)
        if cap is None:
            cap = self._grid_caps[block_dim] = min(self.max_grid_x,
                                                   self.sm_count * max(self.threads_per_sm // block_dim, 1) * WAVES)
        return cap

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The threads launched for `iterations`: ceil(N / block_dim) blocks up to the grid cap
        (None: the cap); 0 iterations launch nothing."""
        if launch["policy"] != "grid":
            raise ValueError(f"the {self.arch} device cannot launch a task with launch policy {launch['policy']!r}")
        block = self.block_dim(launch)
        cap = self.grid_cap(block)
        if iterations is None:
            return cap * block
        if iterations <= 0:
            return 0
        return min(-(-iterations // block), cap) * block

    def launch_task(self, loaded: StreamKernel, task: int, ctx_address: int, slices: int) -> None:
        if self.lost is not None:
            self.check_not_lost()
        if slices <= 0:
            return
        if loaded is not self._last_launched:
            self._last_launched = loaded
            self._note_submitted(loaded.meta.name)
        t = loaded.tasks[task]
        copy = loaded.ctx_copies.get(ctx_address) or self._ctx_copy(loaded, ctx_address)
        if t.heap_threads_word is not None:
            self._check_heap(loaded, t, copy, slices)
        if copy.host != copy.last:
            self._upload_ctx(copy, copy.host.tobytes())
        block = t.block_dim  # the launch itself inline: this is every kernel's hot path
        err = self._launch(t.function, -(-slices // block), 1, 1, block, 1, 1, 0, self.stream,
                           copy.params_address, 0)[0]
        if err != self.driver.ok:
            self.driver.fail(err, f"launching task '{t.name}' of kernel '{loaded.meta.name}'")

    def _ctx_copy(self, loaded: StreamKernel, ctx_address: int) -> CtxCopy:
        copy = loaded.ctx_copies.get(ctx_address)
        if copy is None:
            copy = loaded.ctx_copies[ctx_address] = CtxCopy(self.allocate(loaded.ctx_bytes), loaded.ctx_bytes,
                                                            ctx_address)
        return copy

    @staticmethod
    def _check_heap(loaded: StreamKernel, t: StreamTask, copy: CtxCopy, slices: int) -> None:
        if t.heap_threads_word is not None and copy.words[t.heap_threads_word] < slices:
            raise RuntimeError(f"kernel '{loaded.meta.name}', task '{t.name}': {slices} threads launched but its "
                               f"adstack heap holds {int(copy.words[t.heap_threads_word])}: the heap was not sized "
                               f"for this launch (the launcher's adstack hooks did not run)")

    def _launch_on_stream(self, loaded: StreamKernel, t: StreamTask, copy: CtxCopy, slices: int) -> None:
        block = t.block_dim
        err = self._launch(t.function, -(-slices // block), 1, 1, block, 1, 1, 0, self.stream,
                           copy.params_address, 0)[0]
        if err != self.driver.ok:
            self.driver.fail(err, f"launching task '{t.name}' of kernel '{loaded.meta.name}'")

    @property
    def has_graphs(self) -> bool:
        return getattr(self.calls, "graph_launch", None) is not None

    def launch_graph(self, loaded: StreamKernel, ctx_address: int, slices: list) -> None:
        """Every task of `loaded` in order, task i on `slices[i]` thread slices (0: not
        launched), as one replay of an executable graph (see "Graphs"); task by task where the
        driver has no graphs."""
        if not self.has_graphs:
            for task, n in enumerate(slices):
                self.launch_task(loaded, task, ctx_address, n)
            return
        self.replay(loaded, ctx_address, slices, (), lambda copy: self._capture(loaded, copy, slices))

    def replay(self, loaded: StreamKernel, ctx_address: int, slices: list, key: tuple, build) -> None:
        """Launch the executable graph of `loaded` for these slices and `key` (what else the
        graph holds), made by `build(ctx copy)` the first time."""
        if self.lost is not None:
            self.check_not_lost()
        copy = self._ctx_copy(loaded, ctx_address)
        for t, n in zip(loaded.tasks, slices):
            self._check_heap(loaded, t, copy, n)
        if not any(slices):
            return
        if loaded is not self._last_launched:
            self._last_launched = loaded
            self._note_submitted(loaded.meta.name)
        if copy.host != copy.last:
            self._upload_ctx(copy, copy.host.tobytes())
        key = (ctx_address, tuple(slices)) + key
        graphs = loaded.graphs
        graph = graphs.pop(key, None)
        if graph is None:
            graph = build(copy)
            while len(graphs) >= GRAPHS_PER_KERNEL:
                self._destroy_after_fence(graphs.pop(next(iter(graphs))))
        graphs[key] = graph  # the most recently used last
        err = self.calls.graph_launch(graph, self.stream)[0]
        if err != self.driver.ok:
            self.driver.fail(err, f"launching the graph of kernel '{loaded.meta.name}'")
        self.graph_replays += 1

    def _capture(self, loaded: StreamKernel, copy: CtxCopy, slices: list):
        """An executable graph of the tasks with nonzero `slices`, captured from the stream."""
        c, d = self.calls, self.driver
        what = f"capturing the graph of kernel '{loaded.meta.name}'"
        d.check(c.begin_capture(self.stream), what)
        try:
            for t, n in zip(loaded.tasks, slices):
                if n > 0:
                    self._launch_on_stream(loaded, t, copy, n)
        finally:
            graph = d.check(c.end_capture(self.stream), what)
        try:
            return d.check(c.graph_instantiate(graph), f"instantiating the graph of kernel '{loaded.meta.name}'")
        finally:
            c.graph_destroy(graph)  # the executable graph keeps what it needs

    def _destroy_after_fence(self, graph) -> None:
        """Destroy an executable graph once the replays queued so far ran."""
        self._retire()
        self._pending_frees.append((self._record_event(), lambda: self.calls.graph_exec_destroy(graph)))

    def _upload_ctx(self, copy: CtxCopy, data: bytes) -> None:
        """Stage `data` in the pinned ring and copy it to the ctx's device copy on the stream."""
        host = int(self._ring_host) + self._stage(-(-len(data) // CTX_ALIGN) * CTX_ALIGN)
        ctypes.memmove(host, data, len(data))
        err = self._upload(copy.alloc.ptr, host, len(data), self.stream)[0]
        if err != self.driver.ok:
            self.driver.fail(err, "uploading a launch's ctx words")
        copy.last = data

    def _stage(self, size: int) -> int:
        """Ring offset of `size` staging bytes. Entering a half waits for the event recorded when
        the ring last left it (the copies reading it ran); leaving one records its event."""
        half = RING_BYTES // 2
        start = self._ring_offset
        if start + size > RING_BYTES:
            start = 0
        elif start < half < start + size:
            start = half  # a staging never straddles the halves
        entered = start // half
        if entered != self._ring_half:
            self._ring_events[self._ring_half] = self._record_event()
            old = self._ring_events[entered]
            if old is not None:
                self._event_done(old, block=True)
                self.calls.event_destroy(old)
                self._ring_events[entered] = None
            self._ring_half = entered
        self._ring_offset = start + size
        return start

    def close_stream(self) -> bool:
        """Wait for the stream, free what waited for it and the staging ring (the subclass then
        releases its stream and context); False when already closed."""
        if self._closed:
            return False
        self._closed = True
        if self.lost is None:
            self.calls.stream_synchronize(self.stream)
            self._retire(block=True)
        self.calls.host_free(self._ring_host)
        return True

