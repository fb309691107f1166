"""Adstack capacities evaluated at launch from SizeExpr trees, end to end: compile-time capture,
the artifact, the per-launch evaluation, the heap it sizes, and the gradients it makes right.

Every kernel runs the same step `v = sin(v) * 0.9 + 0.05` T_i times for element i, so the
gradient is d/dx of T_i steps (computed in float64 numpy) and the deepest stack of `v` holds
1 + max_i T_i entries (its first value, then one per step): both come from plain Python, not
from the compiler. Heap sizes are compared with threads * sum(align8(8 + capacity * entry))
on a fresh runtime, where the heap has exactly the size the first launch asked for.
"""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import adstack, context
from qdc.runtime import sizeexpr_eval as ev
from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.adstack_sizing import dtype_range
from qdc.runtime.contract.artifact import KernelMeta
from qdc.runtime.launcher import LaunchContext
from cpu_lanes_util import heap_slices_per_thread

N = 8
x = qd.field(qd.f64, shape=N, needs_grad=True)
y = qd.field(qd.f64, shape=(), needs_grad=True)
n = qd.field(qd.i32, shape=())
F64_ENTRY = 8  # an f64 primal; its adjoint is a local of the reverse sweep (compiler/autodiff/register_adjoints.py)


def align8(v):
    return (v + 7) & ~7


_last_gradient = {"slices per thread": 1}  # of the last gradient `run_grad` ran (cpu_lanes_util.py)


def heap_bytes(threads, stacks):
    """threads * the slices each takes * sum(align8(8 + capacity * entry bytes)) for (capacity,
    entry bytes) pairs; a thread of a task lowered W iterations at a time takes W slices."""
    return threads * _last_gradient["slices per thread"] * sum(align8(8 + cap * entry) for cap, entry in stacks)


def steps_reference(xs, trips):
    """d/dx of `trips` applications of v -> sin(v) * 0.9 + 0.05, elementwise, in float64."""
    v, d = np.array(xs, np.float64), np.ones(len(xs))
    trips = np.broadcast_to(trips, v.shape)
    for t in range(int(trips.max(initial=0))):
        live = t < trips
        d = np.where(live, d * np.cos(v) * 0.9, d)
        v = np.where(live, np.sin(v) * 0.9 + 0.05, v)
    return d


def run_grad(kernel, *args):
    y[None] = 0
    kernel(*args)
    x.grad.fill(0)
    y.grad[None] = 1
    kernel.grad(*args)
    _last_gradient["slices per thread"] = heap_slices_per_thread(kernel.grad.compile(args))
    return x.grad.to_numpy()


def one_thread(**options):
    """A fresh runtime on one worker thread, so the heap holds exactly one thread's slice."""
    qd.init(arch=qd.cpu, cpu_max_num_threads=1, cache_dir=context_cache_dir(), **options)


def context_cache_dir():
    from qdc.compiler.jit.api import direct_options
    return direct_options().cache_dir


@qd.func
def step(v):
    return qd.sin(v) * 0.9 + 0.05


# ---- the field-load bound: sized per launch, the fallback bypassed ------------------------------

@qd.kernel
def field_bound():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = step(v)
        y[None] += v


def test_field_bound_is_evaluated_at_every_launch_not_the_fallback(rng):
    one_thread(default_ad_stack_size=2)
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in the grammar: no fallback warning
        record = field_bound.grad.compile().meta.adstack["stacks"][0]
    assert record["source"] == "size_expr" and record["size_expr"]
    for trips in (1, 20, 50):  # each launch needs more than twice the last: the heap is exact
        n[None] = trips
        np.testing.assert_allclose(run_grad(field_bound), steps_reference(xs, trips), rtol=1e-10)
        assert qd.adstack_heap_bytes() == heap_bytes(1, [(trips + 1, F64_ENTRY)])


# ---- ndarray reads ---------------------------------------------------------------------------------

