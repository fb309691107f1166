"""SizeExpr: building adstack bounds from IR, serialization, printing and launch-time evaluation.

Builder tests construct IR directly and compare the evaluated bound with an independent
reference: a small interpreter (below) runs the IR with the same data and records the deepest
each adstack gets. Evaluator tests compare against a plain-Python brute-force evaluator.
"""
from contextlib import contextmanager

import msgpack
import numpy as np
import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.autodiff.sizeexpr_builder import SizeExprBuilder, stack_capacity_expr, trip_count_expr
from qdc.compiler.ir.adstack import AdStackAlloca, AdStackLoadTop, AdStackPop, AdStackPush
from qdc.runtime import sizeexpr_eval as ev
from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.contract import types as T

I64_MAX = (1 << 63) - 1


# ---- building IR by hand ---------------------------------------------------------------------

class KB:
    """Appends statements to the current block; ints given as operands become i32 constants."""

    def __init__(self, *params):
        self.k = ir.KernelIR("k", [ir.Param(n, kind, T.i32, ndim) for n, kind, ndim in params])
        self.blocks = [self.k.body]
        self.line = 0

    def __call__(self, stmt):
        self.line += 1
        stmt.loc = ir.SourceLoc("kern.py", self.line, 5)
        return self.blocks[-1].append(stmt)

    def v(self, x):
        return self(ir.Const(x, T.i32)) if isinstance(x, int) else x

    def arg(self, i):
        return self(ir.ArgLoad(i, T.i32))

    def shape(self, i, d=0):
        return self(ir.NdarrayShape(i, d, T.i32))

    def op(self, name, a, b):
        a, b = self.v(a), self.v(b)
        return self(ir.Binary(name, a, b, a.type))

    def field(self, shape, dtype=T.i32):
        ref = ir.FieldRef(len(self.k.fields), f"f{len(self.k.fields)}", dtype, tuple(shape), False)
        self.k.fields.append(ref)
        return ref

    def nd(self, arg, ndim=1):
        return ir.NdarrayRef(arg, f"a{arg}", T.i32, ndim, False)

    def read(self, target, *idx):
        return self(ir.GlobalLoad(self(ir.GlobalPtr(target, [self.v(i) for i in idx]))))

    @contextmanager
    def loop(self, begin, end):
        loop = self(ir.RangeFor(self.v(begin), self.v(end), T.i32))
        self.blocks.append(loop.body)
        try:
            yield loop
        finally:
            self.blocks.pop()

    @contextmanager
    def when(self, cond):
        node = self(ir.If(cond))
        self.blocks.append(node.then_block)
        try:
            yield node
        finally:
            self.blocks.pop()

    def stack(self):
        return self(AdStackAlloca(T.i32, 0))

    def push(self, stack, value=0):
        return self(AdStackPush(stack, self.v(value)))


# ---- the reference: run the IR ----------------------------------------------------------------

_PY_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "min": min, "max": max,
           "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b, "bit_xor": lambda a, b: a ^ b,
           "lt": lambda a, b: a < b, "gt": lambda a, b: a > b, "eq": lambda a, b: a == b}


def run_ir(k: ir.KernelIR, args, fields=()):
    """Execute `k`; returns {adstack alloca: the most entries it ever held}."""
    val, stacks, deepest = {}, {}, {}

    def run(block):
        for s in block:
            if isinstance(s, ir.Const):
                val[s] = s.value
            elif isinstance(s, ir.ArgLoad):
                val[s] = args[s.arg_index]
            elif isinstance(s, ir.NdarrayShape):
                val[s] = args[s.arg_index].shape[s.dim]
            elif isinstance(s, ir.GlobalPtr):
                val[s] = tuple(val[i] for i in s.indices)
            elif isinstance(s, ir.GlobalLoad):
                t = s.ptr.target
                arr = fields[t.slot] if isinstance(t, ir.FieldRef) else args[t.arg_index]
                val[s] = int(arr[val[s.ptr]])
            elif isinstance(s, ir.Binary):
                val[s] = _PY_OPS[s.op](val[s.a], val[s.b])
            elif isinstance(s, ir.Cast):
                val[s] = int(val[s.x])
            elif isinstance(s, ir.Unary):
                val[s] = abs(val[s.x])
            elif isinstance(s, ir.Select):
                val[s] = val[s.a] if val[s.cond] else val[s.b]
            elif isinstance(s, ir.Alloca):
                val[s] = 0
            elif isinstance(s, ir.LocalStore):
                val[s.var] = val[s.value]
            elif isinstance(s, ir.LocalLoad):
                val[s] = val[s.var]
            elif isinstance(s, ir.If):
                run(s.then_block if val[s.cond] else s.else_block)
            elif isinstance(s, ir.RangeFor):
                for i in range(val[s.begin], val[s.end]):
                    val[s.index] = i
                    run(s.body)
            elif isinstance(s, AdStackAlloca):
                stacks[s] = []
                deepest.setdefault(s, 0)
            elif isinstance(s, AdStackPush):
                stacks[s.stack].append(val[s.value])
                deepest[s.stack] = max(deepest[s.stack], len(stacks[s.stack]))
            elif isinstance(s, AdStackLoadTop):
                val[s] = stacks[s.stack][-1]
            elif isinstance(s, AdStackPop):
                stacks[s.stack].pop()
            else:
                raise NotImplementedError(type(s).__name__)

    run(k.body)
    return deepest


