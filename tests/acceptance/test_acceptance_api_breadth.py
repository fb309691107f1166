"""Acceptance tests of the user reference's Writing kernels, written from the page alone as a
Quadrants user would: `qd.template()`/`qd.Template` parameters (fields, Python values, on
`@qd.func` too), kernel return values (scalars, vectors/matrices, tuples), `qd.abs/min/max`
(n-ary), plain Python functions inlined, `qd.types.NDArray[dtype, ndim]` and arguments that
fix an omitted dtype/ndim. References are numpy; errors are `file:line:col: error:` at the
marked line. Autodiff is in test_acceptance_api_autodiff.py, running kernels (§4/§5) in
test_acceptance_api_running.py."""
import os

import numpy as np
import pytest

import qdc as qd
from acceptance_util import compile_error_checker, f32, line_of
from tolerance_util import assert_close_f32

HERE = os.path.abspath(__file__)


_assert_compile_error_at = compile_error_checker(HERE)
_f32 = f32


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
    assert_close_f32(out[:, 3], np.maximum.reduce([a, b, c]) + np.minimum(c, d) + np.abs(d), rtol=1e-6)


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
    assert_close_f32(x.to_numpy(), (v * v - 1) * 2, rtol=1e-6)


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
    assert_close_f32(b, want, rtol=1e-6)


def test_ndarray_dtype_and_ndim_taken_from_argument(arch, rng):
    @qd.kernel
    def neg(a: qd.types.ndarray()):
        for i in range(a.shape[0]):
            a[i] = -a[i]

    v = rng.standard_normal(9)
    w = v.copy()
    neg(w)
    np.testing.assert_array_equal(w, -v)


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
    assert f"{HERE}:{line_of(HERE, 'NO-ANNOTATION')}:" in str(info.value).splitlines()[0], str(info.value)


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
    np.testing.assert_allclose(s, data.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-6)
    assert twice == 6


def test_omitted_ndarray_dtype_follows_each_argument(arch, rng):
    @qd.kernel
    def twice(a: qd.types.ndarray(ndim=1)):
        for i in range(a.shape[0]):
            a[i] = a[i] * 2

    for dt in (np.float32, np.float64, np.int32):
        v = (rng.standard_normal(7) * 10).astype(dt)
        w = v.copy()
        twice(w)
        assert w.dtype == dt
        np.testing.assert_array_equal(w, v * 2)


def test_template_float_is_a_weak_constant_exact_in_f64(arch, rng):
    f = qd.field(qd.f64, shape=9)

    @qd.kernel
    def mul(c: qd.template()):
        for i in f:
            f[i] = f[i] * c

    v = rng.standard_normal(9)
    f.from_numpy(v)
    mul(0.1)
    np.testing.assert_array_equal(f.to_numpy(), v * 0.1)  # 0.1 as a double, not rounded to f32


def test_template_tuple_of_fields_and_small_int_returns(arch):
    a = qd.field(qd.f32, shape=3)
    b = qd.field(qd.f32, shape=5)
    a.fill(1.0)
    b.fill(2.5)

    @qd.kernel
    def total(fs: qd.template()) -> qd.f32:
        s = 0.0
        for f in qd.static(fs):
            for i in f:
                s += f[i]
        return s

    @qd.kernel
    def small() -> tuple[qd.i8, qd.u8, qd.u16, qd.types.vector(3, qd.i32)]:
        return -5, 250, 60000, qd.Vector([1, -2, 3])

    assert total((a, b)) == 3 * 1.0 + 5 * 2.5
    assert total((b,)) == 5 * 2.5
    i8, u8, u16, vec = small()
    assert (i8, u8, u16) == (-5, 250, 60000)
    np.testing.assert_array_equal(vec, [1, -2, 3])


def test_kernel_return_inside_forward_mode(arch, rng):
    x = qd.field(qd.f32, shape=3, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def sq() -> qd.f32:
        for i in x:
            y[None] += x[i] * x[i]
        return y[None]

    v = _f32(rng, 3)
    x.from_numpy(v)
    with qd.ad.FwdMode(loss=y, param=x, seed=[1.0, 1.0, 1.0]):
        r = sq()
    np.testing.assert_allclose(r, float((v.astype(np.float64) ** 2).sum()), rtol=1e-5)
    np.testing.assert_allclose(y.dual[None], float(2 * v.astype(np.float64).sum()), rtol=1e-5, atol=1e-6)


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