@qd.kernel
def by_outer_index(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in x:
        v = x[i]
        for _ in range(a[i]):
            v = step(v)
        y[None] += v


@qd.kernel
def by_2d_read(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i in x:
        v = x[i]
        for _ in range(a[i, 1]):
            v = step(v)
        y[None] += v


@qd.kernel
def by_i64_read(a: qd.types.ndarray(dtype=qd.i64, ndim=1)):
    for i in x:
        v = x[i]
        for _ in range(a[i]):
            v = step(v)
        y[None] += v


@pytest.mark.parametrize("kernel, shape, dtype, column", [
    (by_outer_index, (N,), np.int32, None), (by_2d_read, (N, 3), np.int32, 1), (by_i64_read, (N,), np.int64, None)])
def test_inner_range_bounded_by_an_ndarray_read(rng, kernel, shape, dtype, column):
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    a = rng.integers(0, 40, size=shape).astype(dtype)
    trips = a if column is None else a[:, column]
    np.testing.assert_allclose(run_grad(kernel, a), steps_reference(xs, trips), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + trips.max(), F64_ENTRY)])
    a2 = (a + 45).astype(dtype)  # relaunched with new contents: sized again
    np.testing.assert_allclose(run_grad(kernel, a2), steps_reference(xs, trips + 45), rtol=1e-10)


@qd.kernel
def by_stashed_index(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in x:
        v = x[i]
        k = i
        for _ in range(3):
            for _ in range(a[k]):
                v = step(v)
            k = (k + 1) % 8
        y[None] += v


def test_read_indexed_by_a_stashed_loop_variable(rng):
    """`k` is loop-carried, so the gradient kernel keeps it on a stack of its own; the bound of
    a[k] is the max of `a` over every value pushed there (k < 8): 3 * max(a) + 1 entries,
    which bounds the deepest element (exact when the three reads of one element peak
    together) and never reads past `a`."""
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    a = rng.integers(0, 30, size=N + 4).astype(np.int32)
    trips = np.array([a[i] + a[(i + 1) % 8] + a[(i + 2) % 8] for i in range(N)])
    np.testing.assert_allclose(run_grad(by_stashed_index, a), steps_reference(xs, trips), rtol=1e-10)
    stacks = by_stashed_index.grad.compile().meta.adstack["stacks"]
    assert [(r["name"], r["dtype"], r["source"]) for r in stacks] == [("v", "f64", "size_expr"),
                                                                      ("k", "i32", "constant bounds")]
    capacity = 3 * a[:N].max() + 1
    assert capacity >= 1 + trips.max()
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(capacity, F64_ENTRY), (stacks[1]["max_size"], 4)])


@qd.kernel
def through_index_elements(idx: qd.types.ndarray(dtype=qd.i32, ndim=1), cnt: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in x:
        v = x[i]
        for k in range(idx.shape[0]):
            for _ in range(cnt[idx[k]]):
                v = step(v)
        y[None] += v


@qd.kernel
def through_index_shapes(idx: qd.types.ndarray(dtype=qd.i32, ndim=1), cnt: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in x:
        v = x[i]
        for k in range(idx.shape[0]):
            for _ in range(cnt.shape[0]):
                v = step(v)
        y[None] += v


@pytest.mark.parametrize("variant", ["elements", "shapes"])
def test_nested_trip_counts_through_an_index_ndarray(rng, variant):
    """The inner loop's count depends on the outer index: the pushes are the sum over it,
    sized exactly (not the outer count times the largest inner count)."""
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    cnt = rng.integers(0, 20, size=12).astype(np.int32)
    idx = rng.integers(0, 12, size=int(rng.integers(2, 9))).astype(np.int32)
    kernel = through_index_elements if variant == "elements" else through_index_shapes
    total = int(cnt[idx].sum()) if variant == "elements" else len(idx) * len(cnt)
    np.testing.assert_allclose(run_grad(kernel, idx, cnt), steps_reference(xs, total), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + total, F64_ENTRY)])


# ---- differences: fused pointwise, capped at the shorter ndarray -------------------------------------

