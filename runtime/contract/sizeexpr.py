"""Adstack capacities as symbolic expressions (`SizeExpr`): the format of the contract.

The compiler (compiler/autodiff/sizeexpr_builder.py) captures, per adstack, an upper bound of
its depth as a tree over launch-time data; the runtime evaluates it against the live launch
(runtime/sizeexpr_eval.py) and sizes the adstack heap exactly. This module is the format both
sides share: the nodes, their serialized form and their readable text; it imports nothing
beyond the contract.

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
    reads_temps(expr) -> bool        whether `expr` reads a kernel temporary (TempRead)
    reads_memory(expr) -> bool       whether `expr` reads an element of an array or a temporary
A serialized node is `[kind, [attributes], [child positions]]`, e.g. `["add", [], [0, 1]]`.
"""
from __future__ import annotations

from .errors import QdcError

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
MAX_NODES = 1 << 16  # also the limit once shared subtrees are expanded: evaluation expands them
_MAX_INDICES = 16
MAX_DEPTH = 200  # evaluation and printing recurse; the builder never nests this deep


class SizeExprError(QdcError):
    """An adstack size expression is malformed, or cannot be evaluated for this launch."""


def clamp_int64(x: int) -> int:
    """`x` saturated to the int64 range, as every value of a tree is."""
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
        super().__init__((clamp_int64(int(value)),), ())

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


def reads_memory(expr) -> bool:
    """Whether `expr` reads an element of a field, an ndarray or a temporary: its value then sits
    in (device) memory, which a launch on a GPU would wait for every queued launch to read."""
    return expr is not None and any(isinstance(e, (_Read, TempRead)) for e in walk(expr))


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
