"""Arguments and Python-scope declarations as Quadrants has them:
- a kernel that reads or writes `x.grad[...]` of an ndarray parameter that gets a gradient
  cannot be differentiated (Quadrants: "Cannot automatically differentiate through a grad
  tensor, ... pass the grad tensor into the kernel directly"); passing `a.grad` itself is fine;
- Python's `float` / `int` as the dtype of `qd.ndarray` / `qd.field` mean default_fp /
  default_ip (f32 / i32 unless `qd.init` says otherwise), where numpy's float64 stays f64."""
import numpy as np
import pytest

import qdc as qd

from module_util import compile_error_of


def test_differentiating_through_a_grad_tensor_is_refused_naming_kernel_and_parameter(tmp_path):
    err, path = compile_error_of(tmp_path, "grad_tensor", """
        import qdc as qd
        a = qd.ndarray(qd.f32, shape=10, needs_grad=True)
        b = qd.ndarray(qd.f32, shape=(), needs_grad=True)

        @qd.kernel
        def reads_grad(x: qd.types.ndarray(), total: qd.types.ndarray()):
            for i in x:
                total[None] += x.grad[i]

        def bad():
            a.grad.fill(2.0)
            reads_grad(a, b)  # the forward kernel is fine
            assert b[None] == 20.0
            reads_grad.grad(a, b)
        """)
    assert err.filename == str(path) and err.line == 9
    message = str(err)
    assert "kernel 'reads_grad', parameter 'x'" in message
    assert "cannot automatically differentiate through a grad tensor" in message
    assert "pass the grad tensor into the kernel directly" in message


def test_a_grad_tensor_passed_directly_differentiates(arch, rng):
    n = 16
    a = qd.ndarray(qd.f32, shape=n, needs_grad=True)
    g = rng.uniform(-1, 1, n).astype(np.float32)
    a.grad.from_numpy(g)
    total = qd.ndarray(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def square_sum(x: qd.types.ndarray(), out: qd.types.ndarray()):
        for i in x:
            out[None] += x[i] * x[i]

    square_sum(a.grad, total)  # a.grad has no gradient of its own: nothing to differentiate into
    assert total[None] == pytest.approx(float(np.sum(g.astype(np.float64) ** 2)), rel=1e-5)
    b = qd.ndarray(qd.f32, shape=n, needs_grad=True)
    b.from_numpy(g)
    total.grad[None] = 1.0
    square_sum.grad(b, total)
    np.testing.assert_allclose(b.grad.to_numpy(), 2 * g, rtol=1e-6)


def test_python_float_and_int_follow_the_default_types(arch, rng):
    assert qd.ndarray(float, 4).dtype is qd.f32 and qd.ndarray(int, (2, 3)).dtype is qd.i32
    assert qd.field(float, shape=4).dtype is qd.f32 and qd.field(int, shape=()).dtype is qd.i32
    assert qd.ndarray(np.float64, 4).dtype is qd.f64 and qd.ndarray(np.int64, 4).dtype is qd.i64
    x = qd.ndarray(float, 8)
    values = rng.uniform(-1, 1, 8)
    x.from_numpy(values.astype(np.float32))

    @qd.kernel
    def double(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in a:
            a[i] = a[i] * 2

    double(x)
    np.testing.assert_array_equal(x.to_numpy(), values.astype(np.float32) * 2)


def test_python_float_and_int_follow_init_options():
    try:
        qd.init(arch=qd.cpu, default_fp=qd.f64, default_ip=qd.i64)
        assert qd.ndarray(float, 4).dtype is qd.f64 and qd.ndarray(int, 4).dtype is qd.i64
        assert qd.field(float, shape=2).dtype is qd.f64 and qd.field(int, shape=2).dtype is qd.i64
        assert qd.ndarray(float, 4, needs_grad=True).grad.dtype is qd.f64
    finally:
        qd.init(arch=qd.cpu)
    assert qd.ndarray(float, 4).dtype is qd.f32 and qd.field(int, shape=2).dtype is qd.i32
