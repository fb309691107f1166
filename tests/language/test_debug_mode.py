"""`debug=True` (docs/api.md, Configuration): every index of every field/ndarray access is checked; the first
out-of-range one of a launch raises IndexError naming source line, kernel, target and index,
without the kernel touching memory outside the target. Without debug nothing is emitted."""
import re

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.runtime.contract import artifact as A
from qdc.runtime.loader import load

PARALLEL_N = 60000  # enough iterations for the range-for to be split over worker threads


def line_of(marker: str) -> str:
    """`file:line:` of the line of this file holding `marker` (comments mark the accesses)."""
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if marker in text and "line_of" not in text:
                return f"{__file__}:{number}:"
    raise AssertionError(marker)


def debug_on(session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, debug=True)


def indices_with_one_bad(rng, n: int, size: int, bad: int):
    idx = rng.integers(0, size, n).astype(np.int32)
    where = int(rng.integers(0, n))
    idx[where] = bad
    return idx, where


@pytest.mark.parametrize("access", ["read", "write", "atomic"])
def test_out_of_range_in_a_parallel_loop_is_reported_and_never_touches_memory(access, rng, session_cache_dir):
    debug_on(session_cache_dir)
    size = 16
    x = qd.field(qd.f32, shape=(size,))
    out = qd.field(qd.f32, shape=(PARALLEL_N,))

    @qd.kernel
    def gather(idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(idx.shape[0]):
            out[i] = x[idx[i]]  # <- gather read

    @qd.kernel
    def scatter(idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(idx.shape[0]):
            x[idx[i]] = qd.cast(i, qd.f32)  # <- scatter write

    @qd.kernel
    def histogram(idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(idx.shape[0]):
            x[idx[i]] += 1.0  # <- histogram atomic

    kernel, marker = {"read": (gather, "<- gather read"), "write": (scatter, "<- scatter write"),
                      "atomic": (histogram, "<- histogram atomic")}[access]
    bad = size + int(rng.integers(0, 1000))
    idx, where = indices_with_one_bad(rng, PARALLEL_N, size, bad)
    x_init = rng.random(size).astype(np.float32)
    x.from_numpy(x_init)
    with pytest.raises(IndexError) as e:
        kernel(idx)
    msg = str(e.value)
    assert msg.startswith(line_of(marker)), msg
    assert f"kernel '{kernel.__name__}': index {bad} out of range for field 'x' of shape ({size},)" in msg

    # the launch completed for every in-range index and wrote nothing anywhere else
    ok = np.delete(np.arange(PARALLEL_N), where)
    if access == "read":
        np.testing.assert_array_equal(out.to_numpy()[ok], x_init[idx[ok]])
        np.testing.assert_array_equal(x.to_numpy(), x_init)
    elif access == "atomic":
        want = x_init + np.bincount(idx[ok], minlength=size).astype(np.float32)
        np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(np.isin(np.arange(size), idx[ok]) | (x.to_numpy() == x_init), True)

    # the error was cleared: the next launch with valid indices works and reports nothing
    idx[where] = int(rng.integers(0, size))
    x.from_numpy(x_init)
    kernel(idx)
    if access == "read":
        np.testing.assert_array_equal(out.to_numpy(), x_init[idx])


def test_negative_index_in_a_serial_task(rng, session_cache_dir):
    debug_on(session_cache_dir)
    x = qd.field(qd.i32, shape=(8,))

    @qd.kernel
    def put(i: qd.i32, v: qd.i32):
        x[i] = v  # <- serial store

    value = int(rng.integers(1, 100))
    negative = -int(rng.integers(1, 9))
    with pytest.raises(IndexError, match=re.escape(f"index {negative} out of range for field 'x' of shape (8,)")) as e:
        put(negative, value)
    assert str(e.value).startswith(line_of("<- serial store"))
    np.testing.assert_array_equal(x.to_numpy(), 0)  # x[-1] style wrap-around did not happen
    put(3, value)
    assert x[3] == value


def test_two_dimensional_field_checks_each_axis(rng, session_cache_dir):
    """x[1, 7] of a (4, 5) field is inside its memory (element 12), still out of range."""
    debug_on(session_cache_dir)
    x = qd.field(qd.f64, shape=(4, 5))
    x_init = rng.random((4, 5))
    x.from_numpy(x_init)

    got = qd.field(qd.f64, shape=())

    @qd.kernel
    def read(i: qd.i32, j: qd.i32):
        got[None] = x[i, j]  # <- 2d read

    with pytest.raises(IndexError) as e:
        read(1, 7)
    assert str(e.value).startswith(line_of("<- 2d read"))
    assert "kernel 'read': index 7 out of range on axis 1 for field 'x' of shape (4, 5)" in str(e.value)
    with pytest.raises(IndexError, match=re.escape("index 4 out of range on axis 0 for field 'x'")):
        read(4, 0)
    read(3, 4)
    assert got[None] == x_init[3, 4]


def test_ndarray_argument_reports_its_shape_at_launch(rng, session_cache_dir):
    debug_on(session_cache_dir)

    @qd.kernel
    def shift(a: qd.types.ndarray(dtype=qd.f32, ndim=1), by: qd.i32):
        for i in range(a.shape[0]):
            a[i] = a[i + by] * 2.0  # <- ndarray shift

    n = int(rng.integers(5, 50))
    a = rng.random(n).astype(np.float32)
    with pytest.raises(IndexError) as e:
        shift(a.copy(), 1)
    assert str(e.value).startswith(line_of("<- ndarray shift"))
    assert f"kernel 'shift': index {n} out of range for ndarray 'a' of shape ({n},)" in str(e.value)
    b = a.copy()
    shift(b, 0)
    np.testing.assert_array_equal(b, a * np.float32(2.0))


def test_gradient_kernels_are_checked_too(rng, session_cache_dir):
    debug_on(session_cache_dir)
    x = qd.field(qd.f64, shape=(6,), needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def sum_squares(idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(idx.shape[0]):
            loss[None] += x[idx[i]] ** 2

    x.from_numpy(rng.random(6))
    loss.grad[None] = 1.0
    idx = np.array([0, 3, 9], np.int32)
    with pytest.raises(IndexError, match="kernel 'sum_squares': index 9 out of range for field 'x(.grad)?' of shape \\(6,\\)"):
        sum_squares.grad(idx)
    idx[2] = 5
    x.grad.fill(0)
    sum_squares.grad(idx)
    want = np.zeros(6)
    np.add.at(want, idx, 2 * x.to_numpy()[idx])
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-12)


def test_in_range_kernels_compute_the_same_with_and_without_debug(rng, session_cache_dir):
    grid_shape = (7, 9)
    g0 = rng.random(grid_shape).astype(np.float32)
    a0 = rng.random(50).astype(np.float32)
    idx = rng.integers(0, 63, 50).astype(np.int32)

    @qd.kernel
    def mix(a: qd.types.ndarray(dtype=qd.f32, ndim=1), idx: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            k = idx[i]
            grid[k // 9, k % 9] += a[i]
            a[i] = grid[k % 7, k % 9] * a[(i + 3) % a.shape[0]]

    results = []
    for debug in (False, True):
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir, debug=debug)
        grid = qd.field(qd.f32, shape=grid_shape)
        grid.from_numpy(g0)
        a = a0.copy()
        mix(a, idx)
        results.append((a, grid.to_numpy()))
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0], results[1][0])
    want = g0.copy()
    np.add.at(want, (idx // 9, idx % 9), a0)
    np.testing.assert_allclose(results[1][1], want, rtol=1e-5)


def test_without_debug_nothing_is_emitted(session_cache_dir):
    x = qd.field(qd.f32, shape=(16,))

    @qd.kernel
    def touch(i: qd.i32):
        x[i] += 1.0

    plain = touch.compile((0,))
    assert plain.meta.debug_checks == [] and plain.meta.debug_slot is None
    assert "debug_checks" not in plain.meta.to_dict()
    assert "qdc_bounds_fail" not in plain.artifacts["ll"].decode()
    assert "_q_finish" not in touch.__qdc_source__

    debug_on(session_cache_dir)
    checked = touch.compile((0,))
    assert checked.meta.ctx_words == plain.meta.ctx_words + 1
    assert "qdc_bounds_fail" in checked.artifacts["ll"].decode()
    (record,) = checked.meta.debug_checks
    assert record[:4] == ["field", "x", False, [16]] and (record[4] + ":").startswith(line_of("x[i] += 1.0"))


def test_debug_metadata_round_trips_and_is_checked():
    meta = A.KernelMeta("k", "qdc_k", [A.ParamMeta("a", "ndarray", "f32", 2)], [A.FieldMeta("x", "i32", (4,))], [],
                        debug_checks=[["field", "x", False, [4], "f.py:3:5"], ["ndarray", "a", True, 0, ""]])
    back = A.KernelMeta.from_dict(meta.to_dict())
    assert back.debug_checks == meta.debug_checks and back.debug_slot == meta.debug_slot == meta.ctx_words - 1
    for bad in (["field", "x", False, "4", ""], ["ndarray", "a", False, 1, ""], ["global", "x", False, [4], ""],
                ["field", "x", False, [4]]):
        d = meta.to_dict()
        d["debug_checks"] = [bad]
        with pytest.raises(ValueError, match="malformed metadata: debug check 0"):
            A.KernelMeta.from_dict(d)


AOT_MODULE = '''
import qdc as qd

cells = qd.field(qd.i32, shape=(10,))


@qd.kernel
def mark(i: qd.i32):
    cells[i] = 1
'''


def test_ahead_of_time_build_with_debug_raises_the_same_error(tmp_path, rng):
    src = tmp_path / "k"
    src.mkdir()
    (src / "marks.py").write_text(AOT_MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = CliRunner().invoke(cli, ["build", str(src), "--cache", cache, "-j", "1", "--debug"])
    assert r.exit_code == 0, r.output
    marks = load(cache, "marks")
    bad = 10 + int(rng.integers(0, 100))
    with pytest.raises(IndexError) as e:
        marks.mark(bad)
    assert f"marks.py:9:5: kernel 'mark': index {bad} out of range for field 'cells' of shape (10,)" in str(e.value)
    marks.mark(4)
    assert marks.cells.to_numpy().tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]


@qd.kernel
def pick_component(m: qd.types.NDArray[qd.math.mat2, 1], v: qd.types.NDArray[qd.math.vec3, 1],
                   out: qd.types.ndarray(dtype=qd.f32, ndim=1), p: qd.i32, x: qd.i32, y: qd.i32):
    for k in range(1):
        out[0] = m[p][x, y]  # <- component of a matrix
        w = v[p]
        w[y] = 1.5            # <- component written
        out[1] = w[x] + w[y]


def test_run_time_component_indices_are_checked(arch, session_cache_dir, rng):
    """`m[p][x, y]` with x or y known only at run time: outside the vector's or matrix's shape is
    an IndexError at sync naming the kernel, the line and the index (without debug the select
    chain over the components would give the last one); in range, the component itself."""
    qd.init(arch=arch, cache_dir=session_cache_dir, debug=True)
    m = rng.uniform(-1, 1, (4, 2, 2)).astype(np.float32)
    v = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    out = np.zeros(2, np.float32)
    p, x, y = int(rng.integers(0, 4)), int(rng.integers(0, 2)), int(rng.integers(0, 2))
    pick_component(m, v, out, p, x, y)
    qd.sync()
    w = v[p].copy()
    w[y] = 1.5
    np.testing.assert_allclose(out, [m[p, x, y], w[x] + w[y]], rtol=1e-6)
    for bad_x, bad_y, shown in ((2, 0, 2), (0, -1, -1), (int(rng.integers(3, 100)), 1, None)):
        with pytest.raises(IndexError) as info:
            pick_component(m, v, out, p, bad_x, bad_y)
            qd.sync()
        text = str(info.value)
        assert line_of("<- component of a matrix") in text and "kernel 'pick_component'" in text, text
        assert f"index {bad_x if shown is None else shown} is out of range" in text, text
    with pytest.raises(IndexError, match="index 3 is out of range for a vector/matrix dimension of size 3"):
        write_component(v, out, 3)
        qd.sync()


@qd.kernel
def write_component(v: qd.types.NDArray[qd.math.vec3, 1], out: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.i32):
    w = v[0]
    w[y] = 1.5
    out[0] = w[0]