def bound(expr, args, fields=()):
    """Evaluate after a msgpack round trip, as the runtime does with a cached artifact."""
    nodes = msgpack.unpackb(msgpack.packb(se.to_nodes(expr)), raw=False)
    return ev.evaluate(nodes, ev.LaunchEnv(args, fields))


def capacity(kb, stack):
    b = SizeExprBuilder(kb.k)
    expr = b.stack_capacity(stack)
    assert expr is not None, b.failure
    return expr


# ---- builder: leaves, loop indices and trip counts ------------------------------------------

def test_constant_range_folds_to_a_const():
    kb = KB()
    with kb.loop(3, 10) as loop:
        pass
    expr = trip_count_expr(loop, kb.k)
    assert expr == se.Const(7)
    assert se.to_nodes(expr) == [["const", [7], []]]


def test_scalar_argument_and_field_load_bounds(rng):
    kb = KB(("n", "scalar", 0))
    count = kb.field(())
    with kb.loop(0, 1):
        s = kb.stack()
        with kb.loop(kb.arg(0), kb.op("mul", kb.read(count), 2)):
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "field0[None] * 2 - arg0"
    for _ in range(5):
        n, c = int(rng.integers(0, 20)), np.array(rng.integers(0, 30), np.int32)
        assert bound(expr, [n], [c]) == run_ir(kb.k, [n], [c])[s]


def test_field_load_indexed_by_constants_and_arguments(rng):
    kb = KB(("k", "scalar", 0))
    table = kb.field((4, 6))
    with kb.loop(0, 1):
        s = kb.stack()
        with kb.loop(0, kb.read(table, 2, kb.arg(0))):
            kb.push(s)
    expr = capacity(kb, s)
    assert expr == se.Max(se.FieldLoad(0, [se.Const(2), se.ScalarArg(0)]), se.Const(0))
    t = rng.integers(0, 50, size=(4, 6)).astype(np.int32)
    for k in range(6):
        assert bound(expr, [k], [t]) == t[2, k] == run_ir(kb.k, [k], [t])[s]


def test_loop_index_bounds_an_inner_range_by_the_loop_end(rng):
    kb = KB(("n", "scalar", 0))
    with kb.loop(0, kb.arg(0)) as outer:
        s = kb.stack()
        with kb.loop(0, outer.index):  # for j in range(i)
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "arg0 - 1"
    for n in [0, 1, int(rng.integers(2, 40))]:
        assert bound(expr, [n]) == max(n - 1, 0) == run_ir(kb.k, [n]).get(s, 0)


def test_nested_trip_counts_multiply_and_pushes_sum(rng):
    kb = KB(("n", "scalar", 0), ("m", "scalar", 0))
    with kb.loop(0, 2):
        s = kb.stack()
        kb.push(s)
        with kb.loop(0, kb.arg(0)):
            kb.push(s)
            with kb.loop(1, kb.arg(1)):
                with kb.when(kb.op("gt", kb.arg(0), -1)):  # an If does not change the count
                    kb.push(s)
                    kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "1 + max(arg0, 0) * (1 + (arg1 - 1) * 2)"
    for _ in range(5):
        n, m = (int(x) for x in rng.integers(0, 12, size=2))
        assert bound(expr, [n, m]) == run_ir(kb.k, [n, m])[s]


def test_an_if_counts_its_heavier_branch(rng):
    kb = KB(("n", "scalar", 0), ("flag", "scalar", 0))
    with kb.loop(0, 1):
        s = kb.stack()
        with kb.loop(0, kb.arg(0)):
            node = kb(ir.If(kb.op("gt", kb.arg(1), 0)))
            kb.blocks.append(node.then_block)
            for _ in range(3):
                kb.push(s)
            kb.blocks[-1] = node.else_block
            kb.push(s)
            kb.blocks.pop()
    expr = capacity(kb, s)
    n = int(rng.integers(1, 40))
    assert bound(expr, [n, 1]) == 3 * n == run_ir(kb.k, [n, 1])[s]
    assert bound(expr, [n, 0]) == 3 * n >= run_ir(kb.k, [n, 0])[s] == n


def test_triangular_loops_are_summed_exactly(rng):
    kb = KB(("n", "scalar", 0))
    with kb.loop(0, 1):
        s = kb.stack()
        with kb.loop(0, kb.arg(0)) as i:
            with kb.loop(0, kb.op("add", i.index, 1)):
                kb.push(s)
    expr = capacity(kb, s)
    assert isinstance(expr, se.SumOverRange)
    for n in rng.integers(1, 30, size=4):
        n = int(n)
        assert bound(expr, [n]) == run_ir(kb.k, [n])[s] == n * (n + 1) // 2


def test_ndarray_read_at_the_outer_index_is_a_max_over_its_range(rng):
    kb = KB(("counts", "ndarray", 1))
    with kb.loop(0, kb.shape(0)) as i:
        s = kb.stack()
        with kb.loop(0, kb.read(kb.nd(0), i.index)):
            kb.push(s)
            kb.push(s)
        kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "max_over(j in [0, shape(arg0,0)): read(arg0[j])) * 2 + 1"
    counts = rng.integers(0, 100, size=int(rng.integers(1, 50))).astype(np.int32)
    assert bound(expr, [counts]) == 2 * counts.max() + 1 == run_ir(kb.k, [counts])[s]


