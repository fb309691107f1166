"""IR -> SizeExpr: symbolic upper bounds of adstack depths, evaluated by the runtime at launch.

API (the node classes, serialization and evaluation are in qdc.runtime.contract.sizeexpr):

    b = SizeExprBuilder(kernel)
    b.stack_capacity(alloca) -> SizeExpr | None    depth bound of one AdStackAlloca: the
        most pushes onto it in one run of the block that holds the alloca
    b.pushes(block, stack) -> SizeExpr | None      the same for any block
    b.trip_count(loop) -> SizeExpr | None          iterations of one RangeFor / range-for Task
    b.upper_bound(value) -> SizeExpr | None        bound of one integer IR value
    b.failure -> str | None    after a None: "file:line:col: why", for the fallback warning
    b.failure_loc, b.failure_reason    the same in parts (the SourceLoc may be None)
    stack_capacity_expr(alloca, kernel), trip_count_expr(loop, kernel)   one-shot forms

Results contain no bound variables outside a Max/SumOverRange; `se.to_nodes` serializes them.

How a value is bounded. Each IR value becomes a term: an expression `body` that may mention
enclosing loop indices as bound variables, each with a range [begin, end) of closed
expressions that contains every value the index takes; `exact` says the body equals the value
(not merely bounds it) at every point. A term is closed by wrapping MaxOverRange around its
body, one per variable, which is exact for the maximum because the ranges are exact or wider.

- Leaves: constants, scalar arguments, ndarray shapes; integer field and ndarray elements
  (an index that is not an exact term becomes a fresh variable over the axis); a loop index
  is its variable over the loop's range, so `range(i)` inside `for i in range(n)` closes to
  max_over(j in [0, n): j), written `n - 1`: the loop's end bounds it. Integer casts pass
  through; `x << c` is `x * 2**c`; `x // d` and `x >> c` are fresh variables over
  [0, max(x) + 1) and `x % d` one over [0, max(d)), which bounds them by max(x) and keeps
  qd.ndrange index decompositions readable; `x // b` with x over [0, a * b) is one over
  [0, a), so an ndrange's row index is bounded by its extent.
- A read indexed by `v + c` caps v's range at the array's axis length minus c: the kernel
  cannot legally read beyond it, so the bound need not either. When a loop's range is not
  expressible, these caps alone bound its index.
- Binary operators fuse two terms into one body when one's variables are a subset of the
  other's (the same loop index denotes the same iteration on both sides), intersecting the
  ranges of shared variables: the end becomes min(end_a, end_b), written a + b - max(a, b).
  That is what makes `a[i + 1] - a[i]` bounded pointwise. Fusion is declined when one side
  reads a field and the other an ndarray through bound variables (as in the reference: an
  evaluator next to ndarray memory cannot read fields); then `x - y` falls back to x alone
  and the other operators combine the closed terms. min(x, y) is exact when fused, else
  bounded by max(x, y); a select by the max of its two values.
- A subtrahend must be exact; otherwise it is dropped, which bounds the difference from above
  for non-negative subtrahends. The grammar assumes the values it subtracts are non-negative
  (loop bounds, counts, offsets); a negative one can make a bound too small, which the
  always-on push overflow check then reports.
- Local loads, kernel temporaries and stash-stack load-tops are bounded by the max over every
  value stored or pushed into them. A value that reaches its own variable again through only
  max / min / select / cast / subtraction / division (for instance a stack re-pushing its own
  top) adds nothing and is skipped; one that grows from itself (`n = n + 1`) is unsupported.
- Pushes are counted over the structure of the stack's block, like the compile-time sizing:
  statements add, an `if` takes the larger of its branches, a loop multiplies its body's
  count by its trip count (fused, so `for j in range(a[i])` under i counts a[i] per i); when
  the body's count depends on the loop's own index and nothing else varying, the loop sums
  it instead (SumOverRange: `for j in range(i)` under `for i in range(n)` counts n(n-1)/2,
  `for _ in range(cnt[idx[k]])` under k counts the sum over k, both exact).
  Closing hoists non-negative terms and factors that do not depend on the variable out of
  MaxOverRange, which keeps the usual `max_over(...) * 2 + 1` form (an empty range then
  over-counts, soundly).
Anything else returns None with `failure` set; the caller falls back to default_ad_stack_size.

Exact and over-approximate. The capacity equals the deepest the stack gets (for the launch's
data) when every loop count is a sum or product of launch data and of the index of the loop
itself, and reads are at exact indices: field and argument bounds, ndarray reads at a loop
index (also `off[i + 1] - off[i]`), shapes, ndrange rows, counts summed over one loop
(triangles, `cnt[idx[k]]`). It is an upper bound, not the depth, where
- an `if` pushes more in one branch: the heavier branch counts, whatever the condition;
- a loop's count depends on its index and on an enclosing one (`for j in range(a[i])` then
  `for _ in range(b[j])` under i): the trip count times the largest count;
- a read's index is not exact (a loop-carried or stashed value, `%`, `//` other than an
  ndrange row): the largest element over the index's whole range;
- values are unfused min / select (the max of the two) or a subtraction whose subtrahend is
  not exact (the minuend alone).
"""
from __future__ import annotations

