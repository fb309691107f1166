"""No silent wrong results, tested as a user would against the user reference
(parameters and names, gradients, ahead of time, cpu_target, build/verify): every case either gives
the right answer or fails loudly. References are independent: numpy for values, float64 central
differences (written here) for gradients, and the exact error contracts (`file:line:col: error:`
plus the source line; ValueError/TypeError naming kernel and parameter; CacheError naming the
file; CLI exit codes 0/1/2 and no traceback).

One file, longer than the project's usual ~800 lines, on purpose: its sections follow one
checklist of promises, and its error tests locate their expected lines by markers in this very
file."""
import math
import math as m_alias
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.contract import artifact as A
from qdc.runtime.loader import load

HERE = os.path.abspath(__file__)
SRC_LINES = open(HERE, encoding="utf-8").read().splitlines()
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(SRC_LINES) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def _assert_located(msg: str, marker: str, *words, path: str = HERE, lines=None):
    """`file:line:col: error: ...` at the marked line, with that source line shown, no traceback."""
    first = msg.splitlines()[0]
    m = re.match(r"(.+?):(\d+):(\d+): error: ", first)
    assert m, msg
    assert os.path.realpath(m.group(1)) == os.path.realpath(path), msg
    lines = lines if lines is not None else SRC_LINES
    want = _line_of(marker) if lines is SRC_LINES else [i + 1 for i, t in enumerate(lines) if t.rstrip().endswith("# " + marker)][0]
    assert int(m.group(2)) == want, msg
    assert int(m.group(3)) >= 1
    src = lines[want - 1].split("  # ")[0].strip()
    assert src in msg, msg
    assert "Traceback" not in msg
    for w in words:
        assert w in msg, (w, msg)


def _compile_error(fn, marker, *words):
    with pytest.raises(qd.QdcCompileError) as ei:
        fn()
    _assert_located(str(ei.value), marker, *words)


def qdc_cli(*args, cwd=None, env=None):
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=120)


# ---------------------------------------------------------------- captured objects in the key

xs = qd.field(qd.f32, shape=())
ys = qd.field(qd.f32, shape=())


def _unary_kernel(op):
    @qd.kernel
    def apply():
        ys[None] = op(xs[None])
    return apply


def test_item1_getattr_in_a_loop_each_kernel_computes_its_own_function(rng):
    v = float(rng.uniform(0.1, 0.9))
    xs[None] = v
    for module in (qd, math, m_alias):
        names = ["sin", "cos", "tan", "exp", "sqrt"]
        rng.shuffle(names)
        for name in names:
            op = getattr(module, name)
            _unary_kernel(op)()
            want = float(getattr(np, name)(np.float32(v)))
            assert ys[None] == pytest.approx(want, rel=2e-6), (module.__name__, name)


def test_item1_numpy_ufuncs_are_either_their_function_or_a_compile_error(rng):
    v = float(rng.uniform(0.1, 0.9))
    xs[None] = v
    for name in ("sin", "cos", "exp"):
        try:
            _unary_kernel(getattr(np, name))()
        except qd.QdcCompileError:
            continue
        assert ys[None] == pytest.approx(float(getattr(np, name)(np.float32(v))), rel=2e-6), name


_GLOBAL_OP = qd.sin


def _kernel_through_global():
    @qd.kernel
    def apply_global():
        ys[None] = _GLOBAL_OP(xs[None])
    return apply_global


def test_item1_captured_through_globals(rng):
    global _GLOBAL_OP
    v = float(rng.uniform(0.1, 0.9))
    xs[None] = v
    try:
        for name in ("sin", "cos", "exp", "sin"):
            _GLOBAL_OP = getattr(qd, name)
            _kernel_through_global()()
            assert ys[None] == pytest.approx(float(getattr(np, name)(np.float32(v))), rel=2e-6), name
    finally:
        _GLOBAL_OP = qd.sin


@qd.func
def _f_twice(v):
    return v * 2.0


@qd.func
def _f_square(v):
    return v * v


def _py_twice(v):
    return v * 2.0


def _py_cube(v):
    return v * v * v


def _scaled_by(c):
    def helper(v):
        return v * c
    return helper


def _run_unary_cases(cases, rng):
    order = rng.permutation(len(cases))
    for k in order:
        fn, want = cases[k]
        _unary_kernel(fn)()
        assert ys[None] == pytest.approx(float(want), rel=2e-6), k


def test_item1_qd_funcs_chosen_at_runtime(rng):
    v = float(rng.uniform(0.5, 1.5))
    xs[None] = v
    f32 = np.float32(v)
    _run_unary_cases([(_f_twice, f32 * 2), (_f_square, f32 * f32), (qd.sqrt, np.sqrt(f32))], rng)


def test_item1_plain_python_functions_and_their_own_captures(rng):
    """docs/api.md: a plain Python function called in a kernel is inlined like a @qd.func when its
    source is available; the key holds its source and its own captures."""
    v = float(rng.uniform(0.5, 1.5))
    xs[None] = v
    f32 = np.float32(v)
    cases = [(_py_twice, f32 * 2), (_py_cube, f32 * f32 * f32)]
    for c in rng.uniform(1.0, 5.0, 3):
        cases.append((_scaled_by(float(c)), f32 * np.float32(c)))
    _run_unary_cases(cases, rng)


_CROSS_PROCESS = '''
import sys
import numpy as np
import qdc as qd
import math
sys.path.insert(0, {here!r})
import helper8 as H
from helper8 import g
qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
x = qd.field(qd.f32, shape=())
y = qd.field(qd.f32, shape=3)


def make(op):
    @qd.kernel
    def k():
        y[0] = op(x[None])
        y[1] = H.f(x[None])
        y[2] = g(x[None])
    return k


x[None] = 0.7
make(getattr(math, sys.argv[2]))()
print(repr(y.to_numpy().tolist()))
'''