def test_multidimensional_ndarray_read(rng):
    kb = KB(("m", "ndarray", 2))
    with kb.loop(0, kb.shape(0, 0)) as i:
        with kb.loop(0, kb.shape(0, 1)) as j:
            s = kb.stack()
            with kb.loop(0, kb.read(kb.nd(0, 2), i.index, j.index)):
                kb.push(s)
    expr = capacity(kb, s)
    m = rng.integers(0, 60, size=(5, 7)).astype(np.int32)
    assert bound(expr, [m]) == m.max() == max(run_ir(kb.k, [m]).values())


def test_csr_offsets_are_bounded_pointwise(rng):
    """for i in range(len(off) - 1): for j in range(off[i], off[i + 1]) -- the longest row."""
    kb = KB(("off", "ndarray", 1))
    with kb.loop(0, kb.op("sub", kb.shape(0), 1)) as i:
        s = kb.stack()
        nxt = kb.read(kb.nd(0), kb.op("add", i.index, 1))
        with kb.loop(kb.read(kb.nd(0), i.index), nxt):
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "max_over(j in [0, shape(arg0,0) - 1): read(arg0[j + 1]) - read(arg0[j]))"
    off = np.concatenate([[0], np.cumsum(rng.integers(0, 40, size=30))]).astype(np.int32)
    assert bound(expr, [off]) == np.diff(off).max() == run_ir(kb.k, [off])[s]


def test_ndrange_row_is_bounded_by_its_extent_and_index_sums_are_exact(rng):
    """flat // m over [0, m * m) is a row index below m; the pushes of a loop whose inner count
    is read at its index are the sum over it (with an exact bound, no product)."""
    kb = KB(("m", "scalar", 0), ("cnt", "ndarray", 1))
    m = kb.arg(0)
    with kb.loop(0, kb.op("mul", m, m)) as flat:
        s = kb.stack()
        with kb.loop(0, kb.op("floordiv", flat.index, m)):
            kb.push(s)
        t = kb.stack()
        with kb.loop(0, kb.shape(1)) as k:
            with kb.loop(0, kb.read(kb.nd(1), k.index)):
                kb.push(t)
    rows, sums = capacity(kb, s), capacity(kb, t)
    for _ in range(3):
        args = [int(rng.integers(1, 12)), rng.integers(0, 9, size=int(rng.integers(1, 7))).astype(np.int32)]
        deepest = run_ir(kb.k, args)
        assert bound(rows, args) == deepest[s] == args[0] - 1
        assert bound(sums, args) == deepest[t] == args[1].sum()


def test_ndrange_index_decomposition_is_bounded(rng):
    """for v in range(n * m): i, j = v // m, v % m; for _ in range(a[i, j])."""
    kb = KB(("a", "ndarray", 2))
    rows, cols = kb.shape(0, 0), kb.shape(0, 1)
    with kb.loop(0, kb.op("mul", rows, cols)) as v:
        s = kb.stack()
        i, j = kb.op("floordiv", v.index, cols), kb.op("mod", v.index, cols)
        with kb.loop(0, kb.read(kb.nd(0, 2), i, j)):
            kb.push(s)
    expr = capacity(kb, s)
    a = rng.integers(0, 90, size=(4, 6)).astype(np.int32)
    assert bound(expr, [a]) == a.max() == run_ir(kb.k, [a])[s]


def test_local_load_is_bounded_by_every_stored_value(rng):
    kb = KB(("n", "scalar", 0), ("flag", "scalar", 0))
    with kb.loop(0, 1):
        s = kb.stack()
        x = kb(ir.Alloca(T.i32, "x"))
        kb(ir.LocalStore(x, kb.v(3)))
        with kb.when(kb.op("gt", kb.arg(1), 0)):
            kb(ir.LocalStore(x, kb.arg(0)))
            kb(ir.LocalStore(x, kb(ir.LocalLoad(x))))  # a copy of itself adds nothing
        with kb.loop(0, kb(ir.LocalLoad(x))):
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "max(3, arg0)"
    n = int(rng.integers(4, 50))
    assert bound(expr, [n, 1]) == n == run_ir(kb.k, [n, 1])[s]
    assert bound(expr, [n, 0]) >= run_ir(kb.k, [n, 0])[s] == 3


def test_kernel_temporaries_and_upper_bound_of_a_value(rng):
    """A value crossing tasks through a temporary is bounded by every value stored into it."""
    kb = KB(("n", "scalar", 0), ("m", "scalar", 0))
    kb(ir.TempStore(0, kb.op("add", kb.arg(0), 4)))
    with kb.loop(0, 3):
        kb(ir.TempStore(0, kb.op("shl", kb.arg(1), 2)))
    value = kb.op("floordiv", kb(ir.TempLoad(0, T.i32)), 3)
    expr = SizeExprBuilder(kb.k).upper_bound(value)
    n, m = (int(x) for x in rng.integers(0, 50, size=2))
    assert se.to_text(expr) == "max(max(arg0 + 4, arg1 * 4), 0)"
    assert bound(expr, [n, m]) == max(n + 4, 4 * m) >= max(n + 4, 4 * m) // 3


