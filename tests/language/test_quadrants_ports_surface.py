"""More of the surface ported Quadrants kernels rely on (docs/api.md, Writing kernels):
func parameter annotations, template parameters naming a caller's local, asserts without
debug, 0-d loops, swizzles, vector operands written as tuples, rounding to a type, `bool`
annotations, `*args` spreading. Checked against Python's own semantics and numpy, on every
selected arch."""
import itertools

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.commands.inspect import inspect_ir
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.target import TARGET as CPU

from compile_error_util import compile_error

I32_1D = qd.types.ndarray(dtype=qd.i32, ndim=1)
F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


# ---- func parameter annotations convert; a template parameter names the caller's local -------

def test_annotated_func_parameters_convert_their_arguments(arch, rng):
    n = 32

    @qd.func
    def through_int(a: qd.i32) -> qd.f32:
        return a

    @qd.func
    def halve(a: float, b: int):
        return a / 2 + b          # a is f32 even for an integer argument; b truncates

    @qd.func
    def truthy(a: bool):
        return a * 10

    @qd.kernel
    def k(x: F32_1D, m: I32_1D, out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(n):
            out[i, 0] = through_int(x[i])
            out[i, 1] = halve(m[i], x[i])
            out[i, 2] = through_int(2.75)                 # a compile-time argument converts too
            out[i, 3] = truthy(m[i])

    x = (rng.random(n) * 20 - 10).astype(np.float32)
    m = rng.integers(-3, 4, n).astype(np.int32)
    out = np.zeros((n, 4), np.float32)
    k(x, m, out)
    np.testing.assert_array_equal(out[:, 0], np.trunc(x))
    np.testing.assert_array_equal(out[:, 1], m.astype(np.float32) / 2 + np.trunc(x))
    np.testing.assert_array_equal(out[:, 2], 2.0)
    np.testing.assert_array_equal(out[:, 3], (m != 0) * 10.0)


def test_a_scalar_annotated_parameter_refuses_a_vector(arch):
    @qd.func
    def f(a: qd.f32):
        return a

    @qd.kernel
    def k() -> qd.f32:
        return f(qd.math.vec2(1.0, 2.0))

    e = compile_error(k)
    assert "parameter 'a' is a f32" in str(e) and "f(qd.math.vec2" in str(e)


def test_a_template_parameter_bound_to_a_local_is_that_local(arch, rng):
    @qd.func
    def set_to_one(x: qd.template()):
        x = 1

    @qd.func
    def bump(v: qd.template(), by):
        v += by
        v[0] = v[0] * 2

    @qd.func
    def by_value(x):
        x = 100
        return x

    @qd.kernel
    def k(s: qd.i32) -> qd.types.vector(5, qd.i32):
        a = s
        set_to_one(a)                       # the caller's a becomes 1
        w = qd.math.ivec3(s, s + 1, s + 2)
        bump(w, 3)
        b = s
        c = by_value(b)                     # an unannotated parameter is a copy
        return qd.Vector([a, w[0], w[2], b, c])

    s = int(rng.integers(-50, 50))
    assert k(s).tolist() == [1, (s + 3) * 2, s + 5, s, 100]


# ---- assert without debug: no check, the condition still evaluated ---------------------------

def test_assert_without_debug_evaluates_its_condition(arch):
    calls = qd.field(qd.i32, shape=())

    @qd.func
    def counted() -> bool:
        calls[None] += 1
        return False

    @qd.kernel
    def k(n: qd.i32):
        assert counted()
        assert False
        for _ in range(n):
            assert counted(), "never raised without debug"

    k(5)
    qd.sync()
    assert calls[None] == 6


def test_a_pure_assert_without_debug_leaves_the_code_unchanged(session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=8)

    def llvm_text(kernel) -> str:
        k = kernel._primal
        compiled = K.compile_kernel(k.fn, k.params, Options())
        return str(codegen.generate_llvm(compiled.ir, compiled.meta, target=CPU))

    @qd.kernel
    def plain(s: qd.f32):
        for i in x:
            x[i] = x[i] * s + 1

    plain_text = llvm_text(plain)

    @qd.kernel
    def plain(s: qd.f32):  # noqa: F811  (same name: the same symbols in the module)
        for i in x:
            assert x[i] * s > 0 and qd.sqrt(s) < 4, "pure"
            x[i] = x[i] * s + 1

    assert llvm_text(plain) == plain_text


# ---- 0-d loops ---------------------------------------------------------------------------------

def test_loops_over_no_dimension_run_once_with_the_empty_index(arch):
    val = qd.field(qd.i32, shape=())
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.i32, ndim=0)):
        for I in qd.grouped(qd.ndrange()):
            val[I] = 42
            count[None] += 1
        for I in qd.grouped(qd.ndrange()):
            val[I] += 1
        for I in qd.static(qd.grouped(qd.ndrange())):
            val[I] += 10
        for I in qd.grouped(val):
            val[I] += 100
            count[None] += 1
        for I in qd.grouped(a):
            a[I] = a[I] * 3

    a = np.array(7, np.int32)
    k(a)
    assert val[None] == 153 and count[None] == 2 and int(a) == 21
    assert list(qd.ndrange()) == [()] and list(qd.grouped(qd.ndrange())) == [()]


