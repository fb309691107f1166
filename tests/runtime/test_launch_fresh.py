"""A launch with a different numpy array on every call binds it in the launch code itself
(runtime/launcher.py, `rebind_numpy`): every check of the full bind still holds for arrays
that come after a cached one (class, dtype, ndim, C-contiguity, writability, shape)."""
import numpy as np
import pytest

import qdc as qd

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def scale_into(out: F32_1D, a: F32_1D, w: qd.f32):
    for i in range(out.shape[0]):
        out[i] = w * a[i]


@qd.kernel
def fill3(a: qd.types.ndarray(dtype=qd.i32, ndim=3)):
    for i, j, k in qd.ndrange(a.shape[0], a.shape[1], a.shape[2]):
        a[i, j, k] = i * 10000 + j * 100 + k


def test_a_different_array_every_call_gets_its_own_data_and_shape(rng):
    for n in [5, 37, 37, 1, 64, 37]:  # sizes repeat and change; every array is new
        a, out = rng.random(n, dtype=np.float32), np.full(n + 3, -1, np.float32)[:n]
        w = float(rng.random())
        scale_into(out, a, w)
        np.testing.assert_allclose(out, np.float32(w) * a, rtol=1e-6)
    assert scale_into.__qdc_launcher__.kinds == {0: True, 1: True}  # the specialised code ran


def test_fresh_arrays_of_three_dimensions():
    for shape in [(2, 3, 4), (4, 3, 2), (1, 1, 7), (3, 3, 3)]:
        a = np.zeros(shape, np.int32)
        fill3(a)
        i, j, k = np.indices(shape)
        np.testing.assert_array_equal(a, i * 10000 + j * 100 + k)