def test_load_top_of_a_stash_stack_is_bounded_by_the_pushed_values(rng):
    """A stack that stashes a[i] per outer iteration, re-pushes its own top (idempotent), and
    bounds an inner loop by its top."""
    kb = KB(("a", "ndarray", 1))
    with kb.loop(0, 1):
        stash, s = kb.stack(), kb.stack()
        with kb.loop(0, kb.shape(0)) as i:
            kb.push(stash, kb.read(kb.nd(0), i.index))
            kb.push(stash, kb.op("max", kb(AdStackLoadTop(stash)), 0))
            with kb.loop(0, kb(AdStackLoadTop(stash))):
                kb.push(s)
            kb(AdStackPop(stash))
            kb(AdStackPop(stash))
    expr = capacity(kb, s)
    a = rng.integers(0, 70, size=12).astype(np.int32)
    # the pushes of `s` sit inside two loops: len(a) * max(a) bounds their total
    assert se.to_text(expr) == "shape(arg0,0) * max_over(j in [0, shape(arg0,0)): read(arg0[j]))"
    assert bound(expr, [a]) == len(a) * a.max() >= run_ir(kb.k, [a])[s] == a.sum()
    assert bound(stack_capacity_expr(stash, kb.k), [a]) == 2 * len(a) >= run_ir(kb.k, [a])[stash]


def test_a_value_growing_from_itself_is_unsupported():
    kb = KB()
    with kb.loop(0, 1):
        stash, s = kb.stack(), kb.stack()
        with kb.loop(0, 10):
            kb.push(stash, kb.op("add", kb(AdStackLoadTop(stash)), 1))
        with kb.loop(0, kb(AdStackLoadTop(stash))):
            kb.push(s)
    b = SizeExprBuilder(kb.k)
    assert b.stack_capacity(s) is None
    assert "grows from its own previous value" in b.failure and b.failure.startswith("kern.py:")


def test_unsupported_operation_returns_none_with_the_line():
    kb = KB(("n", "scalar", 0))
    with kb.loop(0, 1):
        s = kb.stack()
        with kb.loop(0, kb.op("bit_xor", kb.arg(0), 3)):
            kb.push(s)
    b = SizeExprBuilder(kb.k)
    assert b.stack_capacity(s) is None
    line = next(st.loc.line for st in ir.walk(kb.k.body) if isinstance(st, ir.Binary))
    assert b.failure.startswith(f"kern.py:{line}:5:") and "bit_xor" in b.failure


def test_push_inside_a_while_loop_is_unsupported():
    kb = KB()
    with kb.loop(0, 1):
        s = kb.stack()
        w = kb(ir.While())
        kb.blocks.append(w.body)
        kb.push(s)
        kb.blocks.pop()
    b = SizeExprBuilder(kb.k)
    assert b.stack_capacity(s) is None and "while loop" in b.failure


# ---- builder: fusion ---------------------------------------------------------------------------

def _unbounded_outer_loop(kb):
    """A loop whose end is outside the grammar: only the reads in it bound its index."""
    return kb.loop(0, kb(ir.Unary("abs", kb.arg(0), T.i32)))


def test_fusion_caps_at_the_shorter_ndarray(rng):
    kb = KB(("n", "scalar", 0), ("a", "ndarray", 1), ("b", "ndarray", 1))
    with _unbounded_outer_loop(kb) as i:
        s = kb.stack()
        with kb.loop(0, kb.op("sub", kb.read(kb.nd(1), i.index), kb.read(kb.nd(2), i.index))):
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == ("max_over(j in [0, min(shape(arg1,0), shape(arg2,0))): "
                                "read(arg1[j]) - read(arg2[j]))")
    a = rng.integers(50, 100, size=9).astype(np.int32)
    b = rng.integers(0, 50, size=5).astype(np.int32)
    a[7] = 10_000  # past b's end: a body reading beyond b would report it
    assert bound(expr, [5, a, b]) == (a[:5] - b).max() == run_ir(kb.k, [5, a, b])[s]


def test_fusion_intersects_the_loop_range_with_the_array_length(rng):
    kb = KB(("n", "scalar", 0), ("a", "ndarray", 1))
    with kb.loop(0, kb.arg(0)) as i:
        s = kb.stack()
        with kb.loop(0, kb.read(kb.nd(1), i.index)):
            kb.push(s)
    expr = capacity(kb, s)
    assert se.to_text(expr) == "max_over(j in [0, min(arg0, shape(arg1,0))): read(arg1[j]))"
    a = rng.integers(0, 100, size=10).astype(np.int32)
    for n in (3, 10, 25):  # n beyond len(a): the kernel cannot read there, nor does the bound
        assert bound(expr, [n, a]) == a[:n].max()


def test_field_and_ndarray_reads_are_never_fused(rng):
    kb = KB(("n", "scalar", 0), ("b", "ndarray", 1))
    fld = kb.field((16,))
    with kb.loop(0, kb.arg(0)) as i:
        s = kb.stack()
        with kb.loop(0, kb.op("sub", kb.read(fld, i.index), kb.read(kb.nd(1), i.index))):
            kb.push(s)
    expr = capacity(kb, s)
    for node in _subtrees(expr):
        if isinstance(node, se.MaxOverRange):
            kinds = {type(x) for x in _subtrees(node.body)}
            assert not {se.FieldLoad, se.NdarrayRead} <= kinds
    # the reference's fallback: the minuend alone bounds the difference
    assert se.to_text(expr) == "max_over(j in [0, min(arg0, 16)): field0[j])"
    f = rng.integers(20, 90, size=16).astype(np.int32)
    b = rng.integers(0, 20, size=16).astype(np.int32)
    assert bound(expr, [16, b], [f]) == f.max() >= run_ir(kb.k, [16, b], [f])[s]


