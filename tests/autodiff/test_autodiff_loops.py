"""Reverse mode through dynamic loops: loop-carried values on adstacks, checked analytically or
against float64 central differences."""
import numpy as np
import pytest

import qdc as qd
from autodiff_util import check_against_central_diff, autodiff_grad
from tolerance_util import assert_close_f32

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")


@pytest.mark.parametrize("n_iter", [1, 3, 10])
def test_loop_carried_affine_map(rng, n_iter):
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    a = qd.field(qd.f32, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def affine():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = v * a[None] + 0.25
            y[None] += v

    xs = rng.uniform(-1, 1, 8).astype(np.float32)
    av = float(rng.uniform(0.5, 1.2))
    x.from_numpy(xs)
    a[None] = av
    n[None] = n_iter
    gx, ga = autodiff_grad(affine, y, [x, a])
    av32 = np.float32(av)
    np.testing.assert_allclose(gx, np.full(8, av32 ** n_iter), rtol=1e-5)
    # v_n = a^n x + 0.25 (a^(n-1) + ... + 1): d/da = n a^(n-1) x + 0.25 sum_k k a^(k-1)
    terms = np.append(n_iter * av32 ** (n_iter - 1) * xs.astype(np.float64),
                      8 * 0.25 * sum(k * av32 ** (k - 1) for k in range(1, n_iter)))
    assert_close_f32(ga, terms.sum(), rtol=1e-4, scale=np.abs(terms).sum())  # signed x: the sum can cancel


# One loop-carried step per operation, kept inside the operation's domain for any start in (0, 1).
@qd.func
def step_sin(v):
    return qd.sin(v) + 0.1


@qd.func
def step_cos(v):
    return qd.cos(v)


@qd.func
def step_tan(v):
    return qd.tan(v * 0.5)


@qd.func
def step_asin(v):
    return qd.asin(v * 0.5)


@qd.func
def step_acos(v):
    return qd.acos(v * 0.3)


@qd.func
def step_atan(v):
    return qd.atan(v * 2.0)


@qd.func
def step_tanh(v):
    return qd.tanh(v) + 0.5


@qd.func
def step_exp(v):
    return qd.exp(v * 0.3 - 0.5)


@qd.func
def step_log(v):
    return qd.log(v + 2.0)


@qd.func
def step_sqrt(v):
    return qd.sqrt(v + 1.0)


@qd.func
def step_rsqrt(v):
    return qd.rsqrt(v + 1.0)


@qd.func
def step_abs(v):
    return abs(v - 0.3)


@qd.func
def step_neg(v):
    return -v * 0.9 + 0.2


@qd.func
def step_pow(v):
    return qd.pow(v + 1.5, 1.3)


@qd.func
def step_floor(v):
    return qd.floor(v * 3.0) * 0.1 + qd.ceil(v) * 0.2 + qd.round(v * 2.0) * 0.05 + v * 0.5


UNARY_STEPS = {name[5:]: f for name, f in globals().items() if name.startswith("step_")}


@pytest.mark.parametrize("op", sorted(UNARY_STEPS))
def test_every_unary_math_op_loop_carried(rng, op):
    step = UNARY_STEPS[op]
    x = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def iterate():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = step(v)
            y[None] += v * v

    x.from_numpy(rng.uniform(0.1, 0.9, 4))
    n[None] = 4
    check_against_central_diff(iterate, y, [x])


def test_binary_ops_and_select_loop_carried(rng):
    x = qd.field(qd.f64, shape=5, needs_grad=True)
    w = qd.field(qd.f64, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def mix():
        for i in x:
            v = x[i]
            u = w[None]
            for _ in range(n[None]):
                v, u = qd.atan2(v, u + 2.0) + v / (u + 3.0), max(u * v, 0.1) + min(v, u) * 0.5
                v = qd.select(v > 0.4, v * v, v + 0.3) - (v % 0.7) * 0.1
            y[None] += v * u

    x.from_numpy(rng.uniform(0.1, 0.9, 5))
    w[None] = float(rng.uniform(0.2, 0.6))
    n[None] = 3
    check_against_central_diff(mix, y, [x, w])


def test_fibonacci_with_tuple_swap(rng):
    a0 = qd.field(qd.f64, shape=3, needs_grad=True)
    b0 = qd.field(qd.f64, shape=3, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def fib():
        for i in a0:
            a = a0[i]
            b = b0[i]
            for _ in range(n[None]):
                a, b = b, a + b
            y[None] += b * (i + 1)

    a0.from_numpy(rng.uniform(-1, 1, 3))
    b0.from_numpy(rng.uniform(-1, 1, 3))
    n[None] = 10
    ga, gb = autodiff_grad(fib, y, [a0, b0])
    fibs = [0, 1]
    while len(fibs) < 13:
        fibs.append(fibs[-1] + fibs[-2])
    weights = np.arange(1, 4)
    np.testing.assert_array_equal(ga, fibs[10] * weights)  # b_n = F(n) a0 + F(n+1) b0, exactly
    np.testing.assert_array_equal(gb, fibs[11] * weights)


def test_integer_loop_carried_weight(rng):
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def weighted():
        for i in x:
            v = x[i]
            w = 1
            for _ in range(n[None]):
                v = qd.sin(v) * w * 0.5
                w = w + 1
            y[None] += v

    xs = rng.uniform(-1, 1, 6)
    x.from_numpy(xs.astype(np.float32))
    n[None] = 5
    (g,) = autodiff_grad(weighted, y, [x])
    v, d = xs.astype(np.float32).astype(np.float64), np.ones(6)
    for w in range(1, 6):
        d *= np.cos(v) * w * 0.5
        v = np.sin(v) * w * 0.5
    np.testing.assert_allclose(g, d, rtol=1e-4, atol=1e-7)
