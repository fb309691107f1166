"""Shared checks of the autodiff tests: a kernel's gradient against float64 central differences."""
import numpy as np


def loss_of(kernel, loss, args=()):
    """Run the forward kernel on the current inputs, from a zeroed loss; return the loss."""
    loss.fill(0)
    kernel(*args)
    return float(loss.to_numpy().reshape(-1)[0])


def autodiff_grad(kernel, loss, inputs, args=()):
    """The gradients of `loss` with respect to `inputs` (fields/ndarrays), by `kernel.grad`."""
    loss_of(kernel, loss, args)
    for x in inputs:
        x.grad.fill(0)
    loss.grad.fill(1)
    kernel.grad(*args)
    return [x.grad.to_numpy().astype(np.float64) for x in inputs]


def central_diff_grad(kernel, loss, x, args=(), h=1e-6):
    """d loss / d x by float64 central differences (x should be an f64 field or ndarray)."""
    base = x.to_numpy()
    grad = np.zeros(base.shape, np.float64)
    for idx in np.ndindex(base.shape):
        for sign in (1, -1):
            moved = base.copy()
            moved[idx] += sign * h
            x.from_numpy(moved)
            grad[idx] += sign * loss_of(kernel, loss, args) / (2 * h)
    x.from_numpy(base)
    return grad


def check_against_central_diff(kernel, loss, inputs, args=(), rtol=1e-5, atol=1e-7):
    got = autodiff_grad(kernel, loss, inputs, args)
    for x, g in zip(inputs, got):
        want = central_diff_grad(kernel, loss, x, args)
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol)
    return got