@qd.kernel
def csr_rows(off: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in x:
        v = x[i]
        for _ in range(off[i], off[i + 1]):
            v = step(v)
        y[None] += v


@qd.kernel
def between(m: qd.i32, lo: qd.types.ndarray(dtype=qd.i32, ndim=1), hi: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(m):
        v = x[i]
        for _ in range(lo[i], hi[i]):
            v = step(v)
        y[None] += v


def test_sub_of_ranges_fuses_with_matching_shape_ends(rng):
    """off[i + 1] - off[i] of one ndarray: the largest row, not max(off) - min(off)."""
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    off = np.concatenate([[0], np.cumsum(rng.integers(0, 25, size=N))]).astype(np.int32)
    rows = np.diff(off)
    np.testing.assert_allclose(run_grad(csr_rows, off), steps_reference(xs, rows), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + rows.max(), F64_ENTRY)])


@pytest.mark.parametrize("lengths", [(N, N), (N, N + 5), (N + 5, N)])
def test_sub_of_ranges_fuses_across_ndarrays_of_any_length(rng, lengths):
    """hi[i] - lo[i] of two ndarrays, pointwise, over the iterations the kernel runs: a peak
    of the longer ndarray past the loop's end does not count, and nothing past the shorter
    one's end is read (its range is capped at min(shape(lo), shape(hi), m))."""
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    lo = rng.integers(0, 20, size=lengths[0]).astype(np.int32)
    hi = (lo[:min(lengths)].max() + rng.integers(-5, 30, size=lengths[1])).astype(np.int32)
    if len(hi) > len(lo):
        hi[-1] = 10_000  # a peak of hi - lo that the loop never reaches
    elif len(lo) > len(hi):
        lo[-1] = -10_000
    m = min(lengths)
    trips = np.maximum(hi[:m] - lo[:m], 0)
    got = run_grad(between, m, lo, hi)
    np.testing.assert_allclose(got[:m], steps_reference(xs[:m], trips), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + trips.max(), F64_ENTRY)])


# ---- loop indices, ndrange, scalar arguments ---------------------------------------------------------

@qd.kernel
def triangular_self_referential(m: qd.i32):
    for i, j in qd.ndrange(m, m):
        v = x[j]
        lim = i
        for _ in range(2):
            for _ in range(lim):
                v = step(v)
            lim = max(lim - j, 0)  # pushed onto its own stack, from its own top
        y[None] += v


def test_triangular_ndrange_with_a_self_referential_push(rng):
    """`lim` starts at the row index i and only shrinks: its stack's pushes bound it by i < m
    (the row of the ndrange's flat index), so `v` needs 1 + 2 (m - 1) entries, exactly."""
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    m = int(rng.integers(3, N + 1))
    want = np.zeros(N)
    for i in range(m):
        trips = i + np.maximum(i - np.arange(m), 0)
        want[:m] += steps_reference(xs[:m], trips)
    np.testing.assert_allclose(run_grad(triangular_self_referential, m), want, rtol=1e-10)
    stacks = triangular_self_referential.grad.compile().meta.adstack["stacks"]
    assert [r["name"] for r in stacks] == ["v", "lim"] and stacks[1]["source"] == "constant bounds"
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + 2 * (m - 1), F64_ENTRY), (stacks[1]["max_size"], 4)])


@qd.kernel
def triangle_in_a_task(m: qd.i32):
    for i in x:
        v = x[i]
        for r in range(m):
            for _ in range(r):
                v = step(v)
        y[None] += v


@qd.kernel
def by_scalar_argument(m: qd.i32):
    for i in x:
        v = x[i]
        for _ in range(m * 2 + 1):
            v = step(v)
        y[None] += v


@qd.kernel
def by_i64_argument(m: qd.i64):
    for i in x:
        v = x[i]
        for _ in range(m):
            v = step(v)
        y[None] += v


