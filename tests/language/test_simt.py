"""qd.simt on every GPU arch the suite runs (lavapipe's Vulkan by default: subgroups of 8 lanes;
CUDA's of 32 with --archs=cuda): barriers, shared arrays, indices, subgroup exchanges and
votes, the subgroup and block reductions and scans, each checked against numpy. The CPU
refuses block-level code (tests/language/test_simt_errors.py)."""
import numpy as np
import pytest

import qdc as qd

pytestmark = pytest.mark.skip_arch("cpu", reason="the CPU runs no blocks of threads: qd.simt is refused there")

B = 64      # threads per block: a multiple of every subgroup size (8 on lavapipe, 32, 64)
N = 4 * B   # four blocks


@qd.kernel
def group_size_of(out: qd.types.ndarray(qd.i32, ndim=1)):
    for i in range(1):
        out[0] = qd.simt.subgroup.group_size()
        out[1] = qd.simt.subgroup.log2_group_size()


def subgroup_size() -> int:
    out = np.zeros(2, np.int32)
    group_size_of(out)
    assert 1 << int(out[1]) == int(out[0])
    return int(out[0])


@qd.kernel
def indices(out: qd.types.ndarray(qd.i32, ndim=2)):
    qd.loop_config(block_dim=B)
    for i in range(out.shape[0]):
        out[i, 0] = qd.simt.block.thread_idx()
        out[i, 1] = qd.simt.block.block_idx()
        out[i, 2] = qd.simt.block.block_dim()
        out[i, 3] = qd.simt.block.global_thread_idx()
        out[i, 4] = qd.simt.subgroup.invocation_id()


