"""Evaluating adstack capacities and trip counts (contract/sizeexpr.py's `SizeExpr` trees)
against a live launch: the runtime's half of the format the compiler writes.

    evaluate(expr_or_nodes, env) -> int   the bound for this launch, in [0, 2**63 - 1]
    LaunchEnv(args, fields, temps=None)   the `env` of a launch (see its docstring); any
                                          object with the same methods works

Semantics are the format's: int64 arithmetic that saturates, `Sub` and the ranges clamped at
0, an element index outside its array read as 0.

Cost: a tree that reads only arguments, shapes and constants touches no array memory. A
MaxOverRange over a read indexed by its variable is one `np.max` over a slice; a sum of the
variable itself is the arithmetic series; other bodies are evaluated with numpy over chunks
of the range. Only a range whose body holds another range depending on its variable iterates
in Python. Every range is charged against a budget and evaluation stops with
`SizeExprError` rather than appear to hang.
"""
from __future__ import annotations

import operator

import numpy as np

from . import context, external_arrays
from .contract.sizeexpr import (INT64_MAX, INT64_MIN, Add, BoundVariable, Const, FieldLoad, Max, MaxOverRange,
                                Mul, NdarrayRead, NdarrayShape, ScalarArg, SizeExpr, SizeExprError, Sub,
                                SumOverRange, TempRead, clamp_int64 as _clamp, from_nodes, to_text)

_MAGNITUDE_CAP = 1 << 63  # the largest |value| of a saturated int64: |INT64_MIN|
# Evaluation budgets per `evaluate` call: elements visited with numpy, and iterations of the
# Python loop (each costs microseconds, so that limit keeps the worst case around a second).
MAX_VECTOR_ELEMENTS = 1 << 28
MAX_SCALAR_ITERATIONS = 1 << 18
_CHUNK = 1 << 14  # values per numpy chunk: 128 KiB int64 arrays stay under malloc's mmap
# threshold, so chunks reuse memory instead of faulting in fresh pages (measured 3x faster)


# ---- launch data ----------------------------------------------------------------------------

class LaunchEnv:
    """What a tree reads at launch. `args` are the launch's arguments in kernel-parameter order
    (ints for scalars; numpy arrays or qdc ndarrays for ndarrays); `fields` are the kernel's
    fields in its field-table order (qdc fields or numpy arrays); `temps(slot, dtype)`, if
    given, reads a kernel temporary of this launch (TempRead). A single element is read on
    its own (a ranged read of device memory); a range over an array fetches the array once
    per env; shapes never touch memory."""

    def __init__(self, args, fields=(), temps=None):
        self.args, self.fields, self.temps = args, fields, temps
        self._arrays: dict = {}

    def scalar_arg(self, arg: int) -> int:
        value = self.args[arg]
        try:
            return operator.index(value)
        except TypeError:
            raise SizeExprError(f"argument {arg} bounds an adstack and must be an integer, got "
                                f"{type(value).__name__} {value!r:.40}") from None

    def ndarray_shape(self, arg: int, axis: int) -> int:
        return self.args[arg].shape[axis]

    def ndarray_array(self, arg: int) -> np.ndarray:
        return self._array(("arg", arg), self.args[arg])

    def field_array(self, slot: int) -> np.ndarray:
        return self._array(("field", slot), self.fields[slot])

    def ndarray_element(self, arg: int, idx: list) -> int:
        return read_element(self.args[arg], idx)

    def field_element(self, slot: int, idx: list) -> int:
        return read_element(self.fields[slot], idx)

    def temp_value(self, slot: int, dtype: str) -> int:
        if self.temps is None:
            raise SizeExprError(f"the expression reads kernel temporary {slot}, which an earlier task of the "
                                f"launch computes: it has no value before the launch")
        return self.temps(slot, dtype)

    def _array(self, key, obj) -> np.ndarray:
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = host_array(obj)
        return arr


def read_element(obj, idx) -> int:
    """Element `idx` of a numpy array or qdc field/ndarray as an int (0 outside it, a u64
    past int64 saturated): a ranged read of that one element where memory is the device's."""
    idx = tuple(idx)
    if len(idx) != len(obj.shape) or any(not 0 <= i < n for i, n in zip(idx, obj.shape)):
        return 0
    if isinstance(obj, np.ndarray) or not hasattr(obj, "_read_element"):  # numpy, a tensor, a DLPack array
        return _clamp(int(host_array(obj)[idx]))
    return _clamp(int(obj._read_element(idx)))


def host_array(obj) -> np.ndarray:
    """A host numpy view of a field/ndarray (or a tensor's, a DLPack array's) without copying
    where the device shares memory."""
    if isinstance(obj, np.ndarray):
        return obj
    if not hasattr(obj, "_host_view"):
        return external_arrays.readable(obj)
    view = obj._host_view()  # runtime-internal accessor of fields.py: no copy on the CPU
    if view is None:
        return obj.to_numpy()
    context.current().device.sync()  # the previous launch may still be writing it
    return view


