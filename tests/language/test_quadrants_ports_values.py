"""Vectors, Python-scope values and refusals as in Quadrants (docs/api.md, Writing kernels):
element-wise unary, logical and comparison operators on vectors and matrices, `qd.min(*v)`,
`qd.zero(x)`, the long type names, `copy.deepcopy` of ndarrays and fields, a kernel returning
a 1024-element vector, `qd.Matrix` values in Python scope (also elements read from fields and
ndarrays), and the constructs Quadrants refuses, each a located compile error. Checked
against numpy on random inputs on every arch of the suite; PTX of a vector kernel through ptxas.
"""
import copy

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit

from module_util import compile_error_of


def test_elementwise_unary_logical_and_comparisons(arch, rng):
    n = 16
    a = qd.Vector.ndarray(3, qd.f32, shape=n)
    b = qd.Vector.ndarray(3, qd.i32, shape=n)
    m = qd.Matrix.ndarray(2, 2, qd.f32, shape=n)
    out_f = qd.Vector.ndarray(3, qd.f32, shape=n)
    out_i = qd.Vector.ndarray(3, qd.i32, shape=n)
    out_m = qd.Matrix.ndarray(2, 2, qd.f32, shape=n)
    av = (rng.random((n, 3)) * 8 - 4).astype(np.float32)
    bv = rng.integers(-50, 50, (n, 3)).astype(np.int32)
    mv = (rng.random((n, 2, 2)) * 8 - 4).astype(np.float32)
    a.from_numpy(av), b.from_numpy(bv), m.from_numpy(mv)

    @qd.kernel
    def k(a: qd.types.ndarray(), b: qd.types.ndarray(), m: qd.types.ndarray(), out_f: qd.types.ndarray(),
          out_i: qd.types.ndarray(), out_m: qd.types.ndarray()):
        for i in a:
            v, w = a[i], b[i]
            out_f[i] = -v + qd.sqrt(abs(v)) + qd.select(v > 0, 1.0, 0.0)
            out_i[i] = ~w + (w < 0) * 100 + (w == 0) * 1000 + (v >= 1.0) * 10000 + ((w > 3) & (w < 20)) * 7
            out_m[i] = abs(-m[i]) + qd.floor(m[i]) * (m[i] != 0)

    k(a, b, m, out_f, out_i, out_m)
    np.testing.assert_allclose(out_f.to_numpy(), -av + np.sqrt(np.abs(av)) + (av > 0), rtol=1e-6, atol=1e-6)
    want_i = ~bv + (bv < 0) * 100 + (bv == 0) * 1000 + (av >= 1.0) * 10000 + ((bv > 3) & (bv < 20)) * 7
    np.testing.assert_array_equal(out_i.to_numpy(), want_i)
    np.testing.assert_allclose(out_m.to_numpy(), np.abs(mv) + np.floor(mv) * (mv != 0), rtol=1e-6)


def test_starred_min_max_and_zero(arch, rng):
    vals = rng.integers(-1000, 1000, 4).astype(np.int32)
    x = qd.ndarray(qd.f32, shape=3)

    @qd.kernel
    def k(a: qd.i32, b: qd.i32, c: qd.i32, d: qd.i32, x: qd.types.ndarray()) -> qd.types.vector(4, qd.i32):
        v = qd.Vector([a, b, c, d])
        m = qd.Matrix([[a, b], [c, d]])
        f = qd.cast(a, qd.f32) * 0.5
        x[0] = qd.zero(f) + 1.5
        x[1] = qd.zero(m).sum() + qd.zero(v).max() - 2
        x[2] = qd.zero(qd.Vector([f, f])).norm_sqr()
        row_max = qd.max(*m)  # the rows of a matrix, element-wise
        return qd.Vector([qd.max(*v), qd.min(*v), qd.max(*row_max), qd.min(a, *v, 7)])

    got = k(*vals.tolist(), x)
    assert got.tolist() == [vals.max(), vals.min(), vals.max(), min(vals.min(), 7)]
    assert x.to_numpy().tolist() == [1.5, -2.0, 0.0]


def test_long_type_names():
    assert (qd.int8, qd.int16, qd.int32, qd.int64) == (qd.i8, qd.i16, qd.i32, qd.i64)
    assert (qd.uint8, qd.uint16, qd.uint32, qd.uint64) == (qd.u8, qd.u16, qd.u32, qd.u64)
    assert (qd.float16, qd.float32, qd.float64) == (qd.f16, qd.f32, qd.f64)