from dataclasses import dataclass

from qdc.runtime.contract import sizeexpr as se

from .. import ir
from ..ir.adstack import AdStackLoadTop, AdStackPush

_INTEGER_KINDS = ("int", "uint")


class _Unsupported(Exception):
    def __init__(self, stmt, reason: str):
        super().__init__(reason)
        self.stmt, self.reason = stmt, reason

    def describe(self) -> str:
        loc = getattr(self.stmt, "loc", None)
        return f"{loc}: {self.reason}" if loc is not None else self.reason


_SELF = object()  # "bounded by the variable being bounded": contributes nothing new


@dataclass(frozen=True)
class _Term:
    body: se.SizeExpr
    exact: bool
    ranges: dict  # bound variable -> (begin, end | None); never mutated once built
    kinds: frozenset = frozenset()  # "field"/"ndarray": storage read through bound variables


def _closed(expr: se.SizeExpr, exact: bool = True) -> _Term:
    return _Term(expr, exact, {})


# ---- smart constructors: fold constants and identities --------------------------------------

def _const(e) -> int | None:
    return e.value if isinstance(e, se.Const) else None


def _nonneg(e) -> bool:
    if isinstance(e, se.Const):
        return e.value >= 0
    if isinstance(e, (se.NdarrayShape, se.Sub)):
        return True
    if isinstance(e, se.Max):
        return _nonneg(e.a) or _nonneg(e.b)
    if isinstance(e, (se.Add, se.Mul)):
        return _nonneg(e.a) and _nonneg(e.b)
    return isinstance(e, (se.MaxOverRange, se.SumOverRange))


def _add(a, b):
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return se.Const(ca + cb)
    if ca == 0:
        return b
    if cb == 0:
        return a
    if a == b:
        return _mul(a, se.Const(2))
    for x, y in ((a, b), (b, a)):  # x * c + x = x * (c + 1)
        if isinstance(x, se.Mul) and isinstance(x.b, se.Const) and x.a == y:
            return _mul(y, se.Const(x.b.value + 1))
    return se.Add(a, b)


def _sub(a, b):
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return se.Const(max(ca - cb, 0))
    if a == b:
        return se.Const(0)
    if cb == 0:
        return a if _nonneg(a) else se.Max(a, b)
    if cb is not None and cb > 0 and isinstance(a, se.Add) and _const(a.b) is not None and a.b.value >= cb:
        return _sub(_add(a.a, se.Const(a.b.value - cb)), se.Const(0))  # (x + c) - d = x + (c - d)
    return se.Sub(a, b)


def _mul(a, b):
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return se.Const(ca * cb)
    if ca == 0 or cb == 0:
        return se.Const(0)
    if ca == 1:
        return b
    return a if cb == 1 else se.Mul(a, b)


def _max(a, b):
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return se.Const(max(ca, cb))
    if a == b or (cb is not None and cb <= 0 and _nonneg(a)):
        return a
    if ca is not None and ca <= 0 and _nonneg(b):
        return b
    return se.Max(a, b)


def _min(a, b):
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return se.Const(min(ca, cb))
    if _provably_le(a, b):
        return a
    if _provably_le(b, a):
        return b
    return se.Sub(se.Add(a, b), se.Max(a, b))