def test_every_check_holds_for_an_array_after_a_cached_one(rng):
    a, out = rng.random(8, dtype=np.float32), np.zeros(8, np.float32)
    scale_into(out, a, 2.0)  # caches numpy arrays for both parameters
    with pytest.raises(TypeError, match="dtype float64"):
        scale_into(out, a.astype(np.float64), 2.0)
    with pytest.raises(TypeError, match="dtype >f4"):
        scale_into(out, a.astype(">f4"), 2.0)  # equal item size, not the builtin dtype
    with pytest.raises(ValueError, match="ndim=2"):
        scale_into(out, a.reshape(2, 4), 2.0)
    scale_into(out, np.arange(16, dtype=np.float32)[::2], 2.0)  # not C-contiguous: copied in
    np.testing.assert_array_equal(out, 4 * np.arange(8, dtype=np.float32))
    read_only = np.zeros(8, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        scale_into(read_only, a, 2.0)
    with pytest.raises(TypeError, match="expected an ndarray of f32"):
        scale_into(out, [1.0] * 8, 2.0)
    scale_into(out, a, 3.0)  # still launches after the refusals
    np.testing.assert_allclose(out, np.float32(3.0) * a, rtol=1e-6)


def test_what_the_fast_path_leaves_to_the_full_bind_is_accepted(rng):
    a, out = rng.random(8, dtype=np.float32), np.zeros(8, np.float32)
    scale_into(out, a, 1.0)
    read_only = a.copy()
    read_only.flags.writeable = False  # fine for a parameter the kernel only reads
    scale_into(out, read_only, 2.0)
    np.testing.assert_allclose(out, np.float32(2.0) * a, rtol=1e-6)

    class Sub(np.ndarray):
        pass
    scale_into(out, a.view(Sub), 4.0)
    np.testing.assert_allclose(out, np.float32(4.0) * a, rtol=1e-6)
    scale_into(np.zeros(0, np.float32), np.zeros(0, np.float32), 1.0)  # empty: no byte to export
    d = qd.ndarray(qd.f32, shape=(8,))
    d.from_numpy(a)
    scale_into(out, d, 5.0)  # a qd.ndarray after numpy arrays, then numpy again
    np.testing.assert_allclose(out, np.float32(5.0) * a, rtol=1e-6)
    scale_into(out, a.copy(), 6.0)
    np.testing.assert_allclose(out, np.float32(6.0) * a, rtol=1e-6)


def test_an_array_made_read_only_after_a_fresh_bind_is_refused(rng):
    a = rng.random(8, dtype=np.float32)
    scale_into(np.zeros(8, np.float32), a, 1.0)
    out = np.zeros(8, np.float32)
    scale_into(out, a, 1.0)  # bound in the launch code
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        scale_into(out, a, 1.0)


def test_the_kernel_entry_binds_numpy_arrays_and_refuses_to_python_what_it_cannot(rng):
    """runtime/devices/cpu/numpy_binding.py: the launch code passes a numpy array's address and
    the library's entry checks and binds it; an array it refuses is bound in Python."""
    from qdc.runtime.devices.cpu.numpy_binding import numpy_layout_matches
    assert numpy_layout_matches()
    a, out = rng.random(8, dtype=np.float32), np.zeros(8, np.float32)
    scale_into(out, a, 1.0)
    launcher = scale_into.__qdc_launcher__
    assert launcher.binding is not None and launcher.binding.params == [0, 1]
    assert launcher.python is not None  # every argument bound by the library's Python entry
    assert "_q_fast(out, a, w, )" in "\n".join(launcher.body({0: True, 1: True}))
    # a cached qd.ndarray is bound by the launch code and passed to the entry as the runtime's
    # KEPT marker (`...` in the source, the constant KEPT in the code); a watched tensor goes as
    # itself (the entry checks where its data is)
    assert launcher.python.keeps_bound and "_q_fast(out, ..., w, )" in "\n".join(launcher.body({0: True, 1: False}))
    assert launcher.python.watches and "_q_fast(out, a, w, )" in "\n".join(launcher.body({0: True, 1: "watched"}))
    with pytest.raises(TypeError, match="argument 'a'.*NoneType"):  # None never stands for bound words
        scale_into(out, None, 1.0)
    tagged = np.dtype(np.float32, metadata={"unit": "m"})  # equal to f32, but not numpy's own object
    b = a.astype(tagged)
    assert b.dtype == np.float32 and b.dtype is not np.dtype(np.float32)
    scale_into(out, b, 2.0)
    np.testing.assert_allclose(out, np.float32(2.0) * a, rtol=1e-6)
    for n in [3, 8, 1]:  # fresh arrays after a refusal
        x, o = rng.random(n, dtype=np.float32), np.zeros(n, np.float32)
        scale_into(o, x, 3.0)
        np.testing.assert_allclose(o, np.float32(3.0) * x, rtol=1e-6)
    with pytest.raises(TypeError, match="dtype float64"):
        scale_into(out, a.astype(np.float64), 2.0)
    scale_into(out, a, 4.0)  # the refused array did not stay bound
    np.testing.assert_allclose(out, np.float32(4.0) * a, rtol=1e-6)


def test_an_array_bound_by_the_entry_is_rechecked_after_an_in_place_change(rng):
    a = rng.random(12, dtype=np.float32)
    out = np.zeros(12, np.float32)
    scale_into(np.zeros(12, np.float32), a, 1.0)
    scale_into(out, a, 1.0)  # bound by the entry, then cached
    out.shape = (3, 4)  # same object, now 2-d
    with pytest.raises(ValueError, match="ndim=2"):
        scale_into(out, a, 1.0)
    out.shape = (12,)
    scale_into(out, a, 5.0)
    np.testing.assert_allclose(out, np.float32(5.0) * a, rtol=1e-6)


@qd.kernel
def mix(out: qd.types.ndarray(dtype=qd.f32, ndim=2), a: F32_1D, w: qd.f32, n: qd.i32, u: qd.u8,
        flip: qd.u1, d: qd.f64, big: qd.u64):
    for i, j in qd.ndrange(out.shape[0], out.shape[1]):
        v = w * a[j] + n + u + d + qd.cast(big % 1000, qd.f32)
        if flip:
            v = -v
        out[i, j] = v


def _mix_reference(out_shape, a, w, n, u, flip, d, big):
    v = np.float32(w) * a + np.float32(n) + np.float32(u) + np.float32(d) + np.float32(int(big) % 1000)
    return np.broadcast_to(-v if flip else v, out_shape)


def test_the_python_entry_binds_every_argument_of_every_call(rng):
    """runtime/devices/cpu/numpy_binding.py, PythonEntry: fresh arrays and scalars on every call,
    bound by the library itself, against numpy."""
    for t in range(8):
        rows, cols = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        a, out = rng.random(cols, dtype=np.float32), np.zeros((rows, cols), np.float32)
        args = (float(rng.normal()), int(rng.integers(-2**31, 2**31)), int(rng.integers(0, 256)), bool(t % 2),
                float(rng.normal()), int(rng.integers(0, 2**63)))
        mix(out, a, *args)
        np.testing.assert_allclose(out, _mix_reference(out.shape, a, *args), rtol=1e-5, atol=1e-3)
    assert mix.__qdc_launcher__.python is not None
    assert mix.__code__ is mix.__qdc_launcher__.fast_code and "_q_fast(" in mix.__qdc_launcher__.body(mix.__qdc_launcher__.kinds)[0]


def test_what_the_python_entry_leaves_to_python_is_bound_there(rng):
    a, out = rng.random(4, dtype=np.float32), np.zeros((2, 4), np.float32)
    mix(out, a, 1.0, 1, 1, False, 1.0, 1)
    accepted = [(2, np.int32(3), True, 1, np.float64(0.5), 2**64 - 1),  # int for a float, numpy scalars,
                (np.float32(2), 3, np.uint8(7), np.bool_(True), 1, np.uint64(5)),  # a bool for an int, 0/1
                (2.0, 3, 7, 0, -1.5, 2**63)]  # for a bool, a u64 beyond i64
    for args in accepted:
        mix(out, a, *args)
        np.testing.assert_allclose(out, _mix_reference(out.shape, a, *args), rtol=1e-5, atol=1e-3)
    d = qd.ndarray(qd.f32, shape=(4,))
    d.from_numpy(a)
    mix(out, d, 2.0, 0, 0, False, 0.0, 0)  # a qd.ndarray, then numpy arrays again
    np.testing.assert_allclose(out, _mix_reference(out.shape, a, 2.0, 0, 0, False, 0.0, 0), rtol=1e-6)
    mix(out, a.copy(), 3.0, 0, 0, False, 0.0, 0)
    np.testing.assert_allclose(out, _mix_reference(out.shape, a, 3.0, 0, 0, False, 0.0, 0), rtol=1e-6)


@pytest.mark.parametrize("index, value, error, message", [
    (3, 2**31, ValueError, "'n': 2147483648 is out of range for i32"),
    (3, -2**31 - 1, ValueError, "out of range for i32"),
    (4, 256, ValueError, "'u': 256 is out of range for u8"),
    (4, -1, ValueError, "out of range for u8"),
    (2, 1e39, ValueError, "'w': 1e\\+39 is out of range for f32"),
    (2, "1.0", TypeError, "'w': expected a f32 scalar"),
    (5, 2, TypeError, "'flip': expected a u1"),
    (7, -1, ValueError, "'big': -1 is out of range for u64"),
    (1, np.zeros(4, np.float64), TypeError, "dtype float64"),
    (0, np.zeros(8, np.float32), ValueError, "ndim=2"),
])
def test_the_python_entry_refuses_what_python_refuses(index, value, error, message):
    args = [np.zeros((2, 4), np.float32), np.ones(4, np.float32), 1.0, 1, 1, False, 1.0, 1]
    mix(*args)
    args[index] = value
    with pytest.raises(error, match=message):
        mix(*args)
    args[index] = [np.zeros((2, 4), np.float32), np.ones(4, np.float32), 1.0, 1, 1, False, 1.0, 1][index]
    mix(*args)  # and launches again


def test_f32_infinities_and_nans_pass_as_struct_packs_them():
    out, a = np.zeros((1, 2), np.float32), np.ones(2, np.float32)
    mix(out, a, float("inf"), 0, 0, False, 0.0, 0)
    assert np.isposinf(out).all()
    mix(out, a, float("nan"), 0, 0, False, 0.0, 0)
    assert np.isnan(out).all()


def test_the_generic_launch_never_trusts_words_the_python_entry_rewrote(rng):
    """A slow path (an owner's stub, a Tape) launches through the generic code between fast
    launches: it must bind its numpy arrays again, not take them for cached."""
    scale_into(np.zeros(1, np.float32), np.zeros(1, np.float32), 1.0)  # loaded here, whatever ran before
    launcher = scale_into.__qdc_launcher__
    x, y = rng.random(6, dtype=np.float32), rng.random(6, dtype=np.float32)
    ox, oy = np.zeros(6, np.float32), np.zeros(6, np.float32)
    launcher.launch(ox, x, 1.0)
    scale_into(oy, y, 1.0)  # the Python entry rewrites the words
    launcher.launch(ox, x, 2.0)
    np.testing.assert_allclose(ox, np.float32(2.0) * x, rtol=1e-6)
    np.testing.assert_allclose(oy, y, rtol=1e-6)


def test_a_parallel_kernel_through_the_python_entry(rng):
    n = 1 << 16
    a, out = rng.random(n, dtype=np.float32), np.zeros(n, np.float32)
    for w in (0.5, -2.0):
        scale_into(out, a.copy(), w)
        np.testing.assert_allclose(out, np.float32(w) * a, rtol=1e-6)


def test_without_the_python_entry_new_arrays_are_bound_by_the_numpy_entry(rng, monkeypatch):
    """Where the Python entry is not used (an interpreter whose objects it cannot read), a new
    numpy array's address goes into the ctx and the library's numpy entry binds it."""
    from qdc.runtime.devices.cpu import numpy_binding
    monkeypatch.setattr(numpy_binding, "_python_layout", False)

    @qd.kernel
    def scale_shift(out: F32_1D, a: F32_1D, w: qd.f32, s: qd.i32):
        for i in range(out.shape[0]):
            out[i] = w * a[i] + s

    for n in [4, 9, 9, 1]:
        a, out = rng.random(n, dtype=np.float32), np.zeros(n, np.float32)
        scale_shift(out, a, 2.0, n)
        np.testing.assert_allclose(out, np.float32(2.0) * a + n, rtol=1e-6)
    launcher = scale_shift.__qdc_launcher__
    assert launcher.python is None and "_q_pack_object(_q_mem, 16, _q_id(a), -1)" in \
        "\n".join(launcher.body(launcher.kinds))
    a, out = rng.random(5, dtype=np.float32), np.zeros(5, np.float32)
    with pytest.raises(ValueError, match="'s': 4294967296 is out of range for i32"):
        scale_shift(out, a, 1.0, 2**32)
    scale_shift(out, a, 3.0, 1)  # the same arrays again
    np.testing.assert_allclose(out, np.float32(3.0) * a + 1, rtol=1e-6)
    scale_shift(out, np.zeros(10, np.float32)[::2], 1.0, 1)  # not C-contiguous: copied in
    np.testing.assert_array_equal(out, np.ones(5, np.float32))
    scale_shift(out, a, 4.0, 0)
    np.testing.assert_allclose(out, np.float32(4.0) * a, rtol=1e-6)
