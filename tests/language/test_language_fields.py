"""Fields of every rank, ndarray parameters, and every form of for loop (docs/api.md), including
ranges not divisible by the thread count and qd.loop_config(serialize=True)."""
import numpy as np
import pytest

import qdc as qd


def test_fields_of_rank_0_to_4(arch, rng):
    s = qd.field(qd.f32, shape=())
    f1 = qd.field(qd.i32, shape=7)
    f2 = qd.field(qd.f64, shape=(3, 5))
    f3 = qd.field(qd.i64, shape=(2, 3, 4))
    f4 = qd.field(qd.f32, shape=(2, 3, 2, 5))

    @qd.kernel
    def fill(scale: qd.f32):
        s[None] = s[None] * scale
        for i in f1:
            f1[i] = f1[i] * 2 + i
        for i, j in f2:
            f2[i, j] = f2[i, j] + i * 10 + j
        for i, j, k in f3:
            f3[i, j, k] = i * 100 + j * 10 + k
        for i, j, k, l in f4:
            f4[i, j, k, l] = f4[i, j, k, l] * scale + s[None] * 0 + i * 1000 + j * 100 + k * 10 + l

    s0 = float(rng.random())
    s[None] = s0
    a1 = rng.integers(-100, 100, 7).astype(np.int32)
    a2 = rng.random((3, 5))
    a4 = rng.random((2, 3, 2, 5)).astype(np.float32)
    f1.from_numpy(a1)
    f2.from_numpy(a2)
    f4.from_numpy(a4)
    scale = float(np.float32(rng.random() + 0.5))
    fill(scale)
    assert s[None] == pytest.approx(np.float32(s0) * np.float32(scale), rel=1e-6)
    np.testing.assert_array_equal(f1.to_numpy(), a1 * 2 + np.arange(7))
    i, j = np.indices((3, 5))
    np.testing.assert_array_equal(f2.to_numpy(), a2 + i * 10 + j)
    i, j, k = np.indices((2, 3, 4))
    np.testing.assert_array_equal(f3.to_numpy(), i * 100 + j * 10 + k)
    i, j, k, l = np.indices((2, 3, 2, 5))
    np.testing.assert_allclose(f4.to_numpy(), a4 * np.float32(scale) + i * 1000 + j * 100 + k * 10 + l, rtol=1e-6)


def test_ndarray_shapes_and_struct_for_over_ndarrays(arch, rng):
    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=2), b: qd.types.ndarray(dtype=qd.i32, ndim=3),
          c: qd.types.ndarray(dtype=qd.f64, ndim=1), dims: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i, j in a:
            a[i, j] = a[i, j] * 2 + j
        for i, j, l in b:
            b[i, j, l] = i * b.shape[1] * b.shape[2] + j * b.shape[2] + l
        for i in c:
            c[i] = c[i] + len(c)
        dims[0], dims[1], dims[2] = a.shape[0], a.shape[1], b.shape[2]

    a = rng.random((5, 9)).astype(np.float32)
    a0 = a.copy()
    b = np.zeros((3, 4, 6), np.int32)
    c = rng.random(11)
    c0 = c.copy()
    dims = np.zeros(3, np.int32)
    k(a, b, c, dims)
    np.testing.assert_array_equal(a, a0 * 2 + np.arange(9, dtype=np.float32))
    np.testing.assert_array_equal(b.ravel(), np.arange(b.size))
    np.testing.assert_array_equal(c, c0 + 11)
    assert dims.tolist() == [5, 9, 6]
    b2 = np.zeros((2, 1, 3), np.int32)   # the same kernel serves other shapes
    k(a, b2, c, dims)
    np.testing.assert_array_equal(b2.ravel(), np.arange(6))


def test_qd_ndarray_arguments(arch, rng):
    arr = qd.ndarray(qd.f32, shape=(4, 6))
    data = rng.random((4, 6)).astype(np.float32)
    arr.from_numpy(data)

    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=2), s: qd.f32):
        for i, j in a:
            a[i, j] *= s

    scale(arr, 3.0)
    np.testing.assert_allclose(arr.to_numpy(), data * 3, rtol=1e-6)


def test_range_forms_with_runtime_and_constant_bounds(arch, rng):
    out = qd.field(qd.i32, shape=(6, 64))
    cnt = qd.field(qd.i32, shape=6)

    @qd.func
    def record(row, v):
        out[row, qd.atomic_add(cnt[row], 1)] = v

    @qd.kernel
    def loops(b: qd.i32, e: qd.i32):
        for i in range(e):
            record(0, i)
        for i in range(b, e):
            record(1, i)
        for i in range(b, e, 3):
            record(2, i)
        for i in range(-5, 40, 7):        # constant bounds: still a run-time loop
            record(3, i)
        for i in range(e, b):             # empty when b <= e
            record(4, i)
        for _ in range(1):
            for i in range(b - 3, b + 2, 2):  # nested serial loop, negative start possible
                record(5, i)

    b = int(rng.integers(-10, 10))
    e = b + int(rng.integers(0, 40))
    loops(b, e)
    expect = [range(e), range(b, e), range(b, e, 3), range(-5, 40, 7), range(e, b), range(b - 3, b + 2, 2)]
    got_out, got_cnt = out.to_numpy(), cnt.to_numpy()
    for row, r in enumerate(expect):
        assert got_cnt[row] == len(r), row
        assert sorted(got_out[row, :len(r)]) == list(r), row


