"""The per-launch adstack sizing of one kernel, as a generated Python function.

A kernel's SizeExpr trees (its stacks' capacities and its tasks' trip counts) and the layout
of its stacks are turned, once when the kernel is loaded, into the source of `prepare(lctx)`
(the launcher's hook). For `for i in range(a.shape[0])` with one f32 stack bounded by
`1 + max(n[None], 0)` (ctx words from 8):

    def prepare(lctx):
        global _k0, _k1, _bound, _caps
        if _stale:
            return _rebind(lctx)
        a = lctx.args
        v0 = _f0[0]
        v1 = a[0].shape[0]
        if v0 == _k0 and v1 == _k1 and _heap.alloc is _bound:
            return
        v2 = v0 if v0 >= 0 else 0
        v3 = 1 + v2
        v4 = _slices0(v1)
        v5 = (v3 * 8 + 15) & -8
        v6 = v4 if v4 > 1 else 1
        stride = v5
        slices = v6
        _bound = _grow(stride * slices)
        w = _w
        w[8] = _heap.ptr
        w[9] = stride
        w[11] = 0
        w[12] = v3
        w[13] = slices
        _caps = (v3, )
        _k0 = v0
        _k1 = v1

First the leaves: every value read from launch data (scalar arguments, ndarray shapes,
field and ndarray elements, and every Max/SumOverRange, which the general evaluator of
sizeexpr_eval.py computes with numpy). When they equal the previous launch's and the heap was not
reallocated since, nothing else runs. Otherwise the arithmetic follows, then the layout:
each stack an 8-byte count and its entries rounded up to 8 bytes, a task's stacks one after
another, the stride the largest task, the heap `stride * slices` (`_grow`, runtime/adstack.py)
and the ctx words (artifact.py).

Values are exactly those of `sizeexpr_eval.evaluate`: each operation saturates at int64 where the
ranges of its operands (known from parameter and field dtypes) say it could overflow, `-`
clamps at 0, a read outside its array is 0. Field elements are read through a memoryview of
the field's host memory (a constant index is flattened here; a computed one through a small
function that checks bounds). The thread slices a task of v iterations dispatches are the
device's answer, `_slices<i>(v)` (Device.task_slices with the task's launch policy; v None
when its trip count is unknown before the launch); the heap holds slices for the most of any
task, at least one.

Only integers and names made here reach the source: metadata cannot inject code.
"""
from __future__ import annotations

import operator

from .contract import sizeexpr as se
from .sizeexpr_eval import host_array
from .contract.artifact_schema import MAX_ADSTACK_CAPACITY as MAX_CAPACITY
from .contract.types import by_name

INT64_MAX = se.INT64_MAX
INT64_MIN = se.INT64_MIN
FIELD_FORMAT = {"i8": "b", "i16": "h", "i32": "i", "i64": "q", "u8": "B", "u16": "H", "u32": "I", "u64": "Q",
                "u1": "B"}  # memoryview formats of integer field elements


def dtype_range(name: str) -> tuple:
    """The values a scalar of integer type `name` can hold, as int64 (u64 saturates)."""
    if name == "u1":
        return 0, 1
    bits = by_name(name).nbytes * 8
    if name[0] == "u":
        return 0, min((1 << bits) - 1, INT64_MAX)
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


