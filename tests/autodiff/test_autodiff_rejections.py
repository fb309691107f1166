"""Kernels whose gradient would be silently wrong are refused at compile time, at the right line."""
import numpy as np
import pytest

import qdc as qd
from autodiff_util import grad_error, line_of


x = qd.field(qd.f32, shape=8, needs_grad=True)
out = qd.field(qd.f32, shape=8, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)
plain = qd.field(qd.f32, shape=8)


@qd.kernel
def with_while():
    for i in x:
        v = x[i]
        while v < 10.0:
            v = v * 2.0
        y[None] += v


@qd.kernel
def with_break():
    for i in x:
        v = x[i]
        for _ in range(4):
            if v > 1.0:
                break
            v = v * 2.0
        y[None] += v


@qd.kernel
def with_continue():
    for i in x:
        v = x[i]
        for j in range(4):
            if j == 2:
                continue
            v = v * 2.0
        y[None] += v


@pytest.mark.parametrize("kernel, text, word", [(with_while, "while v < 10.0", "while"),
                                                (with_break, " break", "break"),
                                                (with_continue, " continue", "continue")])
def test_while_break_continue_rejected(kernel, text, word):
    x.fill(1.5)
    kernel()  # the forward kernel is fine
    e = grad_error(kernel)
    assert e.line == line_of(kernel, text) and word in e.raw_message and "gradient" in e.raw_message


@qd.kernel
def prefix_sum():
    for i in range(1, 8):
        out[i] = out[i - 1] + x[i]


@qd.kernel
def read_while_accumulating():
    for i in x:
        y[None] += x[i]
        out[i] = y[None] * 2.0


def test_cross_iteration_read_after_write_rejected():
    e = grad_error(prefix_sum)
    assert e.line == line_of(prefix_sum, "out[i] = out[i - 1]") and "cross-iteration" in e.raw_message
    assert e.col > 1 and e.source_line is not None
    e = grad_error(read_while_accumulating)
    assert e.line == line_of(read_while_accumulating, "out[i] = y[None]") and "cross-iteration" in e.raw_message


@qd.kernel
def reads_past_the_range(n: qd.i32):
    for i in range(1, n):
        out[i] = out[0] * x[i] + out[n] * out[n]   # elements 0 and n: no iteration writes them


@qd.kernel
def reads_the_last_iteration(n: qd.i32):
    for i in range(n):
        out[i] = out[n - 1] + x[i]              # iteration n - 1 writes it: a race


def test_a_read_outside_the_written_range_is_no_race(rng):
    """out[i] over range(1, n) and non-linear reads of out[0] and out[n]: no iteration writes
    what is read, so the gradient is exact (the race and overwrite checks prove that the one
    iteration that could meet them lies outside the range); out[n - 1] over range(n) is still
    refused."""
    n = 5
    xs = rng.uniform(-1, 1, 8).astype(np.float32)
    start = rng.uniform(-1, 1, 8).astype(np.float32)
    x.from_numpy(xs)
    out.from_numpy(start)
    reads_past_the_range(n)
    np.testing.assert_allclose(out.to_numpy()[1:n], start[0] * xs[1:n] + start[n] ** 2, rtol=1e-6)
    x.grad.fill(0)
    out.grad.fill(0)
    seed = rng.uniform(-1, 1, 8).astype(np.float32)
    seed[0] = seed[n] = 0  # only the written elements' adjoints flow back
    out.grad.from_numpy(seed)
    reads_past_the_range.grad(n)
    g = out.grad.to_numpy()
    np.testing.assert_allclose(x.grad.to_numpy()[1:n], start[0] * seed[1:n], rtol=1e-5)
    np.testing.assert_allclose([g[0], g[n]], [np.dot(xs[1:n], seed[1:n]), 2 * start[n] * seed[1:n].sum()],
                               rtol=1e-5, atol=1e-6)
    e = grad_error(reads_the_last_iteration, 4)
    assert e.line == line_of(reads_the_last_iteration, "out[i] = out[n - 1]") and "cross-iteration" in e.raw_message


@qd.kernel
def in_place_sin():
    for i in x:
        x[i] = qd.sin(x[i])          # sin' needs the old x[i], which the store destroys


@qd.kernel
def in_place_scaled_by_a_gradient():
    for i in x:
        out[i] = out[i] * y[None]    # d/dy needs the old out[i]


