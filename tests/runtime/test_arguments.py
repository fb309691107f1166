"""Kernel arguments: binding, conversion, zero-copy numpy arrays, the launcher's identity cache,
and the errors for every kind of argument mistake (each names the kernel and the parameter)."""
import numpy as np
import pytest

import qdc as qd


@qd.kernel
def axpy(y: qd.types.ndarray(dtype=qd.f32, ndim=1), x: qd.types.ndarray(dtype=qd.f32, ndim=1),
         alpha: qd.f32, shift: qd.i32):
    for i in range(y.shape[0]):
        y[i] = alpha * x[i] + y[i] + shift


@qd.kernel
def stamp(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        a[i, j] = i * 1000 + j


@qd.kernel
def stamp3(a: qd.types.ndarray(dtype=qd.i32, ndim=3)):
    for i, j, k in qd.ndrange(a.shape[0], a.shape[1], a.shape[2]):
        a[i, j, k] = i * 10000 + j * 100 + k


@qd.kernel
def pick(out: qd.types.ndarray(dtype=qd.f64, ndim=1), flag: qd.u1, big: qd.i64, small: qd.u8, w: qd.f64):
    for i in range(1):
        out[0] = w if flag else -w
        out[1] = big
        out[2] = small


def stamp_reference(shape):
    i, j = np.indices(shape)
    return (i * 1000 + j).astype(np.int32)


def axpy_reference(y, x, alpha, shift):
    return (np.float32(alpha) * x + y + np.float32(shift)).astype(np.float32)


def raises_naming(exc, kernel, param, *fragments):
    """pytest.raises that also checks the message names the kernel and the parameter."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{f})" for f in
                                                     (f"'{kernel}'", f"'{param}'") + fragments))


def test_numpy_arguments_are_zero_copy(arch, rng):
    y, x = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    expected = axpy_reference(y, x, 1.5, 3)
    y_id = y.ctypes.data
    axpy(y, x, 1.5, 3)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    assert y.ctypes.data == y_id  # written in place, not into a copy


def test_same_array_passed_again_sees_host_writes(arch, rng):
    y, x = np.zeros(100, np.float32), rng.random(100, dtype=np.float32)
    for _ in range(3):
        y[:] = rng.random(100, dtype=np.float32)  # changes the data, not the object
        expected = axpy_reference(y, x, -2.0, 1)
        axpy(y, x, -2.0, 1)
        np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_alternating_arrays_rebind_every_time(arch, rng):
    arrays = [rng.random(n, dtype=np.float32) for n in (10, 300, 10)]
    xs = [rng.random(len(a), dtype=np.float32) for a in arrays]
    for _ in range(2):
        for y, x in zip(arrays, xs):
            expected = axpy_reference(y, x, 0.5, -4)
            axpy(y, x, 0.5, -4)
            np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_keyword_arguments_and_scalar_conversions(arch, rng):
    y, x = rng.random(50, dtype=np.float32), rng.random(50, dtype=np.float32)
    for alpha, shift in [(2, True), (np.float32(0.25), np.int64(-7)), (np.float64(1.75), np.int8(3))]:
        expected = axpy_reference(y, x, float(alpha), int(shift))
        axpy(shift=shift, alpha=alpha, x=x, y=y)
        np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_scalar_types_reach_the_kernel_exactly(arch):
    out = np.zeros(3, np.float64)
    pick(out, True, 2**40 + 3, 255, 0.1)
    assert out.tolist() == [0.1, float(2**40 + 3), 255.0]
    pick(out, np.bool_(False), -(2**62), 0, 2.5)
    assert out.tolist() == [-2.5, float(-(2**62)), 0.0]
    pick(out, 0, 5, 1, 1.0)
    assert out[0] == -1.0


def test_inplace_reshape_of_a_cached_array_is_seen(arch):
    a = np.zeros((4, 6), np.int32)
    stamp(a)
    np.testing.assert_array_equal(a, stamp_reference((4, 6)))
    a.shape = (6, 4)  # same object and data pointer, new shape
    stamp(a)
    np.testing.assert_array_equal(a, stamp_reference((6, 4)))
    b = np.zeros((2, 3, 4), np.int32)
    stamp3(b)
    b.shape = (2, 4, 3)
    stamp3(b)
    i, j, k = np.indices((2, 4, 3))
    np.testing.assert_array_equal(b, i * 10000 + j * 100 + k)


def test_inplace_reshape_to_another_rank_is_rejected(arch, rng):
    y, x = rng.random(16, dtype=np.float32), rng.random(16, dtype=np.float32)
    axpy(y, x, 1.0, 0)
    y.shape = (4, 4)
    with raises_naming(ValueError, "axpy", "y", "ndim=2"):
        axpy(y, x, 1.0, 0)


def test_ndarray_dtype_and_rank_errors(arch, rng):
    y32, x32 = rng.random(8, dtype=np.float32), rng.random(8, dtype=np.float32)
    with raises_naming(TypeError, "axpy", "x", "float64"):
        axpy(y32, x32.astype(np.float64), 1.0, 0)
    with raises_naming(TypeError, "axpy", "y", "int32"):
        axpy(y32.astype(np.int32), x32, 1.0, 0)
    with raises_naming(ValueError, "axpy", "x", "ndim=2"):
        axpy(y32, x32.reshape(2, 4), 1.0, 0)
    with raises_naming(TypeError, "stamp", "a", "f32"):
        stamp(qd.ndarray(qd.f32, (2, 2)))
    with raises_naming(ValueError, "stamp", "a", "ndim=1"):
        stamp(qd.ndarray(qd.i32, 4))
    with raises_naming(TypeError, "axpy", "y", "list"):
        axpy(y32.tolist(), x32, 1.0, 0)
    with raises_naming(TypeError, "axpy", "x", "field"):
        axpy(y32, qd.field(qd.i32, 8), 1.0, 0)


def test_a_field_is_an_array_argument(arch, rng):
    """A field passed to an ndarray parameter is bound as the array it is (Quadrants' `qd.Tensor`
    parameters take fields and ndarrays alike)."""
    y, x0 = rng.random(8, dtype=np.float32), rng.random(8, dtype=np.float32)
    x = qd.field(qd.f32, 8)
    x.from_numpy(x0)
    expected = 2.0 * x0 + y + 1
    axpy(y, x, 2.0, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    out = qd.field(qd.f32, 8)
    axpy(out, x, 1.0, 0)
    np.testing.assert_allclose(out.to_numpy(), x0, rtol=1e-6)


def test_non_contiguous_arrays_are_copied_in_and_written_back(arch, rng):
    y, x = rng.random(32, dtype=np.float32), rng.random(32, dtype=np.float32)
    want = y.copy()
    want[1::2] += np.float32(2.0) * x[::2]
    axpy(y[1::2], x[::2], 2.0, 0)  # written (y) and read (x) through strided views
    np.testing.assert_allclose(y, want, rtol=1e-6)
    f = np.zeros((3, 5), np.int32, order="F")
    stamp(f)
    np.testing.assert_array_equal(f, stamp_reference((3, 5)))
    whole = np.full((6, 5), -1, np.int32)
    stamp(whole[:, 1:])
    np.testing.assert_array_equal(whole[:, 1:], stamp_reference((6, 4)))
    np.testing.assert_array_equal(whole[:, 0], -1)  # outside the view: untouched
    with raises_naming(ValueError, "stamp", "a", "read-only"):  # no copy could be written back
        stamp(np.broadcast_to(np.zeros(5, np.int32), (3, 5)))


def test_scalar_errors(arch, rng):
    y, x = rng.random(8, dtype=np.float32), rng.random(8, dtype=np.float32)
    with raises_naming(TypeError, "axpy", "alpha", "str"):
        axpy(y, x, "2.0", 0)
    with raises_naming(TypeError, "axpy", "alpha", "NoneType"):
        axpy(y, x, None, 0)
    with raises_naming(TypeError, "axpy", "shift", "float"):
        axpy(y, x, 1.0, 2.5)
    with raises_naming(TypeError, "axpy", "shift", "float32"):
        axpy(y, x, 1.0, np.float32(2))
    with raises_naming(ValueError, "axpy", "shift", "out of range"):
        axpy(y, x, 1.0, 2**31)
    with raises_naming(ValueError, "axpy", "alpha", "out of range"):
        axpy(y, x, 1e39, 0)
    out = np.zeros(3, np.float64)
    with raises_naming(ValueError, "pick", "small", "out of range"):
        pick(out, True, 1, -1, 1.0)
    with raises_naming(TypeError, "pick", "flag", "str"):
        pick(out, "yes", 1, 1, 1.0)
    with raises_naming(TypeError, "pick", "flag", "2"):
        pick(out, 2, 1, 1, 1.0)


def test_argument_count_errors(arch, rng):
    y, x = rng.random(8, dtype=np.float32), rng.random(8, dtype=np.float32)
    with pytest.raises(TypeError, match=r"axpy\(\) missing 1 required positional argument: 'shift'"):
        axpy(y, x, 1.0)  # Python's own message: it costs the launch nothing
    with pytest.raises(TypeError, match=r"axpy\(\) takes 4 positional arguments but 5 were given"):
        axpy(y, x, 1.0, 0, 7)
    with pytest.raises(TypeError, match="axpy.*unexpected keyword argument 'beta'"):
        axpy(y, x, 1.0, 0, beta=2)
    with pytest.raises(TypeError, match="axpy.*multiple values for argument 'y'"):
        axpy(y, x, 1.0, 0, y=y)


def test_rejected_launch_runs_nothing_and_the_next_one_works(arch, rng):
    y, x = rng.random(64, dtype=np.float32), rng.random(64, dtype=np.float32)
    axpy(y, x, 1.0, 1)  # y is now the cached array of parameter 'y'
    before = y.copy()
    other = rng.random(64, dtype=np.float32)
    other_before = other.copy()
    with pytest.raises(TypeError):
        axpy(other, x, "bad", 1)  # 'y' rebinds to `other` before the scalar is rejected
    np.testing.assert_array_equal(y, before)
    expected = axpy_reference(y, x, 2.0, 0)
    axpy(y, x, 2.0, 0)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_array_equal(other, other_before)


def test_qd_ndarray_arguments(arch, rng):
    y, x = qd.ndarray(qd.f32, 100), qd.ndarray(qd.f32, (100,), needs_grad=True)
    yn, xn = rng.random(100, dtype=np.float32), rng.random(100, dtype=np.float32)
    y.from_numpy(yn)
    x.from_numpy(xn)
    axpy(y, x, 3.0, -1)
    np.testing.assert_allclose(y.to_numpy(), axpy_reference(yn, xn, 3.0, -1), rtol=1e-6)
    axpy(y, xn, 1.0, 0)  # a numpy array and a qd.ndarray in one launch
    np.testing.assert_allclose(y.to_numpy(), axpy_reference(axpy_reference(yn, xn, 3.0, -1), xn, 1.0, 0),
                               rtol=1e-6)


@qd.kernel
def shadowing(len: qd.types.ndarray(dtype=qd.i32, ndim=1), bool: qd.u1):
    for i in range(len.shape[0]):
        len[i] = i if bool else -i


def test_parameters_named_like_builtins_the_launcher_uses(arch, rng):
    n = int(rng.integers(3, 50))
    a = np.zeros(n, np.int32)
    for flag in (True, 0, np.bool_(True), False):
        shadowing(a, flag)
        np.testing.assert_array_equal(a, np.arange(n) * (1 if flag else -1))
