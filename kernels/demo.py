"""The first example of docs/api.md: a parallel loop with a dynamic inner loop (its gradient needs
adstacks), and a kernel on an ndarray argument."""
import qdc as qd

n = qd.field(qd.i32, shape=())
x = qd.field(qd.f32, shape=16, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.func
def step(v):
    return v * 0.95 + 0.01


@qd.kernel
def compute():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = step(v)
        y[None] += v


@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s