def _provably_le(a, b) -> bool:
    """a <= b at every launch, by structure (keeps caps like min(n - 1, n) short)."""
    if a == b:
        return True
    pair = se.min_operands(b)
    if pair is not None:
        return all(_provably_le(a, y) for y in pair)
    pair = se.min_operands(a)
    if pair is not None:
        return any(_provably_le(x, b) for x in pair)
    if isinstance(a, se.Sub) and _nonneg(a.a) and _nonneg(a.b):  # max(x - y, 0) <= x
        return _provably_le(a.a, b)
    return False


_OPS = {"add": _add, "sub": _sub, "mul": _mul, "max": _max, "min": _min}


# ---- the builder ----------------------------------------------------------------------------

class SizeExprBuilder:
    """`temp_reads`: a kernel temporary whose stored values have no bound becomes a TempRead
    leaf (the value an earlier task left there), for task trip counts, which the runtime
    evaluates once those tasks ran; adstack capacities are evaluated before the launch, so
    their builder has none."""

    def __init__(self, kernel: ir.KernelIR, temp_reads: bool = False):
        self.kernel = kernel
        self.temp_reads = temp_reads
        self.failure: str | None = None
        self.failure_loc: ir.SourceLoc | None = None
        self.failure_reason: str | None = None
        self._memo: dict = {}
        self._sources_index: dict | None = None
        self._in_progress: list = []  # variables whose stored values are being bounded
        self._vars: dict = {}  # ("loop", loop) / ("fresh" | "index", stmt) -> variable id
        self._var_source: dict = {}  # variable id -> statement (for messages)
        self._range_failure: dict = {}  # variable id -> why its loop's end is not expressible

    # -- public --------------------------------------------------------------------------
    def upper_bound(self, value: ir.Stmt) -> se.SizeExpr | None:
        return self._attempt(lambda: self._close(self._top_term(value)))

    def trip_count(self, loop: ir.Stmt) -> se.SizeExpr | None:
        return self._attempt(lambda: self._close(self._trip_term(loop)))

    def stack_capacity(self, alloca) -> se.SizeExpr | None:
        return self.pushes(alloca.block, alloca)

    def pushes(self, block: ir.Block, stack) -> se.SizeExpr | None:
        return self._attempt(lambda: self._close(self._count(block, stack)))

    def _attempt(self, build):
        self.failure = self.failure_loc = self.failure_reason = None
        try:
            expr = build()
        except _Unsupported as u:
            self.failure, self.failure_loc, self.failure_reason = u.describe(), getattr(u.stmt, "loc", None), u.reason
            return None
        if expr.depth > se.MAX_DEPTH or expr.size > se.MAX_NODES:
            self.failure = self.failure_reason = (f"the bound has {expr.size} operations nested {expr.depth} deep "
                                                  f"(limits {se.MAX_NODES} and {se.MAX_DEPTH})")
            return None
        return expr

    # -- terms ---------------------------------------------------------------------------
    def _top_term(self, value) -> _Term:
        t = self._term(value)
        if t is _SELF:  # only possible while bounding a variable, never at the top
            raise _Unsupported(value, "the value is defined only in terms of itself")
        return t

    def _term(self, v: ir.Stmt):
        if not self._in_progress and v in self._memo:
            return self._memo[v]
        t = self._translate(v)
        if not self._in_progress:  # results seen through a cycle are partial: never cache them
            self._memo[v] = t
        return t

    def _translate(self, v: ir.Stmt):
        if isinstance(v, ir.LoopIndex):
            return self._loop_var(v)
        if v.type is None or v.type.kind not in _INTEGER_KINDS:
            raise _Unsupported(v, f"a {v.type} value cannot bound a loop")
        if isinstance(v, ir.Const):
            return _closed(se.Const(int(v.value)))
        if isinstance(v, ir.ArgLoad):
            return _closed(se.ScalarArg(v.arg_index))
        if isinstance(v, ir.NdarrayShape):
            return _closed(se.NdarrayShape(v.arg_index, v.dim))
        if isinstance(v, ir.GlobalLoad):
            return self._read(v)
        if isinstance(v, ir.Cast):
            if v.x.type is None or v.x.type.kind not in _INTEGER_KINDS:
                raise _Unsupported(v, f"a cast from {v.x.type} cannot bound a loop")
            return self._term(v.x)
        if isinstance(v, ir.Binary):
            return self._binary(v)
        if isinstance(v, ir.Select):
            return self._combine("select", self._term(v.a), self._term(v.b), v)
        if isinstance(v, ir.LocalLoad):
            return self._stored_bound(("local", v.var))
        if isinstance(v, ir.TempLoad):
            return self._temp(v)
        if isinstance(v, AdStackLoadTop):
            return self._stored_bound(("stack", v.stack))
        raise _Unsupported(v, f"`{type(v).__name__}` is outside what adstack sizing can express")

    def _temp(self, v: ir.TempLoad):
        if not self.temp_reads or self._in_progress or v.type.name not in se.TEMP_DTYPES:
            return self._stored_bound(("temp", v.slot))
        try:
            return self._stored_bound(("temp", v.slot))
        except _Unsupported:  # no bound before the launch: the value the earlier task left
            return _closed(se.TempRead(v.slot, se.TEMP_DTYPES.index(v.type.name)))

    def _loop_var(self, index: ir.LoopIndex) -> _Term:
        loop = index.loop
        key = ("loop", loop)
        var = self._vars.get(key)
        if var is None:
            var = self._new_var(key, loop)
        begin, end = self._loop_range(loop, var)
        return _Term(se.BoundVariable(var), True, {var: (begin, end)})

    def _new_var(self, key, source) -> int:
        var = self._vars[key] = len(self._vars)
        self._var_source[var] = source
        return var

    def _loop_range(self, loop, var):
        """[begin, end) of `loop`'s index as closed expressions; end None if not expressible."""
        begin = se.Const(0)
        try:
            t = self._term(loop.begin)
            if t is not _SELF and t.exact and not t.ranges:
                begin = t.body
        except _Unsupported:
            pass  # a begin we cannot express is bounded below by 0 (non-negative values)
        try:
            t = self._term(loop.end)
            if t is _SELF:
                raise _Unsupported(loop.end, "the loop's end is defined in terms of itself")
            return begin, self._close(t)
        except _Unsupported as u:
            self._range_failure[var] = u.describe()
            return begin, None

    def _read(self, load: ir.GlobalLoad) -> _Term:
        ptr = load.ptr
        target = ptr.target
        if target.is_grad:
            raise _Unsupported(load, "a gradient buffer cannot bound a loop")
        is_field = isinstance(target, ir.FieldRef)
        terms = [self._index_term(i) for i in ptr.indices]
        ranges: dict = {}
        kinds = frozenset()
        for t in terms:
            ranges = _merge_ranges(ranges, t.ranges)
            kinds |= t.kinds
        if ranges:
            kinds |= {"field" if is_field else "ndarray"}
        bodies = [t.body for t in terms]
        if is_field:
            body = se.FieldLoad(target.slot, bodies)
            lengths = [se.Const(n) for n in target.shape]
        else:
            body = se.NdarrayRead(target.arg_index, bodies)
            lengths = [se.NdarrayShape(target.arg_index, d) for d in range(len(bodies))]
        for index, length in zip(bodies, lengths):
            ranges = _cap_to_axis(ranges, index, length)
        return _Term(body, True, ranges, kinds)

    def _binary(self, v: ir.Binary):
        op = v.op
        if op in _OPS:
            return self._combine(op, self._term(v.a), self._term(v.b), v)
        shift = self._shift_amount(v) if op in ("shl", "shr") else None
        if op == "shl":
            return self._combine("mul", self._term(v.a), _closed(se.Const(1 << shift)), v)
        if op in ("shr", "floordiv"):
            if op == "floordiv":
                self._positive_divisor(v)
            return self._quotient(v)
        if op == "mod":
            divisor = self._positive_divisor(v)
            return self._fresh_var(("fresh", v), v, lambda: self._close(divisor))
        raise _Unsupported(v, f"the operator `{op}` is outside what adstack sizing can express")

    def _shift_amount(self, v) -> int:
        amount = v.b.value if isinstance(v.b, ir.Const) else None
        if not isinstance(amount, int) or not 0 <= amount < 63:
            raise _Unsupported(v, "only shifts by a constant in [0, 63) can bound a loop")
        return amount

    def _positive_divisor(self, v) -> _Term:
        if isinstance(v.b, ir.Const) and v.b.value <= 0:
            raise _Unsupported(v, "a division by a non-positive constant cannot bound a loop")
        t = self._term(v.b)
        if t is _SELF:
            raise _Unsupported(v, "the divisor is defined in terms of the value it bounds")
        return t

    def _quotient(self, v):
        """x // d (d >= 1) and x >> c lie in [0, max(x)]: a fresh variable over that range, or
        over [0, a) when x ranges over [0, a * d) (the row of an ndrange's flat index)."""
        dividend = self._term(v.a)
        if dividend is _SELF:
            return _SELF  # never larger than the value being bounded
        rows = self._rows(dividend, v.b) if v.op == "floordiv" else None
        if rows is not None:
            return self._fresh_var(("fresh", v), v, lambda: rows)
        return self._fresh_var(("fresh", v), v, lambda: _add(self._close(dividend), se.Const(1)))

    def _rows(self, dividend: _Term, divisor: ir.Stmt):
        """a when `dividend` is a variable over [begin >= 0, a * b) and `divisor` is exactly b."""
        var = dividend.body.var if isinstance(dividend.body, se.BoundVariable) else None
        begin, end = dividend.ranges.get(var, (None, None))
        if not (isinstance(end, se.Mul) and _nonneg(begin)):
            return None
        try:
            d = self._term(divisor)
        except _Unsupported:
            return None
        if d is _SELF or d.ranges or not d.exact:
            return None
        return end.a if d.body == end.b else end.b if d.body == end.a else None

    def _index_term(self, index: ir.Stmt) -> _Term:
        """The index's exact term; failing that a fresh variable over [0, max(index) + 1), or
        over [0, ?) if even a bound is missing: a legal read has 0 <= index < axis length, and
        the cap to the axis closes the range. So `range(a[k])` is bounded for any k."""
        try:
            t = self._term(index)
        except _Unsupported:
            t = None
        bounded = t is not None and t is not _SELF
        if bounded and t.exact:
            return t
        end = (lambda: _add(self._close(t), se.Const(1))) if bounded else (lambda: None)
        return self._fresh_var(("index", index), index, end)

    def _fresh_var(self, key, v, end) -> _Term:
        var = self._vars.get(key)
        if var is None:
            var = self._new_var(key, v)
        try:
            end_expr = end()
        except _Unsupported as u:
            self._range_failure[var] = u.describe()
            end_expr = None
        return _Term(se.BoundVariable(var), True, {var: (se.Const(0), end_expr)})

    # -- combining two terms -----------------------------------------------------------------
    def _combine(self, op: str, t1, t2, stmt) -> _Term:
        if t1 is _SELF or t2 is _SELF:
            return self._combine_self(op, t1, t2, stmt)
        if op == "sub" and not t2.exact:
            return _Term(t1.body, False, t1.ranges, t1.kinds)
        if _fusable(t1, t2):
            ranges = _merge_ranges(t1.ranges, t2.ranges)
            kinds = t1.kinds | t2.kinds
            exact = t1.exact and t2.exact
            if op == "select" or (op == "min" and not exact):
                return _Term(_max(t1.body, t2.body), False, ranges, kinds)
            return _Term(_OPS[op](t1.body, t2.body), exact, ranges, kinds)
        if op == "sub":  # as the reference: the minuend alone bounds the difference
            return _Term(t1.body, False, t1.ranges, t1.kinds)
        c1, c2 = self._close(t1), self._close(t2)
        return _closed(_max(c1, c2) if op in ("min", "select") else _OPS[op](c1, c2), exact=False)

    @staticmethod
    def _combine_self(op, t1, t2, stmt):
        other = t2 if t1 is _SELF else t1
        if op in ("max", "min", "select"):
            return other if other is _SELF else _Term(other.body, False, other.ranges, other.kinds)
        if op == "sub" and t1 is _SELF:
            return _SELF
        raise _Unsupported(stmt, "the value grows from its own previous value (like `n = n + 1`), "
                                 "so it has no bound before the kernel runs")

    def _close(self, t: _Term) -> se.SizeExpr:
        body = t.body
        for var in sorted(t.ranges, reverse=True):
            begin, end = t.ranges[var]
            if var not in body.free_vars:
                continue
            if end is None:
                raise _Unsupported(self._var_source[var], "the range of this loop index is not expressible: "
                                   + self._range_failure.get(var, "unknown end"))
            body = _max_over(var, begin, end, body)
        return body

    # -- variables written in several places ----------------------------------------------------
    def _stored_bound(self, key):
        if key in self._in_progress:
            return _SELF
        self._in_progress.append(key)
        try:
            bounds = [self._close(t) for t in map(self._term, self._sources(key)) if t is not _SELF]
        finally:
            self._in_progress.pop()
        if not bounds:  # only ever assigned from itself: its initial value, 0, or an outer cycle's
            return _SELF if self._in_progress else _closed(se.Const(0))
        expr = bounds[0]
        for b in bounds[1:]:
            expr = _max(expr, b)
        return _closed(expr, exact=False)

    def _sources(self, key) -> list:
        """The values written into `key`; accumulations that cannot raise it are skipped."""
        sources = []
        for s in self._sources_of(key):
            if isinstance(s, (ir.LocalAccumulate, ir.TempAtomic)) and s.op != "max":
                if s.op in ("min", "and"):
                    continue  # cannot raise a non-negative value
                raise _Unsupported(s, f"an accumulated `{s.op}` has no bound known before the launch")
            sources.append(s.value)
        return sources

    def _sources_of(self, key) -> list:
        """Statements writing variable `key`: ("local", alloca), ("temp", slot), ("stack", alloca)."""
        if self._sources_index is None:
            index: dict = {}
            for s in ir.walk(self.kernel.body):
                if isinstance(s, (ir.LocalStore, ir.LocalAccumulate)):
                    index.setdefault(("local", s.var), []).append(s)
                elif isinstance(s, (ir.TempStore, ir.TempAtomic)):
                    index.setdefault(("temp", s.slot), []).append(s)
                elif isinstance(s, AdStackPush):
                    index.setdefault(("stack", s.stack), []).append(s)
            self._sources_index = index
        return self._sources_index.get(key, [])

    # -- loops -------------------------------------------------------------------------------
    def _trip_term(self, loop) -> _Term:
        if not isinstance(loop, (ir.RangeFor, ir.Task)) or getattr(loop, "begin", None) is None:
            raise _Unsupported(loop, "a push inside a while loop repeats an unknown number of times")
        return self._combine("sub", self._top_term(loop.end), self._top_term(loop.begin), loop)

    def _count(self, block: ir.Block, stack) -> _Term:
        """Most pushes onto `stack` in one run of `block`, as a term."""
        total = _closed(se.Const(0))
        for s in block.stmts:
            if isinstance(s, AdStackPush):
                count = _closed(se.Const(1 if s.stack is stack else 0))
            elif isinstance(s, ir.If):
                count = self._combine("max", self._count(s.then_block, stack),
                                      self._count(s.else_block, stack), s)
            elif isinstance(s, (ir.RangeFor, ir.While)):
                count = self._count(s.body, stack)
                if count.body != se.Const(0):
                    count = self._sum_over_loop(s, count) or self._combine("mul", self._trip_term(s), count, s)
            else:
                continue
            total = self._combine("add", total, count, s)
        return total


    def _sum_over_loop(self, loop, body: _Term) -> _Term | None:
        """The pushes of `loop` as the sum of its body's count over its index, when that count
        depends on the index (`for j in range(i)`: the triangle, not the square). Variables other
        than the index and those of loops around `loop` are maxed out first, inside the sum: a
        sum of maxima bounds the sum. None (the caller multiplies by the trip count instead)
        unless the result depends on launch data only and is evaluated without Python loops."""
        var = self._vars.get(("loop", loop))
        if not isinstance(loop, ir.RangeFor) or var is None or var not in body.body.free_vars:
            return None
        nested = {s for s in ir.walk(loop.body) if isinstance(s, (ir.RangeFor, ir.While))}
        around = {v for key, v in self._vars.items() if key[0] == "loop" and key[1] is not loop
                  and key[1] not in nested}
        summand = body.body
        if isinstance(summand, se.Max) and summand.a == se.BoundVariable(var) and summand.b == se.Const(0) \
                and _nonneg(body.ranges[var][0]):
            summand = summand.a  # `range(j)` counts max(j, 0): j itself over a non-negative range
        for w in sorted(body.ranges.keys() - around - {var}, reverse=True):
            begin, end = body.ranges[w]
            if w in summand.free_vars:
                if end is None:
                    return None
                summand = _max_over(w, begin, end, summand)
        begin, end = body.ranges[var]
        if end is None or summand.free_vars != {var} or var in summand.max_over_vars:
            return None
        return _closed(se.SumOverRange(var, begin, end, summand), exact=False)


