"""Quadrants' parameter names, passed as keywords: a Quadrants program calls `qd.atomic_add(x=,
y=)`, `qd.math.clamp(x, xmin=, xmax=)`, `qd.select(cond=, x1=, x2=)`, `f.fill(val=)`... and
must run unchanged. In kernels the front end binds such a call by the Python function's
signature; in Python scope the functions take the same names. Checked against numpy on random
inputs."""
import numpy as np
import pytest

import qdc as qd

from module_util import compile_error_of

N = 16


@qd.kernel
def scalar_math(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1),
                out: qd.types.ndarray(qd.f32, ndim=2), rounded: qd.types.ndarray(qd.i32, ndim=2)):
    for i in range(x.shape[0]):
        out[i, 0] = qd.sin(x=x[i]) + qd.cos(x=x[i])
        out[i, 1] = qd.atan2(x1=x[i], x2=y[i])
        out[i, 2] = qd.pow(base=qd.abs(x=x[i]), exponent=y[i])
        out[i, 3] = qd.select(cond=x[i] > y[i], x1=x[i], x2=y[i])
        out[i, 4] = qd.math.clamp(x[i], xmin=-0.5, xmax=0.5)
        out[i, 5] = qd.math.radians(x=x[i]) + qd.math.degrees(x=y[i])
        out[i, 6] = qd.sqrt(x=y[i]) + qd.exp(x=x[i]) + qd.log(x=y[i]) + qd.tanh(x=x[i])
        out[i, 7] = qd.raw_div(x1=x[i], x2=y[i]) + qd.raw_mod(x1=x[i], x2=y[i])
        rounded[i, 0] = qd.floor(x=x[i] * 4.0, dtype=qd.i32)
        rounded[i, 1] = qd.cast(obj=x[i] * 4.0, dtype=qd.i32)
        rounded[i, 2] = qd.bit_shr(x1=qd.cast(x[i] * -100.0, qd.i32), x2=qd.static(x=3))
        rounded[i, 3] = qd.lang.raw_div(x1=qd.cast(x[i] * 100.0, qd.i32), x2=7)


@qd.kernel
def vector_math(a: qd.types.ndarray(qd.f32, ndim=2), b: qd.types.ndarray(qd.f32, ndim=2),
                out: qd.types.ndarray(qd.f32, ndim=2)):
    for i in range(a.shape[0]):
        u = qd.Vector([a[i, 0], a[i, 1], a[i, 2]])
        v = qd.Vector([b[i, 0], b[i, 1], b[i, 2]])
        w = qd.math.cross(x=u, y=v)
        m = qd.Matrix([[2.0 + u[0], u[1]], [v[0], 2.0 + v[1]]])
        inv = qd.math.inverse(mat=m)
        out[i, 0] = qd.math.dot(x=u, y=v)
        out[i, 1] = qd.math.length(x=u)
        out[i, 2] = qd.math.distance(x=u, y=v)
        out[i, 3] = w[0] + 2.0 * w[1] + 3.0 * w[2]
        out[i, 4] = inv[0, 0] + 2.0 * inv[0, 1] + 3.0 * inv[1, 0] + 4.0 * inv[1, 1]


@qd.kernel
def atomics(values: qd.types.ndarray(qd.i32, ndim=1), acc: qd.types.ndarray(qd.i32, ndim=1)):
    for i in range(values.shape[0]):
        qd.atomic_add(x=acc[0], y=values[i])
        qd.atomic_max(y=values[i], x=acc[1])  # keywords in any order, as Python binds them
        qd.atomic_min(acc[2], y=values[i])
        qd.atomic_or(x=acc[3], y=values[i])
    for j in qd.grouped(x=qd.ndrange(values.shape[0])):
        qd.atomic_sub(x=acc[4], y=values[j])


@qd.kernel
def fills(f: qd.template(), out: qd.types.ndarray(qd.f32, ndim=1), level: qd.f32):
    f.fill(val=level)
    for i in range(out.shape[0]):
        v = qd.Vector([0.0, 0.0])
        v.fill(val=level * i)
        out[i] = v[0] + v[1]