@pytest.mark.parametrize("kernel, trips_of", [
    (triangle_in_a_task, lambda m: m * (m - 1) // 2), (by_scalar_argument, lambda m: 2 * m + 1),
    (by_i64_argument, lambda m: m)])
def test_bounds_from_scalar_arguments(rng, kernel, trips_of):
    one_thread()
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    m = int(rng.integers(2, 30))
    np.testing.assert_allclose(run_grad(kernel, m), steps_reference(xs, trips_of(m)), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(1 + trips_of(m), F64_ENTRY)])


def test_a_bound_too_large_is_refused_before_the_launch():
    with pytest.raises(se.SizeExprError, match=r"kernel 'by_i64_argument'.*'v'.*35184372088833 entries"):
        by_i64_argument.grad(1 << 45)
    assert qd.adstack_heap_bytes() == 0


@qd.kernel
def sum_of_squares(m: qd.i32):
    for i in x:
        v = x[i]
        for r in range(m):
            for _ in range(r * r):
                v = step(v)
        y[None] += v


def test_a_range_too_long_to_evaluate_raises_instead_of_hanging(rng):
    x.from_numpy(rng.uniform(0, 1, N))
    with pytest.raises(se.SizeExprError, match=r"kernel 'sum_of_squares'.*would scan 536870912 values"):
        sum_of_squares.grad(1 << 29)
    m = 12
    np.testing.assert_allclose(run_grad(sum_of_squares, m), steps_reference(x.to_numpy(), sum(r * r for r in range(m))),
                               rtol=1e-10)


# ---- exactness over several threads and stacks -------------------------------------------------------

BIG = 20_000  # enough work that every worker thread takes part
xb = qd.field(qd.f64, shape=BIG, needs_grad=True)
yb = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def three_stacks():
    for i in xb:
        a = xb[i]
        b = qd.cast(a, qd.f32)
        k = i % 7
        for _ in range(n[None]):
            k = (k * 3 + 1) % 7
            a = qd.sin(a) * (0.9 + 0.01 * k)
            b = qd.cos(b) * 0.5 + qd.cast(a, qd.f32)
        yb[None] += a + qd.cast(b, qd.f64)


def three_stacks_reference(xs, trips):
    k = np.arange(len(xs)) % 7
    a, b = xs.copy(), xs.astype(np.float32).astype(np.float64)
    da, db = np.ones(len(xs)), np.ones(len(xs))
    for _ in range(trips):
        k = (k * 3 + 1) % 7
        da, a = np.cos(a) * (0.9 + 0.01 * k) * da, np.sin(a) * (0.9 + 0.01 * k)
        db, b = -np.sin(b) * 0.5 * db + da, np.cos(b) * 0.5 + a
    return da + db


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_heap_is_exactly_threads_times_the_stacks(rng, workers):
    qd.init(arch=qd.cpu, cpu_max_num_threads=workers, cache_dir=context_cache_dir())
    xs = rng.uniform(0, 1, BIG)
    xb.from_numpy(xs)
    trips = int(rng.integers(5, 40))
    n[None] = trips
    three_stacks()
    xb.grad.fill(0)
    yb.grad[None] = 1
    three_stacks.grad()
    _last_gradient["slices per thread"] = heap_slices_per_thread(three_stacks.grad.compile())
    np.testing.assert_allclose(xb.grad.to_numpy(), three_stacks_reference(xs, trips), rtol=1e-4)
    stacks = three_stacks.grad.compile().meta.adstack["stacks"]
    # every adjoint is a local of the reverse sweep (register_adjoints.py): entries hold the primal
    assert [(r["name"], r["dtype"], r["adjoint"]) for r in stacks] == [
        ("a", "f64", False), ("b", "f32", False), ("k", "i32", False)]
    capacity = 1 + trips  # each is set once before the loop and once per iteration
    assert qd.adstack_heap_bytes() == heap_bytes(workers, [(capacity, 8), (capacity, 4), (capacity, 4)])


@qd.kernel
def wrapping_range(lo: qd.i32, hi: qd.i32):
    for i in range(lo, hi):
        v = x[i & 7]
        for _ in range(n[None]):
            v = step(v)
        y[None] += v


