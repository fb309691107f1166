"""DLPack (runtime/dlpack.py, runtime/dlpack_capsule.py) and conversions: qd.ndarray's __dlpack__, qd.from_dlpack, DLPack
arrays as kernel arguments, Field/ndarray .to_torch()/.from_torch(); round trips with numpy
(which needs no torch) and torch."""
import gc

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import dlpack_capsule


@qd.kernel
def add_index(a: qd.types.ndarray()):
    for i in range(a.shape[0]):
        a[i] = a[i] + i


DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
          np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ndarray_to_numpy_and_back_without_copies(dtype):
    a = qd.ndarray(dtype, (3, 4))
    a.from_numpy(np.arange(12).reshape(3, 4).astype(dtype))
    view = np.from_dlpack(a)  # numpy reads our capsule
    assert view.dtype == dtype and view.shape == (3, 4)
    view[1, 2] = 7
    assert a[1, 2] == 7
    back = qd.from_dlpack(view)  # and we read numpy's
    assert back.dtype == a.dtype and back.shape == (3, 4)
    assert back.allocation().ptr == a.allocation().ptr


def test_from_dlpack_wraps_in_place_and_kernels_write_through():
    host = np.zeros(5, np.int32)
    wrapped = qd.from_dlpack(host)
    add_index(wrapped)
    np.testing.assert_array_equal(host, np.arange(5))
    wrapped[0] = 40
    assert host[0] == 40
    np.testing.assert_array_equal(wrapped.to_numpy(), host)


def test_from_dlpack_refuses_what_it_cannot_use_in_place():
    with pytest.raises(ValueError, match="not C-contiguous"):
        qd.from_dlpack(np.zeros((4, 4), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="no type"):
        qd.from_dlpack(np.zeros(3, np.complex64))


def test_capsules_release_what_they_hold():
    before = len(dlpack_capsule._exports)
    a = qd.ndarray(qd.f32, 8)
    capsule = a.__dlpack__()  # never consumed: freed with the capsule
    assert len(dlpack_capsule._exports) == before + 1
    del capsule
    gc.collect()
    assert len(dlpack_capsule._exports) == before
    view = np.from_dlpack(a)  # consumed: freed by the consumer's call of the deleter
    assert len(dlpack_capsule._exports) == before + 1
    del view
    gc.collect()
    assert len(dlpack_capsule._exports) == before


def test_dlpack_device_and_export_options():
    a = qd.ndarray(qd.f64, 3)
    assert a.__dlpack_device__() == (dlpack_capsule.CPU, 0)
    with pytest.raises(BufferError, match="copy=True"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        a.__dlpack__(dl_device=(dlpack_capsule.CUDA, 0))


def test_bool_ndarrays():
    a = qd.ndarray(qd.u1, 3)
    a[1] = True
    assert np.from_dlpack(a).tolist() == [False, True, False]


class OnlyDLPack:
    """An array of another library: nothing but the DLPack protocol (as JAX's or CuPy's)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None, **kwargs):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_objects_are_kernel_arguments():
    host = np.zeros(6, np.float32)
    add_index(OnlyDLPack(host))
    np.testing.assert_array_equal(host, np.arange(6))
    wrapped = qd.from_dlpack(OnlyDLPack(host))
    add_index(wrapped)
    np.testing.assert_array_equal(host, 2 * np.arange(6))


def test_torch_round_trips_and_conversions(rng):
    torch = pytest.importorskip("torch")
    a = qd.ndarray(qd.f32, (2, 3))
    t = torch.from_dlpack(a)
    t += 1.5
    np.testing.assert_array_equal(a.to_numpy(), np.full((2, 3), 1.5, np.float32))
    source = torch.arange(4, dtype=torch.int64)
    w = qd.from_dlpack(source)
    add_index(w)
    assert source.tolist() == [0, 2, 4, 6]
    values = rng.random((2, 3)).astype(np.float32)
    for array in (qd.field(qd.f32, shape=(2, 3)), qd.ndarray(qd.f32, (2, 3)), qd.Vector.field(3, qd.f32, shape=2)):
        array.from_torch(torch.from_numpy(values))
        out = array.to_torch()
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device.type == "cpu"
        np.testing.assert_array_equal(out.numpy(), values)
        out += 1  # a copy
        np.testing.assert_array_equal(array.to_numpy(), values)
        assert array.to_torch(device="cpu").shape == (2, 3)
    with pytest.raises(TypeError, match="from_torch takes a torch.Tensor"):
        qd.field(qd.f32, shape=3).from_torch(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="shape"):
        qd.field(qd.f32, shape=3).from_torch(torch.zeros(4))


@qd.kernel
def add_rows(a: qd.template()):
    for i, j in a:
        a[i, j] += i * 10 + j


def test_to_torch_without_a_copy(rng):
    """to_torch(copy=False) shares the array's memory in declared order (a permuted view of a
    field with a layout); copy=None shares where it can; a device the memory is not on refuses."""
    torch = pytest.importorskip("torch")
    values = rng.random((3, 4)).astype(np.float32)
    for array in (qd.field(qd.f32, shape=(3, 4)), qd.ndarray(qd.f32, (3, 4)),
                  qd.tensor(qd.f32, (3, 4), backend=qd.Backend.FIELD, layout=(1, 0))):
        array.from_numpy(values)
        shared = array.to_torch(copy=False)
        assert shared.shape == (3, 4)
        np.testing.assert_array_equal(shared.numpy(), values)
        shared[1, 2] = -1.0  # the array sees the tensor's writes...
        assert array[1, 2] == -1.0
        if isinstance(array, qd.Field):
            add_rows(array)  # ...and the tensor the kernel's
            expected = values.copy()
            expected[1, 2] = -1.0
            np.testing.assert_allclose(shared.numpy(), expected + np.add.outer(np.arange(3) * 10, np.arange(4)))
        assert array.to_torch(copy=None).data_ptr() == shared.data_ptr()
    with pytest.raises(ValueError, match="copy=False"):
        qd.field(qd.f32, shape=3).to_torch(device="meta", copy=False)