def test_item1_across_processes_sharing_a_cache_and_an_edited_helper_module(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "prog.py").write_text(_CROSS_PROCESS.format(here=str(tmp_path)), encoding="utf-8")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    results = []
    for name, scale in (("sin", 2.0), ("cos", 3.0)):
        (tmp_path / "helper8.py").write_text(f"import qdc as qd\nSCALE = {scale}\n\n@qd.func\ndef f(v):\n"
                                             f"    return v * SCALE\n\n@qd.func\ndef g(v):\n    return v + SCALE\n", encoding="utf-8")
        r = subprocess.run([sys.executable, str(tmp_path / "prog.py"), str(cache), name], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        got = eval(r.stdout.strip().splitlines()[-1])
        x = np.float32(0.7)
        want = [float(getattr(np, name)(x)), float(x * np.float32(scale)), float(x + np.float32(scale))]
        np.testing.assert_allclose(got, want, rtol=2e-6, err_msg=f"{name} {scale}")
        results.append(got)


# ---------------------------------------------------------------- ndarray needs_grad follows the argument

Lg = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def _ss_plain(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        Lg[None] += a[i] * a[i]


@qd.kernel
def _ss_none(a: qd.types.ndarray(dtype=qd.f32, ndim=1, needs_grad=None)):
    for i in range(a.shape[0]):
        Lg[None] += a[i] * a[i]


@qd.kernel
def _ss_omitted(a: qd.types.ndarray()):
    for i in range(a.shape[0]):
        Lg[None] += a[i] * a[i]


@qd.kernel
def _sin_into(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        b[i] = qd.sin(a[i]) * 3.0


def _check_sum_of_squares_grad(kernel, rng):
    n = int(rng.integers(5, 40))
    v = rng.uniform(-2, 2, n).astype(np.float32)
    a = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    a.from_numpy(v)
    a.grad.fill(0)
    Lg[None] = 0
    with qd.ad.Tape(loss=Lg):
        kernel(a)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * v, rtol=1e-5, atol=1e-6)
    assert Lg[None] == pytest.approx(float(np.sum(v.astype(np.float64) ** 2)), rel=1e-5)


@pytest.mark.parametrize("kernel", [_ss_plain, _ss_none, _ss_omitted], ids=["plain", "None", "omitted"])
def test_item2_unannotated_needs_grad_follows_a_grad_ndarray_under_tape(kernel, rng):
    _check_sum_of_squares_grad(kernel, rng)


def test_item2_the_NDArray_spelling_follows_the_argument_too(rng):
    @qd.kernel
    def ss_generic(a: qd.types.NDArray[qd.f32, 1]):
        for i in range(a.shape[0]):
            Lg[None] += a[i] * a[i]

    _check_sum_of_squares_grad(ss_generic, rng)


def test_item2_grad_flows_through_an_ndarray_to_ndarray_kernel(rng):
    n = int(rng.integers(5, 40))
    v = rng.uniform(-2, 2, n).astype(np.float32)
    a = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    b = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    a.from_numpy(v)
    a.grad.fill(0)
    b.grad.fill(0)
    Lg[None] = 0
    with qd.ad.Tape(loss=Lg):
        _sin_into(a, b)
        _ss_plain(b)
    want = 2 * (3 * np.sin(v.astype(np.float64))) * 3 * np.cos(v.astype(np.float64))
    np.testing.assert_allclose(a.grad.to_numpy(), want, rtol=1e-4, atol=1e-5)


def test_item2_direct_grad_call_fills_the_ndarray_gradient(rng):
    n = 16
    v = rng.uniform(-2, 2, n).astype(np.float32)
    a = qd.ndarray(qd.f32, shape=(n,), needs_grad=True)
    a.from_numpy(v)
    a.grad.fill(0)
    Lg[None] = 0
    _ss_plain(a)
    Lg.grad[None] = 1.0
    _ss_plain.grad(a)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * v, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- read-only arrays

@qd.kernel
def _ro_copy(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        dst[i] = src[i] * 2.0


@qd.kernel
def _ro_atomic_only(src: qd.types.ndarray(dtype=qd.f32, ndim=1), acc: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        acc[0] += src[i]


@qd.kernel
def _ro_nested_write(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        for j in range(2):
            if src[i] > 100.0:
                dst[i] = 0.0


def _read_only_variants(tmp_path, v):
    """name -> a fresh read-only float32 array holding v (contiguous)."""
    out = {}
    a = v.copy()
    a.flags.writeable = False
    out["flag"] = a
    big = np.concatenate([v, v, v]).copy()
    big.flags.writeable = False
    out["slice"] = big[len(v):2 * len(v)]
    base = v.copy()
    view = base.view()
    view.flags.writeable = False
    out["view"] = view
    out["frombuffer"] = np.frombuffer(v.tobytes(), dtype=np.float32)
    path = tmp_path / "ro.bin"
    v.tofile(path)
    out["memmap"] = np.memmap(path, dtype=np.float32, mode="r", shape=v.shape)
    return out


def _check_read_only(copy_kernel, atomic_kernel, nested_kernel, name_of, tmp_path, rng):
    n = int(rng.integers(4, 50))
    v = rng.uniform(-1, 1, n).astype(np.float32)
    for what, ro in _read_only_variants(tmp_path, v).items():
        assert not ro.flags.writeable
        dst = np.zeros(n, np.float32)
        copy_kernel(ro, dst)  # read-only source: accepted
        np.testing.assert_allclose(dst, v * 2, rtol=1e-6, err_msg=what)
        acc = np.zeros(1, np.float32)
        atomic_kernel(ro, acc)
        assert acc[0] == pytest.approx(float(v.astype(np.float64).sum()), abs=1e-4)
        for kernel, args, param in ((copy_kernel, (dst, ro), "dst"), (atomic_kernel, (v.copy(), ro), "acc"),
                                    (nested_kernel, (v.copy(), ro), "dst")):
            before = np.array(ro, copy=True)
            with pytest.raises(ValueError) as ei:
                kernel(*args)
            msg = str(ei.value)
            assert name_of(kernel) in msg and repr(param)[1:-1] in msg, (what, msg)
            np.testing.assert_array_equal(np.asarray(ro), before, err_msg=what)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "ro.bin", dtype=np.float32), v)


def test_item3_read_only_arrays_direct_mode(tmp_path, rng):
    _check_read_only(_ro_copy, _ro_atomic_only, _ro_nested_write,
                     lambda k: {_ro_copy: "_ro_copy", _ro_atomic_only: "_ro_atomic_only",
                                _ro_nested_write: "_ro_nested_write"}[k], tmp_path, rng)


# ---------------------------------------------------------------- exact gradients vs float64 central differences

N5 = 7
xa = qd.field(qd.f64, shape=N5, needs_grad=True)
oa = qd.field(qd.f64, shape=N5, needs_grad=True)
ca = qd.field(qd.f64, shape=N5, needs_grad=True)
wa = qd.field(qd.f64, shape=N5)
sa = qd.field(qd.f64, shape=(), needs_grad=True)
La = qd.field(qd.f64, shape=(), needs_grad=True)
K5, M5 = 3, 6
xk = qd.field(qd.f64, shape=(K5, M5), needs_grad=True)
ck = qd.field(qd.f64, shape=K5, needs_grad=True)
wk = qd.field(qd.f64, shape=(K5, M5))


@qd.kernel
def _loss_oa():
    for i in oa:
        La[None] += wa[i] * oa[i]


@qd.kernel
def _loss_xa_sq():
    for i in xa:
        La[None] += wa[i] * xa[i] * xa[i]


@qd.kernel
def _loss_xk():
    for k, i in xk:
        La[None] += wk[k, i] * xk[k, i]


@qd.kernel
def _both_branches():
    for i in xa:
        if xa[i] > 0.0:
            oa[i] = xa[i] * xa[i] * ca[i]
        else:
            oa[i] = qd.sin(xa[i]) + ca[i]


def _ref_both_branches(x, o, c):
    return np.where(x > 0, x * x * c, np.sin(x) + c)


@qd.kernel
def _one_branch():
    for i in xa:
        if xa[i] > 0.0:
            oa[i] = qd.exp(xa[i]) * ca[i]


def _ref_one_branch(x, o, c):
    return np.where(x > 0, np.exp(x) * c, o)


@qd.kernel
def _write_then_overwrite():
    for i in xa:
        oa[i] = xa[i] * 3.0 + ca[i]
        if xa[i] > 0.0:
            oa[i] = xa[i] * xa[i]


def _ref_write_then_overwrite(x, o, c):
    return np.where(x > 0, x * x, x * 3 + c)


@qd.kernel
def _inplace_field():
    for i in oa:
        oa[i] = oa[i] * wa[i] + sa[None]


def _ref_inplace_field(x, o, c, s, w):
    return o * w + s


@qd.kernel
def _inplace_arg(a: qd.f64):
    for i in oa:
        oa[i] = oa[i] * a + sa[None]


@qd.kernel
def _serial_inner():
    for k in range(K5):
        for i in range(M5 - 1):
            xk[k, i + 1] = qd.sin(xk[k, i]) * ck[k] + 0.5


def _ref_serial_inner(x, c):
    x = x.copy()
    for k in range(K5):
        for i in range(M5 - 1):
            x[k, i + 1] = np.sin(x[k, i]) * c[k] + 0.5
    return x


@qd.kernel
def _serialized_top_level():
    qd.loop_config(serialize=True)
    for i in range(1, N5):
        oa[i] = qd.sin(oa[i - 1]) * 0.5 + xa[i]


def _ref_serialized_top_level(x, o, c):
    o = o.copy()
    for i in range(1, N5):
        o[i] = np.sin(o[i - 1]) * 0.5 + x[i]
    return o


def _central(loss, values, h=1e-6):
    grads = []
    for k, v in enumerate(values):
        g = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            up = [u.copy() for u in values]
            dn = [u.copy() for u in values]
            up[k][idx] += h
            dn[k][idx] -= h
            g[idx] = (loss(*up) - loss(*dn)) / (2 * h)
        grads.append(g)
    return grads


def _inputs(rng, n=N5):
    x = rng.uniform(0.2, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return x, rng.uniform(-1, 1, n), rng.uniform(0.5, 1.5, n)


def _tape(run, fields, values):
    for f, v in zip(fields, values):
        f.from_numpy(v)
        f.grad.fill(0)
    La[None] = 0
    La.grad[None] = 0
    with qd.ad.Tape(loss=La):
        run()
    return La[None], [f.grad.to_numpy() for f in fields]


@pytest.mark.parametrize("kernel, ref", [(_both_branches, _ref_both_branches), (_one_branch, _ref_one_branch),
                                         (_write_then_overwrite, _ref_write_then_overwrite),
                                         (_serialized_top_level, _ref_serialized_top_level)],
                         ids=["both_branches", "one_branch", "write_then_overwrite", "serialized_loop"])
def test_item5_branch_and_serial_writes_are_exact_for_every_input(kernel, ref, rng):
    x, o, c = _inputs(rng)
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(x, o, c):
        return float(np.sum(w * ref(x, o, c)))

    got_loss, got = _tape(lambda: (kernel(), _loss_oa()), [xa, oa, ca], [x, o, c])
    assert got_loss == pytest.approx(loss(x, o, c), rel=1e-12, abs=1e-12)
    for name, g, want in zip(("x", "out (initial values)", "c"), got, _central(loss, [x, o, c])):
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_item5_in_place_update_exact_including_the_overwritten_initial_values(rng):
    x, o, c = _inputs(rng)
    w = rng.uniform(0.5, 1.5, N5)  # the multiplier (no gradient)
    s = float(rng.uniform(-1, 1))
    wts = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(o, s):
        return float(np.sum(wts * (o * w + s[()])))

    # reading oa with another weight: loss = sum(wts * out); _loss_oa uses wa, so compute it by hand
    oa.from_numpy(o)
    sa[None] = s
    oa.grad.fill(0)
    sa.grad[None] = 0
    _inplace_field()
    np.testing.assert_allclose(oa.to_numpy(), o * w + s, rtol=1e-14)
    oa.grad.from_numpy(wts)  # seed the adjoint of the output
    _inplace_field.grad()
    go, gs = _central(loss, [o, np.array(s)])
    np.testing.assert_allclose(oa.grad.to_numpy(), go, rtol=1e-6, atol=1e-7,
                               err_msg="the store must consume the adjoint of the value it overwrote")
    assert sa.grad[None] == pytest.approx(float(gs), rel=1e-6, abs=1e-7)


def test_item5_in_place_update_with_a_scalar_argument_under_tape(rng):
    _, o, _ = _inputs(rng)
    a = float(rng.uniform(0.5, 2.0))
    s = float(rng.uniform(-1, 1))
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(o, s):
        return float(np.sum(w * (o * a + s[()])))

    oa.from_numpy(o)
    oa.grad.fill(0)
    sa[None] = s
    sa.grad[None] = 0
    La[None] = 0
    with qd.ad.Tape(loss=La):
        _inplace_arg(a)
        _loss_oa()
    go, gs = _central(loss, [o, np.array(s)])
    np.testing.assert_allclose(oa.grad.to_numpy(), go, rtol=1e-6, atol=1e-7)
    assert sa.grad[None] == pytest.approx(float(gs), rel=1e-6, abs=1e-7)


def test_item5_serial_inner_loop_dependency_is_exact(rng):
    x = rng.uniform(-1, 1, (K5, M5))
    c = rng.uniform(0.5, 1.5, K5)
    w = rng.uniform(-1, 1, (K5, M5))
    wk.from_numpy(w)

    def loss(x, c):
        return float(np.sum(w * _ref_serial_inner(x, c)))

    for f, v in ((xk, x), (ck, c)):
        f.from_numpy(v)
        f.grad.fill(0)
    La[None] = 0
    with qd.ad.Tape(loss=La):
        _serial_inner()
        _loss_xk()
    assert La[None] == pytest.approx(loss(x, c), rel=1e-12)
    gx, gc = _central(loss, [x, c])
    np.testing.assert_allclose(xk.grad.to_numpy(), gx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ck.grad.to_numpy(), gc, rtol=1e-6, atol=1e-7)
    assert np.all(xk.grad.to_numpy()[:, 1:] == 0)  # overwritten before any read: no gradient


@qd.kernel
def _double_in_place():
    for i in xa:
        xa[i] = xa[i] * 2.0


def test_item5_x_equals_x_times_two_then_later_kernels_read_it(rng):
    x, _, _ = _inputs(rng)
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(x):
        return float(np.sum(w * (4 * x) ** 2))

    xa.from_numpy(x)
    xa.grad.fill(0)
    La[None] = 0
    with qd.ad.Tape(loss=La):
        _double_in_place()
        _double_in_place()
        _loss_xa_sq()
    (gx,) = _central(loss, [x])
    np.testing.assert_allclose(xa.grad.to_numpy(), gx, rtol=1e-6, atol=1e-7)


@qd.kernel
def _square_in_place():
    for i in xa:
        xa[i] = xa[i] * xa[i]


@qd.kernel
def _inplace_needs_grad_multiplier():
    for i in oa:
        oa[i] = oa[i] * ca[i] + sa[None]


def test_item5_nonlinear_use_of_an_overwritten_value_is_rejected_or_exact(rng):
    x, o, c = _inputs(rng)
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)
    try:
        _, (gx,) = _tape(lambda: (_square_in_place(), _loss_xa_sq()), [xa], [x])
    except qd.QdcCompileError as e:
        assert re.match(r".+:\d+:\d+: error: ", str(e)) and "Traceback" not in str(e)
    else:
        (want,) = _central(lambda x: float(np.sum(w * (x * x) ** 2)), [x])
        np.testing.assert_allclose(gx, want, rtol=1e-6, atol=1e-7)
    s = float(rng.uniform(-1, 1))
    try:
        sa[None] = s
        _, (go, gc) = _tape(lambda: (_inplace_needs_grad_multiplier(), _loss_oa()), [oa, ca], [o, c])
    except qd.QdcCompileError as e:
        assert re.match(r".+:\d+:\d+: error: ", str(e)) and "Traceback" not in str(e)
    else:
        want_o, want_c = _central(lambda o, c: float(np.sum(w * (o * c + s))), [o, c])
        np.testing.assert_allclose(go, want_o, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gc, want_c, rtol=1e-6, atol=1e-7)


nk = qd.field(qd.i32, shape=())


@qd.kernel
def _serial_inner_accumulate():
    for k in range(K5):
        for i in range(M5 - 1):
            xk[k, i + 1] = xk[k, i + 1] + qd.sin(xk[k, i]) * ck[k]


def _ref_serial_inner_accumulate(x, c):
    x = x.copy()
    for k in range(K5):
        for i in range(M5 - 1):
            x[k, i + 1] = x[k, i + 1] + np.sin(x[k, i]) * c[k]
    return x


@qd.kernel
def _dynamic_loop_conditional_inplace():
    for i in xa:
        for _ in range(nk[None]):
            if xa[i] > 0.0:
                oa[i] = oa[i] * 0.5 + xa[i] * ca[i]


def _ref_dynamic_loop_conditional_inplace(x, o, c, n):
    o = o.copy()
    for _ in range(n):
        o = np.where(x > 0, o * 0.5 + x * c, o)
    return o


@qd.kernel
def _top_level_scalar_inplace():
    sa[None] = sa[None] * 3.0 + 1.0
    for i in oa:
        oa[i] = oa[i] + sa[None] * xa[i]


def test_item5_serial_inner_loop_in_place_accumulate_is_exact(rng):
    x = rng.uniform(-1, 1, (K5, M5))
    c = rng.uniform(0.5, 1.5, K5)
    w = rng.uniform(-1, 1, (K5, M5))
    wk.from_numpy(w)

    def loss(x, c):
        return float(np.sum(w * _ref_serial_inner_accumulate(x, c)))

    for f, v in ((xk, x), (ck, c)):
        f.from_numpy(v)
        f.grad.fill(0)
    La[None] = 0
    with qd.ad.Tape(loss=La):
        _serial_inner_accumulate()
        _loss_xk()
    gx, gc = _central(loss, [x, c])
    np.testing.assert_allclose(xk.grad.to_numpy(), gx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ck.grad.to_numpy(), gc, rtol=1e-6, atol=1e-7)


def test_item5_conditional_in_place_store_in_a_dynamic_loop_is_exact(rng):
    x, o, c = _inputs(rng)
    n = int(rng.integers(2, 6))
    nk[None] = n
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(x, o, c):
        return float(np.sum(w * _ref_dynamic_loop_conditional_inplace(x, o, c, n)))

    got_loss, got = _tape(lambda: (_dynamic_loop_conditional_inplace(), _loss_oa()), [xa, oa, ca], [x, o, c])
    assert got_loss == pytest.approx(loss(x, o, c), rel=1e-12, abs=1e-12)
    for name, g, want in zip(("x", "out (initial values)", "c"), got, _central(loss, [x, o, c])):
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_item5_top_level_scalar_in_place_is_exact(rng):
    x, o, _ = _inputs(rng)
    s = float(rng.uniform(-1, 1))
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)

    def loss(x, o, s):
        s2 = s[()] * 3 + 1
        return float(np.sum(w * (o + s2 * x)))

    sa[None] = s
    sa.grad[None] = 0
    got_loss, (gx, go) = _tape(lambda: (_top_level_scalar_inplace(), _loss_oa()), [xa, oa], [x, o])
    want_x, want_o, want_s = _central(loss, [x, o, np.array(s)])
    assert got_loss == pytest.approx(loss(x, o, np.array(s)), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(gx, want_x, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(go, want_o, rtol=1e-6, atol=1e-7)
    assert sa.grad[None] == pytest.approx(float(want_s), rel=1e-6, abs=1e-7)


@qd.kernel
def _nd_inplace(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = a[i] * 3.0 + b[i] * b[i]


@qd.kernel
def _nd_loss(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        La[None] += wa[i] * a[i]


def test_item5_in_place_on_grad_ndarrays_is_exact(rng):
    _, o, c = _inputs(rng)
    w = rng.uniform(-1, 1, N5)
    wa.from_numpy(w)
    a = qd.ndarray(qd.f64, shape=(N5,), needs_grad=True)
    b = qd.ndarray(qd.f64, shape=(N5,), needs_grad=True)
    a.from_numpy(o)
    b.from_numpy(c)
    a.grad.fill(0)
    b.grad.fill(0)
    La[None] = 0
    with qd.ad.Tape(loss=La):
        _nd_inplace(a, b)
        _nd_loss(a)
    ga, gb = _central(lambda o, c: float(np.sum(w * (o * 3 + c * c))), [o, c])
    np.testing.assert_allclose(a.grad.to_numpy(), ga, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.grad.to_numpy(), gb, rtol=1e-6, atol=1e-7)


@qd.kernel
def _parallel_raw():
    for i in range(1, N5):
        oa[i] = oa[i - 1] + xa[i]  # E:parallel_raw


def test_item5_parallel_read_after_write_is_still_rejected(rng):
    x, o, _ = _inputs(rng)

    def run():
        _tape(lambda: (_parallel_raw(), _loss_oa()), [xa, oa], [x, o])

    _compile_error(run, "E:parallel_raw")


# ---------------------------------------------------------------- literals, loop_config, strings

def test_item6_integer_literals_that_do_not_fit_are_compile_errors():
    a8 = qd.field(qd.u8, shape=2)
    a16 = qd.field(qd.i16, shape=2)
    a32 = qd.field(qd.i32, shape=2)
    u32 = qd.field(qd.u32, shape=2)
    a64 = qd.field(qd.i64, shape=2)

    @qd.kernel
    def k_u8():
        a8[0] = 256  # E:lit_u8

    @qd.kernel
    def k_u8_neg():
        a8[0] = -1  # E:lit_u8_neg

    @qd.kernel
    def k_i16():
        a16[0] = 40000  # E:lit_i16

    @qd.kernel
    def k_i32():
        a32[0] = 3000000000  # E:lit_i32

    @qd.kernel
    def k_u32_neg():
        u32[1] = -5  # E:lit_u32_neg

    @qd.kernel
    def k_u32_big():
        u32[0] = 4294967296  # E:lit_u32_big

    @qd.kernel
    def k_pow():
        a64[0] = 2**70  # E:lit_pow

    @qd.kernel
    def k_shift():
        a64[1] = 1 << 100  # E:lit_shift

    for k, marker, lit, ty in ((k_u8, "E:lit_u8", "256", "u8"), (k_u8_neg, "E:lit_u8_neg", "-1", "u8"),
                               (k_i16, "E:lit_i16", "40000", "i16"), (k_i32, "E:lit_i32", "3000000000", "i32"),
                               (k_u32_neg, "E:lit_u32_neg", "-5", "u32"),
                               (k_u32_big, "E:lit_u32_big", "4294967296", "u32"),
                               (k_pow, "E:lit_pow", str(2**70), "i64"), (k_shift, "E:lit_shift", str(1 << 100), "i64")):
        _compile_error(k, marker, lit, ty)


def test_item6_out_of_range_literal_through_a_local_is_an_error():
    a32 = qd.field(qd.i32, shape=2)

    @qd.kernel
    def via_local():
        v = 3000000000  # E:lit_local
        a32[0] = v

    try:
        _compile_error(via_local, "E:lit_local", "3000000000", "i32")
    finally:
        assert a32[0] != -1294967296, "silent wrap-around"


def test_item6_out_of_range_captured_constant_is_an_error():
    a32 = qd.field(qd.i32, shape=2)

    @qd.kernel
    def via_global():
        a32[1] = _BIG_GLOBAL  # E:lit_global

    _compile_error(via_global, "E:lit_global", "3000000000", "i32")


_BIG_GLOBAL = 3000000000


def test_item6_literals_that_fit_are_stored_exactly():
    a8 = qd.field(qd.u8, shape=2)
    a16 = qd.field(qd.i16, shape=2)
    u32 = qd.field(qd.u32, shape=2)
    a64 = qd.field(qd.i64, shape=3)
    u64 = qd.field(qd.u64, shape=1)

    @qd.kernel
    def fits():
        a8[0] = 255
        a8[1] = 0
        a16[0] = -32768
        a16[1] = 32767
        u32[0] = 4294967295
        u32[1] = 3000000000
        a64[0] = -(2**63)
        a64[1] = 2**62 + 12345
        a64[2] = a64[1] + 2**40
        u64[0] = 18446744073709551615

    fits()
    assert a8.to_numpy().tolist() == [255, 0]
    assert a16.to_numpy().tolist() == [-32768, 32767]
    assert u32.to_numpy().tolist() == [4294967295, 3000000000]
    assert a64.to_numpy().tolist() == [-(2**63), 2**62 + 12345, 2**62 + 12345 + 2**40]
    assert u64.to_numpy().tolist() == [18446744073709551615]


def test_item6_big_float_literal_into_f32_is_inf_or_an_error():
    f = qd.field(qd.f32, shape=1)

    @qd.kernel
    def big():
        f[0] = 1e39

    try:
        big()
    except qd.QdcCompileError as e:
        assert re.match(r".+:\d+:\d+: error: ", str(e))
    else:
        assert np.isinf(f[0]) and f[0] > 0


def test_item6_loop_config_unknown_keys_are_errors_and_serialize_serialises():
    a = qd.field(qd.i32, shape=4096)

    @qd.kernel
    def misspelled():
        qd.loop_config(serialise=True)  # E:serialise
        for i in range(1, 4096):
            a[i] = a[i - 1] + 1

    _compile_error(misspelled, "E:serialise", "serialise")

    @qd.kernel
    def other_unknown():
        qd.loop_config(block_dim=64, threads=2)  # E:threads
        for i in range(4096):
            a[i] = i

    _compile_error(other_unknown, "E:threads", "threads")

    @qd.kernel
    def prefix():
        qd.loop_config(serialize=True, block_dim=32)
        for i in range(1, 4096):
            a[i] = a[i - 1] + 1

    a.fill(0)
    prefix()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(4096))


def test_item6_string_literals_are_errors_but_docstrings_and_lists_work():
    f = qd.field(qd.i32, shape=4)

    @qd.kernel
    def with_string():
        s = "hello"  # E:string
        f[0] = 1

    _compile_error(with_string, "E:string")

    @qd.kernel
    def with_docstring():
        """Fill f with 7 (a docstring, as kernels usually carry)."""
        for i in f:
            f[i] = 7

    with_docstring()
    assert f.to_numpy().tolist() == [7] * 4

    @qd.kernel
    def with_list():
        for j in qd.static([1, 2, 3]):
            f[j] = j * 10
        f[0] = qd.static([5, 6])[1]

    with_list()
    assert f.to_numpy().tolist() == [6, 10, 20, 30]


# ---------------------------------------------------------------- locations and messages

def test_item11_signature_errors_point_at_the_parameter():
    def missing():
        @qd.kernel
        def k(a: qd.f32,
              b):  # E:missing_ann
            pass
        k(1.0, 2.0)

    _compile_error(missing, "E:missing_ann", "'b'")

    def star():
        @qd.kernel
        def k(a: qd.f32,
              *rest):  # E:star_args
            pass
        k(1.0)

    _compile_error(star, "E:star_args")


def test_item11_numpy_integer_shapes_are_accepted():
    f = qd.field(qd.i32, shape=np.int64(3))
    g = qd.field(qd.f32, shape=(np.int32(2), np.int64(5)))
    assert tuple(f.shape) == (3,) and tuple(g.shape) == (2, 5)

    @qd.kernel
    def fill():
        for i in f:
            f[i] = i + 1
        for i, j in g:
            g[i, j] = i * 10 + j

    fill()
    assert f.to_numpy().tolist() == [1, 2, 3]
    np.testing.assert_array_equal(g.to_numpy(), np.add.outer(np.arange(2) * 10, np.arange(5)))


def test_item11_float_static_ndrange_and_shape_out_of_range_are_located_errors():
    f = qd.field(qd.i32, shape=4)

    @qd.kernel
    def float_range():
        for i in qd.static(qd.ndrange(0.1, 0.2)):  # E:float_ndrange
            f[0] = 1

    _compile_error(float_range, "E:float_ndrange")

    @qd.kernel
    def bad_shape(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[2]):  # E:bad_shape
            a[i] = 0.0

    with pytest.raises(qd.QdcCompileError) as ei:
        bad_shape(np.zeros(3, np.float32))
    msg = str(ei.value)
    _assert_located(msg, "E:bad_shape", "'a'")
    assert "1" in msg.splitlines()[0] and "tuple index out of range" not in msg


wx = qd.field(qd.f32, shape=4, needs_grad=True)
wy = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def _unsized_adstack():
    for i in wx:
        v = wx[i]
        for _ in range(qd.cast(wx[i] * 3.0, qd.i32)):  # W:unsized
            v = qd.sin(v)
        wy[None] += v


def test_item11_warnings_point_at_the_users_kernel():
    wx.from_numpy(np.full(4, 1.0, np.float32))
    _unsized_adstack()
    wy.grad[None] = 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _unsized_adstack.grad()
    ours = [w for w in caught if "default_ad_stack_size" in str(w.message) or "adstack" in str(w.message)]
    assert ours, [str(w.message) for w in caught]
    for w in ours:
        assert os.path.realpath(w.filename) == os.path.realpath(HERE), (w.filename, w.lineno)
        assert w.lineno == _line_of("W:unsized")
    np.testing.assert_allclose(wx.grad.to_numpy(), np.cos(np.sin(np.sin(1.0))) * np.cos(np.sin(1.0)) * np.cos(1.0),
                               rtol=1e-5)


# ---------------------------------------------------------------- a few corpus variants through direct mode

def test_corpus_variants_direct_mode():
    f = qd.field(qd.f32, shape=8)

    @qd.kernel
    def k_lambda():
        g = lambda v: v + 1  # E:c_lambda
        f[0] = g(1.0)

    @qd.kernel
    def k_float_index():
        f[1.5] = 0.0  # E:c_float_index

    @qd.kernel
    def k_too_many():
        f[1, 2] = 0.0  # E:c_too_many

    @qd.kernel
    def k_undefined():
        f[0] = not_defined_anywhere  # E:c_undefined

    @qd.kernel
    def k_walrus():
        if (v := f[0]) > 0:  # E:c_walrus
            f[1] = v

    @qd.kernel
    def k_fstring():
        t = f"{f[0]}"  # E:c_fstring

    @qd.kernel
    def k_slice():
        f[0] = f[1:3]  # E:c_slice

    @qd.func
    def two(a, b):
        return a + b

    @qd.kernel
    def k_arity():
        f[0] = two(1.0)  # E:c_arity

    for k, marker in ((k_lambda, "E:c_lambda"), (k_float_index, "E:c_float_index"), (k_too_many, "E:c_too_many"),
                      (k_undefined, "E:c_undefined"), (k_walrus, "E:c_walrus"), (k_fstring, "E:c_fstring"),
                      (k_slice, "E:c_slice"), (k_arity, "E:c_arity")):
        _compile_error(k, marker)


# ---------------------------------------------------------------- the user's cache stays untouched

def test_item13_explicit_cache_dir_leaves_home_cache_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = textwrap.dedent(f'''
        import qdc as qd
        qd.init(arch=qd.cpu, cache_dir={str(tmp_path / "private")!r})
        f = qd.field(qd.i32, shape=3)

        @qd.kernel
        def k():
            for i in f:
                f[i] = i * 3

        k()
        print(f.to_numpy().tolist())
    ''')
    (tmp_path / "s.py").write_text(script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "QDC_CACHE_DIR"}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("[0, 3, 6]")
    assert not (home / ".cache" / "qdc").exists()
    assert os.listdir(tmp_path / "private")


# ---------------------------------------------------------------- ahead of time: one build shared by several sections

AOT_MODULE = '''
import qdc as qd

N = 7
out = qd.field(qd.f64, shape=N, needs_grad=True)
s = qd.field(qd.f64, shape=(), needs_grad=True)
L = qd.field(qd.f64, shape=(), needs_grad=True)
w = qd.field(qd.f64, shape=N)


@qd.kernel
def copy2(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        dst[i] = src[i] * 2.0


@qd.kernel
def add_into(src: qd.types.ndarray(dtype=qd.f32, ndim=1), acc: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        acc[0] += src[i]


@qd.kernel
def nested_write(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        for j in range(2):
            if src[i] > 100.0:
                dst[i] = 0.0


@qd.kernel
def inplace(a: qd.f64):
    for i in out:
        out[i] = out[i] * a + s[None]


@qd.kernel
def loss():
    for i in out:
        L[None] += w[i] * out[i]
'''

TINY_MODULE = '''
import qdc as qd


@qd.kernel
def copy2(src: qd.types.ndarray(dtype=qd.f32, ndim=1), dst: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(src.shape[0]):
        dst[i] = src[i] * 2.0
'''

OVERFLOW_MODULE = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)
n = qd.field(qd.i32, shape=())


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.9 + 0.1
        y[None] += v
'''


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    root = tmp_path_factory.mktemp("aot8")
    src = root / "src"
    src.mkdir()
    (src / "acc8.py").write_text(AOT_MODULE, encoding="utf-8")
    (src / "tiny8.py").write_text(TINY_MODULE, encoding="utf-8")
    (src / "ovf8.py").write_text(OVERFLOW_MODULE, encoding="utf-8")
    cache = root / "cache"
    stale = cache / "tmp" / "staging-left-by-a-killed-build"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x", encoding="utf-8")
    old = time.time() - 3 * 24 * 3600
    os.utime(stale / "junk", (old, old))
    os.utime(stale, (old, old))
    first = qdc_cli("build", str(src), "--cache", str(cache), "-j", "2", "--ad-stack-size", "3")
    verbose = qdc_cli("build", str(src / "acc8.py"), "--cache", str(cache), "-v", "-j", "1", "--ad-stack-size", "3")
    return dict(root=root, src=src, cache=str(cache), first=first, verbose=verbose, stale=stale)


def test_item12_build_names_each_kernel_counts_gradients_and_sweeps_stale_staging(aot):
    first, verbose = aot["first"], aot["verbose"]
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Traceback" not in first.stdout + first.stderr
    kernels = ["copy2", "add_into", "nested_write", "inplace", "loss"]
    for name in kernels:
        lines = [ln for ln in (first.stdout + first.stderr).splitlines() if re.search(rf"\b{name}\b", ln)]
        assert lines, (name, first.stdout, first.stderr)
    summary = first.stdout
    assert re.search(r"\b7 kernels\b", summary), summary
    assert re.search(r"\b3 modules\b", summary), summary
    assert re.search(r"\b3 gradients\b", summary), summary
    assert not re.search(r"\b1 kernels\b|\b1 gradients\b|\b0 kernel\b(?!s)", summary)
    # cache hits are named with -v
    assert verbose.returncode == 0
    for name in kernels:
        assert re.search(rf"\b{name}\b", verbose.stdout + verbose.stderr), (name, verbose.stdout)
    assert not aot["stale"].exists()


def test_item3_read_only_arrays_in_a_loaded_module(aot, tmp_path, rng):
    mod = load(aot["cache"], "acc8", arch="cpu")
    names = {mod.copy2: "copy2", mod.add_into: "add_into", mod.nested_write: "nested_write"}
    _check_read_only(mod.copy2, mod.add_into, mod.nested_write, lambda k: names[k], tmp_path, rng)


def test_item5_in_place_gradient_in_a_loaded_module(aot, rng):
    mod = load(aot["cache"], "acc8", arch="cpu")
    n = 7
    o = rng.uniform(-1, 1, n)
    a = float(rng.uniform(0.5, 2.0))
    s = float(rng.uniform(-1, 1))
    w = rng.uniform(-1, 1, n)
    mod.w.from_numpy(w)
    mod.out.from_numpy(o)
    mod.out.grad.fill(0)
    mod.s[None] = s
    mod.s.grad[None] = 0
    mod.L[None] = 0
    mod.inplace(a)
    mod.loss()
    mod.L.grad[None] = 1.0
    mod.loss.grad()
    mod.inplace.grad(a)

    def loss(o, s):
        return float(np.sum(w * (o * a + s[()])))

    go, gs = _central(loss, [o, np.array(s)])
    np.testing.assert_allclose(mod.out.grad.to_numpy(), go, rtol=1e-6, atol=1e-7)
    assert mod.s.grad[None] == pytest.approx(float(gs), rel=1e-6, abs=1e-7)


def _copy_cache(aot, tmp_path) -> str:
    dst = str(tmp_path / "cache")
    shutil.copytree(aot["cache"], dst)
    return dst


def _module_record(cache):
    path = os.path.join(cache, "modules", "cpu", "acc8.msgpack")
    with open(path, "rb") as f:
        return path, A.decode_record(f.read(), A.MODULE_RECORD)


def _write_record(path, body):
    with open(path, "wb") as f:
        f.write(A.encode_record(A.MODULE_RECORD, body))


@pytest.mark.parametrize("tamper", ["swap_forward_grad", "swap_kernels", "field_shape"])
def test_item10_module_records_are_cross_checked_against_entries(aot, tmp_path, tamper):
    cache = _copy_cache(aot, tmp_path)
    path, body = _module_record(cache)
    ks = body["kernels"]
    if tamper == "swap_forward_grad":
        ks["inplace"], ks["inplace.grad"] = ks["inplace.grad"], ks["inplace"]
    elif tamper == "swap_kernels":
        ks["copy2"], ks["nested_write"] = ks["nested_write"], ks["copy2"]
    else:
        for fld in body["fields"]:
            if fld[0] == "out":
                fld[2] = [9]
    _write_record(path, body)
    r = qdc_cli("verify", "--cache", cache)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "acc8" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
    with pytest.raises(qd.CacheError) as ei:
        mod = load(cache, "acc8", arch="cpu")
        mod.inplace(1.0)
        mod.copy2(np.zeros(3, np.float32), np.zeros(3, np.float32))
    assert "acc8" in str(ei.value)


def test_item10_an_entry_file_replaced_by_a_directory(aot, tmp_path):
    cache = _copy_cache(aot, tmp_path)
    _, body = _module_record(cache)
    key = body["kernels"]["copy2"]
    entry = os.path.join(cache, "entries", key[:2], key)
    victim = os.path.join(entry, sorted(n for n in os.listdir(entry) if n.startswith("kernel.so"))[0])
    os.unlink(victim)
    os.mkdir(victim)
    r = qdc_cli("verify", "--cache", cache)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out and "IsADirectoryError" not in out, out
    assert key in out or os.path.basename(victim) in out, out
    with pytest.raises(qd.CacheError) as ei:
        mod = load(cache, "acc8", arch="cpu")
        mod.copy2(np.zeros(3, np.float32), np.zeros(3, np.float32))
    assert key in str(ei.value) or "kernel.so" in str(ei.value)


def test_item10_bundles_with_duplicate_members_or_inflated_artifacts_are_refused(aot, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    r = qdc_cli("pack", "--cache", aot["cache"], "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    mod = load(str(bundle), "acc8", arch="cpu")
    dst = np.zeros(4, np.float32)
    mod.copy2(np.arange(4, dtype=np.float32), dst)
    assert dst.tolist() == [0, 2, 4, 6]
    with tarfile.open(bundle) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    so = next((m, d) for m, d in members if "/kernel.so" in m.name)

    def repack(path, items):
        with tarfile.open(path, "w:gz") as tar:
            for m, data in items:
                info = tarfile.TarInfo(m.name)
                info.size = len(data)
                info.mode = m.mode
                tar.addfile(info, __import__("io").BytesIO(data))

    dup = tmp_path / "dup.tar.gz"
    repack(dup, members + [(so[0], b"\0" * len(so[1]))])
    with pytest.raises(qd.CacheError) as ei:
        load(str(dup), "acc8", arch="cpu")
    assert "twice" in str(ei.value) or "duplicate" in str(ei.value).lower()
    bomb = tmp_path / "bomb.tar.gz"
    repack(bomb, [(m, d) if m.name != so[0].name else (m, d + b"\0" * (64 << 20)) for m, d in members])
    assert os.path.getsize(bomb) < (1 << 20)
    with pytest.raises(qd.CacheError) as ei:
        load(str(bomb), "acc8", arch="cpu")
    assert "bomb.tar.gz" in str(ei.value)


def test_item7_loads_during_force_rebuilds_always_see_an_entry(aot, tmp_path):
    cache = _copy_cache(aot, tmp_path)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([sys.executable, "-m", "qdc.cli.main", "build", str(aot["src"] / "tiny8.py"), "--cache",
                             cache, "--force", "-j", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    errors, loads = [], 0
    src = np.arange(5, dtype=np.float32)
    while True:
        done = proc.poll() is not None
        try:
            mod = load(cache, "tiny8", arch="cpu")
            dst = np.zeros(5, np.float32)
            mod.copy2(src, dst)
            assert dst.tolist() == (src * 2).tolist()
            loads += 1
        except Exception as e:  # any failure is a finding
            errors.append(f"{type(e).__name__}: {e}")
        if done:
            break
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert loads >= 2
    assert not errors, errors[:3]


def test_item8_cache_naming_a_file_is_a_usage_error(aot, tmp_path):
    f = tmp_path / "not_a_folder"
    f.write_text("hello", encoding="utf-8")
    r = qdc_cli("build", str(aot["src"] / "acc8.py"), "--cache", str(f))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and str(f) in out, out


def test_item8_direct_mode_cache_dir_naming_a_file_is_refused_at_init(tmp_path, session_cache_dir):
    f = tmp_path / "cache_file"
    f.write_text("hello", encoding="utf-8")
    try:
        with pytest.raises((qd.QdcError, ValueError, OSError)) as ei:
            qd.init(arch=qd.cpu, cache_dir=str(f))
        assert str(f) in str(ei.value)
    finally:
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


@pytest.mark.skipif(IS_ROOT, reason="root writes through read-only permissions")
def test_item8_read_only_cache_folder(aot, tmp_path):
    cache = tmp_path / "ro"
    cache.mkdir()
    os.chmod(cache, 0o555)
    try:
        r = qdc_cli("build", str(aot["src"] / "acc8.py"), "--cache", str(cache))
        out = r.stdout + r.stderr
        assert r.returncode == 2, out
        assert "Traceback" not in out and "cannot follow" not in out and str(cache) in out
    finally:
        os.chmod(cache, 0o755)


def test_item12_overflow_from_a_loaded_module_advises_the_build_flag(aot):
    mod = load(aot["cache"], "ovf8", arch="cpu")
    mod.x.from_numpy(np.full(4, 0.3, np.float32))
    mod.n[None] = 20
    mod.chain()
    mod.y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError) as ei:
        mod.chain.grad()
    msg = str(ei.value)
    assert "--ad-stack-size" in msg and "chain" in msg, msg
    assert "qd.init(ad_stack_size" not in msg, msg
    mod.n[None] = 2  # the next launch works normally
    mod.chain.grad()


# ---------------------------------------------------------------- cpu_target

def test_item4_portable_build_picks_a_level_the_host_has_and_refuses_clearly(aot, monkeypatch, rng):
    from qdc.runtime.contract import cpu_features
    from qdc.runtime.devices.cpu import device as cpu_device
    if cpu_features.host_machine() != "x86_64":
        pytest.skip("x86-64 levels")
    v2_only = frozenset(f for f in cpu_device.host_features()
                        if f in ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf"))
    n = int(rng.integers(5, 50))
    src = rng.uniform(-1, 1, n).astype(np.float32)
    for feats in (v2_only, v2_only | {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"}):
        monkeypatch.setattr(cpu_device, "host_features", lambda feats=feats: feats)
        mod = load(aot["cache"], "acc8", arch="cpu")
        dst = np.zeros(n, np.float32)
        mod.copy2(src, dst)
        np.testing.assert_allclose(dst, src * 2, rtol=1e-6)
    monkeypatch.setattr(cpu_device, "host_features", lambda: frozenset())
    with pytest.raises(qd.CacheError) as ei:
        mod = load(aot["cache"], "acc8", arch="cpu")
        mod.copy2(src, np.zeros(n, np.float32))
    assert "sse4.2" in str(ei.value) or "lacks" in str(ei.value)


def test_item4_artifact_built_for_v4_is_a_cache_error_on_a_host_without_avx512(tmp_path, monkeypatch):
    from qdc.runtime.contract import cpu_features
    from qdc.runtime.devices.cpu import device as cpu_device
    if cpu_features.host_machine() != "x86_64":
        pytest.skip("x86-64 levels")
    (tmp_path / "v4mod.py").write_text(
        "import qdc as qd\n\n\n@qd.kernel\ndef axpy(a: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), "
        "y: qd.types.ndarray(dtype=qd.f32, ndim=1)):\n    for i in range(x.shape[0]):\n        y[i] = a * x[i] + y[i]\n", encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = qdc_cli("build", str(tmp_path / "v4mod.py"), "--cache", cache, "--cpu-target", "x86-64-v4", "-j", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    no512 = frozenset(f for f in cpu_device.host_features() if not f.startswith("avx512"))
    monkeypatch.setattr(cpu_device, "host_features", lambda: no512)
    with pytest.raises(qd.CacheError) as ei:
        mod = load(cache, "v4mod", arch="cpu")
        mod.axpy(1.0, np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert "avx512" in str(ei.value), str(ei.value)


BAD_BUILD_MODULE = '''import qdc as qd

out = qd.field(qd.f32, shape=4)
cnt = qd.field(qd.i32, shape=4)


@qd.kernel
def fine():
    for i in out:
        out[i] = 1.0


@qd.kernel
def bad_literal():
    out[0] = 1
    for i in cnt:
        cnt[i] = 2**70  # E:build_literal


@qd.kernel
def bad_config():
    qd.loop_config(serialise=True)  # E:build_config
    for i in out:
        out[i] = 2.0
'''


def test_corpus_through_qdc_build_reports_each_error_at_its_line(tmp_path):
    path = tmp_path / "bad8.py"
    path.write_text(BAD_BUILD_MODULE, encoding="utf-8")
    lines = BAD_BUILD_MODULE.splitlines()
    r = qdc_cli("build", str(path), "--cache", str(tmp_path / "cache"), "-j", "1")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out
    for marker in ("E:build_literal", "E:build_config"):
        want = [i + 1 for i, t in enumerate(lines) if t.rstrip().endswith("# " + marker)][0]
        assert re.search(rf"{re.escape(str(path))}:{want}:\d+: error: ", out), (marker, out)
        assert lines[want - 1].split("  # ")[0].strip() in out, (marker, out)
    assert re.search(r"\bfine\b", out)
