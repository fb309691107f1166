"""Vector and matrix locals read and written at run-time indices (a local array once compiled:
compiler/passes/local_arrays.py), on every arch, against numpy replaying the same steps:

- reads and writes of a 4x4 matrix and a 6-vector in dynamic loops, at indices uniform across
  the parallel iterations and at indices that differ between them, under a branch, in f32, f64
  and i32, with the vector read back whole and at constant indices;
- out-of-range indices do what the scalar form does: a read gives the last component (negative
  indices too), a write changes nothing; the same for 3-vectors (kept as scalars) and 6-vectors
  (an array);
- with debug=True an out-of-range index raises IndexError at the next sync, naming the line.
"""

import numpy as np
import pytest

import qdc as qd

N = 37  # parallel iterations: more than a vector of lanes, not a multiple of one


def _replay_matrix(a, idx, steps):
    """What `shuffle` computes, in numpy, element by element in the kernel's order."""
    out = np.zeros(len(a), a.dtype)
    for p in range(len(a)):
        m = np.arange(16, dtype=a.dtype).reshape(4, 4) * a[p]
        for j in range(steps):
            r, c = (idx[p] + j) % 4, (j * 3) % 4
            m[r, c] = m[c, r] * a.dtype.type(0.5) + m[j % 4, (r + 1) % 4]
            if a[p] > 0.5:
                m[j % 4, idx[p] % 4] -= a.dtype.type(1)
        out[p] = m[idx[p] % 4, 3 - j % 4] * 2 + m[0, 0] + m[3, 3]
    return out


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64, qd.i32])
def test_matrix_reads_and_writes_in_loops(arch, rng, dtype):
    npt = {qd.f32: np.float32, qd.f64: np.float64, qd.i32: np.int32}[dtype]
    a_np = (rng.random(N) * (1 if dtype is not qd.i32 else 3)).astype(npt)
    idx_np = rng.integers(0, 40, N).astype(np.int32)
    a, idx, out = qd.ndarray(dtype, shape=N), qd.ndarray(qd.i32, shape=N), qd.ndarray(dtype, shape=N)
    a.from_numpy(a_np)
    idx.from_numpy(idx_np)

    @qd.kernel
    def shuffle(a: qd.types.ndarray(dtype, ndim=1), idx: qd.types.ndarray(qd.i32, ndim=1),
                out: qd.types.ndarray(dtype, ndim=1), steps: qd.i32):
        for p in a:
            m = qd.Matrix.zero(dtype, 4, 4)
            for r in qd.static(range(4)):
                for c in qd.static(range(4)):
                    m[r, c] = qd.cast(4 * r + c, dtype) * a[p]
            j = 0
            for jj in range(steps):
                j = jj
                r, c = (idx[p] + j) % 4, (j * 3) % 4
                m[r, c] = m[c, r] * qd.cast(0.5, dtype) + m[j % 4, (r + 1) % 4]
                if a[p] > 0.5:
                    m[j % 4, idx[p] % 4] -= qd.cast(1, dtype)
            out[p] = m[idx[p] % 4, 3 - j % 4] * 2 + m[0, 0] + m[3, 3]

    if dtype is qd.i32:  # i32: 0.5 is 0 once cast; replay with the same integer steps
        want = _replay_int(a_np, idx_np, 9)
    else:
        want = _replay_matrix(a_np, idx_np, 9)
    shuffle(a, idx, out, 9)
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5 if dtype is qd.f32 else 1e-12)


def _replay_int(a, idx, steps):
    out = np.zeros(len(a), np.int64)
    for p in range(len(a)):
        m = (np.arange(16).reshape(4, 4) * int(a[p])).astype(np.int64)
        for j in range(steps):
            r, c = (idx[p] + j) % 4, (j * 3) % 4
            m[r, c] = m[c, r] * 0 + m[j % 4, (r + 1) % 4]
            if a[p] > 0.5:
                m[j % 4, idx[p] % 4] -= 1
        out[p] = m[idx[p] % 4, 3 - j % 4] * 2 + m[0, 0] + m[3, 3]
    return out.astype(np.int32)


def test_vector_read_whole_after_run_time_writes(arch, rng):
    a_np = rng.standard_normal(N).astype(np.float32)
    perm = np.stack([rng.permutation(6) for _ in range(N)]).astype(np.int32)
    a, order = qd.ndarray(qd.f32, shape=N), qd.ndarray(qd.i32, shape=(N, 6))
    out = qd.Vector.ndarray(6, qd.f32, shape=N)
    a.from_numpy(a_np)
    order.from_numpy(perm)

    @qd.kernel
    def scatter(a: qd.types.ndarray(qd.f32, ndim=1), order: qd.types.ndarray(qd.i32, ndim=2),
                out: qd.types.ndarray(qd.types.vector(6, qd.f32), ndim=1)):
        for p in a:
            v = qd.Vector([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            for k in range(6):
                v[order[p, k]] = a[p] * qd.cast(k + 1, qd.f32)
            out[p] = v

    scatter(a, order, out)
    want = np.zeros((N, 6), np.float32)
    for p in range(N):
        want[p, perm[p]] = a_np[p] * np.arange(1, 7, dtype=np.float32)
    np.testing.assert_array_equal(out.to_numpy(), want)


@pytest.mark.parametrize("size", [3, 6])
def test_out_of_range_indices_read_the_last_and_write_nothing(arch, rng, size):
    values = rng.standard_normal(size).astype(np.float32)
    indices = np.array([-7, -1, 0, size - 1, size, size + 5, 2 ** 31 - 1, -2 ** 31], np.int32)
    out = qd.ndarray(qd.f32, shape=(len(indices), size + 1))
    vals, idx = qd.ndarray(qd.f32, shape=size), qd.ndarray(qd.i32, shape=len(indices))
    vals.from_numpy(values)
    idx.from_numpy(indices)

    @qd.kernel
    def probe(vals: qd.types.ndarray(qd.f32, ndim=1), idx: qd.types.ndarray(qd.i32, ndim=1),
              out: qd.types.ndarray(qd.f32, ndim=2)):
        for p in idx:
            v = qd.Vector.zero(qd.f32, size)
            for k in qd.static(range(size)):
                v[k] = vals[k]
            for _ in range(1):  # a run-time index inside the task's loops
                out[p, size] = v[idx[p]]
                v[idx[p]] = 100.0
            for k in qd.static(range(size)):
                out[p, k] = v[k]

    probe(vals, idx, out)
    got = out.to_numpy()
    for row, i in zip(got, indices):
        written = values.copy()
        if 0 <= i < size:
            written[i] = 100.0
        np.testing.assert_array_equal(row[:size], written)
        assert row[size] == (values[i] if 0 <= i < size else values[-1])


def test_debug_mode_reports_an_out_of_range_index(session_cache_dir, fresh_runtime):
    qd.init(arch=qd.cpu, debug=True, cache_dir=session_cache_dir)
    out = qd.ndarray(qd.f32, shape=4)

    @qd.kernel
    def read(out: qd.types.ndarray(qd.f32, ndim=1), i: qd.i32):
        for p in out:
            v = qd.Vector([1.0, 2.0, 3.0, 4.0, 5.0])
            for _ in range(1):
                out[p] = v[i]

    read(out, 4)
    qd.sync()
    assert (out.to_numpy() == 5.0).all()
    with pytest.raises(IndexError, match="index 5 is out of range for a vector/matrix dimension of size 5"):
        read(out, 5)
        qd.sync()
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