def test_reads_of_independent_loops_are_not_paired(rng):
    """a[i] - b[k] for two different loops: pairing i with k would miss a's peaks."""
    kb = KB(("a", "ndarray", 1), ("b", "ndarray", 1))
    with kb.loop(0, kb.shape(0)) as i:
        with kb.loop(0, kb.shape(1)) as k:
            s = kb.stack()
            with kb.loop(0, kb.op("sub", kb.read(kb.nd(0), i.index), kb.read(kb.nd(1), k.index))):
                kb.push(s)
    expr = capacity(kb, s)
    a = rng.integers(50, 100, size=8).astype(np.int32)
    b = rng.integers(0, 50, size=8).astype(np.int32)
    assert bound(expr, [a, b]) == a.max() >= max(run_ir(kb.k, [a, b]).values()) == a.max() - b.min()


def test_min_of_two_shapes_is_exact(rng):
    kb = KB(("a", "ndarray", 1), ("b", "ndarray", 1))
    with kb.loop(0, kb.op("min", kb.shape(0), kb.shape(1))) as loop:
        pass
    expr = trip_count_expr(loop, kb.k)
    assert se.to_text(expr) == "min(shape(arg0,0), shape(arg1,0))"
    assert bound(expr, [np.zeros(4), np.zeros(9)]) == 4


def _subtrees(e):
    yield e
    for c in e.children:
        yield from _subtrees(c)


# ---- serialization and printing -----------------------------------------------------------------

def _example():
    j = se.BoundVariable(0)
    mor = se.MaxOverRange(0, se.Const(0), se.NdarrayShape(0, 0), se.NdarrayRead(1, [j]))
    return se.Add(se.Mul(mor, se.Const(2)), se.Max(mor, se.FieldLoad(2, [se.Const(1), se.ScalarArg(3)])))


def test_round_trip_is_post_order_with_the_root_last():
    expr = _example()
    nodes = se.to_nodes(expr)
    for pos, (kind, args, kids) in enumerate(nodes):
        assert all(k < pos for k in kids), "children precede their parent"
    assert nodes[-1][0] == "add"
    assert sum(1 for n in nodes if n[0] == "max_over") == 1, "a shared subtree is stored once"
    loaded = se.from_nodes(msgpack.unpackb(msgpack.packb(nodes), raw=False))
    assert loaded == expr and se.to_nodes(loaded) == nodes
    assert se.from_nodes([]) is None and se.to_nodes(None) == []


def test_printer():
    text = se.to_text(_example(), arg_names=["a", "b", "c", "n"], field_names=["x", "y", "tbl"])
    assert text == "max_over(j in [0, shape(a,0)): read(b[j])) * 2 + max(max_over(j in [0, shape(a,0)): " \
                   "read(b[j])), tbl[1, n])"
    e = se.Sub(se.Const(9), se.Sub(se.ScalarArg(0), se.Mul(se.Add(se.Const(1), se.Const(2)), se.Const(3))))
    assert se.to_text(e) == "9 - (arg0 - (1 + 2) * 3)"
    assert se.to_text(se.FieldLoad(0, [])) == "field0[None]"


@pytest.mark.parametrize("nodes, why", [
    ([["nope", [], []]], "unknown kind"),
    ([["const", [1], []], ["add", [], [0, 1]]], "earlier nodes"),
    ([["add", [], [0]]], "earlier nodes"),
    ([["const", [1.5], []]], "integer attribute"),
    ([["shape", [0, -1], []]], "non-negative"),
    ([["var", [0], []]], "outside any max_over"),
    ([["const", [1]]], "expected [kind"),
    ("add", "list"),
])
def test_malformed_node_lists_are_rejected(nodes, why):
    with pytest.raises(ValueError, match=f"malformed SizeExpr.*{why}".replace("[", r"\[")):
        se.from_nodes(nodes)


def test_too_deep_or_too_large_trees_are_rejected():
    chain = [["const", [1], []]] + [["add", [], [i, 0]] for i in range(se.MAX_DEPTH + 1)]
    with pytest.raises(ValueError, match="nested 202 deep"):
        se.from_nodes(chain)
    doubling = [["const", [1], []]] + [["add", [], [i, i]] for i in range(40)]  # 2**41 nodes expanded
    with pytest.raises(ValueError, match="nodes nested 41 deep"):
        se.from_nodes(doubling)
    assert ev.evaluate(doubling[:11], ev.LaunchEnv([])) == 1024


# ---- evaluation -----------------------------------------------------------------------------------

