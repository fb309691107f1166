"""Reverse mode through nested and sibling loops, branches, and stacks of several types."""
import numpy as np
import pytest

import qdc as qd
from autodiff_util import autodiff_grad, check_against_central_diff
from tolerance_util import assert_close_f32

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")


def stack_dtypes(kernel, args=()):
    return sorted(r["dtype"] for r in kernel.grad.compile(args).meta.adstack["stacks"])


def test_double_and_triple_nested_loops(rng):
    x = qd.field(qd.f64, shape=3, needs_grad=True)
    w = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def nested():
        for i in x:
            v = x[i]
            for j in range(n[None]):
                for k in range(n[None] - 1):
                    v = qd.sin(v * w[k]) + 0.1 * j
                    for m in range(2):
                        v = v * 0.9 + qd.cos(v + m) * 0.05
            y[None] += v

    x.from_numpy(rng.uniform(0, 1, 3))
    w.from_numpy(rng.uniform(0.5, 1.5, 4))
    n[None] = 3
    check_against_central_diff(nested, y, [x, w])


def test_mixed_static_and_dynamic_inner_loops(rng):
    x = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def mixed():
        for i in x:
            v = x[i]
            for j in range(n[None]):
                for s in qd.static(range(3)):
                    v = qd.tanh(v * (s + 1)) + 0.05 * j
                for _ in range(2):
                    v = v * v * 0.5 + 0.2
            y[None] += v

    x.from_numpy(rng.uniform(-0.5, 0.5, 4))
    n[None] = 3
    check_against_central_diff(mixed, y, [x])


def test_sibling_inner_loops_reverse_in_order(rng):
    x = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=2)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def siblings():
        for i in x:
            v = x[i]
            u: qd.f64 = 1.0
            for _ in range(n[0]):
                v = qd.sin(v) + 0.3
            for _ in range(n[1]):
                u = u * v + qd.exp(-u)
                v = v * 0.7
            y[None] += u + v

    x.from_numpy(rng.uniform(0, 1, 4))
    n.from_numpy(np.array([3, 4], np.int32))
    check_against_central_diff(siblings, y, [x])


