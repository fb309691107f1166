"""Semantics and syntax ported Quadrants kernels rely on (docs/api.md, Writing kernels),
checked against Python's own semantics, numpy and analytic derivatives, on every selected arch."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

from compile_error_util import compile_error

I32_1D = qd.types.ndarray(dtype=qd.i32, ndim=1)
F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


# ---- and / or give an operand ------------------------------------------------------------------

def test_and_or_return_an_operand_as_in_python(arch, rng):
    n = 64
    out = qd.field(qd.i32, shape=(5, n))

    @qd.kernel
    def k(a: I32_1D, b: I32_1D, c: I32_1D):
        for i in range(n):
            out[0, i] = a[i] and b[i]
            out[1, i] = a[i] or b[i]
            out[2, i] = a[i] and b[i] or c[i]
            out[3, i] = (a[i] or 0) and qd.static(0 or 3 or 5)
            out[4, i] = a[i] > 0 or b[i] * 2     # a bool operand and an int one: their common type

    a, b, c = (rng.integers(-2, 3, n).astype(np.int32) for _ in range(3))
    k(a, b, c)
    want = [[int(x and y) for x, y in zip(a, b)], [int(x or y) for x, y in zip(a, b)],
            [int(x and y or z) for x, y, z in zip(a, b, c)], [int((x or 0) and 3) for x in a],
            [int(x > 0 or y * 2) for x, y in zip(a, b)]]
    assert out.to_numpy().tolist() == want


def test_or_evaluates_its_second_operand_only_when_needed(arch, rng):
    n = 32
    calls = qd.field(qd.i32, shape=())

    @qd.func
    def counted(v):
        calls[None] += 1
        return v

    @qd.kernel
    def k(a: I32_1D, out: I32_1D):
        for i in range(n):
            out[i] = a[i] or counted(7)

    a = rng.integers(0, 2, n).astype(np.int32)
    out = np.zeros(n, np.int32)
    k(a, out)
    assert out.tolist() == [int(x or 7) for x in a]
    assert calls[None] == int((a == 0).sum())


# ---- a func's return annotation converts -----------------------------------------------------

def test_func_return_annotation_converts_the_value(arch, rng):
    n = 32

    @qd.func
    def to_int(a: qd.f32) -> qd.i32:
        return a

    @qd.func
    def pair(a) -> tuple[qd.i32, qd.f32]:
        return a, a

    @qd.func
    def vec(a) -> qd.types.vector(2, qd.i32):
        return qd.Vector([a, -a])

    @qd.func
    def as_float(a: qd.i32) -> float:
        return a // 2

    @qd.kernel
    def k(x: F32_1D, out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(n):
            out[i, 0] = to_int(x[i]) + 0.25          # an i32 + 0.25: stays a fraction
            p, q = pair(x[i])
            out[i, 1] = p
            out[i, 2] = q
            v = vec(x[i])
            out[i, 3] = v[0] + v[1] * 10
            out[i, 4] = as_float(qd.i32(x[i])) / 4

    x = (rng.random(n) * 20 - 10).astype(np.float32)
    out = np.zeros((n, 5), np.float32)
    k(x, out)
    t = np.trunc(x)
    np.testing.assert_array_equal(out[:, 0], t + np.float32(0.25))
    np.testing.assert_array_equal(out[:, 1], t)
    np.testing.assert_array_equal(out[:, 2], x)
    np.testing.assert_array_equal(out[:, 3], t - 10 * t)
    np.testing.assert_array_equal(out[:, 4], (t.astype(np.int32) // 2).astype(np.float32) / 4)


# ---- qd.grouped, vector and tuple indices ------------------------------------------------------

def test_grouped_loops_bind_a_vector_index(arch, rng):
    x = qd.field(qd.i32, shape=(5, 7))
    y = qd.field(qd.i32, shape=(5, 7))

    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
        for I in qd.grouped(x):
            x[I] = I[0] * 100 + I[1] + a[I]
        for I in qd.grouped(qd.ndrange((1, 4), (2, 6))):
            y[I + 1] = I[0] * I[1]                   # vector arithmetic on the index
        for I in qd.grouped(a):
            a[I] = a[I] * 2 + I.sum()

    a = rng.integers(-50, 50, (5, 7)).astype(np.int32)
    a0 = a.copy()
    k(a)
    i, j = np.indices((5, 7))
    np.testing.assert_array_equal(x.to_numpy(), i * 100 + j + a0)
    want_y = np.zeros((5, 7), np.int32)
    for p in range(1, 4):
        for q in range(2, 6):
            want_y[p + 1, q + 1] = p * q
    np.testing.assert_array_equal(y.to_numpy(), want_y)
    np.testing.assert_array_equal(a, a0 * 2 + i + j)


@pytest.mark.parametrize("by_remainder", [True, False])
def test_a_tuple_index_held_in_a_local(arch, rng, by_remainder):
    K_ = 3
    n = 24
    selector = qd.field(qd.i32, shape=n)

    @qd.kernel
    def k(v: I32_1D):
        for i in range(n):
            idx = (i % K_,) if qd.static(by_remainder) else (i // 2,)
            selector[idx] += v[i]

    v = rng.integers(-9, 10, n).astype(np.int32)
    k(v)
    want = np.zeros(n, np.int64)
    np.add.at(want, np.arange(n) % K_ if by_remainder else np.arange(n) // 2, v)
    np.testing.assert_array_equal(selector.to_numpy(), want)


def test_static_grouped_ndrange_unrolls_vector_indices(arch, rng):
    x = qd.field(qd.f32, shape=(2, 3))

    @qd.kernel
    def k(s: qd.f32):
        for I in qd.static(qd.grouped(qd.ndrange(2, 3))):
            x[I] = s * (I[0] * 3 + I[1])

    s = float(rng.random()) + 0.5
    k(s)
    np.testing.assert_allclose(x.to_numpy(), np.float32(s) * np.arange(6, dtype=np.float32).reshape(2, 3),
                               rtol=1e-6)


# ---- lambdas and plain callables, qd.func(f) in a kernel -----------------------------------------

def _value_and_grad(tifunc, x0):
    """(f(x), df/dx) of `tifunc` applied in a kernel, with reverse-mode autodiff."""
    n = len(x0)
    x = qd.field(qd.f32, shape=n, needs_grad=True)
    y = qd.field(qd.f32, shape=n, needs_grad=True)

    @qd.kernel
    def run():
        for i in x:
            y[i] = tifunc(x[i])

    x.from_numpy(x0)
    run()
    y.grad.from_numpy(np.ones(n, np.float32))
    run.grad()
    return y.to_numpy(), x.grad.to_numpy()


def test_lambdas_are_inlined_and_differentiated(arch, rng):
    x0 = (rng.random(16) * 4 - 2).astype(np.float32)
    y, g = _value_and_grad(lambda v: qd.sin(v), x0)
    np.testing.assert_allclose(y, np.sin(x0.astype(np.float64)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, np.cos(x0.astype(np.float64)), rtol=1e-5, atol=1e-6)
    scale = float(rng.random()) + 0.5
    y, g = _value_and_grad(lambda v: scale * v * v, x0)      # a closure over a Python float
    np.testing.assert_allclose(y, scale * x0.astype(np.float64) ** 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, 2 * scale * x0.astype(np.float64), rtol=1e-5, atol=1e-6)


def test_two_lambdas_on_one_line_and_qd_func_applied_in_a_kernel(arch, rng):
    n = 16
    out = qd.field(qd.f32, shape=(3, n))
    f, g = (lambda v: v + 1.0), (lambda v: v * 3.0)

    def halve(v):
        return v * 0.5

    @qd.kernel
    def k(x: F32_1D):
        for i in range(n):
            out[0, i] = f(x[i])
            out[1, i] = g(x[i])
            out[2, i] = qd.func(halve)(x[i])

    x = rng.standard_normal(n).astype(np.float32)
    k(x)
    np.testing.assert_array_equal(out.to_numpy(), np.stack([x + np.float32(1), x * np.float32(3),
                                                            x * np.float32(0.5)]))


# ---- assigning to a loop variable --------------------------------------------------------------

def test_assigning_a_loop_variable_changes_it_for_the_rest_of_the_iteration(arch, rng):
    n, m = 6, 5
    out = qd.field(qd.i32, shape=(n, m, 2))

    @qd.kernel
    def k(flip: I32_1D):
        for i, j in qd.ndrange(n, m):
            i0 = i
            if flip[i] > 0:
                i = n - 1 - i                          # seen by the rest of this iteration only
            j += 1
            out[i0, j - 1, 0] = i
            out[i0, j - 1, 1] = j
        for s in range(1):
            for t in range(3):                      # a serial inner loop: its trip count is unchanged
                t = t * 10
                out[0, 0, 1] += t

    flip = rng.integers(0, 2, n).astype(np.int32)
    k(flip)
    got = out.to_numpy()
    for i in range(n):
        for j in range(m):
            assert got[i, j, 0] == (n - 1 - i if flip[i] > 0 else i)
            assert got[i, j, 1] == (j + 1 if (i, j) != (0, 0) else 1 + 0 + 10 + 20)


# ---- returns under qd.static, bare returns ------------------------------------------------------

def test_returns_under_static_if_and_in_static_loops(arch, rng):
    @qd.func
    def first_at_least(v, limit: qd.template()):
        for t in qd.static(range(5)):
            if qd.static(t * t >= limit):
                return v * t                        # the branch compiled ends the func
        return -v

    @qd.func
    def sign_or_value(v, want_sign: qd.template()):
        if qd.static(want_sign):
            return qd.select(v >= 0, 1, -1)
        return v

    @qd.func
    def nothing(v) -> None:
        if qd.static(v is None):
            return None
        return

    @qd.kernel
    def k(v: qd.i32) -> tuple[qd.i32, qd.i32, qd.i32, qd.i32]:
        nothing(None)
        return first_at_least(v, 5), first_at_least(v, 100), sign_or_value(v, True), sign_or_value(v, False)

    v = int(rng.integers(-100, 100))
    assert k(v) == (v * 3, -v, 1 if v >= 0 else -1, v)


def test_kernel_returns_under_static_if_and_bare_returns(arch, rng):
    out = qd.field(qd.i32, shape=2)

    def make(early: bool):
        @qd.kernel
        def k(v: qd.i32) -> qd.i32:
            if qd.static(early):
                return v * 2
            return v - 1
        return k

    @qd.kernel
    def bare(v: qd.i32):
        out[0] = v
        for t in qd.static(range(3)):
            if qd.static(t == 1):
                return
            out[1] += v                             # runs for t == 0 only

    @qd.kernel
    def bare_none(v: qd.i32):
        out[0] += v
        return None

    v = int(rng.integers(-1000, 1000))
    assert make(True)(v) == v * 2 and make(False)(v) == v - 1
    bare(v)
    assert out.to_numpy().tolist() == [v, v]
    bare_none(3)
    assert out.to_numpy().tolist() == [v + 3, v]


# ---- qd.loop_config --------------------------------------------------------------------------

def test_loop_config_parallelize_block_dim_adaptive_and_name(arch, rng):
    n = 4096
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def k(x: F32_1D, y: F32_1D):
        qd.loop_config(parallelize=2, block_dim_adaptive=True, name="scale_rows")
        for i in range(n):
            y[i] = x[i] * 2
        qd.loop_config(parallelize=1, block_dim=64, name="sum_up")
        for i in range(n):
            total[None] += y[i]

    x = rng.standard_normal(n).astype(np.float32)
    y = np.zeros(n, np.float32)
    k(x, y)
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_allclose(total[None], float(np.sum(x.astype(np.float64) * 2)), rtol=1e-4, atol=1e-3)
    kernel = k._primal
    compiled = K.compile_kernel(kernel.fn, kernel.params, Options(arch=arch), arch=arch)
    names = [t.name for t in compiled.meta.tasks]
    assert names == ["k_t0_scale_rows", "k_t1_sum_up"], names


def test_loop_config_errors_are_located(arch):
    @qd.kernel
    def bad_name():
        qd.loop_config(name="two words")
        for i in range(4):
            pass

    @qd.kernel
    def bad_threads():
        qd.loop_config(parallelize=0)
        for i in range(4):
            pass

    e = compile_error(bad_name)
    assert "identifier" in e.raw_message and "two words" in e.source_line
    e = compile_error(bad_threads)
    assert "parallelize=...) must be a positive integer" in e.raw_message


# ---- casts to Python types, ndarray hints ----------------------------------------------------

def test_cast_to_python_float_and_int_and_untyped_ndarray_hints(arch, rng):
    n = 16

    @qd.kernel
    def k(x: qd.types.ndarray(dtype=float, ndim=1), v: qd.types.ndarray(dtype=qd.types.vector(), ndim=1),
          out: qd.types.ndarray(dtype=int, ndim=1)):
        for i in range(n):
            out[i] = qd.cast(x[i], int) * 10 + qd.cast(qd.cast(x[i], int) * 0.5 > 1, int)
            x[i] = qd.cast(out[i], float) / 4
            v[i] = v[i] * 2 + qd.cast(i, float)

    x = (rng.random(n) * 40 - 20).astype(np.float32)
    vecs = qd.ndarray(qd.math.vec3, shape=n)
    v0 = rng.standard_normal((n, 3)).astype(np.float32)
    vecs.from_numpy(v0)
    out = np.zeros(n, np.int32)
    x0 = x.copy()
    k(x, vecs, out)
    t = np.trunc(x0).astype(np.int32)
    want = t * 10 + (t * np.float32(0.5) > 1)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(x, want.astype(np.float32) / 4)
    np.testing.assert_array_equal(vecs.to_numpy(), v0 * 2 + np.arange(n, dtype=np.float32)[:, None])


# ---- iterables chosen at compile time, compile-time break / continue ---------------------------

@pytest.mark.parametrize("use_field", [True, False])
def test_a_static_conditional_chooses_the_iterable(arch, use_field):
    A = qd.field(qd.i32, shape=5)
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def k():
        for _ in A if qd.static(use_field) else qd.static(range(3)):
            count[None] += 1

    k()
    assert count[None] == (5 if use_field else 3)


def test_compile_time_break_and_continue_in_static_loops(arch, rng):
    out = qd.field(qd.i32, shape=2)

    @qd.kernel
    def k(v: qd.i32):
        for t in qd.static(range(10)):
            if qd.static(t % 3 == 1):
                continue
            if qd.static(t >= 7):
                break
            out[0] += v * t
        for t in qd.static(range(4)):
            out[1] += t
            break                                   # unconditional: one iteration, as in Python

    v = int(rng.integers(-50, 50))
    k(v)
    want = 0
    for t in range(10):
        if t % 3 == 1:
            continue
        if t >= 7:
            break
        want += v * t
    assert out.to_numpy().tolist() == [want, 0]


def test_misuse_is_a_locatedcompile_error(arch):
    @qd.kernel
    def runtime_break(n: qd.i32):
        for t in qd.static(range(3)):
            if n > t:
                break

    @qd.kernel
    def runtime_choice(n: qd.i32):
        for _ in range(3) if n > 0 else range(2):
            pass

    @qd.kernel
    def and_on_vectors(n: qd.i32):
        v = qd.Vector([n, n])
        w = n and v
        w[0] += 1

    @qd.kernel
    def func_of_a_number():
        qd.func(3)(1)

    e = compile_error(runtime_break, 1)
    assert "must be decided at compile time" in e.raw_message and "break" in e.source_line
    e = compile_error(runtime_choice, 1)
    assert "chosen at compile time" in e.raw_message and "n > 0" in e.source_line
    e = compile_error(and_on_vectors, 1)
    assert "scalars" in e.raw_message and "n and v" in e.source_line
    e = compile_error(func_of_a_number)
    assert "qd.func() takes a Python function" in e.raw_message