def test_thread_block_and_lane_indices(arch):
    g = subgroup_size()
    out = np.zeros((N, 5), np.int32)
    indices(out)
    i = np.arange(N)
    np.testing.assert_array_equal(out[:, 0], i % B)
    np.testing.assert_array_equal(out[:, 1], i // B)
    np.testing.assert_array_equal(out[:, 2], B)
    np.testing.assert_array_equal(out[:, 3], i)
    np.testing.assert_array_equal(out[:, 4], i % g)


@qd.kernel
def reverse_in_block(x: qd.types.ndarray(qd.f32, ndim=1), v: qd.types.ndarray(qd.math.vec3, ndim=1),
                     y: qd.types.ndarray(qd.f32, ndim=1), w: qd.types.ndarray(qd.math.vec3, ndim=1)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        scalars = qd.simt.block.SharedArray((B,), qd.f32)
        vectors = qd.simt.block.SharedArray(B, qd.math.vec3)
        grid = qd.simt.block.SharedArray((2, B // 2), qd.i32)
        t = qd.simt.block.thread_idx()
        scalars[t] = x[i]
        vectors[t] = v[i]
        grid[t // (B // 2), t % (B // 2)] = t
        qd.simt.block.sync()
        first = scalars[B - 1 - t]
        qd.simt.block.sync()  # every read of the first values before they are overwritten
        scalars[t] = first * 2.0
        qd.simt.block.sync()
        y[i] = scalars[B - 1 - t] + grid[(B - 1 - t) // (B // 2), (B - 1 - t) % (B // 2)]
        w[i] = vectors[B - 1 - t] + qd.math.vec3(1.0, 2.0, 3.0)


def test_shared_arrays_and_block_sync(arch, rng):
    x = rng.standard_normal(N).astype(np.float32)
    v = rng.standard_normal((N, 3)).astype(np.float32)
    y, w = np.zeros(N, np.float32), np.zeros((N, 3), np.float32)
    reverse_in_block(x, v, y, w)
    mirror = (np.arange(N) // B) * B + (B - 1 - np.arange(N) % B)
    np.testing.assert_allclose(y, 2 * x + (B - 1 - np.arange(N) % B), rtol=1e-6)
    np.testing.assert_allclose(w, v[mirror] + [1, 2, 3], rtol=1e-6)


@qd.kernel
def exchanges(x: qd.types.ndarray(qd.i32, ndim=1), d: qd.types.ndarray(qd.f64, ndim=1),
              out: qd.types.ndarray(qd.i32, ndim=2), wide: qd.types.ndarray(qd.f64, ndim=2)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        lane = qd.simt.subgroup.invocation_id()
        g = qd.simt.subgroup.group_size()
        out[i, 0] = qd.simt.subgroup.shuffle(x[i], qd.u32((lane * 3 + 1) % g))
        out[i, 1] = qd.simt.subgroup.shuffle_up(x[i], qd.u32(2))
        out[i, 2] = qd.simt.subgroup.shuffle_down(x[i], qd.u32(3))
        out[i, 3] = qd.simt.subgroup.shuffle_xor(x[i], qd.u32(5 % g))
        out[i, 4] = qd.simt.subgroup.broadcast(x[i], qd.u32(g - 1))
        out[i, 5] = qd.simt.subgroup.broadcast_first(x[i])
        out[i, 6] = qd.simt.subgroup.elect()
        out[i, 7] = qd.i32(qd.simt.subgroup.ballot(x[i] % 3 == 0) & qd.u64(0xFFFFFFFF))
        out[i, 8] = qd.simt.subgroup.all_true(x[i] >= 0)
        out[i, 9] = qd.simt.subgroup.any_true(x[i] % 7 == 0)
        out[i, 10] = qd.simt.subgroup.all_equal(x[i] // 1000)
        out[i, 11] = qd.i32(qd.simt.subgroup.shuffle(x[i] % 2 == 1, qd.u32(0)))  # a bool travels too
        wide[i, 0] = qd.simt.subgroup.shuffle(d[i], qd.u32((lane + 1) % g))
        wide[i, 1] = qd.simt.subgroup.shuffle_down(d[i], qd.u32(1))


def test_subgroup_exchanges_and_votes(arch, rng):
    if arch == "metal":
        pytest.skip("metal: no 64-bit types (ballot is a u64)")
    g = subgroup_size()
    x = rng.integers(0, 3000, N).astype(np.int32)
    d = rng.standard_normal(N)
    out, wide = np.zeros((N, 12), np.int32), np.zeros((N, 2), np.float64)
    exchanges(x, d, out, wide)
    lane = np.arange(N) % g
    base = np.arange(N) - lane
    groups = x.reshape(-1, g)
    np.testing.assert_array_equal(out[:, 0], x[base + (lane * 3 + 1) % g])
    np.testing.assert_array_equal(out[:, 1], np.where(lane >= 2, x[np.arange(N) - 2], x))
    np.testing.assert_array_equal(out[:, 2], np.where(lane + 3 < g, x[np.minimum(np.arange(N) + 3, N - 1)], x))
    np.testing.assert_array_equal(out[:, 3], x[base + (lane ^ (5 % g))])
    np.testing.assert_array_equal(out[:, 4], np.repeat(groups[:, -1], g))
    np.testing.assert_array_equal(out[:, 5], np.repeat(groups[:, 0], g))
    np.testing.assert_array_equal(out[:, 6], lane == 0)
    bits = (groups % 3 == 0).astype(np.int64) << np.arange(g)
    np.testing.assert_array_equal(out[:, 7], np.repeat(bits.sum(axis=1) & 0xFFFFFFFF, g).astype(np.uint32)
                                  .view(np.int32))
    np.testing.assert_array_equal(out[:, 8], 1)
    np.testing.assert_array_equal(out[:, 9], np.repeat((groups % 7 == 0).any(axis=1), g))
    np.testing.assert_array_equal(out[:, 10], np.repeat((groups // 1000 == groups[:, :1] // 1000).all(axis=1), g))
    np.testing.assert_array_equal(out[:, 11], np.repeat(groups[:, 0] % 2, g))
    np.testing.assert_array_equal(wide[:, 0], d[base + (lane + 1) % g])
    np.testing.assert_array_equal(wide[:, 1], np.where(lane + 1 < g, d[np.minimum(np.arange(N) + 1, N - 1)], d))


@qd.kernel
def subgroup_scans(x: qd.types.ndarray(qd.i32, ndim=1), heads: qd.types.ndarray(qd.i32, ndim=1),
                   out: qd.types.ndarray(qd.i32, ndim=2)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        v = x[i]
        out[i, 0] = qd.simt.subgroup.reduce_add(v)
        out[i, 1] = qd.simt.subgroup.reduce_all_add(v)
        out[i, 2] = qd.simt.subgroup.reduce_all_min(v)
        out[i, 3] = qd.simt.subgroup.reduce_all_max(v)
        out[i, 4] = qd.simt.subgroup.inclusive_add(v)
        out[i, 5] = qd.simt.subgroup.exclusive_add(v)
        out[i, 6] = qd.simt.subgroup.exclusive_min(v)
        out[i, 7] = qd.simt.subgroup.inclusive_max(v)
        out[i, 8] = qd.simt.subgroup.segmented_reduce_add(v, heads[i])
        out[i, 9] = qd.simt.subgroup.reduce_all_add_tiled(v, 2)
        out[i, 10] = qd.simt.subgroup.inclusive_add_tiled(v, 2)
        out[i, 11] = qd.simt.subgroup.segmented_reduce_min_tiled(v, heads[i], 2)


def _segmented(values, heads, op):
    out = values.copy()
    for k in range(1, len(values)):
        if not heads[k]:
            out[k] = op(out[k - 1], values[k])
    return out


def test_subgroup_reductions_and_scans(arch, rng):
    g = subgroup_size()
    x = rng.integers(-100, 100, N).astype(np.int32)
    heads = (rng.random(N) < 0.3).astype(np.int32)
    out = np.zeros((N, 12), np.int32)
    subgroup_scans(x, heads, out)
    lane = np.arange(N) % g
    groups = x.reshape(-1, g)
    np.testing.assert_array_equal(out[lane == 0, 0], groups.sum(axis=1))
    np.testing.assert_array_equal(out[:, 1], np.repeat(groups.sum(axis=1), g))
    np.testing.assert_array_equal(out[:, 2], np.repeat(groups.min(axis=1), g))
    np.testing.assert_array_equal(out[:, 3], np.repeat(groups.max(axis=1), g))
    np.testing.assert_array_equal(out[:, 4], np.cumsum(groups, axis=1).ravel())
    np.testing.assert_array_equal(out[:, 5], (np.cumsum(groups, axis=1) - groups).ravel())
    exclusive_min = np.minimum.accumulate(np.concatenate([np.full((len(groups), 1), 2**31 - 1), groups[:, :-1]], 1), 1)
    np.testing.assert_array_equal(out[:, 6], exclusive_min.ravel())
    np.testing.assert_array_equal(out[:, 7], np.maximum.accumulate(groups, axis=1).ravel())
    tiles = x.reshape(-1, 4)
    np.testing.assert_array_equal(out[:, 9], np.repeat(tiles.sum(axis=1), 4))
    np.testing.assert_array_equal(out[:, 10], np.cumsum(tiles, axis=1).ravel())
    for s in range(0, N, g):
        np.testing.assert_array_equal(out[s:s + g, 8], _segmented(x[s:s + g], heads[s:s + g], np.add))
    for s in range(0, N, 4):
        np.testing.assert_array_equal(out[s:s + 4, 11], _segmented(x[s:s + 4], heads[s:s + 4], np.minimum))


@qd.kernel
def block_scans(x: qd.types.ndarray(qd.f32, ndim=1), k: qd.types.ndarray(qd.i32, ndim=1),
                out: qd.types.ndarray(qd.f32, ndim=2), counts: qd.types.ndarray(qd.i32, ndim=2)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        out[i, 0] = qd.simt.block.reduce_add(x[i], B, qd.f32)
        out[i, 1] = qd.simt.block.reduce_all_add(x[i], B, qd.f32)
        out[i, 2] = qd.simt.block.reduce_all_max(x[i], B, qd.f32)
        out[i, 3] = qd.simt.block.inclusive_add(x[i], B, qd.f32)
        out[i, 4] = qd.simt.block.exclusive_add(x[i], B, qd.f32)
        counts[i, 0] = qd.simt.block.exclusive_add(k[i], B, qd.i32)
        counts[i, 1] = qd.simt.block.sync_count_nonzero(k[i] % 2)
        counts[i, 2] = qd.simt.block.sync_any_nonzero(k[i] == 7)
        counts[i, 3] = qd.simt.block.sync_all_nonzero(k[i] >= 0)
        counts[i, 4] = qd.simt.block.reduce_all_min(k[i], B, qd.i32)


def test_block_reductions_and_scans(arch, rng):
    x = rng.integers(-50, 50, N).astype(np.float32) / 4  # exact in f32 whatever the order of the sums
    k = rng.integers(0, 20, N).astype(np.int32)
    out, counts = np.zeros((N, 5), np.float32), np.zeros((N, 5), np.int32)
    block_scans(x, k, out, counts)
    blocks, kb = x.reshape(-1, B), k.reshape(-1, B)
    np.testing.assert_array_equal(out[::B, 0], blocks.sum(axis=1))
    np.testing.assert_array_equal(out[:, 1], np.repeat(blocks.sum(axis=1), B))
    np.testing.assert_array_equal(out[:, 2], np.repeat(blocks.max(axis=1), B))
    np.testing.assert_array_equal(out[:, 3], np.cumsum(blocks, axis=1).ravel())
    np.testing.assert_array_equal(out[:, 4], (np.cumsum(blocks, axis=1) - blocks).ravel())
    np.testing.assert_array_equal(counts[:, 0], (np.cumsum(kb, axis=1) - kb).ravel())
    np.testing.assert_array_equal(counts[:, 1], np.repeat((kb % 2).sum(axis=1), B))
    np.testing.assert_array_equal(counts[:, 2], np.repeat((kb == 7).any(axis=1), B))
    np.testing.assert_array_equal(counts[:, 3], 1)
    np.testing.assert_array_equal(counts[:, 4], np.repeat(kb.min(axis=1), B))


@qd.kernel
def publish(x: qd.types.ndarray(qd.i32, ndim=1), out: qd.types.ndarray(qd.i32, ndim=1)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        slot = qd.simt.block.SharedArray((1,), qd.i32)
        t = qd.simt.block.thread_idx()
        if t == 0:
            slot[0] = -1
        qd.simt.block.sync()
        before = slot[0]
        qd.simt.block.sync()
        if t == B - 1:
            slot[0] = x[i]
            qd.simt.block.mem_fence()
        qd.simt.grid.mem_fence()
        qd.simt.block.sync()
        out[i] = slot[0] * 10 + before  # the same address read again after the barrier: a new value


def test_reads_after_a_barrier_see_other_threads_writes(arch, rng):
    x = rng.integers(0, 1000, N).astype(np.int32)
    out = np.zeros(N, np.int32)
    publish(x, out)
    np.testing.assert_array_equal(out, np.repeat(x[B - 1::B], B) * 10 - 1)


@qd.kernel
def shared_dtypes(x: qd.types.ndarray(qd.f64, ndim=1), y: qd.types.ndarray(qd.f64, ndim=1),
                  out: qd.types.ndarray(qd.i32, ndim=1)):
    qd.loop_config(block_dim=32)
    for i in range(x.shape[0]):
        wide = qd.simt.block.SharedArray((32,), qd.f64)
        flags = qd.simt.block.SharedArray((32,), qd.u1)
        narrow = qd.simt.block.SharedArray((32,), qd.i16)
        matrices = qd.simt.block.SharedArray((2, 2), qd.types.matrix(2, 2, qd.f32))
        t = qd.simt.block.thread_idx()
        wide[t] = x[i]
        flags[t] = x[i] > 0
        narrow[t] = qd.i16(t * 3)
        if t < 2:
            matrices[t, 0] = qd.Matrix([[1.0, 2.0], [3.0, float(t)]])
        qd.simt.block.sync()
        y[i] = wide[31 - t] + qd.simt.block.reduce_all_add(x[i], 32, qd.f64)
        out[i] = qd.i32(flags[31 - t]) + qd.i32(narrow[31 - t]) * 10 + qd.i32(matrices[1, 0][1, 1]) * 1000


def test_shared_arrays_of_64_8_and_16_bit_and_matrix_elements(arch, rng):
    if arch == "metal":
        pytest.skip("metal: no 64-bit types")
    x = rng.standard_normal(64)
    y, out = np.zeros(64), np.zeros(64, np.int32)
    shared_dtypes(x, y, out)
    t = np.arange(64) % 32
    mirror = np.arange(64) - t + 31 - t
    np.testing.assert_allclose(y, x[mirror] + np.repeat(x.reshape(2, -1).sum(1), 32), rtol=1e-12)
    np.testing.assert_array_equal(out, (x[mirror] > 0) + (31 - t) * 30 + 1000)