def test_deepcopy_of_ndarrays_and_fields(arch, rng):
    a = qd.Vector.ndarray(3, qd.f32, shape=7, needs_grad=True)
    data, grad = rng.random((7, 3)).astype(np.float32), rng.random((7, 3)).astype(np.float32)
    a.from_numpy(data), a.grad.from_numpy(grad)
    f = qd.field(qd.i64, shape=(3, 5))
    fdata = rng.integers(-2**40, 2**40, (3, 5))
    f.from_numpy(fdata)

    @qd.kernel
    def double(x: qd.types.ndarray()):
        for i in x:
            x[i] *= 2

    b, g = copy.deepcopy(a), copy.deepcopy(f)
    double(a)  # after the copy: only the original changes
    a.grad.fill(0)
    f.fill(1)
    assert isinstance(b, qd.Ndarray) and b.shape == (7,) and (b.n, b.m) == (3, 1)
    np.testing.assert_array_equal(b.to_numpy(), data)
    np.testing.assert_array_equal(b.grad.to_numpy(), grad)
    np.testing.assert_array_equal(a.to_numpy(), data * 2)
    np.testing.assert_array_equal(g.to_numpy(), fdata)
    double(b)
    np.testing.assert_array_equal(b.to_numpy(), data * 2)


def test_a_kernel_returns_a_1024_element_vector(arch, rng):
    base, at = int(rng.integers(-1000, 1000)), int(rng.integers(0, 1024))

    @qd.kernel
    def k(base: qd.i32, at: qd.i32) -> qd.types.vector(1024, qd.i32):
        v = qd.types.vector(1024, qd.i32)(base)
        v[at] = -1
        return v

    want = np.full(1024, base, np.int32)
    want[at] = -1
    np.testing.assert_array_equal(k(base, at), want)


def test_returns_past_the_limit_are_a_compile_error(tmp_path):
    e, _ = compile_error_of(tmp_path, "bad_returns", '''
        import qdc as qd

        @qd.kernel
        def bad() -> qd.types.matrix(300, 300, qd.f32):
            return qd.types.matrix(300, 300, qd.f32)(0)
    ''')
    assert "returns at most 65536 scalars" in str(e) and "90000" in str(e) and e.line == 5, str(e)


def test_python_scope_values_are_qd_matrix(rng):
    av, bv = rng.random(3) * 4 - 2, rng.random(3) * 4 - 2
    mv = rng.random((3, 3)) * 4 - 2
    a, b, m = qd.Vector(av.tolist()), qd.Vector(bv.tolist()), qd.Matrix(mv.tolist())
    s = np.float64(rng.random() + 0.5)
    results = {"a + b": (a + b, av + bv), "a * s": (a * s, av * s), "s - a (numpy scalar left)": (s - a, s - av),
               "2 ** a": (2 ** a, 2 ** av), "m @ a": (m @ a, mv @ av), "a @ m": (a @ m, av @ mv),
               "m @ m": (m @ m, mv @ mv), "-m": (-m, -mv), "abs(m)": (abs(m), np.abs(mv)),
               "a < b": (a < b, av < bv), "m == m.T": (m == m.T, mv == mv.T), "qd.sqrt(abs(a))":
               (qd.sqrt(abs(a)), np.sqrt(np.abs(av))), "qd.max(a, b)": (qd.max(a, b), np.maximum(av, bv)),
               "qd.min(a, 0.5, b)": (qd.min(a, 0.5, b), np.minimum(np.minimum(av, 0.5), bv)),
               "m.inverse()": (m.inverse(), np.linalg.inv(mv)), "a.cross(b)": (a.cross(b), np.cross(av, bv)),
               "a.normalized()": (a.normalized(), av / np.linalg.norm(av)), "vec3(1, 2, 3)":
               (qd.math.vec3(1, 2, 3), [1, 2, 3]), "m[1]": (m[1], mv[1])}
    for what, (got, want) in results.items():
        assert isinstance(got, qd.Matrix), what
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-12, atol=1e-12, err_msg=what)
    assert isinstance(a, qd.Vector) and (a.n, a.m, m.n, m.m) == (3, 1, 3, 3)
    assert a.norm() == pytest.approx(np.linalg.norm(av)) and a.dot(b) == pytest.approx(av @ bv)
    assert max(a) == av.max() and min(b) == bv.min() and m.sum() == pytest.approx(mv.sum())
    assert list(a) == av.tolist() and a.x == av[0] and m[2, 1] == mv[2, 1]
    assert np.asarray(m).tolist() == mv.tolist()