# ---- evaluation ----------------------------------------------------------------------------

def evaluate(expr, env) -> int:
    """The value of `expr` (a SizeExpr or a non-empty node list) for this launch, clamped to
    [0, 2**63 - 1]. Raises SizeExprError when a range is too long to scan."""
    if not isinstance(expr, SizeExpr):
        expr = from_nodes(expr)
        if expr is None:
            raise ValueError("an empty SizeExpr has no value: use the compile-time size")
    value = _Evaluation(env, expr).scalar(expr, {})
    return max(0, value)


class _Evaluation:
    """One evaluation: the env, the budgets, and the memo of variable-free subtrees."""

    def __init__(self, env, root: SizeExpr):
        self.env, self.root = env, root
        self.elements_left = MAX_VECTOR_ELEMENTS
        self.iterations_left = MAX_SCALAR_ITERATIONS
        # Variable-free subtrees repeat inside a range's iterations: remembered from the first
        # range on (None until then, which keeps trees without ranges at a few microseconds).
        self.memo: dict | None = None
        self.vector_var = None
        self.span = (0, 0)  # the values [lo, hi) `vector_var` takes in the current chunk

    # -- scalar mode: every bound variable has one value ------------------------------------
    def scalar(self, e: SizeExpr, bind: dict) -> int:
        if self.memo is not None and not e.free_vars:
            value = self.memo.get(e)
            if value is None:
                value = self.memo[e] = self._scalar(e, bind)
            return value
        return self._scalar(e, bind)

    def _scalar(self, e, bind) -> int:
        t = type(e)
        if t is Const:
            return e.value
        if t is BoundVariable:
            return bind[e.var]
        if t is ScalarArg:
            return _clamp(self.env.scalar_arg(e.arg))
        if t is NdarrayShape:
            return self.env.ndarray_shape(e.arg, e.axis)
        if t is FieldLoad:
            return self.env.field_element(e.slot, [self.scalar(i, bind) for i in e.indices])
        if t is NdarrayRead:
            return self.env.ndarray_element(e.arg, [self.scalar(i, bind) for i in e.indices])
        if t is TempRead:
            return _clamp(self.env.temp_value(e.slot, e.dtype))
        if t is MaxOverRange:
            return self._max_over(e, bind)
        if t is SumOverRange:
            return self._sum_over(e, bind)
        a, b = self.scalar(e.a, bind), self.scalar(e.b, bind)
        if t is Add:
            return _clamp(a + b)
        if t is Sub:
            return max(_clamp(a - b), 0)
        if t is Mul:
            return _clamp(a * b)
        return a if a >= b else b

    def _array(self, e) -> np.ndarray:
        if isinstance(e, FieldLoad):
            return self.env.field_array(e.slot)
        return self.env.ndarray_array(e.arg)

    def _max_over(self, e: MaxOverRange, bind: dict) -> int:
        begin, end = self.scalar(e.begin, bind), self.scalar(e.end, bind)
        if end <= begin:
            return 0
        if self.memo is None:
            self.memo = {}
        var, body = e.var, e.body
        if var not in body.free_vars:
            return max(0, self.scalar(body, bind))
        if type(body) is BoundVariable:
            return max(0, end - 1)
        if var in body.max_over_vars:
            return max(0, max(self._range_values(e, begin, end, bind), default=0))
        self._charge_elements(e, end - begin)
        sliced = self._slice_max(body, var, begin, end, bind)
        if sliced is not None:
            return sliced
        best = 0
        for inner in self._chunks(var, begin, end, bind):
            best = max(best, int(np.max(self.vector(body, inner)[0])))
        return best

    def _chunks(self, var, begin: int, end: int, bind: dict):
        """`bind` with `var` bound to each chunk of [begin, end) in turn, as an int64 vector
        (`self.span` is the chunk's range while the caller evaluates it)."""
        outer = self.vector_var, self.span
        try:
            self.vector_var = var
            for lo in range(begin, end, _CHUNK):
                self.span = lo, min(end, lo + _CHUNK)
                yield {**bind, var: np.arange(*self.span, dtype=np.int64)}
        finally:
            self.vector_var, self.span = outer

    def _sum_over(self, e: SumOverRange, bind: dict) -> int:
        begin, end = self.scalar(e.begin, bind), self.scalar(e.end, bind)
        if end <= begin:
            return 0
        if self.memo is None:
            self.memo = {}
        var, body, count = e.var, e.body, end - begin
        if var not in body.free_vars:
            return max(0, _clamp(count * self.scalar(body, bind)))
        if type(body) is BoundVariable:
            return max(0, _clamp((begin + end - 1) * count // 2))
        if var in body.max_over_vars:
            return max(0, _clamp(sum(self._range_values(e, begin, end, bind))))
        self._charge_elements(e, count)
        total = 0
        for inner in self._chunks(var, begin, end, bind):
            values, magnitude = self.vector(body, inner)
            values = np.broadcast_to(values, (self.span[1] - self.span[0],))
            if magnitude * len(values) <= INT64_MAX:
                total += int(np.sum(values))
            else:  # the int64 sum could wrap: add exactly
                total += sum(values.tolist())
        return max(0, _clamp(total))

    def _range_values(self, e, begin, end, bind):
        """The body's values over the range, one Python iteration each (charged first)."""
        count = end - begin
        if count > self.iterations_left:
            self._too_long(e, count, MAX_SCALAR_ITERATIONS, "Python-level iterations")
        self.iterations_left -= count
        inner = dict(bind)
        for v in range(begin, end):
            inner[e.var] = v
            yield self.scalar(e.body, inner)

    def _charge_elements(self, e, count):
        if count > self.elements_left:
            self._too_long(e, count, MAX_VECTOR_ELEMENTS, "values")
        self.elements_left -= count

    def _too_long(self, e, count, limit, what):
        raise SizeExprError(
            f"sizing an adstack would scan {count} {what} of `{to_text(e)}` (limit {limit} per launch, "
            f"in `{to_text(self.root)}`). The loop bound it comes from ranges over too many values to "
            f"evaluate at launch: bound the loop by a scalar argument, field or ndarray shape, or fix "
            f"the capacity with qd.init(ad_stack_size=N).")

    def _slice_max(self, body, var, begin, end, bind):
        """`max(arr[..., begin:end, ...])` when `body` reads an array at `var` on one axis and at
        values independent of `var` on the others; None if `body` is not of that shape."""
        if not isinstance(body, (FieldLoad, NdarrayRead)):
            return None
        var_axes = [d for d, i in enumerate(body.indices) if var in i.free_vars]
        if len(var_axes) != 1 or body.indices[var_axes[0]] != BoundVariable(var):
            return None
        axis = var_axes[0]
        arr = self._array(body)
        idx = [None if d == axis else self.scalar(i, bind) for d, i in enumerate(body.indices)]
        if len(idx) != arr.ndim or any(i is not None and not 0 <= i < n for i, n in zip(idx, arr.shape)):
            return 0  # every element read is out of bounds
        lo, hi = max(begin, 0), min(end, arr.shape[axis])  # reads outside give 0: no need to visit
        if hi <= lo:
            return 0
        idx[axis] = slice(lo, hi)
        return max(0, _clamp(int(np.max(arr[tuple(idx)]))))

    # -- vector mode: `vector_var` is bound to the int64 array of `span` --------------------
    # Values come with a bound on their magnitude, known from array dtypes and the span: while
    # it stays below 2**63 plain numpy arithmetic cannot overflow and saturation is skipped.
    def vector(self, e: SizeExpr, bind: dict) -> tuple:
        if self.vector_var not in e.free_vars:
            value = self.scalar(e, bind)
            return value, abs(value)
        t = type(e)
        if t is BoundVariable:
            return bind[e.var], max(abs(self.span[0]), abs(self.span[1]))
        if t is FieldLoad or t is NdarrayRead:
            return self._read_vector(e, bind)
        (a, ma), (b, mb) = self.vector(e.a, bind), self.vector(e.b, bind)
        if t is Max:
            return np.maximum(a, b), max(ma, mb)
        if t is Mul:
            m = ma * mb
            return (a * b if m <= INT64_MAX else _sat_mul(a, b)), min(m, _MAGNITUDE_CAP)
        m = ma + mb
        if t is Add:
            return (a + b if m <= INT64_MAX else _sat_add(a, b)), min(m, _MAGNITUDE_CAP)
        return np.maximum(a - b if m <= INT64_MAX else _sat_sub(a, b), 0), min(m, INT64_MAX)

    def _read_vector(self, e, bind) -> tuple:
        arr = self._array(e)
        magnitude = _dtype_magnitude(arr.dtype)
        var = self.vector_var
        axes = [d for d, i in enumerate(e.indices) if var in i.free_vars]
        offset = _unit_offset(e.indices[axes[0]], var) if len(axes) == 1 else None
        if offset is None or len(e.indices) != arr.ndim:
            return _gather(arr, [self.vector(i, bind)[0] for i in e.indices]), magnitude
        # The lanes read consecutive elements along one axis: copy a slice, not a gather.
        axis = axes[0]
        lo, hi = self.span
        idx = [self.scalar(i, bind) if d != axis else None for d, i in enumerate(e.indices)]
        if any(i is not None and not 0 <= i < n for i, n in zip(idx, arr.shape)):
            return np.zeros(hi - lo, np.int64), 0
        first, stop = max(lo + offset, 0), min(hi + offset, arr.shape[axis])
        if first >= stop:
            return np.zeros(hi - lo, np.int64), 0
        idx[axis] = slice(first, stop)
        values = arr[tuple(idx)]
        if values.dtype == np.uint64:
            values = np.minimum(values, np.uint64(INT64_MAX))
        out = np.empty(hi - lo, np.int64)
        head, tail = first - lo - offset, stop - lo - offset
        out[:head] = 0
        out[head:tail] = values  # converts while copying: no temporary
        out[tail:] = 0
        return out, magnitude


def _unit_offset(index: SizeExpr, var: int):
    """c when `index` is var + c (c a constant), else None."""
    if index == BoundVariable(var):
        return 0
    if isinstance(index, Add):
        for x, y in ((index.a, index.b), (index.b, index.a)):
            if x == BoundVariable(var) and isinstance(y, Const):
                return y.value
    return None


def _dtype_magnitude(dtype) -> int:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return min(max(-int(info.min), int(info.max)), _MAGNITUDE_CAP)
    return 1 if dtype.kind == "b" else INT64_MAX


def _as_int64(values: np.ndarray) -> np.ndarray:
    if values.dtype == np.uint64:
        values = np.minimum(values, np.uint64(INT64_MAX))
    return values.astype(np.int64)


def _gather(arr: np.ndarray, idx: list) -> np.ndarray:
    """Elements at int64 index arrays (or ints); out-of-bounds positions read as 0."""
    shape = np.broadcast_shapes(*(np.shape(i) for i in idx))
    if len(idx) != arr.ndim or arr.size == 0:
        return np.zeros(shape, np.int64)
    valid = np.ones(shape, bool)
    for i, n in zip(idx, arr.shape):
        valid &= (np.asarray(i) >= 0) & (np.asarray(i) < n)
    safe = tuple(np.where(valid, i, 0) for i in idx)
    return np.where(valid, _as_int64(arr[safe]), 0)


# Saturating int64 arithmetic on arrays (numpy integer arrays wrap silently on overflow).

def _sat_add(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = a + b
    overflow = ((a ^ r) & (b ^ r)) < 0
    return np.where(overflow, np.where(a > 0, INT64_MAX, INT64_MIN), r)


def _sat_sub(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = a - b
    overflow = ((a ^ b) & (a ^ r)) < 0
    return np.where(overflow, np.where(a >= 0, INT64_MAX, INT64_MIN), r)


def _sat_mul(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = a * b
    divisor = np.where(a == 0, 1, a)
    overflow = (a != 0) & ((r // divisor != b) | ((a == -1) & (b == INT64_MIN)))
    positive = (a > 0) == (b > 0)
    return np.where(overflow, np.where(positive, INT64_MAX, INT64_MIN), r)


def simple_trip_count(tree):
    """`trips(args)` for a trip count computed from the launch's arguments alone: constants,
    integer arguments and ndarray extents combined by Add, Sub, Mul and Max (what `evaluate`
    gives for it, or None where an argument is not an integer, as `trip_count` says), as one
    generated Python function: a GPU kernel evaluates its tasks' trip counts at every launch,
    and walking the tree cost ~5 us a task. None for any other tree (reads of memory or
    temporaries, ranges: `evaluate` handles them)."""
    body = _python_of(tree)
    if body is None:
        return None
    source = (f"def trips(args):\n    try:\n        value = {body}\n"
              f"    except TypeError:\n        return None\n    return value if value > 0 else 0\n")
    names = {"_index": operator.index, "_clamp": _clamp}
    try:
        code = compile(source, "<qdc trip count>", "exec")
    except (SyntaxError, RecursionError, MemoryError):  # nested deeper than Python's parser takes
        return None
    exec(code, names)
    return names["trips"]


def _python_of(e) -> str | None:
    """The Python expression over `args` that computes `e` with the format's saturating int64
    arithmetic, or None where `e` reads anything but the arguments."""
    t = type(e)
    if t is Const:
        return repr(e.value)
    if t is NdarrayShape:
        return f"args[{e.arg}].shape[{e.axis}]"
    if t is ScalarArg:
        return f"_clamp(_index(args[{e.arg}]))"
    if t not in (Add, Sub, Mul, Max):
        return None
    a, b = _python_of(e.a), _python_of(e.b)
    if a is None or b is None:
        return None
    if t is Add:
        return f"_clamp({a} + {b})"
    if t is Mul:
        return f"_clamp({a} * {b})"
    if t is Sub:
        return f"max(_clamp({a} - {b}), 0)"
    return f"max({a}, {b})"