def test_triangular_inner_bound_is_enclosing_index(rng):
    x = qd.field(qd.f64, shape=3, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def triangular():
        for i in x:
            v = x[i]
            for j in range(n[None]):
                for k in range(j):
                    v = qd.sin(v) * 1.1 + 0.01 * k
            y[None] += v

    x.from_numpy(rng.uniform(0, 1, 3))
    n[None] = 6
    check_against_central_diff(triangular, y, [x])


def test_if_wrapping_a_loop_with_a_carried_variable(rng):
    x = qd.field(qd.f64, shape=6, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def guarded():
        for i in x:
            v = x[i]
            if x[i] > 0.5:
                for _ in range(n[None]):
                    v = qd.sqrt(v * v + 0.5)
            else:
                for _ in range(n[None] + 1):
                    v = qd.exp(-v) + v
            y[None] += v

    x.from_numpy(np.concatenate([rng.uniform(0.1, 0.4, 3), rng.uniform(0.6, 0.9, 3)]))
    n[None] = 4
    check_against_central_diff(guarded, y, [x])


def test_condition_on_a_value_changed_in_the_branch_is_snapshotted(rng):
    x = qd.field(qd.f64, shape=8, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def branchy():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                if v > 0.5:
                    v = qd.sin(v) * 0.8
                else:
                    v = v * v + 0.45
            y[None] += v

    x.from_numpy(rng.uniform(0, 1, 8))
    n[None] = 6
    check_against_central_diff(branchy, y, [x])
    assert "u1" in stack_dtypes(branchy)  # the branch taken, per iteration


def test_f32_and_f64_stacks_in_one_kernel(rng):
    a = qd.field(qd.f32, shape=4, needs_grad=True)
    b = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def two_precisions():
        for i in a:
            u = a[i]
            v = b[i]
            for _ in range(n[None]):
                u = qd.sin(u) + 0.2
                v = qd.cos(v) * qd.cast(u, qd.f64)
            y[None] += v

    a.from_numpy(rng.uniform(0, 1, 4).astype(np.float32))
    b.from_numpy(rng.uniform(0, 1, 4))
    n[None] = 5
    ga, gb = autodiff_grad(two_precisions, y, [a, b])
    assert stack_dtypes(two_precisions) == ["f32", "f64"]
    u, v = a.to_numpy().astype(np.float32), b.to_numpy()
    du, dv_db, dv_du = np.ones(4, np.float32), np.ones(4), np.zeros(4)
    dv_du_size = np.zeros(4)  # the size of the terms dv_du sums: it can cancel to near 0
    for _ in range(5):  # forward-mode reference, with u computed in f32 as the kernel does
        u_new = (np.sin(u) + np.float32(0.2)).astype(np.float32)
        du_new = np.cos(u) * du
        v, dv_db, dv_du, dv_du_size = (np.cos(v) * u_new, -np.sin(v) * u_new * dv_db,
                                       -np.sin(v) * u_new * dv_du + np.cos(v) * du_new,
                                       np.abs(np.sin(v) * u_new) * dv_du_size + np.abs(np.cos(v) * du_new))
        u, du = u_new, du_new
    np.testing.assert_allclose(gb, dv_db, rtol=1e-5)
    assert_close_f32(ga, dv_du, rtol=1e-4, scale=dv_du_size.max())


def test_i32_and_u1_stacks_beside_f32(rng):
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    table = qd.field(qd.f32, shape=7, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def mixed_types():
        for i in x:
            v = x[i]
            k = i % 7
            flip = False
            for _ in range(n[None]):
                v = qd.sin(v * table[k]) + 0.1   # k indexes a differentiable field
                k = (k * 3 + 1) % 7
                if v > 0.3:
                    flip = not flip
                if flip:
                    v = v * v
            y[None] += v

    x.from_numpy(rng.uniform(0, 1, 8).astype(np.float32))
    table.from_numpy(rng.uniform(0.5, 1.5, 7).astype(np.float32))
    n[None] = 5
    assert {"f32", "i32", "u1"} <= set(stack_dtypes(mixed_types))
    gx, gt = autodiff_grad(mixed_types, y, [x, table])
    xs, ts = x.to_numpy().astype(np.float64), table.to_numpy().astype(np.float64)
    want_x, want_t = np.zeros(8), np.zeros(7)
    for i in range(8):  # forward mode, element by element
        v, dv_dx, dv_dt = xs[i], 1.0, np.zeros(7)
        k, flip = i % 7, False
        for _ in range(5):
            c = np.cos(v * ts[k])
            dv_dt = c * ts[k] * dv_dt
            dv_dt[k] += c * v
            dv_dx = c * ts[k] * dv_dx
            v = np.sin(v * ts[k]) + 0.1
            k = (k * 3 + 1) % 7
            flip = not flip if v > 0.3 else flip
            if flip:
                dv_dx, dv_dt, v = 2 * v * dv_dx, 2 * v * dv_dt, v * v
        want_x[i], want_t = dv_dx, want_t + dv_dt
    np.testing.assert_allclose(gx, want_x, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gt, want_t, rtol=1e-4, atol=1e-6)


def test_constant_trip_counts_size_stacks_exactly():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def fixed():
        for i in x:
            v = x[i]
            for _ in range(5):
                for _ in range(3):
                    v = qd.sin(v)
                if v > 0.0:
                    v = qd.cos(v)
            y[None] += v

    stacks = fixed.grad.compile().meta.adstack["stacks"]
    sizes = {r["dtype"]: r["max_size"] for r in stacks}
    assert sizes["f32"] == 1 + 5 * (3 + 1)  # the initial store, then per outer iteration 3 + (if) 1
    assert all(r["source"] == "constant bounds" for r in stacks)


def test_locals_declared_in_loops_and_branches_ndrange_and_steps(rng):
    x = qd.field(qd.f64, shape=(2, 3), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def shapes():
        for i, j in x:
            v = x[i, j]
            for a, b in qd.ndrange(n[None], (1, 3)):
                t = v * b               # a local of the loop body, reassigned in a branch
                if (a + b) % 2 == 0:
                    t = qd.sin(t) + a
                else:
                    w = qd.cos(v)       # declared in a branch only
                    t = t * w
                v = v * 0.5 + qd.tanh(t) * 0.3
            for k in range(1, n[None] + 4, 2):
                v = qd.exp(-v * k * 0.1) + v
            y[None] += v * (i + 1) + j

    x.from_numpy(rng.uniform(-1, 1, (2, 3)))
    n[None] = 3
    check_against_central_diff(shapes, y, [x])