def test_scalar_intrinsics_by_keyword(arch, rng):
    x = rng.uniform(-1.0, 1.0, N).astype(np.float32)
    y = rng.uniform(0.5, 2.0, N).astype(np.float32)
    out, rounded = np.zeros((N, 8), np.float32), np.zeros((N, 4), np.int32)
    scalar_math(x, y, out, rounded)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    want = np.stack([np.sin(x64) + np.cos(x64), np.arctan2(x64, y64), np.abs(x64) ** y64, np.where(x64 > y64, x64, y64),
                     np.clip(x64, -0.5, 0.5), np.radians(x64) + np.degrees(y64),
                     np.sqrt(y64) + np.exp(x64) + np.log(y64) + np.tanh(x64), x64 / y64 + np.fmod(x64, y64)], axis=1)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    scaled = (x * np.float32(4.0)).astype(np.float32)
    np.testing.assert_array_equal(rounded[:, 0], np.floor(scaled).astype(np.int32))
    np.testing.assert_array_equal(rounded[:, 1], np.trunc(scaled).astype(np.int32))
    shifted = (x * np.float32(-100.0)).astype(np.int32).view(np.uint32) >> 3
    np.testing.assert_array_equal(rounded[:, 2], shifted.view(np.int32))
    hundred = (x * np.float32(100.0)).astype(np.int32)
    np.testing.assert_array_equal(rounded[:, 3], np.trunc(hundred / 7).astype(np.int32))


