"""8- and 16-bit elements at the end of an array whose byte size is not a multiple of 4: an
atomic on such an element is a compare-and-swap of the 32-bit word holding it, so the bound
range must cover that whole word (it once ended at the array's last byte and the atomic on the
last elements silently did nothing). Checked against numpy on ndarrays and fields of every
length 1-9; skipped without a Vulkan device."""
import numpy as np
import pytest

import qdc as qd


NARROW = [(qd.i8, np.int8), (qd.u8, np.uint8), (qd.i16, np.int16), (qd.u16, np.uint16)]


@pytest.mark.parametrize("dtype,np_dtype", NARROW, ids=[d.name for d, _ in NARROW])
def test_atomics_and_stores_reach_the_last_narrow_elements(vulkan_runtime, rng, dtype, np_dtype):
    for n in range(1, 10):
        start = rng.integers(0, 50, n).astype(np_dtype)
        adds = rng.integers(1, 50, n).astype(np_dtype)
        x = qd.ndarray(dtype, shape=(n,))
        x.from_numpy(start)
        y = qd.ndarray(dtype, shape=(n,))
        f = qd.field(dtype, shape=n)
        f.from_numpy(start)

        @qd.kernel
        def bump(x: qd.types.ndarray(dtype, ndim=1), y: qd.types.ndarray(dtype, ndim=1),
                 a: qd.types.ndarray(dtype, ndim=1)):
            for i in x:
                qd.atomic_add(x[i], a[i])
                qd.atomic_add(f[i], a[i])
                y[i] = a[i]

        a = qd.ndarray(dtype, shape=(n,))
        a.from_numpy(adds)
        bump(x, y, a)
        want = (start.astype(np.int64) + adds).astype(np_dtype)
        np.testing.assert_array_equal(x.to_numpy(), want, err_msg=f"ndarray of {n}")
        np.testing.assert_array_equal(f.to_numpy(), want, err_msg=f"field of {n}")
        np.testing.assert_array_equal(y.to_numpy(), adds, err_msg=f"stores into {n}")
