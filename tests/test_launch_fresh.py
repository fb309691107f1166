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
    with pytest.raises(ValueError, match="not C-contiguous"):
        scale_into(out, np.zeros(16, np.float32)[::2], 2.0)
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
    assert "_q_pack_object(_q_mem, 0, _q_id(out), -1)" in "\n".join(launcher.body({0: True, 1: True}))
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