def test_a_trip_count_evaluated_too_low_never_outruns_the_heap(rng):
    """hi - lo wraps around in the kernel's i32 arithmetic (20000 iterations) while the exact
    value is negative (0 iterations): the heap gets one slice, and the task runs on one
    thread instead of every worker's, writing nothing past that slice."""
    qd.init(arch=qd.cpu, cpu_max_num_threads=2, cache_dir=context_cache_dir())
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    n[None] = 3
    lo, hi = (1 << 31) - 1, -(1 << 31) + 19_999
    run_grad(wrapping_range, lo, hi)
    heap = adstack.heap_for(context.current())
    one_slice = heap.nbytes
    assert one_slice == heap_bytes(1, [(4, F64_ENTRY)])
    heap.ensure(4 * one_slice, "test")  # room past the slice, filled with guard bytes
    heap.alloc.host[:] = 0xAB
    got = run_grad(wrapping_range, lo, hi)
    assert np.all(heap.alloc.host[one_slice:] == 0xAB)
    i = (lo + np.arange(20_000) + (1 << 31)) % (1 << 32) - (1 << 31)
    np.testing.assert_allclose(got, np.bincount(i & 7, minlength=N) * steps_reference(xs, 3), rtol=1e-9)


# ---- compile-time decisions: fallback warning, strict mode ---------------------------------------------

s_float = qd.field(qd.f32, shape=())


@qd.kernel
def float_bound():
    for i in x:
        v = x[i]
        for _ in range(int(s_float[None])):
            v = step(v)
        y[None] += v


def line_of(text):
    with open(__file__, encoding="utf-8") as f:
        return next(number for number, line in enumerate(f, 1) if text in line)


def test_bound_outside_the_grammar_warns_with_the_construct_or_fails_when_strict():
    with pytest.warns(UserWarning, match=r"test_adstack_sizeexpr.py:\d+: .*a cast from f32 cannot bound a loop.*"
                                         r"default_ad_stack_size=256") as record:
        stacks = float_bound.grad.compile().meta.adstack["stacks"]
    assert record[0].lineno == line_of("range(int(s_float[None]))")
    assert stacks[0]["source"] == "default_ad_stack_size" and stacks[0]["max_size"] == 256
    qd.init(arch=qd.cpu, ad_stack_strict=True, cache_dir=context_cache_dir())
    with pytest.raises(qd.QdcCompileError, match="a cast from f32 cannot bound a loop.*ad_stack_strict") as e:
        float_bound.grad.compile()
    assert e.value.line == line_of("range(int(s_float[None]))")


# ---- the artifact: cache hits, load-time checks ----------------------------------------------------------

def test_a_cache_hit_sizes_from_the_stored_tree(rng):
    field_bound.grad.compile()  # stored
    one_thread()  # a new runtime: the kernel comes back from the cache
    assert field_bound.grad.compile().from_cache
    xs = rng.uniform(0, 1, N)
    x.from_numpy(xs)
    n[None] = 300  # past default_ad_stack_size
    np.testing.assert_allclose(run_grad(field_bound), steps_reference(xs, 300), rtol=1e-10)
    assert qd.adstack_heap_bytes() == heap_bytes(1, [(301, F64_ENTRY)])


@pytest.mark.parametrize("nodes, why", [
    ([["arg", [0], []]], "reads a parameter or field the kernel does not have"),
    ([["field", [7], []]], "reads a parameter or field the kernel does not have"),
    ([["const", [1], [3]]], "children must name earlier nodes"),
    ([["var", [0], []]], "outside any max_over")])
def test_malformed_trees_fail_when_the_metadata_is_loaded(nodes, why):
    meta = field_bound.grad.compile().meta.to_dict()
    meta["adstack"]["stacks"][0]["size_expr"] = nodes
    with pytest.raises(ValueError, match=f"adstack record 0, size_expr: .*{why}"):
        KernelMeta.from_dict(meta)


