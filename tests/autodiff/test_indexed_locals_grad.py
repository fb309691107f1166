"""Gradients through vector and matrix locals read and written at run-time indices (arrays in the
forward kernel: compiler/passes/local_arrays.py; the scalar form in the gradient kernel, which
autodiff transforms): against float64 central differences, on every arch, for a matrix carried
by a dynamic loop (its scalars on adstacks) with reads and writes at indices that differ between
the parallel iterations, and for a vector written and read in straight-line code inside a loop
of constant trips. Forward mode gives the same derivatives."""
import numpy as np

import qdc as qd
from autodiff_util import check_against_central_diff

N = 5


def test_matrix_carried_by_a_dynamic_loop(arch, rng):
    x = qd.field(qd.f64, shape=N, needs_grad=True, needs_dual=True)
    w = qd.field(qd.f64, shape=4, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True, needs_dual=True)
    shift = qd.field(qd.i32, shape=N)
    steps = qd.field(qd.i32, shape=())
    x.from_numpy(rng.uniform(0.2, 1.0, N))
    w.from_numpy(rng.uniform(-1.0, 1.0, 4))
    shift.from_numpy(rng.integers(0, 8, N).astype(np.int32))
    steps[None] = 6

    @qd.kernel
    def mix():
        for p in x:
            m = qd.Matrix([[x[p], w[0], 0.5, 0.0], [w[1], x[p] * x[p], 0.25, 1.0]])
            for j in range(steps[None]):
                r, c = (j + shift[p]) % 2, (j * 3 + shift[p]) % 4
                m[r, c] = qd.sin(m[1 - r, (c + 1) % 4]) * w[j % 4] + m[r, c] * 0.5
            loss[None] += m[shift[p] % 2, shift[p] % 4] + m[0, 0] * m[1, 3]

    dx, _ = check_against_central_diff(mix, loss, [x, w], rtol=1e-6, atol=1e-9)
    seed = rng.standard_normal(N)
    with qd.ad.FwdMode(loss=loss, param=x, seed=list(seed)):  # a Jacobian-vector product
        loss.fill(0)
        mix()
    np.testing.assert_allclose(loss.dual[None], dx @ seed, rtol=1e-9, atol=1e-12)


def test_vector_written_and_read_in_a_loop_of_constant_trips(arch, rng):
    x = qd.field(qd.f64, shape=N, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)
    order = qd.field(qd.i32, shape=(N, 6))
    x.from_numpy(rng.uniform(-1.0, 1.0, N))
    order.from_numpy(np.stack([rng.permutation(6) for _ in range(N)]).astype(np.int32))

    @qd.kernel
    def spread():
        for p in x:
            v = qd.Vector.zero(qd.f64, 6)
            for k in range(6):
                v[order[p, k]] = x[p] * (k + 1) + v[order[p, (k + 5) % 6]] * x[p]
            for k in range(6):
                loss[None] += v[k] * v[order[p, k]]

    check_against_central_diff(spread, loss, [x], rtol=1e-6, atol=1e-9)
