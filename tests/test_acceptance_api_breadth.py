"""Acceptance tests of ../shared/API.md written from the page alone, the way a Quadrants user
would: templates, return values, ahead-of-time instantiation, n-ary builtins, inlined Python
functions, `qd.types.NDArray`, reverse mode with overwritten globals, Tape(grad_check=...),
forward mode, adstack options and overflow, `qd.init` arch spellings, GPU launch semantics,
argument errors, fields from Python and option files. One small test per promise; references
are numpy, analytic derivatives and float64 central differences."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from conftest import vulkan_unavailable_reason

HERE = os.path.abspath(__file__)


def _line_of(marker: str) -> int:
    lines = open(HERE, encoding="utf-8").read().splitlines()
    hits = [i + 1 for i, t in enumerate(lines) if t.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def _assert_compile_error_at(fn, marker: str, *words):
    with pytest.raises(qd.QdcCompileError) as info:
        fn()
    msg = str(info.value)
    first = msg.splitlines()[0]
    assert first.startswith(f"{HERE}:{_line_of(marker)}:"), msg
    assert ": error: " in first, msg
    assert "Traceback" not in msg
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    return msg


def _f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


# ---- §2 templates ----------------------------------------------------------------------------

def test_template_field_argument_compiles_per_field(arch, rng):
    a = qd.field(qd.f32, shape=7)
    b = qd.field(qd.f32, shape=(3, 5))

    @qd.kernel
    def scale_into(f: qd.template(), s: qd.f32):
        for i in f:
            f[i] = f[i] * s

    @qd.kernel
    def scale2(f: qd.template(), s: qd.f32):
        for i, j in f:
            f[i, j] = f[i, j] * s + i - j

    va, vb = _f32(rng, 7), _f32(rng, 3, 5)
    a.from_numpy(va); b.from_numpy(vb)
    scale_into(a, 3.0)
    scale2(b, 0.5)
    np.testing.assert_allclose(a.to_numpy(), va * 3.0, rtol=1e-6)
    i, j = np.meshgrid(np.arange(3), np.arange(5), indexing="ij")
    np.testing.assert_allclose(b.to_numpy(), vb * 0.5 + i - j, rtol=1e-6, atol=1e-6)


def test_qd_Template_spelling_and_python_value_is_a_constant(arch, rng):
    out = qd.field(qd.f32, shape=6)

    @qd.kernel
    def fill_pow(f: qd.Template, k: qd.template()):
        for i in f:
            v = 1.0
            for _ in qd.static(range(k)):  # k is a Python int: static unrolling needs a constant
                v = v * (i + 1)
            f[i] = v

    for k in (2, 3):
        fill_pow(out, k)
        np.testing.assert_allclose(out.to_numpy(), (np.arange(1, 7, dtype=np.float64) ** k), rtol=1e-6)


def test_template_value_compiles_once_per_distinct_value(arch):
    out = qd.field(qd.f32, shape=())
    compiled = []

    @qd.kernel
    def put(c: qd.template()):
        out[None] = c

    for c in (1.5, 2.5, 1.5, 2.5, 1.5):
        put(c)
        compiled.append(out[None])
    assert compiled == [1.5, 2.5, 1.5, 2.5, 1.5]


def test_template_on_qd_func(arch, rng):
    x = qd.field(qd.f32, shape=9)
    y = qd.field(qd.f32, shape=9)

    @qd.func
    def read_scaled(f: qd.template(), i, factor: qd.template()):
        return f[i] * factor

    @qd.kernel
    def run():
        for i in x:
            y[i] = read_scaled(x, i, 4) + read_scaled(y, i, 0.5)

    vx, vy = _f32(rng, 9), _f32(rng, 9)
    x.from_numpy(vx); y.from_numpy(vy)
    run()
    np.testing.assert_allclose(y.to_numpy(), vx * 4 + vy * 0.5, rtol=1e-6)


def test_template_rejects_numpy_array_naming_kernel_and_parameter():
    @qd.kernel
    def k(f: qd.template()):
        pass

    with pytest.raises(TypeError) as info:
        k(np.zeros(3, np.float32))
    assert "k" in str(info.value) and "f" in str(info.value)


# ---- §2 return values -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype,pytype", [(qd.f32, float), (qd.f64, float), (qd.i32, int), (qd.i64, int)])
def test_scalar_return_types(arch, rng, dtype, pytype):
    vals = rng.integers(-50, 50, 20)

    @qd.kernel
    def total(a: qd.types.ndarray(dtype=dtype, ndim=1)) -> dtype:
        s = a[0] * 0
        for i in range(a.shape[0]):
            s += a[i]
        return s

    arr = vals.astype({qd.f32: np.float32, qd.f64: np.float64, qd.i32: np.int32, qd.i64: np.int64}[dtype])
    got = total(arr)
    assert isinstance(got, pytype)
    assert got == pytype(vals.sum())


def test_return_converts_to_declared_type(arch):
    @qd.kernel
    def trunc() -> qd.i32:
        return 7.9

    @qd.kernel
    def widen() -> qd.f64:
        return 3

    assert trunc() == 7 and isinstance(trunc(), int)
    assert widen() == 3.0 and isinstance(widen(), float)


def test_vector_and_matrix_returns(arch, rng):
    m = qd.Matrix.field(2, 2, qd.f32, shape=())
    mv = _f32(rng, 2, 2) + 2 * np.eye(2, dtype=np.float32)
    m.from_numpy(mv)

    @qd.kernel
    def vec() -> qd.math.vec3:
        return qd.Vector([1.0, 2.0, 3.0]) * 2

    @qd.kernel
    def inv() -> qd.types.matrix(2, 2, qd.f32):
        return m[None].inverse()

    v = vec()
    assert isinstance(v, np.ndarray) and v.shape == (3,)
    np.testing.assert_allclose(v, [2, 4, 6])
    got = inv()
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, np.linalg.inv(mv.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_tuple_return_both_spellings(arch, rng):
    data = _f32(rng, 33)

    @qd.kernel
    def minmax(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> tuple[qd.f32, qd.f32]:
        lo = a[0]
        hi = a[0]
        for i in range(a.shape[0]):
            qd.atomic_min(lo, a[i])
            qd.atomic_max(hi, a[i])
        return lo, hi

    @qd.kernel
    def pair() -> (qd.i32, qd.f32):
        return 4, 0.25

    lo, hi = minmax(data)
    assert (lo, hi) == (float(data.min()), float(data.max()))
    assert pair() == (4, 0.25)


def test_return_not_last_top_level_statement_is_located_error():
    @qd.kernel
    def bad() -> qd.f32:
        for i in range(3):
            return 1.0  # RET-IN-LOOP
        return 0.0

    _assert_compile_error_at(bad, "RET-IN-LOOP")


def test_missing_return_annotation_is_error():
    @qd.kernel
    def bad():
        return 1.0  # RET-UNDECLARED

    _assert_compile_error_at(bad, "RET-UNDECLARED")


# ---- §2 builtins, inlined Python functions, NDArray spelling --------------------------------

def test_nary_abs_min_max(arch, rng):
    a, b, c, d = (_f32(rng, 40) for _ in range(4))

    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1),
          c: qd.types.ndarray(dtype=qd.f32, ndim=1), d: qd.types.ndarray(dtype=qd.f32, ndim=1),
          out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(a.shape[0]):
            out[i, 0] = qd.min(a[i], b[i], c[i])
            out[i, 1] = qd.max(a[i], b[i], c[i], d[i])
            out[i, 2] = qd.abs(a[i])
            out[i, 3] = max(a[i], b[i], c[i]) + min(c[i], d[i]) + abs(d[i])

    out = np.zeros((40, 4), np.float32)
    k(a, b, c, d, out)
    np.testing.assert_array_equal(out[:, 0], np.minimum(np.minimum(a, b), c))
    np.testing.assert_array_equal(out[:, 1], np.maximum.reduce([a, b, c, d]))
    np.testing.assert_array_equal(out[:, 2], np.abs(a))
    np.testing.assert_allclose(out[:, 3], np.maximum.reduce([a, b, c]) + np.minimum(c, d) + np.abs(d), rtol=1e-6)


def _plain_helper(v, w):
    return v * v - w


def test_plain_python_function_is_inlined(arch, rng):
    x = qd.field(qd.f32, shape=11)

    def local_helper(v):
        return _plain_helper(v, 1.0) * 2

    @qd.kernel
    def k():
        for i in x:
            x[i] = local_helper(x[i])

    v = _f32(rng, 11)
    x.from_numpy(v)
    k()
    np.testing.assert_allclose(x.to_numpy(), (v * v - 1) * 2, rtol=1e-6)


def test_calling_a_builtin_python_function_is_a_compile_error():
    x = qd.field(qd.f32, shape=3)

    @qd.kernel
    def bad():
        for i in x:
            x[i] = len("ab")  # BAD-CALL

    _assert_compile_error_at(bad, "BAD-CALL")


def test_NDArray_subscript_spelling(arch, rng):
    @qd.kernel
    def axpy(a: qd.types.NDArray[qd.f32, 2], b: qd.types.NDArray[qd.f32, 2], s: qd.f32):
        for i, j in qd.ndrange(a.shape[0], a.shape[1]):
            b[i, j] = a[i, j] * s + b[i, j]

    a, b = _f32(rng, 5, 6), _f32(rng, 5, 6)
    want = a * np.float32(1.5) + b
    axpy(a, b, 1.5)
    np.testing.assert_allclose(b, want, rtol=1e-6)


def test_ndarray_dtype_and_ndim_taken_from_argument(arch, rng):
    @qd.kernel
    def neg(a: qd.types.ndarray()):
        for i in range(a.shape[0]):
            a[i] = -a[i]

    v = rng.standard_normal(9)
    w = v.copy()
    neg(w)
    np.testing.assert_array_equal(w, -v)


# ---- §3 reverse mode through overwritten globals --------------------------------------------

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
    np.testing.assert_allclose(out.to_numpy(), o0 * av + sv, rtol=1e-6)
    seed = _f32(rng, 10)
    out.grad.from_numpy(seed)
    update.grad(av)
    np.testing.assert_allclose(out.grad.to_numpy(), seed * av, rtol=1e-6)   # d/d out_initial
    np.testing.assert_allclose(s.grad[None], seed.astype(np.float64).sum(), rtol=1e-5)


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
    assert f"{HERE}:{_line_of('INPLACE-NONLINEAR')}:" in str(info.value).splitlines()[0], str(info.value)


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
    np.testing.assert_allclose(x.to_numpy()[:, N], forward64(init[:, 0]), rtol=1e-5)
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
    assert f"{HERE}:{_line_of('RAW-CROSS')}:" in str(info.value).splitlines()[0], str(info.value)


def test_rejection_nonlinear_use_of_overwritten_value():
    x = qd.field(qd.f32, shape=8, needs_grad=True)

    @qd.kernel
    def bad():
        for i in x:
            x[i] = qd.sin(x[i])  # NONLINEAR-OVERWRITE

    with pytest.raises(qd.QdcCompileError) as info:
        bad.grad()
    assert f"{HERE}:{_line_of('NONLINEAR-OVERWRITE')}:" in str(info.value).splitlines()[0], str(info.value)


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
    assert f"{HERE}:{_line_of('WHILE-GRAD')}:" in str(info.value).splitlines()[0], str(info.value)


# ---- §3 Tape options ------------------------------------------------------------------------

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

    x.from_numpy(rng.uniform(1, 2, 5).astype(np.float32))
    with pytest.raises(qd.ad.GradCheckError) as info:
        with qd.ad.Tape(loss=loss, grad_check=[x]):
            stairs()
    msg = str(info.value)
    assert "'x'" in msg or " x" in msg, msg


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


# ---- §3 forward mode ------------------------------------------------------------------------

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
    np.testing.assert_allclose(y.dual[None], float((np.exp(v) * np.arange(1, 5) * seed).sum()), rtol=1e-5)
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


# ---- §3 adstack options and overflow --------------------------------------------------------

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
    assert f"{_line_of('UNBOUNDED')}" in text, text
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


# ---- §4 init, GPU semantics ----------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["cpu", qd.cpu])
def test_init_arch_string_and_constant(spelling, session_cache_dir, rng):
    qd.init(arch=spelling, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=5)
    v = _f32(rng, 5)
    x.from_numpy(v)

    @qd.kernel
    def inc():
        for i in x:
            x[i] += 1

    inc()
    np.testing.assert_allclose(x.to_numpy(), v + 1, rtol=1e-6)


def test_gpu_takes_a_working_gpu(session_cache_dir, rng):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch=qd.gpu, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=64)
    v = _f32(rng, 64)
    x.from_numpy(v)

    @qd.kernel
    def sq():
        for i in x:
            x[i] = x[i] * x[i]

    sq()
    np.testing.assert_allclose(x.to_numpy(), v * v, rtol=1e-6)
    qd.init(arch="vulkan", cache_dir=session_cache_dir)


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


def test_vulkan_debug_bounds_error_raised_by_host_read(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", debug=True, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=8)
    off = qd.field(qd.i32, shape=())

    @qd.kernel
    def shifted():
        for i in range(8):
            x[i + off[None]] = 1.0

    off[None] = 3
    with pytest.raises(IndexError) as info:
        shifted()
        x.to_numpy()
    assert "shifted" in str(info.value)


# ---- §4 argument errors, read-only arrays ---------------------------------------------------

@qd.kernel
def _axpy(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        b[i] = b[i] + a[i] * s


@pytest.mark.parametrize("bad,kind", [
    (lambda: _axpy(np.zeros(4, np.float64), np.zeros(4, np.float32), 1.0), "dtype"),
    (lambda: _axpy(np.zeros((4, 2), np.float32), np.zeros(4, np.float32), 1.0), "rank"),
    (lambda: _axpy(np.zeros(8, np.float32)[::2], np.zeros(4, np.float32), 1.0), "contiguous"),
    (lambda: _axpy(np.zeros(4, np.float32), np.zeros(4, np.float32)), "missing"),
])
def test_argument_mistakes_name_kernel_and_parameter(bad, kind):
    with pytest.raises((TypeError, ValueError)) as info:
        bad()
    msg = str(info.value)
    assert "_axpy" in msg, msg
    assert {"dtype": "'a'", "rank": "'a'", "contiguous": "'a'", "missing": "'s'"}[kind] in msg or \
        {"dtype": " a", "rank": " a", "contiguous": " a", "missing": " s"}[kind] in msg, msg


def test_read_only_array_for_read_parameter_accepted_written_refused(rng):
    a = _f32(rng, 6)
    a.flags.writeable = False
    b = np.zeros(6, np.float32)
    _axpy(a, b, 2.0)
    np.testing.assert_allclose(b, 2 * a)
    before = b.copy()
    b.flags.writeable = False
    with pytest.raises(ValueError) as info:
        _axpy(_f32(rng, 6), b, 1.0)
    assert "_axpy" in str(info.value) and "b" in str(info.value)
    np.testing.assert_array_equal(b, before)


# ---- §4 fields from Python ------------------------------------------------------------------

def test_field_python_access(arch, rng):
    x = qd.field(qd.f64, shape=(3, 4), needs_grad=True)
    assert x.shape == (3, 4)
    assert x.dtype == qd.f64
    v = rng.standard_normal((3, 4))
    x.from_numpy(v)
    assert x[1, 2] == v[1, 2]
    x[2, 3] = 7.25
    v[2, 3] = 7.25
    got = x.to_numpy()
    assert got.dtype == np.float64 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, v)
    x.fill(-1.5)
    np.testing.assert_array_equal(x.to_numpy(), -1.5)
    assert x.grad.shape == (3, 4)
    np.testing.assert_array_equal(x.grad.to_numpy(), 0)
    s = qd.field(qd.i32, shape=())
    s[None] = 41
    assert s[None] == 41 and isinstance(s[None], int)


def test_qd_ndarray_with_grad(arch, rng):
    @qd.kernel
    def sumsq(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            out[0] += a[i] * a[i]

    a = qd.ndarray(qd.f32, shape=(10,), needs_grad=True)
    out = qd.ndarray(qd.f32, shape=(1,), needs_grad=True)
    v = _f32(rng, 10)
    a.from_numpy(v)
    sumsq(a, out)
    np.testing.assert_allclose(out.to_numpy()[0], float((v.astype(np.float64) ** 2).sum()), rtol=1e-5)
    out.grad.from_numpy(np.ones(1, np.float32))
    sumsq.grad(a, out)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * v, rtol=1e-6)


# ---- §5 options -----------------------------------------------------------------------------

def test_default_fp_option_makes_literals_f64(session_cache_dir):
    qd.init(arch=qd.cpu, default_fp=qd.f64, cache_dir=session_cache_dir)

    @qd.kernel
    def third() -> qd.f64:
        v = 1.0
        return v / 3.0

    assert third() == 1.0 / 3.0


def test_unknown_init_option_is_refused(session_cache_dir):
    with pytest.raises((TypeError, ValueError)):
        qd.init(arch=qd.cpu, ad_stack_sise=4, cache_dir=session_cache_dir)


# ---- §4 ahead of time -----------------------------------------------------------------------

AOT_MODULE = '''
import qdc as qd

u = qd.field(qd.f32, shape=10, needs_grad=True)
v = qd.field(qd.f32, shape=6, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def power_sum(f: qd.template(), p: qd.template(), w: qd.f32) -> qd.f32:
    for i in f:
        loss[None] += f[i] ** p * w
    return loss[None]


@qd.kernel
def bounds(a: qd.types.NDArray[qd.f32, 1]) -> tuple[qd.f32, qd.f32]:
    lo = a[0]
    hi = a[0]
    for i in range(a.shape[0]):
        qd.atomic_min(lo, a[i])
        qd.atomic_max(hi, a[i])
    return lo, hi


cube_u = qd.aot.instantiate(power_sum, f=u, p=3)
square_v = qd.aot.instantiate(power_sum, p=2, f=v)
'''

AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "breadth_aot", arch=arch)
uu = rng.uniform(-1, 1, 10).astype(np.float32)
vv = rng.uniform(-1, 1, 6).astype(np.float32)
m.u.from_numpy(uu); m.v.from_numpy(vv)
w = 0.75
got = m.cube_u(w)
assert np.isclose(got, (uu.astype(np.float64) ** 3 * w).sum(), rtol=1e-5, atol=1e-6), got
m.loss[None] = 0.0
got = m.square_v(w)
assert np.isclose(got, (vv.astype(np.float64) ** 2 * w).sum(), rtol=1e-5), got
m.loss.grad[None] = 1.0
m.square_v.grad(w)
assert np.allclose(m.v.grad.to_numpy(), 2 * vv * w, rtol=1e-5), m.v.grad.to_numpy()
a = rng.standard_normal(50).astype(np.float32)
lo, hi = m.bounds(a)
assert (lo, hi) == (float(a.min()), float(a.max())), (lo, hi)
assert isinstance(m.adstack_heap_bytes(), int)
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
'''


def test_aot_instantiate_build_and_load_without_compiler(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    (src / "breadth_aot.py").write_text(textwrap.dedent(AOT_MODULE))
    cache = str(tmp_path / "cache")
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    r = subprocess.run(["qdc", "build", str(src), "--cache", cache, "--arch", ",".join(archs)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN)
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, (arch, r.stdout + r.stderr)


def test_options_from_qdc_yaml_and_pyproject(tmp_path):
    mod = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def k():
    for i in x:
        y[None] += x[i] * 2
'''
    for kind in ("yaml", "pyproject"):
        proj = tmp_path / kind
        (proj / "kernels").mkdir(parents=True)
        (proj / "kernels" / "optmod.py").write_text(mod)
        if kind == "yaml":
            (proj / "qdc.yaml").write_text("cache_dir: from_file_cache\nopt_level: 1\n")
        else:
            (proj / "pyproject.toml").write_text('[tool.qdc]\ncache_dir = "from_file_cache"\nopt_level = 1\n')
        r = subprocess.run(["qdc", "build", "kernels", "--arch", "cpu"], cwd=proj, capture_output=True, text=True)
        assert r.returncode == 0, (kind, r.stdout + r.stderr)
        assert (proj / "from_file_cache").is_dir(), (kind, os.listdir(proj), r.stdout)
        # a flag wins over the file
        r = subprocess.run(["qdc", "build", "kernels", "--arch", "cpu", "--cache", "flag_cache"], cwd=proj,
                           capture_output=True, text=True)
        assert r.returncode == 0 and (proj / "flag_cache").is_dir(), (kind, r.stdout + r.stderr)


# ---- more of §2-§5 --------------------------------------------------------------------------

def test_template_bool_selects_a_static_branch(arch, rng):
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def transform(squared: qd.template()):
        for i in x:
            if qd.static(squared):
                x[i] = x[i] * x[i]
            else:
                x[i] = -x[i]

    v = _f32(rng, 8)
    x.from_numpy(v)
    transform(True)
    np.testing.assert_allclose(x.to_numpy(), v * v, rtol=1e-6)
    transform(False)
    np.testing.assert_allclose(x.to_numpy(), -(v * v), rtol=1e-6)


def test_template_rejects_qd_ndarray_and_unhashable_values():
    # (a list is taken element by element, as Quadrants takes lists of fields: not an error)
    @qd.kernel
    def k(f: qd.template()):
        pass

    for bad in (qd.ndarray(qd.f32, shape=(3,)), {"a": 1}):
        with pytest.raises(TypeError) as info:
            k(bad)
        assert "'k'" in str(info.value) or "k" in str(info.value).split(), str(info.value)
        assert "f" in str(info.value)


def test_grad_of_a_kernel_with_a_return_returns_none(rng):
    x = qd.field(qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def sq() -> qd.f32:
        for i in x:
            loss[None] += x[i] * x[i]
        return loss[None]

    v = _f32(rng, 5)
    x.from_numpy(v)
    total = sq()
    np.testing.assert_allclose(total, float((v.astype(np.float64) ** 2).sum()), rtol=1e-5)
    loss.grad[None] = 1.0
    assert sq.grad() is None
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * v, rtol=1e-6)


def test_wrong_tuple_length_is_a_located_error():
    @qd.kernel
    def bad() -> tuple[qd.f32, qd.f32]:
        return 1.0, 2.0, 3.0  # RET-TUPLE-LEN

    _assert_compile_error_at(bad, "RET-TUPLE-LEN")


def test_missing_parameter_annotation_is_a_located_error():
    @qd.kernel
    def bad(s):  # NO-ANNOTATION
        pass

    with pytest.raises(qd.QdcCompileError) as info:
        bad(1.0)
    assert f"{HERE}:{_line_of('NO-ANNOTATION')}:" in str(info.value).splitlines()[0], str(info.value)


def test_vector_ndarray_parameter_trailing_axes(arch, rng):
    @qd.kernel
    def lengths(p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(p.shape[0]):
            out[i] = p[i].norm()

    p = _f32(rng, 20, 3)
    out = np.zeros(20, np.float32)
    lengths(p, out)
    np.testing.assert_allclose(out, np.linalg.norm(p.astype(np.float64), axis=1), rtol=1e-5)
    with pytest.raises(ValueError) as info:
        lengths(_f32(rng, 20, 4), out)
    assert "lengths" in str(info.value) and "p" in str(info.value)


def test_vector_field_python_access(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=(4,))
    assert v.shape == (4,)
    data = _f32(rng, 4, 3)
    v.from_numpy(data)
    assert v.to_numpy().shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(v[2]), data[2])

    @qd.kernel
    def cross_z():
        for i in v:
            v[i] = v[i].cross(qd.Vector([0.0, 0.0, 1.0]))

    cross_z()
    np.testing.assert_allclose(v.to_numpy(), np.cross(data, [0, 0, 1]), rtol=1e-6, atol=1e-7)


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


def test_vulkan_launches_async_and_sync_and_return_wait(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=4096)

    @qd.kernel
    def step():
        for i in x:
            x[i] = x[i] * 0.5 + 1.0

    @qd.kernel
    def total() -> qd.f32:
        s = 0.0
        for i in x:
            s += x[i]
        return s

    v = _f32(rng, 4096)
    x.from_numpy(v)
    want = v.astype(np.float64)
    for _ in range(10):
        step()
        want = want * 0.5 + 1.0
    qd.sync()
    np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-5)
    step()
    want = want * 0.5 + 1.0
    np.testing.assert_allclose(total(), want.sum(), rtol=1e-4)  # the return waits for the launch


def test_cpu_debug_bounds_error_names_kernel(rng, session_cache_dir):
    qd.init(arch=qd.cpu, debug=True, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def past_end(off: qd.i32):
        for i in range(8):
            x[i + off] = 1.0

    with pytest.raises(IndexError) as info:
        past_end(2)
    assert "past_end" in str(info.value)
    past_end(0)
    np.testing.assert_array_equal(x.to_numpy(), 1.0)


@pytest.mark.parametrize("options", [dict(opt_level=0), dict(cpu_max_num_threads=1), dict(fast_math=True)])
def test_code_options_give_the_same_results(options, rng, session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, **options)
    x = qd.field(qd.f32, shape=1000, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in x:
            y[None] += qd.exp(x[i]) * 0.5

    v = _f32(rng, 1000)
    x.from_numpy(v)
    with qd.ad.Tape(loss=y):
        f()
    np.testing.assert_allclose(y[None], float(np.exp(v.astype(np.float64)).sum() * 0.5), rtol=1e-4)
    np.testing.assert_allclose(x.grad.to_numpy(), np.exp(v) * 0.5, rtol=1e-5)


def test_default_ip_i64(session_cache_dir):
    qd.init(arch=qd.cpu, default_ip=qd.i64, cache_dir=session_cache_dir)

    @qd.kernel
    def big() -> qd.i64:
        v = 1
        qd.loop_config(serialize=True)
        for _ in range(40):
            v = v * 2
        return v

    assert big() == 2 ** 40


def test_read_only_memmap_argument(tmp_path, rng):
    path = tmp_path / "a.bin"
    data = _f32(rng, 16)
    data.tofile(path)
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=(16,))
    b = np.zeros(16, np.float32)
    _axpy(ro, b, 3.0)
    np.testing.assert_allclose(b, 3 * data, rtol=1e-6)
    with pytest.raises(ValueError) as info:
        _axpy(b, ro, 1.0)
    assert "_axpy" in str(info.value) and "b" in str(info.value)


def test_template_kernel_keyword_arguments_and_dtypes(arch, rng):
    a32 = qd.field(qd.f32, shape=6)
    a64 = qd.field(qd.f64, shape=6)

    @qd.kernel
    def affine(f: qd.template(), s: qd.f32, c: qd.template()):
        for i in f:
            f[i] = f[i] * s + c

    v32, v64 = _f32(rng, 6), rng.standard_normal(6)
    a32.from_numpy(v32); a64.from_numpy(v64)
    affine(f=a32, s=2.0, c=1)
    affine(a64, c=0.25, s=-1.0)
    np.testing.assert_allclose(a32.to_numpy(), v32 * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(a64.to_numpy(), -v64 + 0.25, rtol=1e-7)


def test_template_kernel_gradient_through_tape(arch, rng):
    p = qd.field(qd.f32, shape=7, needs_grad=True)
    q = qd.field(qd.f32, shape=5, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def accumulate(f: qd.template(), w: qd.template()):
        for i in f:
            loss[None] += qd.exp(f[i]) * w

    pv, qv = _f32(rng, 7), _f32(rng, 5)
    p.from_numpy(pv); q.from_numpy(qv)
    with qd.ad.Tape(loss=loss):
        accumulate(p, 2.0)
        accumulate(q, -0.5)
    np.testing.assert_allclose(p.grad.to_numpy(), np.exp(pv) * 2.0, rtol=1e-5)
    np.testing.assert_allclose(q.grad.to_numpy(), np.exp(qv) * -0.5, rtol=1e-5)


def test_vector_in_tuple_return_and_vector_field_element(arch, rng):
    v = qd.Vector.field(2, qd.f32, shape=5)
    data = _f32(rng, 5, 2)
    v.from_numpy(data)

    @qd.kernel
    def summary(k: qd.i32) -> tuple[qd.math.vec2, qd.i32]:
        s = qd.Vector([0.0, 0.0])
        for i in v:
            s += v[i]
        return s + v[k] * 0, k * 2

    s, twice = summary(3)
    np.testing.assert_allclose(s, data.astype(np.float64).sum(axis=0), rtol=1e-5)
    assert twice == 6


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
    np.testing.assert_allclose(x.to_numpy(), ref, rtol=1e-5)


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


def test_ndarray_python_access(arch, rng):
    b = qd.ndarray(qd.f32, shape=(4, 3), needs_grad=True)
    assert tuple(b.shape) == (4, 3) and b.dtype == qd.f32
    v = _f32(rng, 4, 3)
    b.from_numpy(v)
    np.testing.assert_array_equal(b.to_numpy(), v)
    b[1, 2] = 5.0
    assert b[1, 2] == 5.0
    assert b.grad is not None and tuple(b.grad.shape) == (4, 3)
    np.testing.assert_array_equal(b.grad.to_numpy(), 0)


def test_from_numpy_wrong_shape_is_refused():
    x = qd.field(qd.f32, shape=(3, 4))
    with pytest.raises((ValueError, TypeError)):
        x.from_numpy(np.zeros((4, 3), np.float32))


def test_keyword_arguments_to_a_kernel(arch, rng):
    a, b = _f32(rng, 8), _f32(rng, 8)
    want = b + a * np.float32(0.5)
    _axpy(b=b, a=a, s=0.5)
    np.testing.assert_allclose(b, want, rtol=1e-6)


def test_init_arch_vulkan_string(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    for spelling in ("vulkan", qd.vulkan):
        qd.init(arch=spelling, cache_dir=session_cache_dir)
        x = qd.field(qd.i32, shape=33)

        @qd.kernel
        def ids():
            for i in x:
                x[i] = i * i

        ids()
        np.testing.assert_array_equal(x.to_numpy(), np.arange(33) ** 2)


AOT_AD_MODULE = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
n = qd.field(qd.i32, shape=4)
y = qd.field(qd.f32, shape=(), needs_grad=True)
p = qd.field(qd.f32, shape=3, needs_dual=True)
r = qd.field(qd.f32, shape=(), needs_dual=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[i]):
            v = qd.sin(v) + 0.1
        y[None] += v


@qd.kernel
def cubes():
    for i in p:
        r[None] += p[i] * p[i] * p[i]


@qd.kernel
def scaled(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s
'''

AOT_AD_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load, FwdMode
import qdc.runtime as rt

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "breadth_ad", arch=arch)

# forward mode without the compiler
pv = rng.uniform(-1, 1, 3).astype(np.float32)
sd = rng.uniform(-1, 1, 3).astype(np.float32)
m.p.from_numpy(pv)
with FwdMode(loss=m.r, param=m.p, seed=[float(s) for s in sd]):
    m.cubes()
assert np.isclose(m.r.dual[None], float((3 * pv.astype(np.float64) ** 2 * sd).sum()), rtol=1e-5, atol=1e-6)

# built with --ad-stack-size 8: an overflow names kernel and capacities, then a launch works
x0 = rng.uniform(-1, 1, 4).astype(np.float32)
m.x.from_numpy(x0)
m.n.from_numpy(np.array([2, 20, 3, 1], np.int32))
m.y.grad[None] = 1.0
err = None
try:
    m.chain.grad()
    m.x.grad.to_numpy()
except Exception as e:
    err = e
assert err is not None and type(err).__name__ == "AdStackOverflowError", repr(err)
assert "chain" in str(err) and "8" in str(err), str(err)
trips = [2, 5, 3, 1]
m.n.from_numpy(np.array(trips, np.int32))
m.x.grad.fill(0); m.y.grad[None] = 1.0
m.chain.grad()
want = []
for v, t in zip(x0.astype(np.float64), trips):
    g = 1.0
    for _ in range(t):
        g *= np.cos(v); v = np.sin(v) + 0.1
    want.append(g)
assert np.allclose(m.x.grad.to_numpy(), want, rtol=1e-4, atol=1e-6), (m.x.grad.to_numpy(), want)
assert m.adstack_heap_bytes() > 0

# argument errors name kernel and parameter
for bad in (lambda: m.scaled(np.zeros(3, np.float64), 1.0), lambda: m.scaled(np.zeros(3, np.float32))):
    try:
        bad()
    except (TypeError, ValueError) as e:
        assert "scaled" in str(e), str(e)
    else:
        raise AssertionError("no error")
ro = np.ones(3, np.float32); ro.flags.writeable = False
try:
    m.scaled(ro, 2.0)
except ValueError as e:
    assert "scaled" in str(e) and "a" in str(e)
else:
    raise AssertionError("read-only array written")
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
'''


def test_aot_forward_mode_overflow_and_argument_errors_without_compiler(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    (src / "breadth_ad.py").write_text(textwrap.dedent(AOT_AD_MODULE))
    cache = str(tmp_path / "cache")
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    r = subprocess.run(["qdc", "build", str(src), "--cache", cache, "--arch", ",".join(archs), "--ad-stack-size", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_AD_RUN)
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, (arch, r.stdout + r.stderr)


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
    np.testing.assert_allclose(y.to_numpy(), np.where(xv > 0, yv * 2, yv + xv), rtol=1e-6)
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
    assert f"{HERE}:{_line_of('ONE-ELEMENT')}:" in str(info.value).splitlines()[0], str(info.value)


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
    assert f"{HERE}:{_line_of('OLD-VALUE')}:" in str(info.value).splitlines()[0], str(info.value)


def test_f64_adstack_on_vulkan_is_a_located_error_and_fine_on_cpu(arch, rng):
    d = qd.field(qd.f64, shape=4, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def f64chain():
        for i in d:
            v = d[i]  # F64-ADSTACK
            for _ in range(n[None]):
                v = qd.sin(v)
            loss[None] += v

    v0 = rng.uniform(-1, 1, 4)
    d.from_numpy(v0)
    n[None] = 5
    if arch == "vulkan":
        with pytest.raises(qd.QdcCompileError) as info:
            f64chain.grad()
        assert f"{HERE}:{_line_of('F64-ADSTACK')}:" in str(info.value).splitlines()[0], str(info.value)
        assert "f64" in str(info.value)
        return
    with qd.ad.Tape(loss=loss):
        f64chain()
    g, v = np.ones(4), v0.copy()
    for _ in range(5):
        g *= np.cos(v)
        v = np.sin(v)
    np.testing.assert_allclose(d.grad.to_numpy(), g, rtol=1e-12)
