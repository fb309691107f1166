"""Least-squares line fit: the loss is differentiable in w and b (their .grad fields are
filled by `mean_squared_error.grad()` once reverse mode is available)."""
import qdc as qd

N = 64
xs = qd.field(qd.f32, shape=N)
ys = qd.field(qd.f32, shape=N)
w = qd.field(qd.f32, shape=(), needs_grad=True)
b = qd.field(qd.f32, shape=(), needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def mean_squared_error():
    for i in xs:
        r = w[None] * xs[i] + b[None] - ys[i]
        loss[None] += r * r / N


@qd.kernel
def sgd_step(lr: qd.f32):
    w[None] -= lr * w.grad[None]
    b[None] -= lr * b.grad[None]