def test_vector_math_by_keyword(arch, rng):
    a = rng.uniform(-1.0, 1.0, (N, 3)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (N, 3)).astype(np.float32)
    out = np.zeros((N, 5), np.float32)
    vector_math(a, b, out)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cross = np.cross(a64, b64)
    mats = np.stack([np.stack([2.0 + a64[:, 0], a64[:, 1]], 1), np.stack([b64[:, 0], 2.0 + b64[:, 1]], 1)], 1)
    inv = np.linalg.inv(mats)
    want = np.stack([np.sum(a64 * b64, 1), np.linalg.norm(a64, axis=1), np.linalg.norm(a64 - b64, axis=1),
                     cross @ [1.0, 2.0, 3.0], inv[:, 0, 0] + 2 * inv[:, 0, 1] + 3 * inv[:, 1, 0] + 4 * inv[:, 1, 1]],
                    axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_atomics_by_keyword(arch, rng):
    values = rng.integers(-1000, 1000, 64).astype(np.int32)
    acc = np.array([0, -(1 << 30), 1 << 30, 0, 0], np.int32)
    atomics(values, acc)
    np.testing.assert_array_equal(acc, [values.sum(), values.max(), values.min(), np.bitwise_or.reduce(values),
                                        -values.sum()])


def test_fill_by_keyword_in_kernels(arch, rng):
    level = np.float32(rng.uniform(1.0, 2.0))
    f = qd.field(qd.f32, shape=5)
    out = np.zeros(4, np.float32)
    fills(f, out, level)
    np.testing.assert_array_equal(f.to_numpy(), np.full(5, level))
    np.testing.assert_allclose(out, 2 * level * np.arange(4, dtype=np.float32), rtol=1e-6)


def test_fields_by_keyword(arch, rng):
    f = qd.field(qd.f32, shape=(3, 4), order="ji", name="f", offset=(0, 0), needs_grad=False)
    assert f.layout == (1, 0)  # j outermost in storage, as Quadrants' order="ji"
    data = rng.standard_normal((3, 4)).astype(np.float32)
    f.from_numpy(data)
    np.testing.assert_array_equal(f.to_numpy(copy=True), data)
    np.testing.assert_array_equal(f.to_numpy(copy=None), data)
    f.fill(val=2.5)
    np.testing.assert_array_equal(f.to_numpy(), np.full((3, 4), 2.5, np.float32))
    m = qd.Matrix.field(n=2, m=3, dtype=qd.f32, shape=5, order=None, name="m", offset=None, ndim=2)
    m.fill(val=1.5)
    np.testing.assert_array_equal(m.to_numpy(), np.full((5, 2, 3), 1.5, np.float32))
    v = qd.Vector.field(3, qd.f32, 4, None, "v")  # Quadrants' positions: shape, order, name
    assert v.shape == (4,) and v.name == "v"
    s = qd.Struct.field({"a": qd.f32, "b": qd.i32}, methods={}, shape=2, name="s")
    s.fill(val=3)
    np.testing.assert_array_equal(s.to_numpy()["b"], [3, 3])
    nd = qd.ndarray(qd.f32, shape=3)
    nd.fill(val=4.0)
    np.testing.assert_array_equal(nd.to_numpy(), [4.0, 4.0, 4.0])


def test_to_numpy_copy_false_is_the_fields_memory_or_an_error(arch):
    f = qd.field(qd.i32, shape=6)
    if arch != "cpu":  # device memory: no host view to share
        with pytest.raises(ValueError, match="copy=False"):
            f.to_numpy(copy=False)
        return
    view = f.to_numpy(copy=False)
    f.fill(val=7)
    np.testing.assert_array_equal(view, np.full(6, 7))  # written through
    with pytest.raises(ValueError, match="conversion"):
        f.to_numpy(np.float64, copy=False)
    with pytest.raises(ValueError, match="layout"):
        qd.field(qd.i32, shape=(2, 3), order="ji").to_numpy(copy=False)


def test_field_options_qdc_cannot_honour_are_errors():
    with pytest.raises(NotImplementedError, match="offset"):
        qd.field(qd.f32, shape=4, offset=2)
    with pytest.raises(ValueError, match="order"):
        qd.field(qd.f32, shape=(2, 3), order="ik")
    with pytest.raises(ValueError, match="ndim"):
        qd.Matrix.field(2, 2, qd.f32, shape=3, ndim=1)


def test_python_scope_by_keyword():
    assert qd.sin(x=0.5) == pytest.approx(np.sin(0.5))
    assert qd.atan2(x1=1.0, x2=2.0) == pytest.approx(np.arctan2(1.0, 2.0))
    assert qd.pow(base=2.0, exponent=3.0) == 8.0
    assert qd.select(cond=False, x1=1, x2=2) == 2
    assert qd.floor(x=2.5, dtype=qd.i32) == 2
    assert qd.math.clamp(x=5.0, xmin=0.0, xmax=1.0) == 1.0
    assert qd.math.dot(x=[1.0, 2.0], y=[3.0, 4.0]) == 11.0
    assert qd.math.length(x=[3.0, 4.0]) == 5.0
    np.testing.assert_allclose(qd.math.inverse(mat=np.eye(2) * 2.0), np.eye(2) / 2.0)
    assert qd.raw_div(x1=-7, x2=2) == -3 and qd.raw_mod(x1=-7, x2=2) == -1
    assert qd.bit_shr(x1=-1, x2=28) == 15
    assert qd.static(x=3) == 3
    assert list(qd.grouped(x=qd.ndrange(2))) == [(0,), (1,)]
    assert qd.types.vector(n=3, dtype=qd.f32, unpacked=True) == qd.types.vector(3, qd.f32)
    assert qd.ad.no_grad(func=lambda: 5)() == 5
    mat = qd.Matrix([[1.0, 2.0], [3.0, 4.0]])
    mat.fill(val=7.0)
    np.testing.assert_array_equal(mat.to_numpy(), np.full((2, 2), 7.0))


def test_func_options(arch):
    @qd.func(is_real_function=True)
    def twice(v):
        return 2 * v

    @qd.func(requires_top_level=True)
    def top(out: qd.template()):
        for i in range(out.shape[0]):
            out[i] = twice(i)

    @qd.kernel
    def run(out: qd.types.ndarray(qd.i32, ndim=1)):
        top(out)

    out = np.zeros(5, np.int32)
    run(out)
    np.testing.assert_array_equal(out, 2 * np.arange(5))


def test_requires_top_level_nested_is_a_compile_error(tmp_path):
    error, _ = compile_error_of(tmp_path, "nested_top_level", """
        import qdc as qd
        qd.init(arch=qd.cpu)

        @qd.func(requires_top_level=True)
        def phase(out: qd.template()):
            for i in range(out.shape[0]):
                out[i] = i

        @qd.kernel
        def bad(out: qd.types.ndarray(qd.i32, ndim=1), flag: qd.i32):
            if flag > 0:
                phase(out)
        """, np.zeros(3, np.int32), 1)
    assert "requires_top_level" in str(error)


def test_kernel_options(arch):
    @qd.kernel(pure=True, fastcache=True, checkpoints=False)
    def run(out: qd.types.ndarray(qd.i32, ndim=1)):
        for i in range(out.shape[0]):
            out[i] = i + 1

    out = np.zeros(4, np.int32)
    run(out)
    np.testing.assert_array_equal(out, np.arange(1, 5))
    with pytest.raises(NotImplementedError, match="checkpoints"):
        qd.kernel(checkpoints=True, graph=True)


def test_loop_config_bit_vectorize(arch):
    @qd.kernel
    def run(out: qd.types.ndarray(qd.i32, ndim=1)):
        qd.loop_config(bit_vectorize=True, block_dim=32)
        for i in range(out.shape[0]):
            out[i] = i * i

    out = np.zeros(9, np.int32)
    run(out)
    np.testing.assert_array_equal(out, np.arange(9) ** 2)


def test_bad_keyword_names_the_parameter(tmp_path):
    error, _ = compile_error_of(tmp_path, "bad_keyword", """
        import qdc as qd
        qd.init(arch=qd.cpu)

        @qd.kernel
        def bad(a: qd.types.ndarray(qd.i32, ndim=1)):
            for i in range(a.shape[0]):
                qd.atomic_add(target=a[0], value=1)
        """, np.zeros(2, np.int32))
    assert "atomic_add() has no parameter 'target' (it takes x, y)" in str(error)