class SizingSource:
    """Generates the `prepare` source of one kernel from its `KernelStacks` (adstack.py): the
    capacities (per stack: a SizeExpr, or an int), the tasks holding stacks ((iterations
    SizeExpr or None, launch policy) each), which task each stack is in and its entry bytes;
    `slot` is the kernel's first adstack ctx word; `log` adds a call of `_log`."""

    def __init__(self, meta, stacks, slot: int, log: bool = False):
        self.meta = meta
        self.lines: list = []
        self.values: dict = {}  # SizeExpr -> (python expression, lo, hi)
        self.leaves: list = []  # names of leaf variables, compared with the previous launch's
        self.max_overs: list = []  # ranges (Max/SumOverRange) left to sizeexpr_eval.evaluate: _mor(i, env)
        self.uses_args = self.uses_env = False
        self.fields_read: set = set()
        self.field_readers: set = set()  # slots read at computed indices
        self._count = 0
        body = self._leaves_then_rest(stacks, slot, log)
        self.source = self._function(body)

    # ---- the function ---------------------------------------------------------------------
    def _function(self, body: list) -> str:
        keys = [f"_k{i}" for i in range(len(self.leaves))]
        head = ["def prepare(lctx):", f"    global {', '.join(keys + ['_bound', '_caps'])}",
                "    if _stale:", "        return _rebind(lctx)"]
        return "\n".join(head + [f"    {line}" for line in body]) + "\n"

    def _leaves_then_rest(self, stacks, slot: int, log: bool) -> list:
        capacities, tasks = stacks.capacities, stacks.tasks
        trees = [c for c in capacities if isinstance(c, se.SizeExpr)] + [it for it, _ in tasks if it is not None]
        for tree in trees:
            self._emit_leaves(tree)
        leaf_lines, self.lines = self.lines, []
        same = [f"{x} == _k{i}" for i, x in enumerate(self.leaves)]
        check = [f"if {' and '.join(same + ['_heap.alloc is _bound'])}:", "    return"]
        caps = [self._capacity(i, c) for i, c in enumerate(capacities)]
        threads = [self._threads(pos, it) for pos, (it, _) in enumerate(tasks)]
        self._layout(caps, threads, stacks, slot)
        tuples = f"({''.join(c + ', ' for c in caps)})", f"({''.join(t + ', ' for t in threads)})"
        self.lines.append(f"_caps = {tuples[0]}")
        if log:
            self.lines.append(f"_log(_caps, {tuples[1]}, slices, stride)")
        remember = [f"_k{i} = {x}" for i, x in enumerate(self.leaves)]
        prologue = (["a = lctx.args"] if self.uses_args else []) + (["env = _env(lctx)"] if self.uses_env else [])
        return prologue + leaf_lines + check + self.lines + remember

    def _capacity(self, i: int, c) -> str:
        if not isinstance(c, se.SizeExpr):
            return str(int(c))
        text, lo, hi = self._value(c)
        if hi > MAX_CAPACITY:
            self.lines.append(f"if {text} > {MAX_CAPACITY}: _too_large({i}, {text})")
        if lo >= 1:
            return text
        return self._assign(f"{text} if {text} > 1 else 1")

    def _threads(self, pos: int, iterations) -> str:
        """The slices task `pos` (of the tasks holding stacks) dispatches: the device says."""
        if iterations is None:
            return self._assign(f"_slices{pos}(None)")
        v, lo, hi = self._value(iterations)
        return "0" if hi <= 0 else self._assign(f"_slices{pos}({v})")

    def _layout(self, caps: list, threads: list, stacks, slot: int) -> None:
        """Each task's stacks one after another in a thread's slice (tasks run one at a time,
        so they share it): offsets, the stride (the largest task), the slices (the most
        threads of any task, at least one); then the heap and the ctx words."""
        heaps = len(stacks.layout.heaps)
        used = [["0"] * len(threads) for _ in range(heaps)]
        offsets = []
        for cap, task, entry, heap in zip(caps, stacks.stack_task, stacks.entry_bytes, stacks.heap_of):
            offsets.append(used[heap][task])
            if _is_literal(cap):
                size = str(stacks.layout.stack_bytes(int(cap), entry))
            else:
                size = self._assign(stacks.layout.stack_bytes_source(cap, entry))
            used[heap][task] = self._sum(used[heap][task], size)
        if heaps == 1:
            lines = [f"stride = {self._max_of(used[0])}", f"slices = {self._max_of(threads + ['1'])}",
                     "_bound = _grow(stride * slices)", "w = _w", f"w[{slot}] = _heap.ptr", f"w[{slot + 1}] = stride"]
        else:  # SPIR-V: a float and an int heap, their addresses in the first two words; the invocations
            # they hold lowered to what one binding spans (`_fit`: the shader's grid-stride loop
            # gives the invocations past it no iteration)
            lines = [f"stride = {self._max_of(used[0])}", f"stride1 = {self._max_of(used[1])}",
                     f"slices = _fit(stride, stride1, {self._max_of(threads + ['0'])})",
                     "_bound = _grow(stride, stride1, slices)",
                     "w = _w", f"w[{slot}] = _heap.ptr", f"w[{slot + 1}] = _heap.ptr1"]
        for i, (offset, cap) in enumerate(zip(offsets, caps)):
            lines += [f"w[{slot + 3 + 2 * i}] = {offset}", f"w[{slot + 4 + 2 * i}] = {cap}"]
        self.lines += lines + [f"w[{slot + 3 + 2 * len(caps)}] = slices"]

    def _sum(self, a: str, b: str) -> str:
        if _is_literal(a) and _is_literal(b):
            return str(int(a) + int(b))
        return b if a == "0" else self._assign(f"{a} + {b}")

    def _max_of(self, items: list) -> str:
        literals = [int(i) for i in items if _is_literal(i)]
        names = list(dict.fromkeys(i for i in items if not _is_literal(i)))
        if literals:
            names.append(str(max(literals)))
        if len(names) == 1:
            return names[0]
        if len(names) == 2:
            return self._assign(f"{names[0]} if {names[0]} > {names[1]} else {names[1]}")
        return self._assign(f"max({', '.join(names)})")

    # ---- values ---------------------------------------------------------------------------
    def _emit_leaves(self, e: se.SizeExpr) -> None:
        """Emit every leaf of `e` (reads of launch data) before the arithmetic on them."""
        if isinstance(e, _LEAVES):
            if e not in self.values:
                self._value(e)
                self.leaves.append(self.values[e][0])
            return
        for c in e.children:
            self._emit_leaves(c)

    def _assign(self, expression: str) -> str:
        name = f"v{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {expression}")
        return name

    def _value(self, e: se.SizeExpr) -> tuple:
        """(python expression, lo, hi) of `e`; lo..hi holds every value it takes."""
        known = self.values.get(e)
        if known is None:
            known = self.values[e] = self._translate(e)
        return known

    def _translate(self, e: se.SizeExpr) -> tuple:
        t = type(e)
        if t is se.Const:
            return str(e.value), e.value, e.value
        if t is se.ScalarArg:
            self.uses_args = True
            lo, hi = dtype_range(self.meta.params[e.arg].dtype)
            text = f"_index(a[{e.arg}])"
            if self.meta.params[e.arg].dtype == "u64":
                text = f"min({text}, {INT64_MAX})"
            return self._assign(text), lo, hi
        if t is se.NdarrayShape:
            self.uses_args = True
            return self._assign(f"a[{e.arg}].shape[{e.axis}]"), 0, INT64_MAX
        if t is se.FieldLoad:
            return self._field_read(e)
        if t is se.NdarrayRead:
            self.uses_args = True
            lo, hi = dtype_range(self.meta.params[e.arg].dtype)
            idx = "".join(self._value(i)[0] + ", " for i in e.indices)
            return self._assign(f"_read(a[{e.arg}], ({idx}))"), min(lo, 0), max(hi, 0)
        if t is se.MaxOverRange or t is se.SumOverRange:
            self.uses_env = True
            self.max_overs.append(e)
            return self._assign(f"_mor({len(self.max_overs) - 1}, env)"), 0, INT64_MAX
        return self._arithmetic(e)

    def _field_read(self, e: se.FieldLoad) -> tuple:
        f = self.meta.fields[e.slot]
        lo, hi = dtype_range(f.dtype)
        lo, hi = min(lo, 0), max(hi, 0)  # a read outside the field is 0
        indices = [self._value(i) for i in e.indices]
        self.fields_read.add(e.slot)
        if all(_is_literal(i[0]) for i in indices):
            flat = _flat_index([int(i[0]) for i in indices], f.shape)
            if flat is None:
                return "0", 0, 0
            text = f"_f{e.slot}[{flat}]"
        else:
            self.field_readers.add(e.slot)
            text = f"_rf{e.slot}({''.join(i[0] + ', ' for i in indices)})"
        if f.dtype == "u64":
            text = f"min({text}, {INT64_MAX})"
        return self._assign(text), lo, hi

    def _arithmetic(self, e) -> tuple:
        (a, alo, ahi), (b, blo, bhi) = self._value(e.a), self._value(e.b)
        t = type(e)
        if t is se.Max:
            return self._assign(f"{a} if {a} >= {b} else {b}"), max(alo, blo), max(ahi, bhi)
        if t is se.Add:
            lo, hi = alo + blo, ahi + bhi
            name = self._assign(f"{a} + {b}")
        elif t is se.Sub:
            lo, hi = alo - bhi, ahi - blo
            name = self._assign(f"{a} - {b}")
        else:
            products = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
            lo, hi = min(products), max(products)
            name = self._assign(f"{a} * {b}")
        if hi > INT64_MAX:
            self.lines.append(f"if {name} > {INT64_MAX}: {name} = {INT64_MAX}")
        if t is se.Sub:
            if lo < 0:
                self.lines.append(f"if {name} < 0: {name} = 0")
            return name, max(lo, 0), min(max(hi, 0), INT64_MAX)
        if lo < INT64_MIN:
            self.lines.append(f"if {name} < {INT64_MIN}: {name} = {INT64_MIN}")
        return name, max(lo, INT64_MIN), min(hi, INT64_MAX)


_LEAVES = (se.ScalarArg, se.NdarrayShape, se.FieldLoad, se.NdarrayRead, se.MaxOverRange, se.SumOverRange)


def _is_literal(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _flat_index(idx: list, shape) -> int | None:
    """Row-major position of `idx` in `shape`, None when outside it."""
    flat = 0
    for i, n in zip(idx, shape):
        if not 0 <= i < n:
            return None
        flat = flat * n + i
    return flat


def field_reader(view, shape):
    """`read(*idx)` of a field element at computed indices (0 outside the field)."""
    shape = tuple(shape)

    def read(*idx):
        flat = _flat_index(idx, shape)
        return 0 if flat is None else view[flat]
    return read


def ndarray_read(array, idx: tuple) -> int:
    """One element of an ndarray argument (numpy or qdc) as sizeexpr_eval.evaluate reads it."""
    arr = host_array(array)
    if len(idx) != arr.ndim or any(not 0 <= i < n for i, n in zip(idx, arr.shape)):
        return 0
    value = int(arr[idx])
    return INT64_MAX if value > INT64_MAX else value


index = operator.index