@qd.kernel
def atomic_result_used():
    for i in x:
        old = qd.atomic_add(y[None], x[i])
        out[i] = old


@qd.kernel
def overwritten_input():
    for i in x:
        a = plain[i]
        plain[i] = 0.0
        y[None] += x[i] * a


def test_overwrites_and_atomic_results_rejected():
    e = grad_error(in_place_sin)
    assert e.line == line_of(in_place_sin, "x[i] = qd.sin(x[i])") and "overwrites 'x' afterwards" in e.raw_message
    assert "not linear" in e.raw_message
    e = grad_error(in_place_scaled_by_a_gradient)
    assert e.line == line_of(in_place_scaled_by_a_gradient, "out[i] * y[None]") and "overwrites" in e.raw_message
    e = grad_error(atomic_result_used)
    assert e.line == line_of(atomic_result_used, "qd.atomic_add") and "atomic" in e.raw_message
    e = grad_error(overwritten_input)
    assert e.line == line_of(overwritten_input, "a = plain[i]") and "overwrites" in e.raw_message


@qd.kernel
def shared_local():
    s = 0.0
    qd.loop_config(serialize=True)
    for i in range(8):
        s += x[i]
    y[None] = s


def test_local_shared_across_tasks_rejected():
    e = grad_error(shared_local)
    assert e.line in (line_of(shared_local, "s = 0.0"), line_of(shared_local, "s += x[i]"))
    assert "more than one part" in e.raw_message


@qd.kernel
def dynamic_bound():
    for i in x:
        v = x[i]
        for _ in range(int(y[None])):
            v = qd.sin(v)
        out[i] = v


def test_strict_mode_rejects_dynamic_bounds_and_default_warns(session_cache_dir):
    with pytest.warns(UserWarning, match="trip count is only known at run time") as record:
        dynamic_bound.grad.compile()
    assert record[0].lineno == line_of(dynamic_bound, "for _ in range")
    qd.init(arch=qd.cpu, ad_stack_strict=True, cache_dir=session_cache_dir)
    e = grad_error(dynamic_bound)
    assert e.line == line_of(dynamic_bound, "for _ in range") and "ad_stack_strict" in e.raw_message
    qd.init(arch=qd.cpu, ad_stack_strict=True, ad_stack_size=64, cache_dir=session_cache_dir)  # no bound needed
    stacks = dynamic_bound.grad.compile().meta.adstack["stacks"]
    assert [r["max_size"] for r in stacks] == [64]


@qd.kernel
def last_writer_wins():
    s = 0.0
    for i in x:
        s = x[i] * 2.0
    y[None] = s


def test_local_assigned_in_parallel_loop_rejected():
    e = grad_error(last_writer_wins)
    assert e.line == line_of(last_writer_wins, "s = x[i] * 2.0") and "parallel loop" in e.raw_message


def test_store_then_read_in_a_loop_is_accepted(rng):
    x2 = qd.field(qd.f64, shape=(3, 4), needs_grad=True)
    mid = qd.field(qd.f64, shape=(3, 4), needs_grad=True)
    scratch = qd.field(qd.f64, shape=(3, 4), needs_grad=True)
    total = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def staged():
        for i in range(3):
            for j in range(4):
                mid[i, j] = qd.sin(x2[i, j])         # written, then read, element by element
                scratch[i, j] = x2[i, j] * 2.0
                total[None] += mid[i, j] * scratch[i, j]

    x2.from_numpy(rng.uniform(-1, 1, (3, 4)))
    staged()
    for f in (x2, mid, scratch):
        f.grad.fill(0)
    total.grad[None] = 1.0
    staged.grad()
    xs = x2.to_numpy()
    want = np.cos(xs) * 2 * xs + np.sin(xs) * 2
    np.testing.assert_allclose(x2.grad.to_numpy(), want, rtol=1e-12)


@qd.kernel
def through_plain_field():
    for i in x:
        plain[i] = x[i] * 2.0
        y[None] += plain[i] * plain[i]


def test_gradient_through_a_field_without_one_rejected():
    e = grad_error(through_plain_field)
    assert e.line == line_of(through_plain_field, "plain[i] = x[i] * 2.0") and "needs_grad=True" in e.raw_message
