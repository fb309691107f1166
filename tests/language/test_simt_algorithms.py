"""qd.algorithms.sort (compiler/language/algorithms.py) on every GPU arch the suite runs, against
numpy's stable sort: Genesis's call (u64 keys sorted in place, the values arguments the keys
themselves, an odd number of passes) and signed keys carrying values with a live count below
the arrays' length."""
import numpy as np
import pytest

import qdc as qd

pytestmark = pytest.mark.skip_arch("cpu", reason="the CPU runs no blocks of threads: qd.algorithms is GPU-only")


@qd.kernel(graph=True)
def sort_morton_keys(keys: qd.types.ndarray(qd.u64, ndim=1), scratch_keys: qd.types.ndarray(qd.u64, ndim=1),
                     scratch: qd.types.ndarray(qd.u32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    qd.algorithms.sort(keys, scratch_keys, keys, scratch_keys, scratch, n, key_dtype=qd.u64, has_values=False,
                       end_bit=24, log256_max_n=1)


def test_sort_of_u64_keys_in_place(arch, rng):
    keys = rng.integers(0, 1 << 24, 256).astype(np.uint64) | (np.uint64(7) << np.uint64(40))  # high bits unsorted
    got = qd.ndarray(qd.u64, shape=(256,))
    got.from_numpy(keys)
    scratch = qd.ndarray(qd.u32, shape=(qd.algorithms.sort_scratch_slots(256, 1),))
    n = qd.ndarray(qd.i32, shape=())
    n.from_numpy(np.array(256, np.int32))
    sort_morton_keys(got, qd.ndarray(qd.u64, shape=(256,)), scratch, n)
    np.testing.assert_array_equal(got.to_numpy(), np.sort(keys))


@qd.kernel
def sort_pairs(keys: qd.types.ndarray(qd.i32, ndim=1), tmp_keys: qd.types.ndarray(qd.i32, ndim=1),
               values: qd.types.ndarray(qd.f32, ndim=1), tmp_values: qd.types.ndarray(qd.f32, ndim=1),
               scratch: qd.types.ndarray(qd.i32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    qd.algorithms.sort(keys, tmp_keys, values, tmp_values, scratch, n, key_dtype=qd.i32, has_values=True,
                       end_bit=32, log256_max_n=2)


@pytest.mark.parametrize("size,live", [(3000, 2999), (300, 1)])
def test_stable_sort_of_signed_keys_with_values(arch, rng, size, live):
    keys = rng.integers(-1000, 1000, size).astype(np.int32)  # many equal keys: the order of their values shows
    values = np.arange(size, dtype=np.float32)
    k, v = keys.copy(), values.copy()
    scratch = np.zeros(qd.algorithms.sort_scratch_slots(size, 2), np.int32)
    sort_pairs(k, np.zeros_like(k), v, np.zeros_like(v), scratch, np.array(live, np.int32))
    order = np.argsort(keys[:live], kind="stable")
    np.testing.assert_array_equal(k[:live], keys[:live][order])
    np.testing.assert_array_equal(v[:live], values[:live][order])
    np.testing.assert_array_equal(k[live:], keys[live:])  # past the live count: untouched


def test_kernels_calling_the_sort_are_cached():
    """Every name the sort's code reaches is one the cache key identifies (a local shadowing a
    module global, such as a block scan's `subgroup`, made such kernels uncacheable and
    `qdc build` refuse them)."""
    from qdc.compiler.driver import cache_key
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.jit.kernel import kernel_of
    for kernel in (sort_morton_keys, sort_pairs):
        k = kernel_of(kernel)
        assert cache_key.kernel_key(k.fn, k.params, direct_options(), "vulkan").key