def _max_over(var, begin, end, body) -> se.SizeExpr:
    """MaxOverRange(var, begin, end, body) with non-negative summands and factors that do not
    depend on var hoisted out, and a clamp at 0 dropped (the node clamps itself)."""
    if isinstance(body, se.Max) and body.b == se.Const(0):
        return _max_over(var, begin, end, body.a)
    if isinstance(body, (se.Add, se.Mul)):
        for x, c in ((body.a, body.b), (body.b, body.a)):
            if var not in c.free_vars and _nonneg(c):
                inner = _max_over(var, begin, end, x)
                return _add(inner, c) if isinstance(body, se.Add) else _mul(inner, c)
    if var not in body.free_vars:
        return body if _nonneg(body) else _max(body, se.Const(0))
    if body == se.BoundVariable(var):  # the largest index: end - 1 (exact unless the range is empty)
        return _sub(end, se.Const(1))
    return se.MaxOverRange(var, begin, end, body)


def _fusable(t1: _Term, t2: _Term) -> bool:
    v1, v2 = t1.ranges.keys(), t2.ranges.keys()
    if not (v1 <= v2 or v2 <= v1):
        return False
    if not (v1 and v2):
        return True
    mixes = ("field" in t1.kinds and "ndarray" in t2.kinds) or ("ndarray" in t1.kinds and "field" in t2.kinds)
    return not mixes


