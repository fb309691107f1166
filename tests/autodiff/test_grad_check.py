"""`qd.ad.Tape(loss, validation=False, grad_check=[fields])` (docs/api.md, Autodiff): after the backward pass
the recorded gradients of the listed fields are compared with central finite differences
(replaying the recorded forward launches from the state before the Tape), all state is put
back, and a disagreement raises naming the worst element."""
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.jit import grad_check


def test_correct_gradients_pass_and_state_is_restored(arch, rng):
    x = qd.field(qd.f32, shape=10, needs_grad=True)
    y = qd.field(qd.f32, shape=10, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def forward(a: qd.f32):
        for i in x:
            y[i] = qd.sin(x[i]) * a + x[i] * x[i]

    @qd.kernel
    def reduce():
        for i in y:
            loss[None] += y[i] * y[i]

    v = rng.random(10).astype(np.float32)
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss, validation=True, grad_check=[x, y]):
        forward(2.0)
        reduce()
    y64 = np.sin(v.astype(np.float64)) * 2 + v.astype(np.float64) ** 2
    # Vulkan's f32 sin is the driver's, exact to an absolute error (README: NVIDIA's 2^-21 or so
    # measured here, the spec allows 2^-11), which is a large relative one where y is small
    atol = 2e-6 if arch == "vulkan" else 0
    np.testing.assert_allclose(loss[None], (y64 ** 2).sum(), rtol=1e-5)  # as the Tape left it
    np.testing.assert_allclose(y.to_numpy(), y64, rtol=1e-5, atol=atol)
    np.testing.assert_array_equal(x.to_numpy(), v)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * y64 * (2 * np.cos(v) + 2 * v), rtol=1e-4)
    # y is overwritten by `forward`: its gradient is the one with respect to its initial value
    # (README), 0, and so are the finite differences that perturb that initial value
    np.testing.assert_array_equal(y.grad.to_numpy(), 0)
    assert loss.grad[None] == 1.0


def test_a_wrong_gradient_is_named_at_its_worst_element(monkeypatch, rng):
    x = qd.field(qd.f64, shape=(3, 4), needs_grad=True, name="xs")
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def cubes():
        for i, j in x:
            loss[None] += x[i, j] * x[i, j] * x[i, j]

    @qd.kernel
    def almost_the_gradient():
        for i, j in x:
            x.grad[i, j] += 3 * x[i, j] * x[i, j] * loss.grad[None]
        x.grad[1, 2] += 0.25
        x.grad[2, 0] += 1e-9  # within the f64 tolerance

    v = rng.random((3, 4))
    x.from_numpy(v)
    monkeypatch.setattr(kernel_of(cubes), "grad", lambda *a, **k: almost_the_gradient())
    with pytest.raises(qd.ad.GradCheckError) as e:
        with qd.ad.Tape(loss=loss, grad_check=[x]):
            cubes()
    message = str(e.value)
    assert "field 'xs', element (1, 2)" in message, message
    analytic, numeric = map(float, re.search(r"gradient is (\S+) but central finite differences give (\S+) ",
                                             message).groups())
    np.testing.assert_allclose([analytic, numeric], [3 * v[1, 2] ** 2 + 0.25, 3 * v[1, 2] ** 2], rtol=1e-6)
    assert "12 of 12 elements checked" in message
    np.testing.assert_array_equal(x.to_numpy(), v)  # restored even on failure
    np.testing.assert_allclose(loss[None], (v ** 3).sum(), rtol=1e-12)


def test_templates_ndarray_arguments_and_large_fields_are_sampled(arch, rng):
    big = qd.field(qd.f32, shape=300, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def weigh(f: qd.template(), w: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in f:
            loss[None] += qd.tanh(f[i]) * w[i]

    v, w = rng.standard_normal(300).astype(np.float32), rng.random(300).astype(np.float32)
    big.from_numpy(v)
    calls = []
    original = grad_check._check_one
    monkey = pytest.MonkeyPatch()
    monkey.setattr(grad_check, "_check_one", lambda f, *a: calls.append(f) or original(f, *a))
    try:
        with qd.ad.Tape(loss=loss, grad_check=[big]):
            weigh(big, w)
    finally:
        monkey.undo()
    assert calls == [big]
    assert len(grad_check._elements(np.arange(300.0))) == grad_check.MAX_ELEMENTS
    assert 299 in grad_check._elements(np.arange(300.0))  # the largest gradient is always checked
    np.testing.assert_allclose(big.grad.to_numpy(), w / np.cosh(v.astype(np.float64)) ** 2, rtol=1e-4, atol=1e-6)


def test_grad_check_arguments_are_checked():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=4)
    plain = qd.field(qd.f32, shape=4)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    with pytest.raises(TypeError, match="needs a list of fields"):
        qd.ad.Tape(loss=loss, grad_check=x)
    with pytest.raises(TypeError, match="holds i32"):
        qd.ad.Tape(loss=loss, grad_check=[n])
    with pytest.raises(ValueError, match="has no gradient"):
        qd.ad.Tape(loss=loss, grad_check=[plain])
    with pytest.raises(ValueError, match="needs a loss"):
        qd.ad.Tape(grad_check=[x])
    qd.ad.Tape(loss=loss, validation=True, grad_check=[])  # an empty list checks nothing
