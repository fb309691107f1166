"""Kernels in Genesis's block-level style, checked against numpy on every GPU arch the suite
runs: a batched Cholesky factor-and-solve with one block per matrix in shared memory (as its
mass-matrix factor), a broad-phase overlap count whose tiles of boxes travel by subgroup
shuffles, and a Jacobi solver iterating in a qd.graph.do_while loop until a residual that a
block reduction computes is small (as its constraint solver)."""
import numpy as np
import pytest

import qdc as qd

pytestmark = pytest.mark.skip_arch("cpu", reason="the CPU runs no blocks of threads: qd.simt is refused there")

T = 32   # threads per block (Genesis's BLOCK_DIM)
N = 12   # matrix size: fewer rows than threads, so some threads idle in every step


@qd.kernel
def cholesky_solve(a: qd.types.ndarray(qd.f32, ndim=3), b: qd.types.ndarray(qd.f32, ndim=2),
                   x: qd.types.ndarray(qd.f32, ndim=2)):
    qd.loop_config(block_dim=T)
    for i in range(a.shape[0] * T):
        tid = i % T
        env = i // T
        L = qd.simt.block.SharedArray((N, N + 1), qd.f32)  # padded rows, as Genesis's tiles
        y = qd.simt.block.SharedArray((N,), qd.f32)
        for k in range(tid, N * N, T):
            L[k // N, k % N] = a[env, k // N, k % N]
        qd.simt.block.sync()
        for j in range(N):  # right-looking: column j, then the trailing update
            if tid == 0:
                L[j, j] = qd.sqrt(L[j, j])
            qd.simt.block.sync()
            for r in range(j + 1 + tid, N, T):
                L[r, j] = L[r, j] / L[j, j]
            qd.simt.block.sync()
            m = N - j - 1
            for k in range(tid, m * m, T):
                r = j + 1 + k // m
                c = j + 1 + k % m
                if c <= r:
                    L[r, c] = L[r, c] - L[r, j] * L[c, j]
            qd.simt.block.sync()
        if tid == 0:  # the two triangular solves, in order
            for r in range(N):
                s = b[env, r]
                for c in range(r):
                    s -= L[r, c] * y[c]
                y[r] = s / L[r, r]
            for rr in range(N):
                r = N - 1 - rr
                s = y[r]
                for c in range(r + 1, N):
                    s -= L[c, r] * x[env, c]
                x[env, r] = s / L[r, r]


def test_tiled_cholesky_solve_matches_numpy(arch, rng):
    envs = 37
    m = rng.standard_normal((envs, N, N))
    a = (m @ m.transpose(0, 2, 1) + N * np.eye(N)).astype(np.float32)
    b = rng.standard_normal((envs, N)).astype(np.float32)
    x = np.zeros((envs, N), np.float32)
    cholesky_solve(a, b, x)
    want = np.linalg.solve(a.astype(np.float64), b.astype(np.float64)[..., None])[..., 0]
    np.testing.assert_allclose(x, want, rtol=2e-4, atol=2e-5)


@qd.kernel
def overlapping_pairs(lo: qd.types.ndarray(qd.math.vec3, ndim=1), hi: qd.types.ndarray(qd.math.vec3, ndim=1),
                      counts: qd.types.ndarray(qd.i32, ndim=1), total: qd.types.ndarray(qd.i32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(lo.shape[0]):
        g = qd.simt.subgroup.group_size()
        lane = qd.simt.subgroup.invocation_id()
        mine_lo, mine_hi = lo[i], hi[i]
        n = 0
        for tile in range(lo.shape[0] // g):  # each lane brings one box of the tile; all test it
            their_lo, their_hi = lo[tile * g + lane], hi[tile * g + lane]
            for k in range(g):
                other = tile * g + k
                o_lo = qd.simt.subgroup.shuffle(their_lo, qd.u32(k))
                o_hi = qd.simt.subgroup.shuffle(their_hi, qd.u32(k))
                if other != i and all(mine_lo <= o_hi) and all(o_lo <= mine_hi):
                    n += 1
        counts[i] = n
        subgroup_total = qd.simt.subgroup.reduce_all_add(n)
        if qd.simt.subgroup.elect():
            qd.atomic_add(total[0], subgroup_total)


def test_subgroup_broad_phase_count_matches_numpy(arch, rng):
    count = 512
    centre = rng.uniform(0, 10, (count, 3))
    half = rng.uniform(0.1, 1.0, (count, 3))
    lo, hi = (centre - half).astype(np.float32), (centre + half).astype(np.float32)
    counts, total = np.zeros(count, np.int32), np.zeros(1, np.int32)
    overlapping_pairs(lo, hi, counts, total)
    overlap = np.all(lo[:, None, :] <= hi[None, :, :], axis=2) & np.all(lo[None, :, :] <= hi[:, None, :], axis=2)
    np.fill_diagonal(overlap, False)
    np.testing.assert_array_equal(counts, overlap.sum(axis=1))
    assert total[0] == overlap.sum()


B = 64


@qd.kernel(graph=True)
def jacobi(a: qd.types.ndarray(qd.f32, ndim=2), b: qd.types.ndarray(qd.f32, ndim=1),
           x: qd.types.ndarray(qd.f32, ndim=1), x_new: qd.types.ndarray(qd.f32, ndim=1),
           residual: qd.types.ndarray(qd.f32, ndim=1), keep_going: qd.types.ndarray(qd.i32, ndim=0),
           iterations: qd.types.ndarray(qd.i32, ndim=0), tol: qd.f32):
    while qd.graph.do_while(keep_going):
        residual[0] = 0.0
        qd.loop_config(block_dim=B)
        for i in range(x.shape[0]):
            s = b[i]
            for j in range(x.shape[0]):
                if j != i:
                    s -= a[i, j] * x[j]
            x_new[i] = s / a[i, i]
            change = qd.simt.block.reduce_max(abs(x_new[i] - x[i]), B, qd.f32)
            if qd.simt.block.thread_idx() == 0:
                qd.atomic_max(residual[0], change)
        for i in range(x.shape[0]):
            x[i] = x_new[i]
        iterations[()] = iterations[()] + 1
        keep_going[()] = 0
        if residual[0] > tol:
            keep_going[()] = 1


def test_do_while_jacobi_solver_matches_numpy(arch, rng):
    n = 4 * B
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    a += np.diag(np.abs(a).sum(axis=1) + 1).astype(np.float32)  # diagonally dominant: Jacobi converges
    b = rng.standard_normal(n).astype(np.float32)
    x, x_new, residual = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(1, np.float32)
    keep_going, iterations = np.array(1, np.int32), np.array(0, np.int32)
    jacobi(a, b, x, x_new, residual, keep_going, iterations, 1e-5)
    assert 2 < int(iterations) < 200 and residual[0] <= 1e-5
    np.testing.assert_allclose(x, np.linalg.solve(a.astype(np.float64), b), rtol=1e-3, atol=1e-4)
