"""`s += v` on a kernel-scope local inside a parallel loop is atomic (as in Quadrants): the
standard reduction idiom `s = 0.0; for i in x: s += x[i]` gives the exact sum at every launch,
on the fused path and with per-task launches (QDC_CPU_LAUNCH=tasks), and differentiates."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands.inspect import inspect_ir
from qdc.runtime import context
from qdc.runtime.contract.errors import QdcCompileError

N = 100_000


@pytest.fixture(params=["fused", "tasks"])
def launch(request, monkeypatch, arch):
    """Both CPU launch modes: qd.init makes a new device, which reads QDC_CPU_LAUNCH. Another
    arch has one launch path: its case runs once, under "tasks" (the per-task protocol)."""
    if arch != "cpu":
        if request.param == "fused":
            pytest.skip(f"{arch}: launches task by task only (its case is the 'tasks' one)")
        yield request.param
        return
    monkeypatch.setenv("QDC_CPU_LAUNCH", request.param)
    qd.init(arch=qd.cpu)
    assert context.current().device.launch_mode == request.param
    yield request.param
    monkeypatch.delenv("QDC_CPU_LAUNCH", raising=False)
    qd.init(arch=qd.cpu)


def test_the_reduction_idiom_is_exact_at_every_launch(arch, launch):
    x = qd.field(qd.f32, shape=N)
    out = qd.field(qd.f32, shape=())

    @qd.kernel
    def k():
        s = 0.0
        for i in x:
            s += x[i]
        out[None] = s

    x.from_numpy(np.ones(N, np.float32))
    for _ in range(30):
        k()
        assert out[None] == N
    v = np.random.default_rng(1).random(N).astype(np.float32)
    x.from_numpy(v)
    k()
    assert out[None] == pytest.approx(float(v.astype(np.float64).sum()), rel=1e-4)


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64, qd.i32])
def test_sums_of_each_type(arch, launch, dtype):
    a = qd.ndarray(dtype, shape=N)
    out = qd.ndarray(dtype, shape=2)

    @qd.kernel
    def k(a: qd.types.ndarray(dtype, ndim=1), out: qd.types.ndarray(dtype, ndim=1)):
        s = dtype(0)
        d = dtype(1000)
        for i in a:
            s += a[i]
            d -= a[i]
        out[0] = s
        out[1] = d

    rng = np.random.default_rng(2)
    v = rng.integers(-50, 50, N) if dtype is qd.i32 else rng.random(N)
    v = v.astype(dtype.np_dtype)
    a.from_numpy(v)
    for _ in range(10):
        k(a, out)
        got = out.to_numpy()
        if dtype is qd.i32:
            assert got.tolist() == [int(v.sum()), 1000 - int(v.sum())]
        else:
            want = v.astype(np.float64).sum()
            np.testing.assert_allclose(got, [want, 1000 - want], rtol=1e-4 if dtype is qd.f32 else 1e-10)


def test_integer_or_and_xor(arch, launch):
    a = qd.ndarray(qd.i32, shape=4096)
    out = qd.ndarray(qd.i32, shape=3)

    @qd.kernel
    def k(a: qd.types.ndarray(qd.i32, ndim=1), out: qd.types.ndarray(qd.i32, ndim=1)):
        o = 0
        x = 0
        m = -1
        for i in a:
            o |= a[i]
            x ^= a[i]
            m &= a[i] | 1
        out[0] = o
        out[1] = x
        out[2] = m

    v = np.random.default_rng(3).integers(0, 1 << 30, 4096).astype(np.int32)
    a.from_numpy(v)
    for _ in range(10):
        k(a, out)
        assert out.to_numpy().tolist() == [int(np.bitwise_or.reduce(v)), int(np.bitwise_xor.reduce(v)),
                                           int(np.bitwise_and.reduce(v | 1))]


def test_a_local_atomic_call_and_a_scalar_argument(arch, launch):
    a = qd.ndarray(qd.i32, shape=N)
    out = qd.ndarray(qd.i32, shape=3)

    @qd.kernel
    def k(a: qd.types.ndarray(qd.i32, ndim=1), out: qd.types.ndarray(qd.i32, ndim=1), n: qd.i32):
        s = 0
        m = -1000
        for i in a:
            qd.atomic_add(s, a[i])
            qd.atomic_max(m, a[i] * 3 - i % 11)
            n += 1
        out[0] = s
        out[1] = n
        out[2] = m

    a.from_numpy(np.arange(N, dtype=np.int32) % 7)
    for _ in range(10):
        k(a, out, 5)
        assert out.to_numpy().tolist() == [int((np.arange(N) % 7).sum()), N + 5,
                                           int((np.arange(N) % 7 * 3 - np.arange(N) % 11).max())]


def test_a_local_reduced_in_one_loop_is_used_in_the_next(arch, launch):
    x = qd.field(qd.f64, shape=N)
    y = qd.field(qd.f64, shape=N)

    @qd.kernel
    def k():
        s = 0.0
        for i in x:
            s += x[i]
        for i in y:
            y[i] = x[i] / s

    v = np.random.default_rng(4).random(N)
    x.from_numpy(v)
    for _ in range(5):
        k()
        np.testing.assert_allclose(y.to_numpy(), v / v.sum(), rtol=1e-4)


def test_ndrange_and_struct_for(arch, launch):
    g = qd.field(qd.i32, shape=(300, 200))
    out = qd.field(qd.i32, shape=2)

    @qd.kernel
    def k():
        s = 0
        for i, j in qd.ndrange(300, 200):
            s += i * 200 + j
        t = 0
        for i, j in g:
            t += g[i, j]
        out[0] = s
        out[1] = t

    g.from_numpy(np.arange(60000, dtype=np.int32).reshape(300, 200) % 5)
    for _ in range(10):
        k()
        assert out.to_numpy().tolist() == [59999 * 60000 // 2, int((np.arange(60000) % 5).sum())]


def test_a_serialized_loop_needs_no_atomic(arch, launch):
    x = qd.field(qd.i32, shape=1000)
    out = qd.field(qd.i32, shape=())

    @qd.kernel
    def k():
        s = 0
        qd.loop_config(serialize=True)
        for i in x:
            s = s * 3 % 1000003 + x[i]  # order-dependent: only a serial loop gives this
            s += 1
        out[None] = s

    x.from_numpy(np.arange(1000, dtype=np.int32))
    want = 0
    for i in range(1000):
        want = want * 3 % 1000003 + i + 1
    k()
    assert out[None] == want
    assert "atomic" not in inspect_ir(k)


def test_a_local_declared_in_the_parallel_loop_stays_a_register(arch):
    x = qd.field(qd.f32, shape=(64, 32))
    out = qd.field(qd.f32, shape=64)

    @qd.kernel
    def k():
        for i in range(64):
            acc = 0.0
            for j in range(32):
                acc += x[i, j]
            out[i] = acc

    v = np.random.default_rng(5).random((64, 32)).astype(np.float32)
    x.from_numpy(v)
    k()
    np.testing.assert_allclose(out.to_numpy(), v.sum(axis=1), rtol=1e-5)
    text = inspect_ir(k)
    assert "atomic" not in text and "temp" not in text


def test_plain_assignment_is_not_made_atomic(arch):
    x = qd.field(qd.f32, shape=16)

    @qd.kernel
    def k():
        s = 0.0
        for i in x:
            s = s + x[i]  # a race the user wrote, as in Quadrants
        x[0] = s

    with pytest.warns(UserWarning, match="'s' is updated from its own value") as rec:
        assert "atomic" not in inspect_ir(k)
        k()
    assert rec[0].filename == __file__ and rec[0].lineno == k.fn.__code__.co_firstlineno + 4


def test_the_temporary_atomic_becomes_one_atomic_per_chunk(arch):
    x = qd.field(qd.f32, shape=N)
    out = qd.field(qd.f32, shape=())

    @qd.kernel
    def k():
        s = 0.0
        for i in x:
            s += x[i]
        out[None] = s

    text = inspect_ir(k)
    body = text.split("chunk_final")[0]
    assert "accumulate_add" in body and "temp_atomic" not in body
    assert "temp_atomic_add" in text.split("chunk_final")[1]


def _grad_kernel_fixture():
    n = 200
    x = qd.field(qd.f64, shape=n, needs_grad=True)
    out = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def k():
        s: qd.f64 = 0.0
        for i in x:
            s += qd.sin(x[i]) * x[i]
        for i in x:
            s -= 0.5 * x[i] * x[i]
        out[None] = s * s

    return n, x, out, k


def test_the_gradient_through_a_local_reduction_is_exact(arch, launch):
    n, x, out, k = _grad_kernel_fixture()

    def f(v):
        x.from_numpy(v)
        k()
        return out[None]

    v = np.random.default_rng(6).random(n)
    f(v)
    out.grad[None] = 1.0
    x.grad.fill(0.0)
    k.grad()
    g = x.grad.to_numpy()
    s = np.sum(np.sin(v) * v) - np.sum(0.5 * v * v)
    np.testing.assert_allclose(g, 2 * s * (np.sin(v) + v * np.cos(v) - v), rtol=1e-10)
    eps = 1e-6
    for j in range(0, n, 37):
        e = np.zeros(n)
        e[j] = eps
        assert g[j] == pytest.approx((f(v + e) - f(v - e)) / (2 * eps), rel=1e-6, abs=1e-6)


def test_min_of_a_float_local_has_no_gradient_and_says_where(arch):
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    out = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def k():
        m = 1e30
        for i in x:
            qd.atomic_min(m, x[i])
        out[None] = m

    k()
    with pytest.raises(QdcCompileError, match="atomic min") as e:
        k.grad()
    assert "qd.atomic_min(m, x[i])" in str(e.value)
