"""Acceptance tests of the user reference's Autodiff, written from the page alone: reverse mode
through overwritten globals (in-place updates, stores in both branches of an `if`, serial-loop
dependencies, gradients w.r.t. the overwritten initial values), the listed rejections (located
compile errors), `qd.ad.Tape(loss, validation, grad_check)`, forward mode (`needs_dual`, `.dual`,
`FwdMode(loss, param, seed)`), the adstack options (`ad_stack_size`, `default_ad_stack_size`,
`ad_stack_strict`), `qd.adstack_heap_bytes()` and `AdStackOverflowError` (also raised
asynchronously on Vulkan by `qd.sync()` or a host read). References are analytic derivatives
and float64 central differences written here."""
import os

import numpy as np
import pytest

import qdc as qd
from acceptance_util import compile_error_checker, f32, line_of
from conftest import vulkan_unavailable_reason
from tolerance_util import assert_close_f32

HERE = os.path.abspath(__file__)


_assert_compile_error_at = compile_error_checker(HERE)
_f32 = f32


def test_inplace_update_gradient_wrt_initial_value(arch, rng):
    out = qd.field(qd.f32, shape=10, needs_grad=True)
    s = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def update(a: qd.f32):
        for i in out:
            out[i] = out[i] * a + s[None]

    o0, av, sv = _f32(rng, 10), np.float32(rng.uniform(-2, 2)), np.float32(rng.uniform(-1, 1))
    out.from_numpy(o0); s[None] = sv
    update(av)
    assert_close_f32(out.to_numpy(), o0 * av + sv, rtol=1e-6)
    seed = _f32(rng, 10)
    out.grad.from_numpy(seed)
    update.grad(av)
    np.testing.assert_allclose(out.grad.to_numpy(), seed * av, rtol=1e-6)   # d/d out_initial
    np.testing.assert_allclose(s.grad[None], seed.astype(np.float64).sum(), rtol=1e-5, atol=1e-6)


def test_inplace_update_times_a_differentiated_factor_is_rejected_with_location():
    # d/da needs the old out[i], which the store destroys: a gradient would be wrong, so it is refused
    out = qd.field(qd.f32, shape=10, needs_grad=True)
    a = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def bad():
        for i in out:
            out[i] = out[i] * a[None] + 1.0  # INPLACE-NONLINEAR

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{line_of(HERE, 'INPLACE-NONLINEAR')}:" in str(info.value).splitlines()[0], str(info.value)


def test_store_in_both_branches_of_if(arch, rng):
    x = qd.field(qd.f32, shape=16, needs_grad=True)
    y = qd.field(qd.f32, shape=16, needs_grad=True)

    @qd.kernel
    def branch():
        for i in x:
            if x[i] > 0:
                y[i] = x[i] * x[i]
            else:
                y[i] = 3 * x[i]

    v = _f32(rng, 16)
    x.from_numpy(v); y.from_numpy(_f32(rng, 16))
    branch()
    np.testing.assert_allclose(y.to_numpy(), np.where(v > 0, v * v, 3 * v), rtol=1e-6)
    y.grad.fill(1.0)
    branch.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), np.where(v > 0, 2 * v, 3.0), rtol=1e-6)
    np.testing.assert_array_equal(y.grad.to_numpy(), 0)  # overwritten: its initial value has no influence


