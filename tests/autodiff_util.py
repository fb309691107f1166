"""Shared checks of the autodiff tests: a kernel's gradient against float64 central differences.

Kernels may overwrite their inputs (in-place updates), so every forward run starts from the
same snapshot of the inputs (and of the further buffers named in `overwrites`)."""
import inspect

import numpy as np
import pytest

import qdc as qd


def line_of(kernel, text: str) -> int:
    """The source line of `kernel` that holds `text` (exactly one must)."""
    lines, first = inspect.getsourcelines(kernel.fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, hits
    return hits[0]


def grad_error(kernel, *args) -> qd.QdcCompileError:
    """The compile error that building `kernel`'s gradient raises."""
    with pytest.raises(qd.QdcCompileError) as info:
        kernel.grad(*args)
    return info.value


def run_grad(kernel, x, y):
    """x's gradient of the scalar y that `kernel` accumulates: forward, then reverse with y.grad = 1."""
    y[None] = 0
    kernel()
    x.grad.fill(0)
    y.grad[None] = 1
    kernel.grad()
    qd.sync()
    return x.grad.to_numpy()


class Snapshot:
    """The contents of some fields/ndarrays, to put back before each forward run."""

    def __init__(self, buffers):
        self.buffers = list(buffers)
        self.saved = [b.to_numpy() for b in self.buffers]

    def restore(self):
        for b, value in zip(self.buffers, self.saved):
            b.from_numpy(value)


def loss_of(kernel, loss, args=()):
    """Run the forward kernel on the current inputs, from a zeroed loss; return the loss."""
    loss.fill(0)
    kernel(*args)
    return float(loss.to_numpy().reshape(-1)[0])


def autodiff_grad(kernel, loss, inputs, args=(), state=None):
    """The gradients of `loss` with respect to `inputs` (fields/ndarrays; their values before the
    launch), by `kernel.grad` run after the forward kernel."""
    if state is not None:
        state.restore()
    loss_of(kernel, loss, args)
    for x in inputs:
        x.grad.fill(0)
    loss.grad.fill(1)
    kernel.grad(*args)
    return [x.grad.to_numpy().astype(np.float64) for x in inputs]


def central_diff(run, x, state, h=1e-6):
    """d run() / d x by float64 central differences; `state` is restored before each run (x
    should be an f64 field or ndarray, and one of the snapshot's buffers)."""
    state.restore()
    base = x.to_numpy()
    grad = np.zeros(base.shape, np.float64)
    for idx in np.ndindex(base.shape):
        for sign in (1, -1):
            state.restore()
            moved = base.copy()
            moved[idx] += sign * h
            x.from_numpy(moved)
            grad[idx] += sign * run() / (2 * h)
    state.restore()
    return grad


def central_diff_grad(kernel, loss, x, args=(), h=1e-6, state=None):
    """d loss / d x by float64 central differences (x should be an f64 field or ndarray)."""
    state = state if state is not None else Snapshot([x])
    return central_diff(lambda: loss_of(kernel, loss, args), x, state, h)


def check_against_central_diff(kernel, loss, inputs, args=(), rtol=1e-5, atol=1e-7, overwrites=()):
    """`overwrites`: further fields/ndarrays the kernel writes that are not inputs."""
    state = Snapshot(list(inputs) + list(overwrites))
    for b in overwrites:  # no stale gradient may act as a seed
        if getattr(b, "grad", None) is not None:
            b.grad.fill(0)
    got = autodiff_grad(kernel, loss, inputs, args, state)
    for x, g in zip(inputs, got):
        want = central_diff_grad(kernel, loss, x, args, state=state)
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol)
    state.restore()
    return got
