"""The README's first example, end to end against numpy."""
import numpy as np

import qdc as qd


def test_api_example(rng):
    n = qd.field(qd.i32, shape=())
    x = qd.field(qd.f32, shape=16, needs_grad=True)
    y = qd.field(qd.f32, shape=())

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

    xs = rng.random(16).astype(np.float32)
    x.from_numpy(xs)
    n[None] = int(rng.integers(1, 20))
    compute()
    ref = xs.astype(np.float64)
    for _ in range(n[None]):
        ref = ref * 0.95 + 0.01
    np.testing.assert_allclose(y[None], ref.sum(), rtol=1e-5)

    a = rng.random(1000).astype(np.float32)
    a0 = a.copy()
    s = float(rng.random())
    scale(a, s)
    np.testing.assert_allclose(a, a0 * np.float32(s), rtol=1e-6)
