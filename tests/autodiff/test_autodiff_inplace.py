"""Overwriting globals in kernels that need a gradient (docs/api.md, Autodiff): a store consumes the adjoint
of the value it overwrote, so in-place updates, stores in either branch of an `if`, repeated
stores and dependencies carried by serial loops differentiate exactly, with respect to the
overwritten initial values too. Every accepted case is checked against float64 central
differences for every input; what cannot be exact is refused at the right line."""

import numpy as np
import pytest

import qdc as qd
from autodiff_util import Snapshot, check_against_central_diff, central_diff, grad_error, line_of

F64_1D = qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True)
F64_2D = qd.types.ndarray(dtype=qd.f64, ndim=2, needs_grad=True)


def fields(rng, *shapes):
    out = []
    for shape in shapes:
        f = qd.field(qd.f64, shape=shape, needs_grad=True)
        f.from_numpy(rng.uniform(-1, 1, shape) if shape else np.array(rng.uniform(-1, 1)))
        out.append(f)
    return out


# ---- in-place updates of a field and an ndarray, a dependency through a serial loop ------

def test_in_place_update_field(rng):
    out, s = fields(rng, (6,), ())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def update(a: qd.f64):
        for i in out:
            out[i] = out[i] * a + s[None]
        for i in out:
            loss[None] += out[i] * out[i] * (i + 1.0)

    g_out, g_s = check_against_central_diff(update, loss, [out, s], args=(0.7,))
    assert np.all(g_out != 0)  # the overwritten initial values have their gradient


def test_in_place_update_ndarray(rng):
    o = qd.ndarray(qd.f64, shape=(5,), needs_grad=True)
    o.from_numpy(rng.uniform(-1, 1, 5))
    (s,) = fields(rng, ())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def update(v: F64_1D, a: qd.f64):
        for i in range(v.shape[0]):
            v[i] = v[i] * a + s[None]
        for i in range(v.shape[0]):
            loss[None] += qd.sin(v[i])

    check_against_central_diff(update, loss, [o, s], args=(o, 1.3))


