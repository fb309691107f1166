"""Adstack capacities as symbolic expressions (`SizeExpr`), evaluated right before a launch.

The compiler (compiler/autodiff/sizeexpr_builder.py) captures, per adstack, an upper bound of
its depth as a tree over launch-time data; the runtime evaluates it against the live launch and
sizes the adstack heap exactly. This module is the runtime half and the shared format: it
imports only numpy and runtime modules.

Nodes (immutable, compared and hashed structurally):

    Const(value)                       an integer literal
    ScalarArg(arg)                     scalar kernel argument number `arg`
    FieldLoad(slot, indices)           element of the kernel's field number `slot`
    NdarrayShape(arg, axis)            `shape[axis]` of ndarray argument `arg`
    NdarrayRead(arg, indices)          element of ndarray argument `arg`
    TempRead(slot, dtype)              kernel temporary `slot` as an earlier task of the same
                                       launch left it (dtype: index in TEMP_DTYPES; the value
                                       sits in the low bytes of the slot's 8-byte word), read
                                       from device memory with a ranged read; only task
                                       iteration counts use it, and they are evaluated
                                       only once the tasks before the reading task have run
    BoundVariable(var)                 the variable bound by an enclosing Max/SumOverRange
    Add(a, b)  Sub(a, b)  Mul(a, b)  Max(a, b)
    MaxOverRange(var, begin, end, body)  max(0, max of `body` for var in [begin, end))
    SumOverRange(var, begin, end, body)  max(0, sum of `body` for var in [begin, end))

Indices are themselves expressions (constants, arguments, bound variables, arithmetic).
Arithmetic is int64 and saturating; `Sub` and the ranges clamp at 0 (they model counts,
and an empty range counts 0); an element index outside its array reads as 0 (the kernel
cannot legally read it). min(a, b), which has no node, is written `a + b - max(a, b)`.

API
    to_nodes(expr) -> list           post-order node list for msgpack, root last
    from_nodes(nodes) -> SizeExpr    validates a list read from disk; [] -> None, meaning
                                     "no tree: use the compile-time size"
    to_text(expr, arg_names=None, field_names=None) -> str   readable form (`qdc inspect`)
    walk(expr)                       every distinct node, children first
    evaluate(expr_or_nodes, env) -> int   the bound for this launch, in [0, 2**63 - 1]
    LaunchEnv(args, fields, temps=None)   the `env` of a launch (see its docstring); any
                                     object with the same methods works
    reads_temps(expr) -> bool        whether `expr` reads a kernel temporary (TempRead)
A serialized node is `[kind, [attributes], [child positions]]`, e.g. `["add", [], [0, 1]]`.

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

from .. import context
from .errors import QdcError

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
_MAGNITUDE_CAP = 1 << 63  # the largest |value| of a saturated int64: |INT64_MIN|
# Evaluation budgets per `evaluate` call: elements visited with numpy, and iterations of the
# Python loop (each costs microseconds, so that limit keeps the worst case around a second).
MAX_VECTOR_ELEMENTS = 1 << 28
MAX_SCALAR_ITERATIONS = 1 << 18
_CHUNK = 1 << 14  # values per numpy chunk: 128 KiB int64 arrays stay under malloc's mmap
# threshold, so chunks reuse memory instead of faulting in fresh pages (measured 3x faster)
MAX_NODES = 1 << 16  # also the limit once shared subtrees are expanded: evaluation expands them
_MAX_INDICES = 16
MAX_DEPTH = 200  # evaluation and printing recurse; the builder never nests this deep


class SizeExprError(QdcError):
    """An adstack size expression cannot be evaluated for this launch."""


def _clamp(x: int) -> int:
    return INT64_MAX if x > INT64_MAX else INT64_MIN if x < INT64_MIN else x


# ---- nodes --------------------------------------------------------------------------------

class SizeExpr:
    """Base node: `args` are plain ints, `children` are nodes. Subclasses fix both."""
    KIND = ""
    ARITY: int | None = 0  # number of children; None: any (the indices of a read)
    NUM_ARGS = 0
    __slots__ = ("args", "children", "free_vars", "max_over_vars", "depth", "size", "_hash")

    def __init__(self, args: tuple, children: tuple):
        self.args = args
        self.children = children
        free = frozenset().union(*(c.free_vars for c in children))
        self.free_vars = self._own_free_vars(free)
        # Free variables of every Max/SumOverRange in this subtree: a body can be evaluated
        # with numpy over variable v only if no range inside it depends on v.
        self.max_over_vars = frozenset().union(*(c.max_over_vars for c in children))
        self.depth = 1 + max((c.depth for c in children), default=0)
        self.size = min(1 + sum(c.size for c in children), 1 << 62)  # shared subtrees counted each time
        self._hash = hash((self.KIND, args, children))

    def _own_free_vars(self, from_children: frozenset) -> frozenset:
        return from_children

    def __eq__(self, other):
        return self is other or (type(self) is type(other) and self._hash == other._hash
                                 and self.args == other.args and self.children == other.children)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"<SizeExpr {to_text(self)}>"


class Const(SizeExpr):
    KIND, NUM_ARGS = "const", 1
    __slots__ = ()

    def __init__(self, value: int):
        super().__init__((_clamp(int(value)),), ())

    @property
    def value(self) -> int:
        return self.args[0]


class ScalarArg(SizeExpr):
    KIND, NUM_ARGS = "arg", 1
    __slots__ = ()

    def __init__(self, arg: int):
        super().__init__((arg,), ())

    @property
    def arg(self) -> int:
        return self.args[0]


class NdarrayShape(SizeExpr):
    KIND, NUM_ARGS = "shape", 2
    __slots__ = ()

    def __init__(self, arg: int, axis: int):
        super().__init__((arg, axis), ())

    @property
    def arg(self) -> int:
        return self.args[0]

    @property
    def axis(self) -> int:
        return self.args[1]


class _Read(SizeExpr):
    ARITY, NUM_ARGS = None, 1
    __slots__ = ()

    def __init__(self, source: int, indices):
        super().__init__((source,), tuple(indices))

    @property
    def indices(self) -> tuple:
        return self.children


class FieldLoad(_Read):
    KIND = "field"
    __slots__ = ()

    @property
    def slot(self) -> int:
        return self.args[0]


class NdarrayRead(_Read):
    KIND = "read"
    __slots__ = ()

    @property
    def arg(self) -> int:
        return self.args[0]


# The integer types a kernel temporary can hold, by the index a TempRead stores.
TEMP_DTYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "u1")


class TempRead(SizeExpr):
    KIND, NUM_ARGS = "temp", 2
    __slots__ = ()

    def __init__(self, slot: int, dtype: int):
        super().__init__((slot, dtype), ())

    @property
    def slot(self) -> int:
        return self.args[0]

    @property
    def dtype(self) -> str:
        return TEMP_DTYPES[self.args[1]]


def reads_temps(expr) -> bool:
    """Whether `expr` reads a kernel temporary: then it has a value only once the earlier
    tasks of the launch have run (adstack sizing, before the launch, cannot evaluate it)."""
    return expr is not None and any(isinstance(e, TempRead) for e in walk(expr))


class BoundVariable(SizeExpr):
    KIND, NUM_ARGS = "var", 1
    __slots__ = ()

    def __init__(self, var: int):
        super().__init__((var,), ())

    def _own_free_vars(self, from_children):
        return frozenset((self.args[0],))

    @property
    def var(self) -> int:
        return self.args[0]


class _Binary(SizeExpr):
    ARITY = 2
    __slots__ = ()

    def __init__(self, a: SizeExpr, b: SizeExpr):
        super().__init__((), (a, b))

    @property
    def a(self) -> SizeExpr:
        return self.children[0]

    @property
    def b(self) -> SizeExpr:
        return self.children[1]


class Add(_Binary):
    KIND = "add"
    __slots__ = ()


class Sub(_Binary):
    """max(a - b, 0)."""
    KIND = "sub"
    __slots__ = ()


class Mul(_Binary):
    KIND = "mul"
    __slots__ = ()


class Max(_Binary):
    KIND = "max"
    __slots__ = ()


class _OverRange(SizeExpr):
    ARITY, NUM_ARGS = 3, 1
    __slots__ = ()

    def __init__(self, var: int, begin: SizeExpr, end: SizeExpr, body: SizeExpr):
        super().__init__((var,), (begin, end, body))
        self.max_over_vars = self.max_over_vars | self.free_vars

    def _own_free_vars(self, from_children):
        begin, end, body = self.children
        return begin.free_vars | end.free_vars | (body.free_vars - {self.args[0]})

    @property
    def var(self) -> int:
        return self.args[0]

    @property
    def begin(self) -> SizeExpr:
        return self.children[0]

    @property
    def end(self) -> SizeExpr:
        return self.children[1]

    @property
    def body(self) -> SizeExpr:
        return self.children[2]


class MaxOverRange(_OverRange):
    KIND = "max_over"
    __slots__ = ()


class SumOverRange(_OverRange):
    """max(0, sum of `body` for var in [begin, end)): the pushes of a loop whose body's count
    depends on its index (`for j in range(i)` under `for i in range(n)`: n(n-1)/2)."""
    KIND = "sum_over"
    __slots__ = ()


_KINDS = {cls.KIND: cls for cls in (Const, ScalarArg, FieldLoad, NdarrayShape, NdarrayRead, TempRead,
                                    BoundVariable, Add, Sub, Mul, Max, MaxOverRange, SumOverRange)}


def walk(expr: SizeExpr):
    """Every distinct node of `expr`, children before parents."""
    seen: set = set()
    stack = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if expanded:
            yield e
        elif e not in seen:
            seen.add(e)
            stack.append((e, True))
            stack.extend((c, False) for c in reversed(e.children))


# ---- serialization ------------------------------------------------------------------------

def to_nodes(expr: SizeExpr | None) -> list:
    """Post-order list of `[kind, [args], [child positions]]`, root last; a subtree that occurs
    several times is stored once. None (no tree) gives []."""
    if expr is None:
        return []
    nodes: list = []
    position: dict = {}

    def emit(e: SizeExpr) -> int:
        if e in position:
            return position[e]
        kids = [emit(c) for c in e.children]
        nodes.append([e.KIND, list(e.args), kids])
        position[e] = len(nodes) - 1
        return position[e]

    emit(expr)
    return nodes


def from_nodes(nodes) -> SizeExpr | None:
    """The tree of a node list (from a cache file: everything is checked, ValueError on any
    malformation); [] -> None."""
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise ValueError("malformed SizeExpr: expected a list of at most %d nodes" % MAX_NODES)
    built: list[SizeExpr] = []
    for pos, node in enumerate(nodes):
        built.append(_node_from_list(node, pos, built))
    if not built:
        return None
    root = built[-1]
    if root.depth > MAX_DEPTH or root.size > MAX_NODES:
        raise ValueError(f"malformed SizeExpr: {root.size} nodes nested {root.depth} deep once shared "
                         f"subtrees are expanded (limits {MAX_NODES} and {MAX_DEPTH})")
    if root.free_vars:
        raise ValueError(f"malformed SizeExpr: bound variable(s) {sorted(root.free_vars)} used outside "
                         f"any max_over")
    return root


def _node_from_list(node, pos: int, built: list) -> SizeExpr:
    def bad(why):
        return ValueError(f"malformed SizeExpr node {pos} ({node!r:.80}): {why}")

    if not (isinstance(node, list) and len(node) == 3 and isinstance(node[0], str)
            and isinstance(node[1], list) and isinstance(node[2], list)):
        raise bad("expected [kind, [args], [children]]")
    kind, args, kids = node
    cls = _KINDS.get(kind)
    if cls is None:
        raise bad(f"unknown kind {kind!r}")
    if len(args) != cls.NUM_ARGS or not all(type(a) is int for a in args):
        raise bad(f"'{kind}' takes {cls.NUM_ARGS} integer attribute(s)")
    if cls is not Const and any(a < 0 or a > INT64_MAX for a in args):
        raise bad("attributes must be non-negative")
    if cls is TempRead and args[1] >= len(TEMP_DTYPES):
        raise bad(f"temporary dtype {args[1]} is not one of {len(TEMP_DTYPES)}")
    arity_ok = len(kids) <= _MAX_INDICES if cls.ARITY is None else len(kids) == cls.ARITY
    if not arity_ok or not all(type(k) is int and 0 <= k < pos for k in kids):
        raise bad("children must name earlier nodes, in the right number")
    children = [built[k] for k in kids]
    if cls.ARITY is None:
        return cls(args[0], children)
    return cls(*args, *children)


# ---- readable text ------------------------------------------------------------------------

_VAR_NAMES = "jklmpqrstuvw"


def to_text(expr: SizeExpr | None, arg_names=None, field_names=None) -> str:
    """E.g. `max_over(j in [0, shape(arg0,0)): read(arg1[j])) * 2 + 1`. `arg_names` and
    `field_names` (lists) replace `argN` / `fieldN`; `a + b - max(a, b)` prints as min(a, b)."""
    if expr is None:
        return "(no expression: the compile-time size)"
    return _Printer(arg_names, field_names).text(expr)[0]


class _Printer:
    def __init__(self, arg_names, field_names):
        self.arg_names, self.field_names = arg_names, field_names
        self.var_names: dict = {}

    def arg(self, i):
        return self.arg_names[i] if self.arg_names and i < len(self.arg_names) else f"arg{i}"

    def field(self, i):
        return self.field_names[i] if self.field_names and i < len(self.field_names) else f"field{i}"

    def var(self, v):
        if v not in self.var_names:
            n = len(self.var_names)
            self.var_names[v] = _VAR_NAMES[n] if n < len(_VAR_NAMES) else f"v{n}"
        return self.var_names[v]

    def text(self, e: SizeExpr) -> tuple[str, int]:
        """(text, precedence): 1 for + and -, 2 for *, 3 for atoms."""
        if isinstance(e, Const):
            return str(e.value), 3
        if isinstance(e, ScalarArg):
            return self.arg(e.arg), 3
        if isinstance(e, NdarrayShape):
            return f"shape({self.arg(e.arg)},{e.axis})", 3
        if isinstance(e, BoundVariable):
            return self.var(e.var), 3
        if isinstance(e, TempRead):
            return f"temp{e.slot}:{e.dtype}", 3
        if isinstance(e, (FieldLoad, NdarrayRead)):
            idx = ", ".join(self.text(i)[0] for i in e.indices) or "None"
            return (f"{self.field(e.slot)}[{idx}]" if isinstance(e, FieldLoad)
                    else f"read({self.arg(e.arg)}[{idx}])"), 3
        if isinstance(e, _OverRange):
            name = self.var(e.var)
            return (f"{e.KIND}({name} in [{self.text(e.begin)[0]}, {self.text(e.end)[0]}): "
                    f"{self.text(e.body)[0]})"), 3
        if isinstance(e, Max):
            return f"max({self.text(e.a)[0]}, {self.text(e.b)[0]})", 3
        pair = min_operands(e)
        if pair is not None:
            return f"min({self.text(pair[0])[0]}, {self.text(pair[1])[0]})", 3
        op, prec = {Add: ("+", 1), Sub: ("-", 1), Mul: ("*", 2)}[type(e)]
        left = self.operand(e.a, prec, strict=False)
        right = self.operand(e.b, prec, strict=not isinstance(e, Add))
        return f"{left} {op} {right}", prec

    def operand(self, e, prec, strict):
        text, p = self.text(e)
        return f"({text})" if p < prec or (strict and p == prec) else text


def min_operands(e: SizeExpr):
    """(a, b) when `e` is min(a, b) written as a + b - max(a, b), else None."""
    if (isinstance(e, Sub) and isinstance(e.a, Add) and isinstance(e.b, Max)
            and {e.a.a, e.a.b} == {e.b.a, e.b.b}):
        return e.a.a, e.a.b
    return None


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
            arr = self._arrays[key] = _host_array(obj)
        return arr


def read_element(obj, idx) -> int:
    """Element `idx` of a numpy array or qdc field/ndarray as an int (0 outside it, a u64
    past int64 saturated): a ranged read of that one element where memory is the device's."""
    idx = tuple(idx)
    if len(idx) != len(obj.shape) or any(not 0 <= i < n for i, n in zip(idx, obj.shape)):
        return 0
    value = obj[idx] if isinstance(obj, np.ndarray) else obj._read_element(idx)
    return _clamp(int(value))


def _host_array(obj) -> np.ndarray:
    """A host numpy view of a field/ndarray without copying where the device shares memory."""
    if isinstance(obj, np.ndarray):
        return obj
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
        outer = self.vector_var, self.span
        try:
            self.vector_var = var
            for lo in range(begin, end, _CHUNK):
                self.span = lo, min(end, lo + _CHUNK)
                inner = dict(bind)
                inner[var] = np.arange(*self.span, dtype=np.int64)
                best = max(best, int(np.max(self.vector(body, inner)[0])))
        finally:
            self.vector_var, self.span = outer
        return best

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
        outer = self.vector_var, self.span
        try:
            self.vector_var = var
            for lo in range(begin, end, _CHUNK):
                self.span = lo, min(end, lo + _CHUNK)
                inner = dict(bind)
                inner[var] = np.arange(*self.span, dtype=np.int64)
                values, magnitude = self.vector(body, inner)
                values = np.broadcast_to(values, (self.span[1] - lo,))
                if magnitude * len(values) <= INT64_MAX:
                    total += int(np.sum(values))
                else:  # the int64 sum could wrap: add exactly
                    total += sum(values.tolist())
        finally:
            self.vector_var, self.span = outer
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