def test_zero_length_and_one_element_ranges(arch):
    hits = qd.field(qd.i32, shape=3)

    @qd.kernel
    def k(n: qd.i32):
        for i in range(n):
            hits[0] += 1
        for i in range(n, n + 1):
            hits[1] += i
        for i, j in qd.ndrange(n, 5):
            hits[2] += 1

    k(0)
    assert hits.to_numpy().tolist() == [0, 0, 0]
    k(1)
    assert hits.to_numpy().tolist() == [1, 1, 5]


def test_ndrange_with_ints_and_pairs(arch, rng):
    grid = qd.field(qd.i32, shape=(8, 9, 4))

    @qd.kernel
    def k(lo: qd.i32, hi: qd.i32):
        for i, j, l in qd.ndrange((lo, hi), 9, (1, 3)):
            grid[i, j, l] += i * 100 + j * 10 + l + 1
        for _ in range(1):
            for i, j in qd.ndrange((2, 4), (hi - 2, hi)):   # nested: a serial loop
                grid[i, j, 3] += 1

    lo = int(rng.integers(0, 4))
    hi = int(rng.integers(lo + 2, 9))
    k(lo, hi)
    expect = np.zeros((8, 9, 4), np.int32)
    for i in range(lo, hi):
        for j in range(9):
            for l in range(1, 3):
                expect[i, j, l] += i * 100 + j * 10 + l + 1
    for i in range(2, 4):
        for j in range(hi - 2, hi):
            expect[i, j, 3] += 1
    np.testing.assert_array_equal(grid.to_numpy(), expect)


@pytest.mark.parametrize("threads", [None, 3])
def test_ranges_not_divisible_by_thread_count(arch, rng, threads, session_cache_dir):
    if threads is not None:  # the CPU's thread count; on a GPU the same ranges, one invocation each
        qd.init(arch=arch, cpu_max_num_threads=threads, cache_dir=session_cache_dir)
    sizes = [1, 7, 1001, 100003]
    hits = qd.field(qd.i32, shape=max(sizes) + 5)
    total = qd.field(qd.i64, shape=())

    @qd.kernel
    def cover(b: qd.i32, e: qd.i32):
        for i in range(b, e):
            hits[i] += 1
            total[None] += i

    for n in sizes:
        hits.fill(0)
        total[None] = 0
        b = int(rng.integers(0, 5))
        cover(b, b + n)
        expect = np.zeros(hits.shape, np.int32)
        expect[b:b + n] = 1
        np.testing.assert_array_equal(hits.to_numpy(), expect)
        assert total[None] == sum(range(b, b + n))


def test_serialized_loop_gives_the_sequential_answer(arch, rng):
    @qd.kernel
    def prefix_sum(a: qd.types.ndarray(dtype=qd.i64, ndim=1)):
        qd.loop_config(serialize=True)
        for i in range(1, a.shape[0]):
            a[i] = a[i - 1] + a[i]

    a = rng.integers(-1000, 1000, 100003).astype(np.int64)
    ref = np.cumsum(a)
    prefix_sum(a)
    np.testing.assert_array_equal(a, ref)


def test_top_level_statements_run_once_and_values_cross_tasks(arch, rng):
    out = qd.field(qd.i32, shape=50)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def k(m: qd.i32):
        base = m * 2          # a serial task; the loops below read it
        n[None] = base + 1
        for i in range(n[None]):
            out[i] = base + i
        for i in range(n[None], 50):
            out[i] = -1

    m = int(rng.integers(1, 20))
    k(m)
    expect = [2 * m + i for i in range(2 * m + 1)] + [-1] * (50 - 2 * m - 1)
    assert out.to_numpy().tolist() == expect


def test_fill_inside_kernels_and_funcs(arch, rng):
    """`x.fill(v)` in a kernel or qd.func, as Quadrants offers it: every element v (a vector
    field's every component), a parallel task at the top level, a serial loop inside a loop."""
    a = qd.field(qd.i32, shape=(7, 3))
    v = qd.Vector.field(3, qd.f32, shape=5)
    s = qd.field(qd.f32, shape=())
    counts = qd.field(qd.i32, shape=4)
    bump = rng.integers(1, 9, 7).astype(np.int32)

    @qd.func
    def reset(x, value):
        x.fill(value)

    @qd.kernel
    def fill_then_add(b: qd.types.ndarray(dtype=qd.i32, ndim=1), value: qd.i32):
        a.fill(value)
        reset(v, 1.5)
        s.fill(2)
        for i in range(b.shape[0]):
            a[i, 0] += b[i]

    @qd.kernel
    def fill_per_iteration():
        qd.loop_config(serialize=True)
        for i in range(3):  # the fill inside a loop is a serial loop: each iteration refills, then counts
            counts.fill(i)
            counts[3] += 10

    a.from_numpy(rng.integers(-5, 5, (7, 3)).astype(np.int32))
    fill_then_add(bump, -3)
    expected = np.full((7, 3), -3, np.int32)
    expected[:, 0] += bump
    np.testing.assert_array_equal(a.to_numpy(), expected)
    np.testing.assert_array_equal(v.to_numpy(), np.full((5, 3), 1.5, np.float32))
    assert s[None] == 2.0
    fill_per_iteration()
    assert counts.to_numpy().tolist() == [2, 2, 2, 12]