def test_dependency_carried_by_a_serial_inner_loop(rng):
    x, c = fields(rng, (3, 5), (3,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for k in range(3):
            for i in range(4):
                x[k, i + 1] = qd.sin(x[k, i]) * 1.5 + c[k]
        for k, i in qd.ndrange(3, 5):
            loss[None] += x[k, i] ** 2 * (k + i + 1.0)

    g_x, _ = check_against_central_diff(chain, loss, [x, c])
    assert np.all(g_x[:, 1:] == 0) and np.all(g_x[:, 0] != 0)  # overwritten before any read


def test_serial_inner_loop_under_ndrange_over_an_ndarray(rng):
    a = qd.ndarray(qd.f64, shape=(2, 3, 4), needs_grad=True)
    a.from_numpy(rng.uniform(-1, 1, (2, 3, 4)))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain(v: qd.types.ndarray(dtype=qd.f64, ndim=3, needs_grad=True), m: qd.i32):
        for p, q in qd.ndrange(2, m):       # the flattened index is split into p and q
            for i in range(3):
                v[p, q, i + 1] = qd.tanh(v[p, q, i]) + 0.1 * v[p, q, i + 1]
        for p, q, i in qd.ndrange(2, m, 4):
            loss[None] += v[p, q, i] * v[p, q, i]

    check_against_central_diff(chain, loss, [a], args=(a, 3))


# ---- if / else ---------------------------------------------------------------------------

def test_store_in_both_branches_and_in_one(rng):
    x, out, other = fields(rng, (8,), (8,), (8,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def branches():
        for i in x:
            if x[i] > 0.0:
                out[i] = qd.sin(x[i])
            else:
                out[i] = x[i] * x[i]
            if x[i] > 0.3:                   # elsewhere the initial value passes through
                other[i] = other[i] * 2.0 + x[i]
        for i in x:
            loss[None] += out[i] * other[i]

    x.from_numpy(np.linspace(-0.9, 0.9, 8) + rng.uniform(0.01, 0.05, 8))  # both branches, off the switches
    g_x, g_out, g_other = check_against_central_diff(branches, loss, [x, out, other])
    assert np.all(g_out == 0)


# ---- several updates of one element --------------------------------------------------------

def test_repeated_stores_and_linear_updates(rng):
    x, out, s = fields(rng, (6,), (6,), ())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def twice():
        for i in x:
            out[i] = x[i]                    # overwritten below: its value never matters
            out[i] = x[i] * 3.0
            out[i] = out[i] * 2.0 + s[None]
            out[i] = out[i] - s[None] * x[i]
        for i in x:
            loss[None] += qd.exp(out[i])

    @qd.kernel
    def top_level():                         # statements outside loops: one serial task each
        s[None] = s[None] * 2.0 + 1.0
        for i in x:
            out[i] = out[i] * 0.5 + s[None] * 2.0 + qd.sin(x[i])
        s[None] = s[None] * 3.0
        loss[None] += s[None] ** 2 + out[2] ** 3

    check_against_central_diff(twice, loss, [x, out, s])
    check_against_central_diff(top_level, loss, [x, out, s])


def test_non_linear_use_of_an_overwritten_value_is_rejected():
    out = qd.field(qd.f64, shape=4, needs_grad=True)
    a = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def scale_then_sin():
        for i in out:
            out[i] = out[i] * 2.0
            out[i] = qd.sin(out[i])

    @qd.kernel
    def scaled_by_a_field():
        for i in out:
            out[i] = out[i] * a[None] + 1.0

    e = grad_error(scale_then_sin)
    assert e.line == line_of(scale_then_sin, "qd.sin(out[i])") and "overwrites 'out'" in e.raw_message
    assert "not linear" in e.raw_message and e.source_line is not None
    @qd.kernel
    def min_then_overwritten():
        for i in out:
            qd.atomic_min(a[None], out[i])   # its reverse needs the final minimum
        a[None] = a[None] * 2.0

    e = grad_error(scaled_by_a_field)  # d/da needs the old out[i]
    assert e.line == line_of(scaled_by_a_field, "out[i] * a[None]") and "overwrites 'out'" in e.raw_message
    e = grad_error(min_then_overwritten)
    assert e.line == line_of(min_then_overwritten, "qd.atomic_min") and "overwrites 'a'" in e.raw_message


def test_in_place_update_by_a_field_without_gradient_is_accepted(rng):
    out, s = fields(rng, (5,), ())
    a = qd.field(qd.f64, shape=())
    a[None] = 0.8
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def update():
        for i in out:
            out[i] = out[i] * a[None] + s[None]
        for i in out:
            loss[None] += out[i] ** 3

    check_against_central_diff(update, loss, [out, s])


# ---- loops -------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")
def test_in_place_update_in_a_dynamic_loop(rng):
    x, s = fields(rng, (4,), ())
    n = qd.field(qd.i32, shape=())
    n[None] = 3
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def repeat():
        for i in x:
            for _ in range(n[None]):
                x[i] = x[i] * 0.5 + s[None]
        for i in x:
            loss[None] += qd.cos(x[i])

    @qd.kernel
    def repeat_sin():
        for i in x:
            for _ in range(n[None]):
                x[i] = qd.sin(x[i])

    check_against_central_diff(repeat, loss, [x, s])
    e = grad_error(repeat_sin)
    assert e.line == line_of(repeat_sin, "x[i] = qd.sin(x[i])") and "overwrites 'x'" in e.raw_message


def test_serialized_loop_with_read_after_write(rng):
    x, out = fields(rng, (6,), (6,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def prefix():
        qd.loop_config(serialize=True)
        for i in range(1, 6):
            out[i] = out[i - 1] + x[i]       # linear: reversed iteration order matters
        qd.loop_config(serialize=True)
        for i in range(1, 6):
            x[i] = qd.sin(x[i - 1]) * 0.8 + out[i]
        for i in x:
            loss[None] += x[i] * out[i] * (i + 1.0)

    check_against_central_diff(prefix, loss, [x, out])


def test_serialized_prefix_sum_is_differentiated_backwards(rng):
    x, out = fields(rng, (6,), (6,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def prefix(n: qd.i32):
        qd.loop_config(serialize=True)
        for i in range(1, n):
            out[i] = out[i - 1] * 0.5 + x[i]
        for i in x:
            loss[None] += out[i] * (i + 1.0)

    g_x, g_out = check_against_central_diff(prefix, loss, [x, out], args=(6,))
    assert np.all(g_out[1:] == 0)


def test_parallel_read_after_write_stays_rejected():
    x = qd.field(qd.f64, shape=(4, 4), needs_grad=True)
    y = qd.field(qd.f64, shape=4, needs_grad=True)

    @qd.kernel
    def shifted_rows():
        for k in range(3):
            for i in range(4):
                x[k + 1, i] = qd.sin(x[k, i])

    @qd.kernel
    def wrapped():
        for k in range(4):
            for i in range(4):
                y[(k + i) % 4] = y[(k + i) % 4] * 0.5 + x[k, i]

    e = grad_error(shifted_rows)
    assert e.line == line_of(shifted_rows, "qd.sin(x[k, i])") and "cross-iteration" in e.raw_message
    e = grad_error(wrapped)
    assert e.line == line_of(wrapped, "y[(k + i) % 4] = ") and "cross-iteration" in e.raw_message


def test_parallel_stores_into_one_element(rng):
    (x,) = fields(rng, (8,))
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def every_iteration():
        for i in x:
            y[None] = x[i] * 2.0

    @qd.kernel
    def one_iteration():
        for i in x:
            if i == 3:
                y[None] = x[i] * x[i]
        for _ in range(1):
            y[None] = y[None] * 3.0

    e = grad_error(every_iteration)
    assert e.line == line_of(every_iteration, "y[None] = x[i] * 2.0") and "every iteration" in e.raw_message
    check_against_central_diff(one_iteration, y, [x])


# ---- the Tape ----------------------------------------------------------------------------

def test_tape_over_repeated_in_place_launches(rng):
    x, s, w = fields(rng, (5,), (), (5,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def step(a: qd.f64):
        for i in x:
            x[i] = x[i] * a + s[None] * w[i]

    @qd.kernel
    def total():
        for i in x:
            loss[None] += qd.sin(x[i]) * w[i]

    def run():
        loss.fill(0)
        for a in (0.9, 1.1, 0.7):
            step(a)
        total()
        return loss[None]

    state = Snapshot([x, s, w])
    for f in (x, s, w):
        f.grad.fill(0)
    with qd.ad.Tape(loss=loss):
        for a in (0.9, 1.1, 0.7):
            step(a)
        total()
    got = [f.grad.to_numpy() for f in (x, s, w)]
    for f, g in zip((x, s, w), got):
        np.testing.assert_allclose(g, central_diff(run, f, state), rtol=1e-5, atol=1e-7)
