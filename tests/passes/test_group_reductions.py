"""Reductions combined across a GPU's subgroups/warps/blocks before their one atomic (Vulkan:
subgroup operations, compiler/targets/spirv/memory.py flush_partial; CUDA: warp shuffles and
shared memory, compiler/targets/cuda/block_reduce.py), checked against numpy for every kind of
update and type, at block sizes that are and are not multiples of a warp, and for tasks whose
trip count is smaller than one block (threads with empty chunks take part with the identity)."""
import numpy as np
import pytest

import qdc as qd

TYPES = [qd.i32, qd.u32, qd.i64, qd.f32, qd.f64]


def make(dtype, block_dim):
    arr = qd.types.ndarray(dtype=dtype, ndim=1)

    @qd.kernel
    def reduce_all(a: arr, out: arr):
        if qd.static(block_dim):
            qd.loop_config(block_dim=block_dim)
        for i in range(a.shape[0]):
            out[0] += a[i]
            qd.atomic_min(out[1], a[i])
            qd.atomic_max(out[2], a[i])
            out[3] -= a[i]
    return reduce_all


def make_bits(dtype, block_dim):
    arr = qd.types.ndarray(dtype=dtype, ndim=1)

    @qd.kernel
    def reduce_bits(a: arr, out: arr):
        if qd.static(block_dim):
            qd.loop_config(block_dim=block_dim)
        for i in range(a.shape[0]):
            qd.atomic_and(out[0], a[i])
            qd.atomic_or(out[1], a[i])
            qd.atomic_xor(out[2], a[i])
    return reduce_bits


def values(rng, dtype, n):
    npt = dtype.np_dtype
    if dtype.is_float:
        return rng.uniform(-50, 50, n).astype(npt)
    if dtype in (qd.u32,):
        return rng.integers(0, 1000, n).astype(npt)
    return rng.integers(-1000, 1000, n).astype(npt)


@pytest.mark.parametrize("block_dim", [0, 48, 256])
@pytest.mark.parametrize("n", [5, 300_001])
@pytest.mark.parametrize("dtype", TYPES)
def test_add_min_max_sub(arch, rng, dtype, n, block_dim):
    a = values(rng, dtype, n)
    npt = dtype.np_dtype
    start = np.array([3, 10**6, -10**6 if dtype.kind != "uint" else 0, 7], dtype=npt)
    out = start.copy()
    make(dtype, block_dim)(a, out)
    if dtype.is_float:
        wide = a.astype(np.float64)
        # any order of additions: error up to ~n * eps * sum|a| in the worst case, far less in practice
        atol = (1e-5 if dtype is qd.f32 else 1e-13) * np.abs(wide).sum()
        np.testing.assert_allclose(out[0], start[0] + wide.sum(), rtol=0, atol=atol)
        np.testing.assert_allclose(out[3], start[3] - wide.sum(), rtol=0, atol=atol)
    else:  # integers wrap like numpy's
        with np.errstate(over="ignore"):
            assert out[0] == start[0] + a.sum(dtype=npt)
            assert out[3] == start[3] - a.sum(dtype=npt)
    assert out[1] == min(start[1], a.min())
    assert out[2] == max(start[2], a.max())


@pytest.mark.parametrize("block_dim", [0, 40])
@pytest.mark.parametrize("dtype", [qd.i32, qd.u32, qd.i64])
def test_and_or_xor(arch, rng, dtype, block_dim):
    a = values(rng, dtype, 100_003) | np.array(0x100, dtype.np_dtype)
    out = np.array([-1 if dtype.kind == "int" else np.iinfo(dtype.np_dtype).max, 0, 0x55], dtype.np_dtype)
    make_bits(dtype, block_dim)(a, out)
    assert out[0] == np.bitwise_and.reduce(a)
    assert out[1] == np.bitwise_or.reduce(a)
    assert out[2] == np.bitwise_xor.reduce(a) ^ 0x55


def test_kernel_scope_local_sum_is_reduced_per_group(arch, rng):
    """`s += x[i]` on a kernel-scope local: a temporary's atomic, flushed the same way."""
    @qd.kernel
    def mean(x: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        s = 0.0
        for i in range(x.shape[0]):
            s += x[i]
        out[0] = s / x.shape[0]

    x = rng.random(200_003).astype(np.float32)
    out = np.zeros(1, np.float32)
    mean(x, out)
    np.testing.assert_allclose(out[0], x.astype(np.float64).mean(), rtol=1e-4)


@pytest.mark.parametrize("dtype", [qd.i8, qd.u8, qd.i16, qd.u16])
def test_narrow_atomics_leave_their_neighbours_alone(arch, rng, dtype):
    """8/16-bit atomics on elements that share a 32-bit word (SPIR-V: a compare-and-swap on the
    word, compiler/targets/spirv/memory.py subword_atomic): each element gets its own updates
    and nothing else, whatever the thread order."""
    npt = dtype.np_dtype
    bins = qd.field(dtype, shape=8)
    lows = qd.field(dtype, shape=8)
    bits = qd.field(dtype, shape=8)

    @qd.kernel
    def scatter(keys: qd.types.ndarray(dtype=qd.i32, ndim=1), v: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(keys.shape[0]):
            k = keys[i]
            bins[k] += 1
            qd.atomic_min(lows[k], v[i])
            qd.atomic_or(bits[k], v[i])

    n = 3000
    keys = rng.integers(0, 8, n).astype(np.int32)
    v = rng.integers(0, 100, n).astype(npt)
    lows.from_numpy(np.full(8, 100, npt))
    scatter(keys, v)
    with np.errstate(over="ignore"):
        counts = np.bincount(keys, minlength=8).astype(npt)  # wraps as the element type does
    np.testing.assert_array_equal(bins.to_numpy(), counts)
    np.testing.assert_array_equal(lows.to_numpy(), [min([100] + list(v[keys == k])) for k in range(8)])
    np.testing.assert_array_equal(bits.to_numpy(), [np.bitwise_or.reduce(v[keys == k]) if (keys == k).any() else 0
                                                    for k in range(8)])


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64], ids=lambda t: t.name)
def test_float_updates_are_combined_across_the_subgroup_before_their_compare_and_swap(dtype):
    """Float min/max (and f64 add) are compare-and-swap loops on Vulkan: one per subgroup, never one
    per invocation on one address (that ran long enough on an NVIDIA GPU for its driver to drop
    the device at 300001 iterations)."""
    from qdc.compiler.driver import kernel as K
    from qdc.compiler.driver.options import Options
    from qdc.compiler.targets.spirv import tools
    kernel = make(dtype, 0)._primal
    module = K.compile_kernel(kernel.fn, kernel.params, Options(), arch="vulkan").artifacts["spirv_t0"]
    text = tools.disassemble(module)
    for op in ("OpGroupNonUniformFMin", "OpGroupNonUniformFMax", "OpGroupNonUniformFAdd"):
        assert op in text, op
    assert text.count("OpGroupNonUniformElect") == 4  # one elected invocation per update