def test_serial_loop_dependency_gradient_wrt_initial_row(arch, rng):
    K, N = 4, 12
    x = qd.field(qd.f32, shape=(K, N + 1), needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for k in range(K):
            for i in range(N):
                x[k, i + 1] = qd.sin(x[k, i]) * 0.9 + 0.1
        for k in range(K):
            loss[None] += x[k, N]

    def forward64(x0):
        v = x0.astype(np.float64)
        for _ in range(N):
            v = np.sin(v) * 0.9 + 0.1
        return v

    init = np.zeros((K, N + 1), np.float32)
    init[:, 0] = _f32(rng, K)
    x.from_numpy(init)
    with qd.ad.Tape(loss=loss):
        chain()
    assert_close_f32(x.to_numpy()[:, N], forward64(init[:, 0]), scale=1.0)  # terms up to ~1, ends near 0
    h = 1e-6
    numeric = (forward64(init[:, 0].astype(np.float64) + h) - forward64(init[:, 0].astype(np.float64) - h)) / (2 * h)
    np.testing.assert_allclose(x.grad.to_numpy()[:, 0], numeric, rtol=1e-4, atol=1e-6)


def test_reverse_mode_dynamic_loop_matches_central_differences(arch, rng):
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def compute():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v

    trips = int(rng.integers(5, 40))
    v0 = _f32(rng, 8)
    x.from_numpy(v0); n[None] = trips

    def f64(v):
        for _ in range(trips):
            v = np.sin(v) * 0.95 + 0.01
        return v

    with qd.ad.Tape(loss=y):
        compute()
    h = 1e-6
    numeric = (f64(v0.astype(np.float64) + h) - f64(v0.astype(np.float64) - h)) / (2 * h)
    np.testing.assert_allclose(x.grad.to_numpy(), numeric, rtol=1e-4, atol=1e-6)
    assert qd.adstack_heap_bytes() > 0


def test_rejection_cross_iteration_read_after_write():
    out = qd.field(qd.f32, shape=8, needs_grad=True)

    @qd.kernel
    def bad():
        for i in range(1, 8):
            out[i] = out[i - 1] + 1.0  # RAW-CROSS

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{line_of(HERE, 'RAW-CROSS')}:" in str(info.value).splitlines()[0], str(info.value)


def test_rejection_nonlinear_use_of_overwritten_value():
    x = qd.field(qd.f32, shape=8, needs_grad=True)

    @qd.kernel
    def bad():
        for i in x:
            x[i] = qd.sin(x[i])  # NONLINEAR-OVERWRITE

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{line_of(HERE, 'NONLINEAR-OVERWRITE')}:" in str(info.value).splitlines()[0], str(info.value)


def test_rejection_while_in_differentiated_kernel_but_forward_runs(rng):
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def halve():
        for i in x:
            v = x[i]
            while v > 1.0:  # WHILE-GRAD
                v = v * 0.5
            y[None] += v

    v = rng.uniform(1, 20, 4).astype(np.float32)
    x.from_numpy(v)
    halve()  # the forward kernel accepts while

    def ref(a):
        while a > 1.0:
            a = a * np.float32(0.5)
        return a
    np.testing.assert_allclose(y[None], sum(ref(a) for a in v), rtol=1e-6)
    with pytest.raises(qd.QdcCompileError) as info:
        halve.grad()
    assert f"{HERE}:{line_of(HERE, 'WHILE-GRAD')}:" in str(info.value).splitlines()[0], str(info.value)


def test_tape_grad_check_passes_on_a_correct_gradient(arch, rng):
    x = qd.field(qd.f32, shape=12, needs_grad=True)
    w = qd.field(qd.f32, shape=12, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy():
        for i in x:
            loss[None] += qd.sin(x[i]) * w[i] + x[i] * x[i] * 0.5

    xv, wv = _f32(rng, 12), _f32(rng, 12)
    x.from_numpy(xv); w.from_numpy(wv)
    with qd.ad.Tape(loss=loss, validation=False, grad_check=[x, w]):
        energy()
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(xv) * wv + xv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.grad.to_numpy(), np.sin(xv), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x.to_numpy(), xv)  # grad_check put the values back


def test_tape_grad_check_fails_on_a_non_differentiable_step(rng):
    # floor's derivative is 0 wherever it exists; a finite difference across its steps is not
    x = qd.field(qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def stairs():
        for i in x:
            loss[None] += qd.floor(x[i] * 1000.0)

    v = rng.uniform(1, 2, 5).astype(np.float32)
    x.from_numpy(v)
    with pytest.raises(qd.ad.GradCheckError) as info:
        with qd.ad.Tape(loss=loss, grad_check=[x]):
            stairs()
    msg = str(info.value)
    assert "'x'" in msg and "0" in msg, msg  # names the field, the element and both values
    np.testing.assert_array_equal(x.to_numpy(), v)  # the check put the values back
    assert loss[None] == float(np.floor(v * np.float32(1000.0)).sum())


def test_tape_seeds_loss_and_accumulates(rng):
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def sq():
        for i in x:
            loss[None] += x[i] * x[i]

    v = _f32(rng, 6)
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss):
        sq()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * v, rtol=1e-6)
    loss.grad[None] = 1.0
    sq.grad()  # plain .grad accumulates
    np.testing.assert_allclose(x.grad.to_numpy(), 4 * v, rtol=1e-6)