def test_a_loop_over_no_dimension_without_grouped_is_refused(arch):
    @qd.kernel
    def k():
        for i in qd.ndrange():
            pass

    assert "qd.grouped(qd.ndrange())" in str(compile_error(k))


# ---- swizzles ------------------------------------------------------------------------------------

def test_swizzles_of_every_letter_set_with_repeats_and_assignment(arch, rng):
    n = 16

    @qd.kernel
    def k(v: qd.types.ndarray(dtype=qd.math.vec4, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(n):
            a = v[i]
            b = a.rgb + a.stp * 2 + a.bgr.xxx
            c = a.xxxx * a.wzyx
            a.zyx += qd.math.vec3(10, 20, 30)
            a.brg += 1
            a.qs = a.ts
            for j in qd.static(range(3)):
                out[i, j] = b[j]
            for j in qd.static(range(4)):
                out[i, 3 + j] = c[j]
                out[i, 7 + j] = a[j]
            out[i, 11] = a.xx.sum() + a.yy.y

    v = rng.random((n, 4)).astype(np.float32)
    out = np.zeros((n, 12), np.float32)
    k(v, out)
    b = v[:, :3] + v[:, :3] * 2 + v[:, [2]]
    c = v[:, [0]] * v[:, ::-1]
    a = v.copy()
    a[:, [2, 1, 0]] += np.float32([10, 20, 30])
    a[:, [2, 0, 1]] += 1
    a[:, [3, 0]] = a[:, [1, 0]]
    np.testing.assert_allclose(out[:, 0:3], b, rtol=1e-6)
    np.testing.assert_allclose(out[:, 3:7], c, rtol=1e-6)
    np.testing.assert_allclose(out[:, 7:11], a, rtol=1e-6)
    np.testing.assert_allclose(out[:, 11], a[:, 0] * 2 + a[:, 1], rtol=1e-6)


def test_swizzle_errors_are_located(arch):
    @qd.kernel
    def repeated():
        a = qd.math.vec3(1, 2, 3)
        a.xx = qd.math.vec2(1, 2)

    @qd.kernel
    def mixed() -> qd.f32:
        a = qd.math.vec3(1, 2, 3)
        return a.xg.sum()

    @qd.kernel
    def beyond() -> qd.f32:
        a = qd.math.vec2(1, 2)
        return a.stp.sum()

    assert "repeats a component" in str(compile_error(repeated))
    assert "mixes letters" in str(compile_error(mixed))
    assert "out of range" in str(compile_error(beyond))


def test_python_scope_math_of_a_vector_is_a_vector(rng):
    v = qd.Vector(rng.uniform(-3, 3, 4).round(1).tolist())
    for fn, ref in ((qd.round, np.round), (qd.floor, np.floor), (qd.ceil, np.ceil), (qd.sin, np.sin)):
        r = fn(v)
        assert isinstance(r, qd.Matrix), (fn, type(r))
        np.testing.assert_array_equal(r.to_numpy(), ref(v.to_numpy()))
    assert qd.round(v, qd.i32).to_numpy().dtype.kind == "i" and qd.round(3) == 3 and qd.round(2.5) == 2.0


def test_python_scope_swizzles():
    v = qd.Vector([1, 2, 3])
    assert isinstance(v.xx, qd.Matrix) and isinstance(v.x, int)
    assert v.xx.to_list() == [1, 1] and v.bgr.to_list() == [3, 2, 1] and v.stp.to_list() == [1, 2, 3]
    assert v.xxxx.to_list() == [1, 1, 1, 1] and v.g == 2
    v.zyx += 1
    assert v.to_list() == [2, 3, 4]
    v.brg = (7, 8, 9)
    assert v.to_list() == [8, 9, 7]
    v.xy = 0
    assert v.to_list() == [0, 0, 7]
    with pytest.raises(AttributeError, match="repeats a component"):
        v.xx = (1, 2)
    with pytest.raises(AttributeError, match="no component 'w'"):
        v.w  # noqa: B018
    with pytest.raises(ValueError, match="swizzle pattern=xy"):
        v.xy = [1, 2, 3]
    f = qd.Vector.field(3, qd.f32, shape=2)
    f[1].zy = (5, 6)                         # a field element writes itself back
    np.testing.assert_array_equal(f.to_numpy(), [[0, 0, 0], [0, 6, 5]])


# ---- vector operands written as tuples, all()/any(), flat qd.Matrix -----------------------------

def test_vectors_compare_and_combine_with_tuple_literals(arch, rng):
    n = 32

    @qd.kernel
    def k(v: qd.types.ndarray(dtype=qd.math.ivec3, ndim=1), out: I32_1D, w: qd.types.ndarray(dtype=qd.math.ivec3,
                                                                                             ndim=1)):
        for i in range(n):
            r = 0
            if all(v[i] == (1, 1, 1)):
                r += 1
            if any(v[i] != [0, 1, 0]):
                r += 10
            if all(v[i] >= (0, 0, 0)) and not any(v[i] > (1, 1, 1)):
                r += 100
            out[i] = r
            w[i] = v[i] + (1, 2, 3) - [0, 0, v[i][0]]

    v = rng.integers(0, 3, (n, 3)).astype(np.int32)
    v[:4] = 1
    out = np.zeros(n, np.int32)
    w = np.zeros((n, 3), np.int32)
    k(v, out, w)
    want = (np.all(v == 1, axis=1) * 1 + np.any(v != [0, 1, 0], axis=1) * 10
            + (np.all(v >= 0, axis=1) & ~np.any(v > 1, axis=1)) * 100)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(w, v + [1, 2, 3] - np.stack([0 * v[:, 0], 0 * v[:, 0], v[:, 0]], axis=1))


def test_a_flat_matrix_literal_is_a_vector_as_in_quadrants(arch):
    @qd.func
    def first(a: qd.types.vector(3, qd.f32)):
        return a[0]

    @qd.kernel
    def k() -> qd.f32:
        x = qd.Matrix([3, 4, 5])
        x[0] = 20
        return first(x) + x[2] * 100 + x.n * 1000 + x.m * 10000

    assert k() == 20 + 500 + 3000 + 10000
    assert qd.Matrix([3, 4, 5]).n == 3


def test_vector_cast_to_python_types(arch, rng):
    @qd.kernel
    def k(x: qd.types.ndarray(dtype=qd.math.vec2, ndim=1), out: qd.types.ndarray(dtype=qd.math.vec2, ndim=1)):
        for i in range(x.shape[0]):
            base = (x[i] * 4 - 0.5).cast(int)
            out[i] = x[i] * 4 - base.cast(float)

    x = rng.random((16, 2)).astype(np.float32)
    out = np.zeros_like(x)
    k(x, out)
    base = np.trunc(x * np.float32(4) - np.float32(0.5))
    np.testing.assert_allclose(out, x * np.float32(4) - base, rtol=1e-6)


# ---- floor / ceil / round to a type ----------------------------------------------------------

def test_rounding_to_a_type(arch, rng):
    n = 64

    @qd.kernel
    def k(x: F32_1D, out: qd.types.ndarray(dtype=qd.i32, ndim=2), v: qd.types.ndarray(dtype=qd.math.ivec2, ndim=1)):
        for i in range(n):
            out[i, 0] = qd.floor(x[i], qd.i32)
            out[i, 1] = qd.ceil(x[i], dtype=qd.i32)
            out[i, 2] = qd.round(x[i], int)
            out[i, 3] = qd.floor(x[i], qd.f32) * 2          # a float result stays one: then *2
            v[i] = qd.floor(qd.math.vec2(x[i], -x[i]), qd.i32)

    x = ((rng.random(n) - 0.5) * 40).astype(np.float32)
    x[:4] = [0.5, 1.5, -2.5, 3.0]
    out = np.zeros((n, 4), np.int32)
    v = np.zeros((n, 2), np.int32)
    k(x, out, v)
    np.testing.assert_array_equal(out[:, 0], np.floor(x))
    np.testing.assert_array_equal(out[:, 1], np.ceil(x))
    np.testing.assert_array_equal(out[:, 2], np.round(x))
    np.testing.assert_array_equal(out[:, 3], np.floor(x) * 2)
    np.testing.assert_array_equal(v, np.floor(np.stack([x, -x], axis=1)))
    assert qd.floor(1.75, qd.i32) == 1 and isinstance(qd.floor(1.75, qd.i32), np.int32)
    assert qd.ceil(-1.5, int) == -1 and qd.round(2.25) == 2.0


def test_rounding_refuses_a_non_type(arch):
    @qd.kernel
    def k(x: qd.f32) -> qd.i32:
        return qd.floor(x, 3)

    assert "dtype must be a qd type" in str(compile_error(k, 1.5))


# ---- bool annotations -----------------------------------------------------------------------------

def test_bool_as_a_func_return_type_and_a_struct_member(arch, rng):
    S = qd.types.struct(a=qd.i32, b=bool)
    f = S.field(shape=8)

    @qd.dataclass
    class Flagged:
        flag: bool
        v: qd.f32

    @qd.func
    def positive(x) -> bool:
        return x

    @qd.kernel
    def k(x: F32_1D) -> Flagged:
        for i in range(8):
            s = S(a=i, b=positive(x[i]))
            f[i] = s
        return Flagged(flag=positive(x[0] > 0), v=2.5)

    x = (rng.random(8) - 0.5).astype(np.float32)
    x[1] = 0.0
    r = k(x)
    got = f.to_numpy()
    np.testing.assert_array_equal(got["b"], x != 0)
    np.testing.assert_array_equal(got["a"], np.arange(8))
    assert r["flag"] == bool(x[0] > 0) and r["v"] == 2.5


# ---- *args and tuple arithmetic at compile time -----------------------------------------------

def test_star_arguments_spread_tuples_and_vectors(arch):
    K_, dim = 3, 2
    v = qd.Vector.field(K_, dtype=qd.i32, shape=(K_,) * dim)

    def stencil_range():
        return qd.ndrange(*((K_,) * (dim + 1)))

    @qd.func
    def digits(a, b, c):
        return a + b * 10 + c * 100

    @qd.kernel
    def k(s: qd.i32) -> qd.types.vector(3, qd.i32):
        for I in qd.static(qd.grouped(stencil_range())):
            v[I[0], I[1]][I[2]] = I[0] + I[1] * 3 + I[2] * 10
        total = 0
        for I in qd.grouped(qd.ndrange(*[[1, 3]] * 3)):
            total += I[0] + I[1] + I[2]
        t = (s, 2)
        w = qd.Vector([*t, 5])
        count = 0
        for i, j in qd.ndrange(*t):
            count += 1
        return qd.Vector([total, digits(*t, 3) + w.sum() * 1000, count])

    assert k(1).tolist() == [36, 1 + 20 + 300 + 8000, 2]
    i, j, c = np.indices((K_, K_, K_))
    np.testing.assert_array_equal(v.to_numpy(), i + j * 3 + c * 10)


def test_tuple_arithmetic_other_than_concatenation_and_repetition_is_refused(arch):
    @qd.kernel
    def k() -> qd.i32:
        return (1, 2) + 3

    assert "not defined on tuples" in str(compile_error(k))


# ---- annotations are part of what a compiled kernel is ------------------------------------------

def test_kernels_differing_only_in_a_closure_annotation_do_not_share_a_compiled_kernel(arch):
    """Annotations are evaluated where the function is defined, not captured by it: two kernels
    (or funcs) defined by one function, differing in `-> dt` or `a: dt`, are different kernels."""
    def returning(dt):
        @qd.kernel
        def k(a: qd.f32, b: qd.f32) -> dt:
            return a * b
        return k

    def converting(dt):
        @qd.func
        def conv(a: dt):
            return a

        @qd.kernel
        def k(a: qd.f32) -> qd.f32:
            return conv(a)
        return k

    assert returning(qd.f32)(0.5, 3.0) == 1.5
    assert returning(qd.i32)(0.5, 3.0) == 1
    assert converting(qd.f32)(1.5) == 1.5
    assert converting(qd.i32)(1.5) == 1.0


# ---- a vector index into a vector/matrix; a func returning a struct -------------------------------

def test_a_vector_index_selects_a_matrix_entry(arch, rng):
    x = qd.Matrix.field(2, 3, dtype=qd.f32, shape=(6, 4))

    @qd.kernel
    def k(s: qd.f32) -> qd.f32:
        for i, j in qd.ndrange(6, 4):
            for I in qd.static(qd.grouped(qd.ndrange(2, 3))):
                x[i, j][I] = I[0] + I[1] * 10 + i + j * s
        m = qd.math.mat2([[1.0, 2.0], [3.0, 4.0]])
        J = qd.math.ivec2(1, 0)
        m[J] += s
        return m[J] + m[0, 1]

    s = float(rng.integers(1, 9))
    assert k(s) == 3 + s + 2
    i, j, a, b = np.indices((6, 4, 2, 3))
    np.testing.assert_array_equal(x.to_numpy(), a + b * 10 + i + j * np.float32(s))


def test_a_func_returns_a_struct_it_declares(arch, rng):
    tp = qd.types.struct(a=qd.i32, v=qd.math.vec2)
    other = qd.types.struct(b=qd.i32)
    f = tp.field(shape=3)

    @qd.func
    def element(i) -> tp:
        return f[i]

    @qd.func
    def made(a) -> tp:
        return tp(a=a, v=qd.math.vec2(a, -a))

    @qd.func
    def wrong() -> tp:
        return other(b=1)

    @qd.kernel
    def k(n: qd.i32) -> tp:
        f[1] = made(n)
        return element(1)

    @qd.kernel
    def bad() -> tp:
        return wrong()

    n = int(rng.integers(1, 100))
    r = k(n)
    assert r["a"] == n and list(r["v"]) == [n, -n]
    assert f.to_numpy()["a"].tolist() == [0, n, 0]
    assert "declares a" in str(compile_error(bad))


# ---- vector and/or, `...`, loops under a constant if ------------------------------------------

def test_and_or_on_vectors_are_element_wise(arch, rng):
    n = 16

    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.math.ivec4, ndim=1), b: qd.types.ndarray(dtype=qd.math.ivec4, ndim=1),
          out: qd.types.ndarray(dtype=qd.math.ivec4, ndim=2)):
        for i in range(n):
            out[i, 0] = a[i] or b[i]
            out[i, 1] = a[i] and b[i]
            out[i, 2] = a[i] or b[i] and qd.Vector([1, 0, 1, 0])

    a = rng.integers(-1, 2, (n, 4)).astype(np.int32)
    b = rng.integers(-1, 2, (n, 4)).astype(np.int32)
    out = np.zeros((n, 3, 4), np.int32)
    k(a, b, out)
    np.testing.assert_array_equal(out[:, 0], (a != 0) | (b != 0))
    np.testing.assert_array_equal(out[:, 1], (a != 0) & (b != 0))
    np.testing.assert_array_equal(out[:, 2], (a != 0) | ((b != 0) & np.array([1, 0, 1, 0], bool)))