def test_arithmetic_saturates_at_int64_max():
    big = se.Const(1 << 62)
    env = ev.LaunchEnv([])
    assert ev.evaluate(se.Mul(big, se.Const(4)), env) == I64_MAX
    assert ev.evaluate(se.Add(se.Const(I64_MAX), se.Const(I64_MAX)), env) == I64_MAX
    assert ev.evaluate(se.Sub(se.Const(2), se.Const(5)), env) == 0
    assert ev.evaluate(se.Sub(se.Const(-I64_MAX), se.Const(I64_MAX)), env) == 0
    huge = np.array([1, (1 << 64) - 1, 7], np.uint64)
    j = se.BoundVariable(0)
    read = se.NdarrayRead(0, [j])
    assert ev.evaluate(se.MaxOverRange(0, se.Const(0), se.Const(3), read), ev.LaunchEnv([huge])) == I64_MAX
    vec = se.MaxOverRange(0, se.Const(0), se.Const(3), se.Mul(se.Add(read, j), big))  # numpy path
    assert ev.evaluate(vec, ev.LaunchEnv([huge])) == I64_MAX
    small = np.array([3, -5], np.int64)
    neg = se.MaxOverRange(0, se.Const(0), se.Const(2), se.Mul(se.NdarrayRead(0, [j]), se.Const(-(1 << 62))))
    assert ev.evaluate(se.Add(neg, se.Const(I64_MAX)), ev.LaunchEnv([small])) == I64_MAX


def test_vectorised_arithmetic_saturates_at_int64_min_too():
    """-3 * 2**62 saturates to INT64_MIN, whose magnitude is 2**63: subtracting it from 0 must
    saturate to INT64_MAX (not wrap around to INT64_MIN, then clamp to 0)."""
    j = se.BoundVariable(0)
    body = se.Sub(se.Const(0), se.Mul(se.NdarrayRead(0, [j]), se.Const(1 << 62)))
    tree = se.MaxOverRange(0, se.Const(0), se.NdarrayShape(0, 0), body)
    for dtype in (np.int32, np.int64):
        arr = np.array([-3, 1, 2], dtype)
        assert ev.evaluate(tree, ev.LaunchEnv([arr])) == I64_MAX == _brute_force(tree, [arr], {})
    wide = se.MaxOverRange(0, se.Const(0), se.NdarrayShape(0, 0), se.Sub(se.Const(0), se.NdarrayRead(0, [j])))
    arr = np.array([-(1 << 63), 5], np.int64)  # an int64 element of magnitude 2**63
    assert ev.evaluate(wide, ev.LaunchEnv([arr])) == I64_MAX


def test_max_over_range_guard_raises_instead_of_hanging():
    j, k = se.BoundVariable(0), se.BoundVariable(1)
    inner = se.MaxOverRange(1, se.Const(0), se.Add(j, se.Const(2)), se.Mul(j, k))
    nested = se.MaxOverRange(0, se.Const(0), se.Const(1 << 40), inner)  # Python-level loop
    with pytest.raises(se.SizeExprError, match=r"1099511627776 Python-level iterations.*ad_stack_size"):
        ev.evaluate(nested, ev.LaunchEnv([]))
    flat = se.MaxOverRange(0, se.Const(0), se.ScalarArg(0), se.Mul(j, se.Const(3)))  # numpy path
    with pytest.raises(se.SizeExprError, match="values of"):
        ev.evaluate(flat, ev.LaunchEnv([1 << 45]))
    assert ev.evaluate(flat, ev.LaunchEnv([1000])) == 2997


def test_guard_counts_every_range_of_one_evaluation(monkeypatch):
    monkeypatch.setattr(ev, "MAX_SCALAR_ITERATIONS", 1000)
    j, k = se.BoundVariable(0), se.BoundVariable(1)
    inner = se.MaxOverRange(1, se.Const(0), j, se.MaxOverRange(2, se.Const(0), k, se.Add(j, k)))
    tree = se.MaxOverRange(0, se.Const(0), se.ScalarArg(0), inner)
    assert ev.evaluate(tree, ev.LaunchEnv([20])) == 19 + 18
    with pytest.raises(se.SizeExprError):
        ev.evaluate(tree, ev.LaunchEnv([60]))  # each range is short, their total is not


def _brute_force(e, args, bind):
    """Independent reference: plain Python, one value at a time, Python ints clamped."""
    clamp = lambda x: max(-(1 << 63), min(x, I64_MAX))  # noqa: E731
    if isinstance(e, se.Const):
        return e.value
    if isinstance(e, se.ScalarArg):
        return args[e.arg]
    if isinstance(e, se.NdarrayShape):
        return args[e.arg].shape[e.axis]
    if isinstance(e, se.BoundVariable):
        return bind[e.var]
    if isinstance(e, se.NdarrayRead):
        idx = [_brute_force(i, args, bind) for i in e.indices]
        arr = args[e.arg]
        inside = all(0 <= i < n for i, n in zip(idx, arr.shape))
        return clamp(int(arr[tuple(idx)])) if inside else 0
    if isinstance(e, (se.MaxOverRange, se.SumOverRange)):
        lo, hi = _brute_force(e.begin, args, bind), _brute_force(e.end, args, bind)
        values = [_brute_force(e.body, args, {**bind, e.var: v}) for v in range(lo, hi)]
        return max([0] + values) if isinstance(e, se.MaxOverRange) else max(0, clamp(sum(values)))
    a, b = _brute_force(e.a, args, bind), _brute_force(e.b, args, bind)
    return {se.Add: lambda: clamp(a + b), se.Sub: lambda: max(clamp(a - b), 0),
            se.Mul: lambda: clamp(a * b), se.Max: lambda: max(a, b)}[type(e)]()