def test_forward_mode_jvp(arch, rng):
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def f():
        for i in x:
            y[None] += qd.exp(x[i]) * (i + 1)

    v = _f32(rng, 4)
    x.from_numpy(v)
    seed = [float(s) for s in _f32(rng, 4)]
    with qd.ad.FwdMode(loss=y, param=x, seed=seed):
        f()
    np.testing.assert_allclose(y.dual[None], float((np.exp(v) * np.arange(1, 5) * seed).sum()), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y[None], float((np.exp(v.astype(np.float64)) * np.arange(1, 5)).sum()), rtol=1e-5)
    assert np.all(x.dual.to_numpy() == 0)  # the seed is cleared on exit


def test_forward_mode_scalar_param_default_seed(rng):
    a = qd.field(qd.f32, shape=(), needs_dual=True)
    y = qd.field(qd.f32, shape=8, needs_dual=True)

    @qd.kernel
    def g():
        for i in y:
            y[i] = qd.sin(a[None] * (i + 1))

    av = np.float32(rng.uniform(-1, 1))
    a[None] = av
    with qd.ad.FwdMode(loss=y, param=a):
        g()
    k = np.arange(1, 9)
    np.testing.assert_allclose(y.dual.to_numpy(), np.cos(av * k) * k, rtol=1e-5, atol=1e-6)


def _sin_chain():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=4)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(n[i]):
                v = qd.sin(v) + 0.1
            y[None] += v

    return chain, x, n, y


def _chain_grad64(x0, trips):
    out = []
    for v, t in zip(x0.astype(np.float64), trips):
        g = 1.0
        for _ in range(t):
            g *= np.cos(v)
            v = np.sin(v) + 0.1
        out.append(g)
    return np.array(out)