def test_what_sizing_reads_per_launch():
    """Trees of arguments and shapes read no array memory; a kernel without adstacks gets no
    hooks at all; the field-bound kernel reads one field element."""
    def source(kernel):
        return adstack.AdStackHooks(kernel.grad.compile().meta).prepare.__qdc_source__
    arg_only = source(by_scalar_argument)
    assert "a[0]" in arg_only and not any(t in arg_only for t in ("_f", "_read", "_mor", "_rf"))
    field = source(field_bound)
    assert "_f" in field and "_mor" not in field and "_read" not in field
    assert "_mor" in source(by_outer_index)  # a max over the ndarray, vectorised by sizeexpr_eval.evaluate

    @qd.kernel
    def linear():
        for i in x:
            y[None] += x[i] * 3.0
    assert adstack.launch_hooks(linear.grad.compile().meta) is None


# ---- the generated evaluation agrees with sizeexpr_eval.evaluate -----------------------------

def _random_tree(rng, depth, fields, params):
    roll = int(rng.integers(0, 10 if depth else 6))
    if roll == 0:
        return se.Const(int(rng.choice([-5, 0, 3, 40, 1 << 31, 1 << 62, -(1 << 62)])))
    if roll == 1:
        return se.ScalarArg(int(rng.integers(0, 3)))
    if roll == 2:
        return se.NdarrayShape(3, int(rng.integers(0, 2)))
    if roll == 3:
        slot = int(rng.integers(0, len(fields)))
        return se.FieldLoad(slot, [se.Const(int(rng.integers(-1, s + 1))) for s in fields[slot].shape])
    if roll == 4:
        return se.FieldLoad(2, [_random_tree(rng, 0, fields, params), se.Const(1)])
    if roll == 5:
        return se.NdarrayRead(3, [se.Const(int(rng.integers(0, 4))), se.ScalarArg(0)])
    if roll == 6:
        j = se.BoundVariable(9)
        cls = se.MaxOverRange if rng.integers(0, 2) else se.SumOverRange
        return cls(9, se.Const(0), se.NdarrayShape(4, 0), se.Add(se.NdarrayRead(4, [j]), j))
    cls = (se.Add, se.Sub, se.Mul, se.Max)[roll - 6]
    return cls(_random_tree(rng, depth - 1, fields, params), _random_tree(rng, depth - 1, fields, params))


