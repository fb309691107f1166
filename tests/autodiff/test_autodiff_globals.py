"""Reverse mode over global data: stores, atomics, ndarrays, values crossing tasks, the Tape."""
import numpy as np

import qdc as qd
from autodiff_util import autodiff_grad, check_against_central_diff


def test_store_then_read_chain_and_ndarray_gradients(rng):
    x = qd.ndarray(qd.f64, shape=(6,), needs_grad=True)
    mid = qd.field(qd.f64, shape=6, needs_grad=True)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chain(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True), s: qd.f64):
        for i in range(a.shape[0]):
            mid[i] = a[i] * s + qd.cast(i, qd.f64)
            y[None] += qd.sin(mid[i]) * mid[i]

    xs = rng.uniform(-1, 1, 6)
    x.from_numpy(xs)
    s = float(rng.uniform(0.5, 2))
    (g,) = autodiff_grad(chain, y, [x], args=(x, s))
    m = xs * s + np.arange(6)
    np.testing.assert_allclose(g, (np.cos(m) * m + np.sin(m)) * s, rtol=1e-10)
    # the store consumed the intermediate's gradient: d y / d (mid's initial values), which it overwrote
    assert not mid.grad.to_numpy().any()


def test_atomic_sub_min_max_gradients(rng):
    x = qd.field(qd.f64, shape=8, needs_grad=True)
    lo = qd.field(qd.f64, shape=(), needs_grad=True)
    hi = qd.field(qd.f64, shape=(), needs_grad=True)
    acc = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def extremes():
        for i in x:
            qd.atomic_min(lo[None], x[i] * 2.0)
            qd.atomic_max(hi[None], x[i] * x[i])
            acc[None] -= x[i] * 3.0

    xs = rng.permutation(np.linspace(0.1, 0.9, 8))
    x.from_numpy(xs)
    lo[None], hi[None], acc[None] = 10.0, -10.0, 0.0
    extremes()
    x.grad.fill(0)
    lo.grad[None], hi.grad[None], acc.grad[None] = 1.0, 10.0, 100.0
    extremes.grad()
    want = np.full(8, -300.0)
    want[np.argmin(xs)] += 2.0          # the element that won the min
    want[np.argmax(xs)] += 10.0 * 2 * xs.max()
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-12)


def test_select_cast_and_min_max_ops(rng):
    x = qd.field(qd.f64, shape=6, needs_grad=True)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def ops():
        for i in x:
            v = x[i]
            lowp = qd.cast(v * 3.0, qd.f32)   # through f32 and back: the gradient passes
            r = qd.select(v > 0.5, qd.cast(lowp, qd.f64) * v, qd.exp(v))
            k = qd.cast(v * 10.0, qd.i32)       # int: no gradient through it
            y[None] += max(r, 0.2) + min(v, 0.4) + qd.cast(k, qd.f64) + v ** 3 + 1.0 / (v + 1.0)

    x.from_numpy(rng.uniform(0.05, 0.95, 6))
    (g,) = autodiff_grad(ops, y, [x])
    v = x.to_numpy()
    dr = np.where(v > 0.5, 6 * v, np.exp(v))
    r = np.where(v > 0.5, 3 * v * v, np.exp(v))
    want = np.where(r > 0.2, dr, 0) + (v < 0.4) + 3 * v ** 2 - 1 / (v + 1) ** 2
    np.testing.assert_allclose(g, want, rtol=1e-6)


def test_value_crossing_tasks_carries_its_gradient(rng):
    x = qd.field(qd.f64, shape=5, needs_grad=True)
    w = qd.field(qd.f64, shape=(), needs_grad=True)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def two_tasks(scale: qd.f64):
        s = w[None] * scale + 1.0        # serial part: crosses into the loop below
        t = qd.sin(w[None])
        for i in x:
            y[None] += qd.exp(x[i] * s) * t

    x.from_numpy(rng.uniform(-1, 1, 5))
    w[None] = float(rng.uniform(0.1, 0.9))
    check_against_central_diff(two_tasks, y, [x, w], args=(0.7,))


def test_tasks_run_in_reverse_order(rng):
    x = qd.field(qd.f64, shape=4, needs_grad=True)
    mid = qd.field(qd.f64, shape=4, needs_grad=True)
    total = qd.field(qd.f64, shape=(), needs_grad=True)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def pipeline():
        for i in x:
            mid[i] = qd.tanh(x[i])
        for i in mid:
            total[None] += mid[i] * mid[i]
        y[None] = qd.sqrt(total[None])

    x.from_numpy(rng.uniform(-1, 1, 4))
    total[None] = 0.0
    pipeline()
    x.grad.fill(0)
    mid.grad.fill(0)
    total.grad.fill(0)
    y.grad[None] = 1.0
    pipeline.grad()
    t = np.tanh(x.to_numpy())
    want = t / np.sqrt((t * t).sum()) * (1 - t * t)
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-10)


def test_tape_records_and_replays(rng):
    x = qd.field(qd.f64, shape=5, needs_grad=True)
    mid = qd.field(qd.f64, shape=5, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def first():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) + 0.5
            mid[i] = v

    @qd.kernel
    def second(p: qd.f64):
        for i in mid:
            loss[None] += mid[i] ** p

    x.from_numpy(rng.uniform(0, 1, 5))
    n[None] = 3
    x.grad.from_numpy(rng.uniform(size=5))  # stale gradients: the tape clears them
    with qd.ad.Tape(loss=loss):  # the adstack is sized from n[None] at launch: no fallback warning
        first()
        second(3.0)
    v, d = x.to_numpy(), np.ones(5)
    for _ in range(3):
        d, v = d * np.cos(v), np.sin(v) + 0.5
    np.testing.assert_allclose(loss[None], (v ** 3).sum(), rtol=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), 3 * v ** 2 * d, rtol=1e-10)
    second(3.0)  # outside the tape: launched normally, not recorded
    np.testing.assert_allclose(loss[None], 2 * (v ** 3).sum(), rtol=1e-12)
    assert second._primal.launches_on_its_own()  # its fast launch path is back


def test_kernel_without_differentiable_output_leaves_gradients_alone(rng):
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    out = qd.field(qd.f32, shape=4)

    @qd.kernel
    def no_grad_out():
        for i in x:
            out[i] = x[i] * 2.0

    x.from_numpy(rng.uniform(size=4).astype(np.float32))
    no_grad_out()
    x.grad.fill(0.5)
    no_grad_out.grad()
    assert np.all(x.grad.to_numpy() == 0.5)
    assert not no_grad_out.grad.compile().meta.adstack["stacks"]