def _merge_ranges(r1: dict, r2: dict) -> dict:
    """Union of the variables; a variable in both lies in the intersection of its ranges."""
    if not r1 or r1 is r2:
        return r2
    if not r2:
        return r1
    out = dict(r1)
    for var, (b2, e2) in r2.items():
        if var in out:
            b1, e1 = out[var]
            out[var] = (_max(b1, b2), e2 if e1 is None else e1 if e2 is None else _min(e1, e2))
        else:
            out[var] = (b2, e2)
    return out


def _index_offset(index: se.SizeExpr):
    """(v, c) when `index` is v + c for a bound variable v and a constant c, else None."""
    if isinstance(index, se.BoundVariable):
        return index.var, 0
    if isinstance(index, se.Add):
        for x, y in ((index.a, index.b), (index.b, index.a)):
            if isinstance(x, se.BoundVariable) and isinstance(y, se.Const):
                return x.var, y.value
    if isinstance(index, se.Sub) and isinstance(index.a, se.BoundVariable) and isinstance(index.b, se.Const):
        return index.a.var, -index.b.value
    return None


def _cap_to_axis(ranges: dict, index: se.SizeExpr, length: se.SizeExpr) -> dict:
    """Legal reads have 0 <= v + c < length: narrow v's range to that."""
    found = _index_offset(index)
    if found is None:
        return ranges
    var, c = found
    begin, end = ranges[var]
    limit = _sub(length, se.Const(c)) if c >= 0 else _add(length, se.Const(-c))
    out = dict(ranges)
    out[var] = (_max(begin, se.Const(-c)) if c < 0 else begin,
                limit if end is None else _min(end, limit))
    return out


def stack_capacity_expr(alloca, kernel: ir.KernelIR) -> se.SizeExpr | None:
    return SizeExprBuilder(kernel).stack_capacity(alloca)


def trip_count_expr(loop, kernel: ir.KernelIR) -> se.SizeExpr | None:
    return SizeExprBuilder(kernel).trip_count(loop)