def _random_body(rng, depth, var):
    roll = rng.integers(0, 9 if depth else 4)
    if roll == 0:
        return se.Const(int(rng.choice([-3, 0, 2, 7, 1 << 40, 1 << 62])))
    if roll == 1:
        return se.BoundVariable(var)
    if roll == 2:
        return se.NdarrayRead(0, [_random_index(rng, var)])
    if roll == 3:
        return se.NdarrayRead(1, [_random_index(rng, var), se.Const(int(rng.integers(0, 3)))])
    cls = [se.Add, se.Sub, se.Mul, se.Max, se.Max][roll - 4]
    return cls(_random_body(rng, depth - 1, var), _random_body(rng, depth - 1, var))


def _random_index(rng, var):
    j = se.BoundVariable(var)
    return [j, se.Add(j, se.Const(3)), se.Sub(j, se.Const(2)), se.Mul(j, se.Const(2))][rng.integers(0, 4)]


def test_numpy_evaluation_matches_brute_force(rng, monkeypatch):
    monkeypatch.setattr(ev, "_CHUNK", 7)  # several chunks per range
    for _ in range(60):
        a = rng.integers(-50, 1 << 40, size=int(rng.integers(1, 30)))
        m = rng.integers(-10, 100, size=(int(rng.integers(1, 30)), 3)).astype(np.int32)
        args = [a, m, int(rng.integers(0, 40))]
        body = _random_body(rng, 3, 0)
        tree = se.MaxOverRange(0, se.Const(int(rng.integers(0, 3))), se.ScalarArg(2), body)
        want = max(0, _brute_force(tree, args, {}))
        assert ev.evaluate(tree, ev.LaunchEnv(args)) == want, se.to_text(tree)


def test_sum_over_matches_brute_force(rng, monkeypatch):
    """Vectorised sums (exact past int64 in the chunks, saturated at the end), the arithmetic
    series, and sums nested in a max over a variable their range depends on."""
    monkeypatch.setattr(ev, "_CHUNK", 7)
    for _ in range(40):
        a = rng.integers(-50, 1 << 40, size=int(rng.integers(1, 30)))
        m = rng.integers(-10, 100, size=(int(rng.integers(1, 30)), 3)).astype(np.int32)
        args = [a, m, int(rng.integers(0, 40))]
        sum_tree = se.SumOverRange(0, se.Const(int(rng.integers(0, 3))), se.ScalarArg(2), _random_body(rng, 3, 0))
        assert ev.evaluate(sum_tree, ev.LaunchEnv(args)) == max(0, _brute_force(sum_tree, args, {})), \
            se.to_text(sum_tree)
    i, j = se.BoundVariable(0), se.BoundVariable(1)
    series = se.SumOverRange(1, se.Const(3), se.ScalarArg(0), j)
    assert ev.evaluate(series, ev.LaunchEnv([1 << 20])) == sum(range(3, 1 << 20))
    assert ev.evaluate(series, ev.LaunchEnv([1 << 40])) == I64_MAX  # closed form, saturated: no scan
    triangle = se.MaxOverRange(0, se.Const(0), se.NdarrayShape(0, 0),
                               se.SumOverRange(1, se.Const(0), i, se.NdarrayRead(0, [j])))
    arr = rng.integers(0, 50, size=20)
    assert ev.evaluate(triangle, ev.LaunchEnv([arr])) == _brute_force(triangle, [arr], {}) == arr[:-1].sum()
    assert se.to_text(series, ["n"]) == "sum_over(j in [3, n): j)"
    assert se.from_nodes(se.to_nodes(triangle)) == triangle


def test_nested_max_over_matches_brute_force(rng):
    for _ in range(10):
        m = rng.integers(0, 100, size=(int(rng.integers(1, 12)), int(rng.integers(1, 12)))).astype(np.int32)
        i, j = se.BoundVariable(0), se.BoundVariable(1)
        body = se.Sub(se.NdarrayRead(0, [i, j]), se.Add(i, j))
        inner = se.MaxOverRange(1, se.Const(0), se.Add(i, se.Const(1)), body)  # triangular: Python loop
        tree = se.MaxOverRange(0, se.Const(0), se.NdarrayShape(0, 0), inner)
        assert ev.evaluate(tree, ev.LaunchEnv([m])) == _brute_force(tree, [m], {})


class _ShapeOnly:
    """An ndarray stand-in whose contents must not be touched."""
    shape = (1000, 3)

    def _host_view(self):
        raise AssertionError("the tree reads only shapes: no array memory may be touched")

    to_numpy = _host_view


def test_argument_and_shape_trees_touch_no_array_memory():
    tree = se.Add(se.Mul(se.NdarrayShape(0, 0), se.NdarrayShape(0, 1)), se.ScalarArg(1))
    assert ev.evaluate(tree, ev.LaunchEnv([_ShapeOnly(), 5])) == 3005


def test_launch_env_reads_live_qdc_fields_and_ndarrays(rng):
    counts = qd.field(qd.i32, shape=(6,))
    arr = qd.ndarray(qd.i64, shape=(8,))
    c, a = rng.integers(0, 99, size=6), rng.integers(0, 99, size=8)
    counts.from_numpy(c)
    arr.from_numpy(a)
    j = se.BoundVariable(0)
    tree = se.Add(se.MaxOverRange(0, se.Const(0), se.Const(6), se.FieldLoad(0, [j])),
                  se.MaxOverRange(0, se.Const(2), se.NdarrayShape(0, 0), se.Mul(se.NdarrayRead(0, [j]), j)))
    assert ev.evaluate(tree, ev.LaunchEnv([arr], [counts])) == c.max() + (a * np.arange(8))[2:].max()
    counts[3] = 1000  # evaluated per launch: a new env sees the new value
    assert ev.evaluate(tree, ev.LaunchEnv([arr], [counts])) == 1000 + (a * np.arange(8))[2:].max()