def test_ellipsis_statement_and_a_loop_under_a_constant_if(arch):
    @qd.kernel
    def k(stop: qd.i32) -> qd.i32:
        for b in range(2):
            ...
        a = 0
        if True:  # not qd.static: as in Quadrants its loop is no top-level one, so it may break
            for i in range(1000):
                if i == stop:
                    break
                a += 1
        return a

    assert k(100) == 100 and k(7) == 7


def test_fill_sets_every_component_of_a_vector_place(arch, rng):
    x = qd.Matrix.field(3, 2, qd.f32, shape=4)

    @qd.kernel
    def k(s: qd.f32) -> qd.types.vector(3, qd.f32):
        x[1].fill(s)
        v = qd.math.vec3(1, 2, 3)
        v.fill(s * 2)
        return v

    s = float(rng.integers(1, 50))
    assert k(s).tolist() == [2 * s] * 3
    want = np.zeros((4, 3, 2), np.float32)
    want[1] = s
    np.testing.assert_array_equal(x.to_numpy(), want)


def test_struct_field_elements_read_and_write_members_as_attributes(arch, rng):
    inner = qd.types.struct(c=qd.i32)
    S = qd.types.struct(a=qd.i32, v=qd.math.vec2, n=inner)
    f = S.field(shape=3)
    a, y, c = (int(v) for v in rng.integers(1, 100, 3))
    f[1].a = a
    f[1].v.y = y
    f[2].n.c = c
    got = f.to_numpy()
    assert got["a"].tolist() == [0, a, 0] and got["v"][1].tolist() == [0, y] and got["n"]["c"].tolist() == [0, 0, c]
    assert f[1].a == a and f[1]["a"] == a and f[2].n.c == c and f[1].v.y == y
    assert isinstance(f[0], dict) and list(f[0]) == ["a", "v", "n"] and f[0]["n"] == {"c": 0}
    with pytest.raises(AttributeError, match="no member 'b'"):
        f[0].b = 1

    @qd.kernel
    def k():
        for i in f:
            f[i].a += i * 10 + f[i].n.c

    k()
    assert [f[i].a for i in range(3)] == [0, a + 10, 20 + c]


