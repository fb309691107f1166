"""Redundant global loads are merged (compiler/passes/load_forward.py) only where no write can
have changed the element: not across a store or atomic to the same field, not across an ndarray
write (two arguments may be one array), not into or out of nested blocks."""
import numpy as np

import qdc as qd
from qdc.compiler import ir


def loads(kernel, *args, variant="forward"):
    compiled = kernel.compile(args, variant) if variant == "forward" else kernel.grad.compile(args)
    return sum(isinstance(s, ir.GlobalLoad) for s in ir.walk(compiled.ir.body))


def atomics(compiled):
    return sum(isinstance(s, ir.AtomicRMW) for s in ir.walk(compiled.ir.body))


def test_repeated_reads_load_once_and_their_gradient_adds_once(arch, rng):
    v = qd.Vector.field(2, qd.f32, shape=8, needs_grad=True)
    out = qd.field(qd.f32, shape=8, needs_grad=True)

    @qd.kernel
    def spread():
        for i in v:
            acc = 0.0
            for k in qd.static(range(4)):
                acc += v[i].dot(v[i]) * (k + 1)  # v[i] named eight times
            out[i] = acc

    assert loads(spread) == 2
    grad = spread.grad.compile(())
    assert atomics(grad) == 2  # one adjoint accumulation per component
    vs = rng.random((8, 2)).astype(np.float32)
    v.from_numpy(vs)
    spread()
    np.testing.assert_allclose(out.to_numpy(), (vs * vs).sum(1) * 10, rtol=1e-5)
    out.grad.fill(1)
    spread.grad()
    np.testing.assert_allclose(v.grad.to_numpy(), 20 * vs, rtol=1e-5)


def test_no_merging_across_writes(arch, rng):
    x = qd.field(qd.f32, shape=6)
    y = qd.field(qd.f32, shape=6)
    out = qd.field(qd.f32, shape=(3, 6))

    @qd.kernel
    def rewrite(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in x:
            before = x[i]
            x[i] = before * 2.0
            out[0, i] = x[i] + before           # reads the stored value
            y[i] += 1.0
            first = b[i]
            a[i] = first + 10.0                 # `a` and `b` may be one array
            out[1, i] = b[i]
            c = x[i]
            if c > 1.0:
                x[i] = 0.0
            out[2, i] = x[i] + c                # after a branch that may write x

    xs = rng.random(6).astype(np.float32) * 2
    x.from_numpy(xs)
    arr0 = rng.random(6).astype(np.float32)
    arr = qd.ndarray(qd.f32, shape=6)  # one device array as both arguments (numpy arguments are
    arr.from_numpy(arr0)               # copied per argument on devices without host memory)
    rewrite(arr, arr)
    got = out.to_numpy()
    np.testing.assert_allclose(got[0], xs * 3, rtol=1e-6)
    np.testing.assert_allclose(got[1], arr0 + 10, rtol=1e-6)
    c = xs * 2
    np.testing.assert_allclose(got[2], np.where(c > 1, 0, c) + c, rtol=1e-6)