def test_generated_evaluation_matches_the_reference_evaluator(rng):
    """Random trees over every leaf kind, with values near the int64 limits: the capacities and
    the thread slices the generated `prepare` writes into the ctx words are those of
    sizeexpr_eval.evaluate (and a capacity past the limit is refused)."""
    fields = [qd.field(qd.i32, shape=()), qd.field(qd.u64, shape=(5,)), qd.field(qd.i16, shape=(3, 4))]
    params = [["s", "scalar", "i32", 0, False], ["t", "scalar", "i64", 0, False],
              ["u", "scalar", "u64", 0, False], ["a", "ndarray", "i32", 2, False],
              ["b", "ndarray", "i64", 1, False]]
    for _ in range(60):
        trees = [_random_tree(rng, 3, fields, params) for _ in range(3)]
        iterations = _random_tree(rng, 2, fields, params)
        records = [{"task": 0, "dtype": "f32", "adjoint": True, "max_size": 1, "name": f"s{i}", "where": "?",
                    "source": "size_expr", "size_expr": se.to_nodes(t)} for i, t in enumerate(trees)]
        launch = {"policy": "cpu_chunks", "parallel_from": int(rng.integers(0, 20))}
        task = {"name": "t0", "kind": "range_for", "serial": False, "source_kind": "range", "entry": "k_t0",
                "iterations": se.to_nodes(iterations), "launch": launch, "adstacks": [0, 1, 2]}
        meta = KernelMeta.from_dict({
            "name": "k", "entry": "k", "num_temps": 0, "is_grad": True, "params": params,
            "fields": [[f"f{i}", f.dtype.name, list(f.shape), False] for i, f in enumerate(fields)],
            "tasks": [task], "adstack": {"stacks": records}})
        for f in fields:
            lo, hi = dtype_range(f.dtype.name)
            f.from_numpy(rng.integers(max(lo, -(1 << 40)), hi, size=f.shape, endpoint=True, dtype=np.int64)
                         .astype(f.dtype.np_dtype))
        args = (int(rng.integers(-50, 50)), int(rng.integers(-(1 << 62), 1 << 62)), int(rng.integers(0, 1 << 64,
                dtype=np.uint64)), rng.integers(-9, 99, size=(4, int(rng.integers(1, 6)))).astype(np.int32),
                rng.integers(-(1 << 40), 1 << 40, size=int(rng.integers(0, 7))))
        hooks = adstack.AdStackHooks(meta)
        hooks.namespace["_grow"] = lambda required: None  # the layout, without allocating it
        device = context.current().device
        lctx = LaunchContext(meta, device, fields, np.zeros(meta.ctx_words, np.uint64), device.acquire_error_slot())
        lctx.args = args
        env = ev.LaunchEnv(args, fields)
        want_caps = [max(ev.evaluate(t, env), 1) for t in trees]
        too_large = [c for c in want_caps if c > 1 << 40]
        if too_large:  # the first one is refused, with its saturated value
            with pytest.raises(se.SizeExprError, match=f"would need {too_large[0]} entries"):
                hooks.prepare(lctx)
            continue
        hooks.prepare(lctx)
        trip, nt, pf = ev.evaluate(iterations, env), context.current().device.num_threads, launch["parallel_from"]
        want_threads = 0 if trip <= 0 else 1 if pf == 0 or trip < pf else min(trip, nt)
        s = meta.adstack_slot
        assert list(lctx.words[s + 4:s + 10:2]) == want_caps, [se.to_text(t) for t in trees]
        sizes = [align8(8 + c * 8) for c in want_caps]  # f32 entries with adjoints: 8 bytes
        assert list(lctx.words[s + 3:s + 9:2]) == [0, sizes[0], sizes[0] + sizes[1]]
        assert lctx.words[s + 1] == sum(sizes)  # the stride
        assert lctx.words[meta.adstack_threads_slot] == max(want_threads, 1), se.to_text(iterations)


# ---- ahead of time ------------------------------------------------------------------------------------------

KERNEL_MODULE = """
import qdc as qd

x = qd.field(qd.f64, shape=16, needs_grad=True)
n = qd.field(qd.i32, shape=())
y = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.9 + 0.05
        y[None] += v
"""

RUN = """
import sys
import numpy as np
from qdc.runtime import adstack, load

mod = load(sys.argv[1], "adk", arch="cpu")
xs = np.linspace(0.1, 0.9, 16)
mod.x.from_numpy(xs)
mod.n[None] = 300  # past default_ad_stack_size = 256
mod.chain()
mod.y.grad[None] = 1.0
mod.chain.grad()
v, d = xs.copy(), np.ones(16)
for _ in range(300):
    d, v = d * np.cos(v) * 0.9, np.sin(v) * 0.9 + 0.05
assert np.allclose(mod.x.grad.to_numpy(), d, rtol=1e-10), "wrong gradient"
assert adstack.adstack_heap_bytes() >= 8 + 301 * 8
assert not any(m.startswith("qdc.compiler") or m == "llvmlite" for m in sys.modules), "compiler imported"
print("ok")
"""


def test_aot_round_trip_sizes_from_the_artifact(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "adk.py").write_text(textwrap.dedent(KERNEL_MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    cli = [sys.executable, "-m", "qdc.cli.main"]
    build = subprocess.run(cli + ["build", str(tmp_path / "kernels"), "--cache", cache],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0 and "default_ad_stack_size" not in build.stderr, build.stdout + build.stderr
    run = subprocess.run([sys.executable, "-c", RUN, cache], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, QDC_LOG=""))
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    shown = subprocess.run(cli + ["inspect", "adk.chain.grad", "--size-expr", "--cache", cache],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "stack 0 'v' (f64)" in shown.stdout and "1 + max(n[None], 0)  [size_expr]" in shown.stdout
    assert "task chain_grad_t0_struct: 16 iterations" in shown.stdout