def test_forced_ad_stack_size_overflow_names_kernel_then_next_launch_works(arch, rng, session_cache_dir):
    qd.init(arch=arch, ad_stack_size=16, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()
    x0 = _f32(rng, 4)
    x.from_numpy(x0)
    n.from_numpy(np.array([3, 40, 5, 2], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()
        qd.sync()
    e = info.value
    assert "chain" in str(e) and "16" in str(e), str(e)
    assert e.kernel == "chain" and e.allocated == 16 and e.required > 16
    assert e.task and e.task in str(e)
    trips = np.array([3, 9, 5, 2], np.int32)
    n.from_numpy(trips)
    x.grad.fill(0)
    y.grad[None] = 1.0
    chain.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), _chain_grad64(x0, trips), rtol=1e-4, atol=1e-6)


def test_default_sizing_follows_live_trip_counts(arch, rng):
    chain, x, n, y = _sin_chain()
    x0 = _f32(rng, 4)
    x.from_numpy(x0)
    for trips in ([2, 3, 4, 5], [300, 1, 1, 7]):  # 300 > default_ad_stack_size: sized from data
        trips = np.array(trips, np.int32)
        n.from_numpy(trips)
        x.grad.fill(0)
        with qd.ad.Tape(loss=y):
            chain()
        np.testing.assert_allclose(x.grad.to_numpy(), _chain_grad64(x0, trips), rtol=1e-3, atol=1e-6)


def _unbounded_kernel():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def local_trips():
        for i in x:
            v = x[i]
            m = 1
            for _ in range(3):
                # 40, but a loop-carried local: outside what a SizeExpr can say
                m = m * 3 + 1  # UNBOUNDED
            for _ in range(m):
                v = qd.sin(v) * 0.99
            y[None] += v

    return local_trips, x, y


def _local_trips_grad64(x0):
    out = []
    for v in x0.astype(np.float64):
        g = 1.0
        for _ in range(40):
            g *= np.cos(v) * 0.99
            v = np.sin(v) * 0.99
        out.append(g)
    return np.array(out)


def test_unbounded_adstack_warns_naming_line_and_uses_default_capacity(rng):
    k, x, y = _unbounded_kernel()
    x0 = _f32(rng, 4)
    x.from_numpy(x0)
    with pytest.warns(Warning) as caught:
        with qd.ad.Tape(loss=y):
            k()
    text = " ".join(str(w.message) for w in caught)
    assert f"{line_of(HERE, 'UNBOUNDED')}" in text, text
    np.testing.assert_allclose(x.grad.to_numpy(), _local_trips_grad64(x0), rtol=1e-4, atol=1e-7)


def test_default_ad_stack_size_too_small_overflows_then_bigger_works(rng, session_cache_dir):
    qd.init(arch=qd.cpu, default_ad_stack_size=16, cache_dir=session_cache_dir)
    k, x, y = _unbounded_kernel()
    x0 = _f32(rng, 4)
    x.from_numpy(x0)
    with pytest.warns(Warning):
        with pytest.raises(qd.AdStackOverflowError) as info:
            with qd.ad.Tape(loss=y):
                k()
    assert "local_trips" in str(info.value) and "16" in str(info.value)
    qd.init(arch=qd.cpu, default_ad_stack_size=64, cache_dir=session_cache_dir)
    k, x, y = _unbounded_kernel()
    x.from_numpy(x0)
    with pytest.warns(Warning):
        with qd.ad.Tape(loss=y):
            k()
    np.testing.assert_allclose(x.grad.to_numpy(), _local_trips_grad64(x0), rtol=1e-4, atol=1e-7)


def test_ad_stack_strict_turns_the_warning_into_a_located_error(session_cache_dir):
    qd.init(arch=qd.cpu, ad_stack_strict=True, cache_dir=session_cache_dir)
    k, x, y = _unbounded_kernel()
    _assert_compile_error_at(k.grad, "UNBOUNDED")


def test_adstack_heap_bytes_is_zero_without_adstacks():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def lin():
        for i in x:
            y[None] += 2 * x[i]

    with qd.ad.Tape(loss=y):
        lin()
    assert qd.adstack_heap_bytes() == 0
    np.testing.assert_allclose(x.grad.to_numpy(), 2)


def test_vulkan_overflow_raised_at_sync_naming_kernel(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", ad_stack_size=8, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()
    x.from_numpy(_f32(rng, 4))
    n.from_numpy(np.array([1, 2, 30, 1], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()   # asynchronous: may or may not raise here
        qd.sync()
    assert "chain" in str(info.value)
    qd.sync()  # the error was reported once


def test_grad_check_error_names_index_and_values(rng):
    x = qd.field(qd.f64, shape=3, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def stairs():
        for i in x:
            loss[None] += qd.floor(x[i] * 1e7) + x[i]

    x.from_numpy(rng.uniform(1, 2, 3))
    with pytest.raises(qd.ad.GradCheckError) as info:
        with qd.ad.Tape(loss=loss, grad_check=[x]):
            stairs()
    msg = str(info.value)
    assert "x" in msg and any(ch.isdigit() for ch in msg), msg


def test_grad_check_f64_passes(arch, rng):
    x = qd.field(qd.f64, shape=6, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in x:
            loss[None] += qd.tanh(x[i]) * x[i]

    v = rng.standard_normal(6)
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss, grad_check=[x]):
        f()
    np.testing.assert_allclose(x.grad.to_numpy(), np.tanh(v) + v / np.cosh(v) ** 2, rtol=1e-10)


def test_forward_mode_on_a_vector_param_without_seed_is_refused():
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    with pytest.raises((ValueError, TypeError, RuntimeError)):
        with qd.ad.FwdMode(loss=y, param=x):
            pass


def test_forward_mode_agrees_with_reverse_mode(arch, rng):
    x = qd.field(qd.f32, shape=6, needs_grad=True, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True, needs_dual=True)

    @qd.kernel
    def f():
        for i in x:
            v = x[i]
            for _ in range(3):
                v = qd.sin(v) * v
            y[None] += v

    x.from_numpy(_f32(rng, 6))
    with qd.ad.Tape(loss=y):
        f()
    grad = x.grad.to_numpy()
    for j in (0, 4):
        seed = [0.0] * 6
        seed[j] = 1.0
        with qd.ad.FwdMode(loss=y, param=x, seed=seed):
            f()
        np.testing.assert_allclose(y.dual[None], grad[j], rtol=1e-4, atol=1e-6)


def test_gradient_through_vector_norm(arch, rng):
    pos = qd.Vector.field(3, qd.f32, shape=10, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def total_length():
        for i in pos:
            loss[None] += pos[i].norm()

    data = _f32(rng, 10, 3)
    pos.from_numpy(data)
    with qd.ad.Tape(loss=loss):
        total_length()
    want = data / np.linalg.norm(data, axis=1, keepdims=True)
    np.testing.assert_allclose(pos.grad.to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_serialized_loop_carried_dependency_gradient(arch, rng):
    N = 16
    x = qd.field(qd.f32, shape=N, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def prefix(a: qd.f32):
        qd.loop_config(serialize=True)
        for i in range(1, N):
            x[i] = x[i - 1] * a + x[i]
        loss[None] += x[N - 1]

    v = _f32(rng, N)
    a = float(np.float32(rng.uniform(0.5, 1.0)))
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss):
        prefix(a)
    want = np.array([a ** (N - 1 - i) for i in range(N)])
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5)
    ref = v.astype(np.float64).copy()
    for i in range(1, N):
        ref[i] = ref[i - 1] * a + ref[i]
    np.testing.assert_allclose(x.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_forward_mode_with_ndarray_param(arch, rng):
    @qd.kernel
    def f(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            out[0] += a[i] * a[i] * a[i]

    a = qd.ndarray(qd.f32, shape=(5,), needs_dual=True)
    out = qd.ndarray(qd.f32, shape=(1,), needs_dual=True)
    v = _f32(rng, 5)
    a.from_numpy(v)
    seed = [float(s) for s in _f32(rng, 5)]
    with qd.ad.FwdMode(loss=out, param=a, seed=seed):
        f(a, out)
    np.testing.assert_allclose(out.dual.to_numpy()[0], float((3 * v.astype(np.float64) ** 2 * seed).sum()),
                               rtol=1e-5, atol=1e-6)


def test_vulkan_sync_raises_the_first_error_once(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", ad_stack_size=8, debug=True, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()
    z = qd.field(qd.f32, shape=4)

    @qd.kernel
    def shifted(o: qd.i32):
        for i in range(4):
            z[i + o] = 1.0

    x.from_numpy(_f32(rng, 4))
    n.from_numpy(np.array([1, 30, 1, 1], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()
        shifted(3)  # a second error, queued behind the first
        qd.sync()
    assert "chain" in str(info.value)
    qd.sync()
    shifted(0)
    np.testing.assert_array_equal(z.to_numpy(), 1.0)


def test_tape_clears_stale_gradients_on_entry(arch, rng):
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in x:
            loss[None] += qd.cos(x[i])

    v = _f32(rng, 6)
    x.from_numpy(v)
    x.grad.from_numpy(_f32(rng, 6) * 100)
    with qd.ad.Tape(loss=loss):
        f()
    np.testing.assert_allclose(x.grad.to_numpy(), -np.sin(v), rtol=1e-5, atol=1e-7)


def test_fwdmode_zeroes_stale_duals_and_clears_seed(rng):
    x = qd.field(qd.f32, shape=3, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def f():
        for i in x:
            y[None] += x[i] * x[i]

    v = _f32(rng, 3)
    x.from_numpy(v)
    y.dual[None] = 123.0
    with qd.ad.FwdMode(loss=y, param=x, seed=[0.0, 1.0, 0.0]):
        f()
    np.testing.assert_allclose(y.dual[None], 2 * v[1], rtol=1e-6)
    np.testing.assert_array_equal(x.dual.to_numpy(), 0)


def test_grad_check_with_a_dynamic_loop_and_ndarray(arch, rng):
    x = qd.field(qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def iterate(trips: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in x:
            v = x[i]
            for _ in range(trips[i]):
                v = qd.tanh(v * 1.1 + 0.05)
            loss[None] += v * v

    x.from_numpy(_f32(rng, 5))
    trips = rng.integers(1, 12, 5).astype(np.int32)
    with qd.ad.Tape(loss=loss, grad_check=[x]):
        iterate(trips)
    assert np.any(x.grad.to_numpy() != 0)


def test_inplace_update_in_both_branches_and_repeated_stores(arch, rng):
    x = qd.field(qd.f32, shape=12, needs_grad=True)
    y = qd.field(qd.f32, shape=12, needs_grad=True)
    z = qd.field(qd.f32, shape=12, needs_grad=True)

    @qd.kernel
    def branches():
        for i in x:
            if x[i] > 0:
                y[i] = y[i] * 2
            else:
                y[i] = y[i] + x[i]

    @qd.kernel
    def restore():
        for i in x:
            z[i] = x[i]
            z[i] = z[i] * 3 + x[i] * x[i]

    xv, yv = _f32(rng, 12), _f32(rng, 12)
    x.from_numpy(xv); y.from_numpy(yv); z.from_numpy(_f32(rng, 12))
    branches()
    assert_close_f32(y.to_numpy(), np.where(xv > 0, yv * 2, yv + xv), rtol=1e-6)
    y.grad.fill(1.0)
    branches.grad()
    np.testing.assert_array_equal(y.grad.to_numpy(), np.where(xv > 0, 2.0, 1.0))
    np.testing.assert_array_equal(x.grad.to_numpy(), np.where(xv > 0, 0.0, 1.0))
    x.grad.fill(0)
    restore()
    np.testing.assert_allclose(z.to_numpy(), 3 * xv + xv * xv, rtol=1e-6)
    z.grad.fill(1.0)
    restore.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), 3 + 2 * xv, rtol=1e-6)
    np.testing.assert_array_equal(z.grad.to_numpy(), 0)


def test_rejection_every_iteration_stores_one_element():
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    s = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def bad():
        for i in x:
            s[None] = x[i]  # ONE-ELEMENT

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{line_of(HERE, 'ONE-ELEMENT')}:" in str(info.value).splitlines()[0], str(info.value)


def test_rejection_atomic_old_value_in_differentiated_kernel():
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    y = qd.field(qd.f32, shape=6, needs_grad=True)
    s = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def bad():
        for i in x:
            o = qd.atomic_add(s[None], x[i])  # OLD-VALUE
            y[i] = o * x[i]

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{line_of(HERE, 'OLD-VALUE')}:" in str(info.value).splitlines()[0], str(info.value)


def test_f64_adstack_gradient_through_a_dynamic_loop(arch, rng):
    """f64 loop-carried values on adstacks: every arch (SPIR-V where the device has Float64)."""
    d = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def f64chain():
        for i in d:
            v = d[i]
            for _ in range(n[None]):
                v = qd.sin(v)
            loss[None] += v

    v0 = rng.uniform(-1, 1, 4)
    d.from_numpy(v0)
    n[None] = 5
    with qd.ad.Tape(loss=loss):
        f64chain()
    g, v = np.ones(4), v0.copy()
    for _ in range(5):
        g *= np.cos(v)
        v = np.sin(v)
    np.testing.assert_allclose(d.grad.to_numpy(), g, rtol=1e-12)


def test_forward_mode_atomic_max_on_a_dual_is_a_located_error():
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def peak():
        for i in x:
            qd.atomic_max(y[None], x[i])  # FWD-ATOMIC-MAX

    with pytest.raises(qd.QdcCompileError) as info:
        with qd.ad.FwdMode(loss=y, param=x, seed=[1.0, 0.0, 0.0, 0.0]):
            peak()
    assert f"{HERE}:{line_of(HERE, 'FWD-ATOMIC-MAX')}:" in str(info.value).splitlines()[0], str(info.value)


def test_ad_context_misuse_is_refused():
    x = qd.field(qd.f32, shape=4, needs_dual=True, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)
    plain = qd.field(qd.f32, shape=())
    with pytest.raises(ValueError):
        with qd.ad.FwdMode(loss=y, param=plain):
            pass
    with pytest.raises(ValueError):
        with qd.ad.FwdMode(loss=y, param=x, seed=[1.0, 2.0]):
            pass
    with pytest.raises(ValueError):
        with qd.ad.Tape(loss=plain):
            pass
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    with pytest.raises((ValueError, TypeError)):
        with qd.ad.Tape(loss=loss, grad_check=[plain]):
            pass


def test_adstack_capacity_follows_argument_and_loop_index(arch, rng):
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def by_argument(trips: qd.i32):
        for i in x:
            v = x[i]
            for _ in range(trips + i):  # beyond default_ad_stack_size for large `trips`
                v = qd.sin(v) * 0.999 + 0.001
            loss[None] += v

    def reference(x0, trips):
        out = []
        for i, v in enumerate(x0.astype(np.float64)):
            g = 1.0
            for _ in range(trips + i):
                g *= np.cos(v) * 0.999
                v = np.sin(v) * 0.999 + 0.001
            out.append(g)
        return np.array(out)

    x0 = _f32(rng, 6)
    x.from_numpy(x0)
    heaps = []
    for trips in (10, 700):
        x.grad.fill(0)
        with qd.ad.Tape(loss=loss):
            by_argument(trips)
        qd.sync()
        heaps.append(qd.adstack_heap_bytes())
        np.testing.assert_allclose(x.grad.to_numpy(), reference(x0, trips), rtol=2e-3, atol=1e-6)
    assert 0 < heaps[0] < heaps[1], heaps


def test_vulkan_overflow_raised_by_a_single_element_host_read(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", ad_stack_size=8, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()
    x0 = _f32(rng, 4)
    x.from_numpy(x0)
    n.from_numpy(np.array([1, 2, 30, 1], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()
        x.grad[0]
    assert "chain" in str(info.value) and "8" in str(info.value)
    trips = np.array([1, 2, 7, 1], np.int32)
    n.from_numpy(trips)
    x.grad.fill(0)
    y.grad[None] = 1.0
    chain.grad()
    np.testing.assert_allclose(x.grad.to_numpy(), _chain_grad64(x0, trips), rtol=1e-4, atol=1e-6)


def test_tape_positional_loss_validation_true_and_several_launches(arch, rng):
    x = qd.field(qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def f(w: qd.f32):
        for i in x:
            loss[None] += qd.sin(x[i]) * w

    v = _f32(rng, 5)
    x.from_numpy(v)
    with qd.ad.Tape(loss, validation=True, grad_check=[x]):
        f(2.0)
        f(-0.5)
    np.testing.assert_allclose(x.grad.to_numpy(), 1.5 * np.cos(v), rtol=1e-5)


def test_inplace_update_repeated_in_a_dynamic_loop(arch, rng):
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    s = qd.field(qd.f32, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def repeat(a: qd.f32):
        for k in x:
            for t in range(n[None]):
                x[k] = x[k] * a + s[k] * t

    x0, s0 = _f32(rng, 4), _f32(rng, 4)
    a = float(np.float32(rng.uniform(0.5, 1.0)))
    trips = int(rng.integers(3, 10))
    x.from_numpy(x0); s.from_numpy(s0); n[None] = trips
    repeat(a)
    ref = x0.astype(np.float64)
    for t in range(trips):
        ref = ref * a + s0 * t
    np.testing.assert_allclose(x.to_numpy(), ref, rtol=1e-5, atol=1e-4)  # f32 rounding of terms up to ~40
    seed = _f32(rng, 4)
    x.grad.from_numpy(seed)
    repeat.grad(a)
    np.testing.assert_allclose(x.grad.to_numpy(), seed * a ** trips, rtol=1e-5)
    np.testing.assert_allclose(s.grad.to_numpy(), seed * sum(t * a ** (trips - 1 - t) for t in range(trips)),
                               rtol=1e-5)


def test_serial_chain_gradient_wrt_shared_parameter(arch, rng):
    K, N = 3, 6
    y = qd.field(qd.f32, shape=(K, N + 1), needs_grad=True)
    w = qd.field(qd.f32, shape=(), needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for k in range(K):
            for i in range(N):
                y[k, i + 1] = qd.tanh(y[k, i] * w[None])
        for k in range(K):
            loss[None] += y[k, N]

    def total(y0, wv):
        v = y0.astype(np.float64)
        for _ in range(N):
            v = np.tanh(v * wv)
        return v.sum()

    y0 = np.zeros((K, N + 1), np.float32)
    y0[:, 0] = _f32(rng, K)
    w0 = float(np.float32(rng.uniform(0.8, 1.5)))
    y.from_numpy(y0); w[None] = w0
    with qd.ad.Tape(loss=loss):
        chain()
    h = 1e-6
    numeric = (total(y0[:, 0], w0 + h) - total(y0[:, 0], w0 - h)) / (2 * h)
    np.testing.assert_allclose(w.grad[None], numeric, rtol=1e-4, atol=1e-5)


def test_vulkan_kernel_return_is_a_host_read_that_raises_a_pending_error(rng, session_cache_dir):
    # docs/api.md: a host read synchronises first, and synchronising raises the first error; a
    # returned value is read back from the device like x[i]
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", ad_stack_size=8, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()

    @qd.kernel
    def current() -> qd.f32:
        return y[None]

    x.from_numpy(_f32(rng, 4))
    n.from_numpy(np.array([1, 30, 1, 1], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()
        current()
    assert "chain" in str(info.value)
    qd.sync()  # reported once
    y[None] = 2.5
    assert current() == 2.5


def test_cpu_overflow_raises_at_the_launch_itself(rng, session_cache_dir):
    qd.init(arch=qd.cpu, ad_stack_size=8, cache_dir=session_cache_dir)
    chain, x, n, y = _sin_chain()
    x.from_numpy(_f32(rng, 4))
    n.from_numpy(np.array([1, 1, 1, 9], np.int32))
    y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as info:
        chain.grad()  # synchronous on the CPU: no qd.sync() needed
    assert info.value.allocated == 8 and info.value.required == 10
    qd.sync()