def test_elements_read_from_python_are_qd_matrix_and_write_back(arch, rng):
    x = qd.Vector.field(3, qd.f32, shape=4)
    p = qd.Matrix.ndarray(2, 3, qd.i32, shape=(2, 2))
    xv = rng.random((4, 3)).astype(np.float32)
    pv = rng.integers(-100, 100, (2, 2, 2, 3)).astype(np.int32)
    x.from_numpy(xv), p.from_numpy(pv)
    assert (x.n, x.m, p.n, p.m) == (3, 1, 2, 3)

    e = x[2]
    assert isinstance(e, qd.Matrix) and e.n == 3
    np.testing.assert_allclose((e * 2 + x[1]).to_numpy(), xv[2] * 2 + xv[1], rtol=1e-6)
    assert e.norm() == pytest.approx(np.linalg.norm(xv[2].astype(np.float64)), rel=1e-6)
    e[0], e.z = 5, -1  # writes go through to the field
    x[3][1] = 9
    q = p[1, 0]
    np.testing.assert_array_equal((q @ q.T).to_numpy(), pv[1, 0] @ pv[1, 0].T)
    q[1, 2] = 42
    p[0, 1][0][1] = -42  # through a row of the element
    xv[2, 0], xv[2, 2], xv[3, 1] = 5, -1, 9
    pv[1, 0, 1, 2], pv[0, 1, 0, 1] = 42, -42
    np.testing.assert_array_equal(x.to_numpy(), xv)
    np.testing.assert_array_equal(p.to_numpy(), pv)


def test_python_scope_constants_in_kernels(arch, rng):
    scale = qd.Vector(rng.integers(1, 9, 3).tolist())
    out = qd.Vector.ndarray(3, qd.i32, shape=4)

    @qd.kernel
    def k(out: qd.types.ndarray()):
        for i in out:
            out[i] = scale * i

    k(out)
    np.testing.assert_array_equal(out.to_numpy(), np.outer(np.arange(4), scale.to_numpy()))


@pytest.mark.parametrize("source, message", [
    ("x[i] = 1 if x[i] is x[0] else 0", "'is' in a kernel compares only with None"),
    ("x[i] = 1 if i is not 2 else 0", "'is not' in a kernel compares only with None"),
    ("x[i] = i in (1, 2)", "'in' needs compile-time operands"),
    ("x[i] = 1 not in (i, 2)", "'not in' needs compile-time operands"),
    ("x[i] = x in x", "'in' needs compile-time operands"),  # fields hold run-time values
    ("x[i] = not qd.Vector([i, 1])", "'not' is not defined on a vector/matrix"),
    ("x[i] = first(qd.Matrix([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))",
     "parameter 'm' is a matrix(2, 2, f32), the argument has shape 2x3"),
    ("x[i] = first(1.0)", "parameter 'm' is a matrix(2, 2, f32), the argument has a scalar"),
])
def test_refused_as_in_quadrants(source, message, tmp_path):
    e, path = compile_error_of(tmp_path, "bad_ports", f'''
        import qdc as qd
        x = qd.field(qd.i32, shape=4)

        @qd.func
        def first(m: qd.types.matrix(2, 2, qd.f32)) -> qd.f32:
            return m[0, 0]

        @qd.kernel
        def bad():
            for i in x:
                {source}
    ''')
    assert message in str(e), str(e)
    assert e.filename == str(path) and e.line == 12, str(e)


def test_matrix_func_parameter_converts_its_argument():
    @qd.func
    def half(v: qd.types.vector(2, qd.f32)):
        return v / 2

    @qd.kernel
    def k(a: qd.i32) -> qd.types.vector(2, qd.f32):
        return half(qd.Vector([a, a + 1]))

    assert k(3).tolist() == [1.5, 2.0]


def test_ptx_of_a_vector_kernel_assembles():
    @qd.kernel
    def vector_ops(a: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), out: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):
        for i in a:
            v = a[i]
            out[i] = qd.select(v > 0, -v, qd.sqrt(abs(v))) + qd.max(*v) + qd.zero(v)

    k = vector_ops._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda", variant="forward")
    ptx = compiled.artifacts["ptx"].decode()
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    gpu = toolkit.assembling_gpu("sm_90")
    if gpu is None:
        pytest.skip("the installed ptxas assembles none of the GPUs that run sm_90 PTX")
    toolkit.assemble(ptx, gpu)