# ---- qd.ndrange(..., axes=) -----------------------------------------------------------------------

@pytest.mark.parametrize("axes", [None, (0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_ndrange_axes_orders_the_visit_and_keeps_each_index_on_its_axis(arch, axes):
    dims = (3, (1, 5), 2)
    visit = qd.field(qd.i32, shape=(3, 5, 2))
    grouped = qd.field(qd.i32, shape=(3, 5, 2))

    @qd.kernel
    def k():
        c = 0
        qd.loop_config(serialize=True)
        for i, j, l in qd.ndrange(*dims, axes=axes):
            visit[i, j, l] = c
            c += 1
        for I in qd.grouped(qd.ndrange(*dims, axes=axes)):
            grouped[I] = I[0] * 100 + I[1] * 10 + I[2]
        for I in qd.static(qd.grouped(qd.ndrange(1, 2, 1, axes=(1, 0, 2) if axes else None))):
            grouped[I] += 1000

    k()
    order = list(axes or (0, 1, 2))
    ranges = [range(3), range(1, 5), range(2)]
    want = np.full((3, 5, 2), -1, np.int32)
    for c, physical in enumerate(itertools.product(*(ranges[a] for a in order))):
        idx = [0] * 3
        for level, axis in enumerate(order):
            idx[axis] = physical[level]
        want[tuple(idx)] = c
    np.testing.assert_array_equal(visit.to_numpy(), np.maximum(want, 0))
    i, j, l = np.indices((3, 5, 2))
    want_grouped = np.where(j >= 1, i * 100 + j * 10 + l, 0)
    want_grouped[0, 0:2, 0] += 1000
    np.testing.assert_array_equal(grouped.to_numpy(), want_grouped)
    want_order = [tuple(int(v) for v in np.argwhere(want == c)[0]) for c in range(want.max() + 1)]
    assert list(qd.ndrange(*dims, axes=axes)) == want_order


def test_ndrange_axes_errors(session_cache_dir):
    with pytest.raises(ValueError, match="has 3 entries"):
        qd.ndrange(4, 5, axes=(0, 1, 2))
    with pytest.raises(ValueError, match="not a permutation"):
        qd.ndrange(4, 5, axes=(0, 0))
    with pytest.raises(TypeError, match="entries must be Python ints"):
        qd.ndrange(4, 5, axes=(True, False))
    assert qd.ndrange(3, 4, axes=(0, 1)).axes is None and qd.ndrange(3, 4, axes=(1, 0)).axes == (1, 0)
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)

    @qd.kernel
    def k(n: qd.i32):
        for i, j in qd.ndrange(4, 5, axes=(0, n)):
            pass

    assert "must be known at compile time" in str(compile_error(k, 1))

    @qd.kernel
    def k2():
        for i, j in qd.ndrange(4, 5, axes=(0, 2)):
            pass

    assert "not a permutation" in str(compile_error(k2))


def test_vector_field_from_numpy_takes_column_or_row_elements(arch, rng):
    vec = qd.Vector.field(3, dtype=qd.i32, shape=(4, 5))
    for shape in ((4, 5, 3, 1), (4, 5, 1, 3)):
        arr = rng.integers(-9, 9, shape).astype(np.int32)
        vec.from_numpy(arr)
        np.testing.assert_array_equal(vec.to_numpy(), arr.reshape(4, 5, 3))
    with pytest.raises(ValueError, match="expected"):
        vec.from_numpy(np.zeros((4, 5, 3, 2), np.int32))


class _Table:
    """A user's container: indexed at compile time, as Quadrants does with Python objects."""

    def __init__(self, rows):
        self.rows = rows

    def __getitem__(self, index):
        return self.rows[index]


def test_compile_time_python_containers_are_indexed_by_python(arch, rng):
    table = _Table([int(v) for v in rng.integers(-50, 50, 4)])
    weights = {"a": 2, "b": 3}
    x = qd.field(qd.i32, shape=4)

    @qd.kernel
    def k():
        for i in qd.static(range(4)):
            x[i] = table[i] * weights["a"] + weights["b"]

    @qd.kernel
    def out_of_range():
        x[0] = table[9]

    @qd.kernel
    def run_time_index(i: qd.i32):
        x[0] = table[i]

    k()
    np.testing.assert_array_equal(x.to_numpy(), np.array(table.rows) * 2 + 3)
    assert "_Table[9] failed at compile time: IndexError" in str(compile_error(out_of_range))
    assert "not subscriptable" in str(compile_error(run_time_index, 1))


def test_an_uncalled_qd_template_is_a_template_annotation(arch):
    x = qd.field(qd.i32, shape=3)

    @qd.func
    def put(a: qd.template, v: qd.Template):
        a[1] = v

    @qd.kernel
    def k(a: qd.template, v: qd.template):
        put(a, v)

    k(x, 7)
    assert x.to_numpy().tolist() == [0, 7, 0]


def test_vector_constructors_broadcast_and_concatenate(arch, rng):
    @qd.kernel
    def k(s: qd.f32) -> qd.types.matrix(3, 4, qd.f32):
        a = qd.math.vec4(s)
        b = qd.math.vec4([s, 1], 2, s * 2)
        w = qd.math.vec4(5, 6, 7, 8)
        c = qd.math.vec4(w.zyx, s)
        return qd.Matrix.rows([a, b, c])

    s = float(rng.integers(1, 9))
    np.testing.assert_array_equal(k(s), [[s] * 4, [s, 1, 2, 2 * s], [7, 6, 5, s]])


# ---- a kernel-scope vector written at run-time indices by a parallel loop -----------------------

def test_parallel_iterations_write_their_own_components_of_a_kernel_scope_vector(arch):
    """Each iteration stores only its component: rewriting every component (a branch-free select
    per component) made the threads of the loop undo each other's writes."""
    n = 1024 if arch == "cpu" else 256  # the CPU's threads raced visibly at 1024 (lavapipe compiles slowly)
    vec = qd.types.vector(n, qd.i32)

    @qd.kernel
    def k(s: qd.i32) -> vec:
        ret = vec(0)
        for i in range(n):
            ret[i] = i * s + 1
        return ret

    for s in range(-10, 10):  # many launches: a race shows in some
        np.testing.assert_array_equal(k(s), np.arange(n) * s + 1)


def test_a_parallel_iteration_stores_only_the_component_it_indexes(session_cache_dir):
    """What keeps the iterations apart, independent of thread timing: inside the parallel task
    no component is read back and rewritten; each is stored once, under a test of the index."""
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    vec = qd.types.vector(8, qd.i32)

    @qd.kernel
    def k(s: qd.i32) -> vec:
        ret = vec(0)
        for i in range(8):
            ret[i] = i * s + 1
        return ret

    text = inspect_ir(k)
    task = text[text.index("range_for(range)"):]
    task = task[:task.index("  task ")]
    assert "temp_load" not in task and "select" not in task
    assert task.count("temp_store") == 8 and task.count("if ") == 7
