"""Multi-dimensional range-for tasks walk their chunks as rows (passes/task_axes.py): the
coordinates are loop variables, not `k // w` and `k % w`. Three threads cut the ranges into
chunks that start and end mid-row; shapes include 0, 1 and odd sizes."""
import numpy as np
import pytest

import qdc as qd

SHAPES = [(0, 5), (5, 0), (1, 1), (1, 97), (97, 1), (3, 7), (61, 37), (131, 203)]


@pytest.fixture(autouse=True)
def three_threads(arch, session_cache_dir):
    """Every case on every selected arch; on the CPU with three threads (chunks end mid-row)."""
    qd.init(arch=arch, cache_dir=session_cache_dir, cpu_max_num_threads=3)


def test_the_task_has_rows_and_no_division(arch):
    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
        for i, j in a:
            a[i, j] = i * 1000 + j

    text = fill.compile((np.zeros((2, 3), np.int32),)).artifacts["ir"].decode()
    assert " rows (" in text, text
    assert "floordiv" not in text and " mod " not in text, text


def test_runtime_extents_with_begin_end_pairs(arch, rng):
    @qd.kernel
    def paint(out: qd.types.ndarray(dtype=qd.i32, ndim=2), b0: qd.i32, e0: qd.i32, b1: qd.i32, e1: qd.i32):
        for i, j in qd.ndrange((b0, e0), (b1, e1)):
            out[i, j] += i * 1000 + j + 1

    for h, w in SHAPES:
        out = rng.integers(-9, 9, (h + 4, w + 5)).astype(np.int32)
        b0, b1 = int(rng.integers(0, 4)), int(rng.integers(0, 5))
        expect = out.copy()
        rows, cols = np.meshgrid(np.arange(b0, b0 + h), np.arange(b1, b1 + w), indexing="ij")
        expect[b0:b0 + h, b1:b1 + w] += rows * 1000 + cols + 1
        paint(out, b0, b0 + h, b1, b1 + w)
        np.testing.assert_array_equal(out, expect, err_msg=f"shape {(h, w)} at {(b0, b1)}")


def test_stencil_over_ndarray_shapes(arch, rng):
    @qd.kernel
    def stencil(out: qd.types.ndarray(dtype=qd.f32, ndim=2), a: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i, j in qd.ndrange((1, a.shape[0] - 1), (1, a.shape[1] - 1)):
            out[i, j] = 0.2 * (a[i, j] + a[i - 1, j] + a[i + 1, j] + a[i, j - 1] + a[i, j + 1])

    for h, w in SHAPES + [(2, 9)]:
        a = rng.random((h, w)).astype(np.float32)
        out = np.zeros_like(a)
        stencil(out, a)
        expect = np.zeros_like(a)
        if h > 2 and w > 2:
            expect[1:-1, 1:-1] = 0.2 * (a[1:-1, 1:-1] + a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:])
        np.testing.assert_allclose(out, expect, rtol=1e-6, err_msg=f"shape {(h, w)}")


def test_three_dimensional_struct_for_over_an_ndarray(arch, rng):
    @qd.kernel
    def label(a: qd.types.ndarray(dtype=qd.i64, ndim=3)):
        for i, j, k in a:
            a[i, j, k] = a[i, j, k] * 7 + i * 1000000 + j * 1000 + k

    for shape in [(0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1), (5, 1, 7), (7, 13, 29), (3, 61, 1)]:
        a = rng.integers(-50, 50, shape).astype(np.int64)
        i, j, k = np.indices(shape)
        expect = a * 7 + i * 1000000 + j * 1000 + k
        label(a)
        np.testing.assert_array_equal(a, expect, err_msg=f"shape {shape}")


def test_three_dimensional_ndrange_with_extents_loaded_from_a_field(arch, rng):
    n = qd.field(qd.i32, shape=(3,))
    grid = qd.field(qd.i32, shape=(9, 11, 13))

    @qd.kernel
    def count():
        for i, j, k in qd.ndrange(n[0], (2, n[1]), n[2]):
            grid[i, j, k] += (i * 17 + j * 5 + k) % 11 + 1

    for extents in [(9, 11, 13), (0, 11, 13), (4, 2, 13), (9, 7, 0), (5, 9, 1), (1, 3, 7)]:
        start = rng.integers(0, 5, grid.shape).astype(np.int32)
        grid.from_numpy(start)
        n.from_numpy(np.array(extents, np.int32))
        count()
        expect = start.copy()
        i, j, k = np.indices((extents[0], max(extents[1] - 2, 0), extents[2]))
        j = j + 2
        expect[i, j, k] += (i * 17 + j * 5 + k) % 11 + 1
        np.testing.assert_array_equal(grid.to_numpy(), expect, err_msg=f"extents {extents}")


def test_reduction_over_rows_matches_numpy(arch, rng):
    total = qd.field(qd.f64, shape=())
    biggest = qd.field(qd.i32, shape=())

    @qd.kernel
    def reduce(a: qd.types.ndarray(dtype=qd.f64, ndim=2), b: qd.types.ndarray(dtype=qd.i32, ndim=2)):
        for i, j in a:
            total[None] += a[i, j] * (j + 1)
            qd.atomic_max(biggest[None], b[i, j] - i)

    for h, w in SHAPES:
        a = rng.random((h, w))
        b = rng.integers(-1000, 1000, (h, w)).astype(np.int32)
        total[None], biggest[None] = 0.0, -(1 << 31)
        reduce(a, b)
        assert total[None] == pytest.approx(float((a * (np.arange(w) + 1)).sum()), rel=1e-12)
        want = int((b - np.arange(h)[:, None]).max()) if h * w else -(1 << 31)
        assert biggest[None] == want


def test_serialized_rows_break_out_of_the_whole_loop(arch, rng):
    seen = qd.field(qd.i32, shape=(40, 30))

    @qd.kernel
    def walk(stop_i: qd.i32, stop_j: qd.i32, h: qd.i32, w: qd.i32):
        qd.loop_config(serialize=True)
        for i, j in qd.ndrange(h, w):
            if i == stop_i and j == stop_j:
                break
            if j % 3 == 1:
                continue
            seen[i, j] += 1

    h, w = 37, 29
    stop_i, stop_j = int(rng.integers(1, h)), int(rng.integers(0, w))
    seen.fill(0)
    walk(stop_i, stop_j, h, w)
    expect = np.zeros(seen.shape, np.int32)
    for i in range(h):
        for j in range(w):
            if (i, j) == (stop_i, stop_j):
                break
            if j % 3 != 1:
                expect[i, j] += 1
        else:
            continue
        break
    np.testing.assert_array_equal(seen.to_numpy(), expect)


def test_debug_bounds_check_reports_the_coordinates(arch, session_cache_dir):
    qd.init(arch=arch, cache_dir=session_cache_dir, debug=True, cpu_max_num_threads=3)
    x = qd.field(qd.f32, shape=(20, 30))

    @qd.kernel
    def shifted(h: qd.i32, w: qd.i32):
        for i, j in qd.ndrange(h, w):
            x[i, j + 1] = 1.0

    shifted(20, 29)
    with pytest.raises(IndexError, match="index 30 out of range on axis 1 for field 'x'"):
        shifted(20, 30)
        qd.sync()  # a GPU reports the device-side error at the next sync