def _argument_tree(rng, depth):
    """A random trip count over two integer arguments and a 2-D array's extents."""
    if depth == 0 or rng.random() < 0.25:
        leaf = int(rng.integers(0, 4))
        if leaf == 0:
            return se.Const(int(rng.choice([0, 1, 7, -5, 1 << 62, -(1 << 62), I64_MAX])))
        if leaf == 1:
            return se.ScalarArg(int(rng.integers(0, 2)))
        return se.NdarrayShape(2, int(rng.integers(0, 2)))
    node = [se.Add, se.Sub, se.Mul, se.Max][int(rng.integers(0, 4))]
    return node(_argument_tree(rng, depth - 1), _argument_tree(rng, depth - 1))


def test_trip_counts_of_arguments_alone_compile_to_the_evaluated_value(rng):
    """simple_trip_count's generated function (a GPU launch's trip count, per launch) against
    the tree evaluator, saturation and clamping at 0 included."""
    for _ in range(300):
        tree = _argument_tree(rng, int(rng.integers(0, 6)))
        trips = ev.simple_trip_count(tree)
        assert trips is not None, se.to_text(tree)
        for _ in range(3):
            args = [int(rng.choice([0, 3, 1 << 40, -(1 << 61), int(rng.integers(-50, 50))])),
                    int(rng.integers(0, 1 << 20)), np.zeros(tuple(int(x) for x in rng.integers(0, 9, size=2)))]
            assert trips(args) == ev.evaluate(tree, ev.LaunchEnv(args)), se.to_text(tree)
    mixed = se.Add(se.ScalarArg(0), se.ScalarArg(1))
    assert ev.simple_trip_count(mixed)([3, 2.5]) is None  # not an integer: unknown, as trip_count says
    j = se.BoundVariable(0)
    assert ev.simple_trip_count(se.Add(se.ScalarArg(0), se.FieldLoad(0, []))) is None  # reads memory
    assert ev.simple_trip_count(se.MaxOverRange(0, se.Const(0), se.ScalarArg(0), j)) is None


def test_non_integer_scalar_argument_is_reported():
    with pytest.raises(se.SizeExprError, match="argument 0 bounds an adstack"):
        ev.evaluate(se.ScalarArg(0), ev.LaunchEnv([2.5]))


# ---- on the front end's own IR ---------------------------------------------------------------------

row_cap = qd.field(qd.i32, shape=())


def test_bounds_of_loops_in_front_end_ir(rng):
    """range(b, e) as the front end lowers it (casts, max(e - b, 0), offloaded tasks)."""
    from qdc.compiler.frontend.ast_to_ir import FrontEnd
    from qdc.compiler.driver.options import Options
    from qdc.compiler.passes.pipeline import run_pipeline

    @qd.kernel
    def rows(n: qd.i32, off: qd.types.ndarray(dtype=qd.i32, ndim=1),
             out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(off.shape[0] - 1):
            s = 0.0
            for j in range(off[i], off[i + 1]):
                s += 1.0
            for t in range(2, row_cap[None] + n):
                s += 2.0
            out[i] = s

    kir = FrontEnd(rows.fn, rows._primal.params, Options()).build()
    run_pipeline(kir)
    task = kir.tasks[0]
    csr, capped = [s for s in ir.walk(task.body) if isinstance(s, ir.RangeFor)]
    b = SizeExprBuilder(kir)
    off = np.concatenate([[0], np.cumsum(rng.integers(0, 30, size=20))]).astype(np.int32)
    cap = np.array(rng.integers(0, 40), np.int32)
    args, fields = [int(rng.integers(-3, 9)), off, None], [cap]
    assert bound(b.trip_count(task), args, fields) == len(off) - 1
    assert bound(b.trip_count(csr), args, fields) == np.diff(off).max()
    assert bound(b.trip_count(capped), args, fields) == max(int(cap) + args[0] - 2, 0)


def test_read_at_an_index_known_only_at_run_time_is_bounded_by_the_whole_axis(rng):
    """range(a[k]) with k loop-carried (k = b[k] chases pointers): k lies in [0, max(b)]."""
    kb = KB(("a", "ndarray", 1), ("b", "ndarray", 1))
    with kb.loop(0, 1):
        s = kb.stack()
        k = kb(ir.Alloca(T.i32, "k"))
        with kb.loop(0, 4):
            kb(ir.LocalStore(k, kb.read(kb.nd(1), kb(ir.LocalLoad(k)))))
            with kb.loop(0, kb.read(kb.nd(0), kb(ir.LocalLoad(k)))):
                kb.push(s)
    expr = capacity(kb, s)
    a = rng.integers(0, 60, size=10).astype(np.int32)
    b = rng.integers(0, 10, size=10).astype(np.int32)
    assert bound(expr, [a, b]) == 4 * a[:b.max() + 1].max() >= run_ir(kb.k, [a, b])[s]
    b[:] = 0  # k stays 0
    assert bound(expr, [a, b]) == 4 * a[0] == run_ir(kb.k, [a, b])[s]
