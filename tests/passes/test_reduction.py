"""Thread-local reductions: one atomic per chunk for loop-invariant targets, same results."""
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands.inspect import inspect_ir

# Large enough to be split over the worker threads (several chunks), plus the serial path.
SIZES = [100_003, 7]


def body_and_final(text: str):
    m = re.search(r"\n(\s+)for %\d+ : \w+ in \[.*?\) \{\n(.*?)\n\1\}\n(?:\1chunk_final \{\n(.*?)\n\1\})?", text, re.S)
    return m.group(2), m.group(3) or ""


def assert_reduced(text: str, op: str):
    body, final = body_and_final(text)
    assert f"accumulate_{op}" in body and "atomic_" not in body, text
    assert f"atomic_{op}" in final, text


@pytest.mark.parametrize("n", SIZES)
def test_f32_sum_matches_float64_numpy(arch, rng, n):
    y = qd.field(qd.f32, shape=())

    @qd.kernel
    def total(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            y[None] += a[i]

    a = rng.random(n).astype(np.float32)
    assert_reduced(inspect_ir(total, a), "add")
    y[None] = 0.25
    total(a)
    # a GPU adds one f32 partial per workgroup (~400 here) into the total: more rounding than 2 CPU chunks
    np.testing.assert_allclose(y[None], 0.25 + a.astype(np.float64).sum(), rtol=1e-5 if arch == "cpu" else 4e-5)


def test_f32_sum_of_integers_is_exact(arch, rng):
    """Small integers in f32 add exactly in any order: one lost or doubled element shows."""
    y = qd.field(qd.f32, shape=())

    @qd.kernel
    def total(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            y[None] += a[i]

    a = rng.integers(0, 16, 100_003).astype(np.float32)
    total(a)
    assert y[None] == a.astype(np.int64).sum()


@pytest.mark.parametrize("dtype", [qd.i32, qd.i64, qd.u32, qd.f64])
def test_sum_and_difference_by_type(arch, rng, dtype):
    npt = dtype.np_dtype
    s = qd.field(dtype, shape=(2,))

    @qd.kernel
    def sums(a: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(a.shape[0]):
            s[0] += a[i]
            qd.atomic_sub(s[1], a[i])

    a = rng.integers(0, 1000, 100_003).astype(npt)
    text = inspect_ir(sums, a)
    assert text.count("chunk_init") == 1 and text.count("atomic_add") == 2  # one per address, sub included
    s.from_numpy(np.array([7, 1_000_000_000], npt))
    sums(a)
    total = a.astype(np.float64 if dtype is qd.f64 else np.int64).sum()
    expect = np.array([7 + total, 1_000_000_000 - total]).astype(npt)
    np.testing.assert_array_equal(s.to_numpy(), expect)


@pytest.mark.parametrize("dtype", [qd.f32, qd.i32, qd.u8])
@pytest.mark.parametrize("n", SIZES)
def test_min_and_max(arch, rng, dtype, n):
    lo = qd.field(dtype, shape=())
    hi = qd.field(dtype, shape=())

    @qd.kernel
    def extremes(a: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(a.shape[0]):
            qd.atomic_min(lo[None], a[i])
            qd.atomic_max(hi[None], a[i])

    if dtype is qd.f32:
        a = rng.standard_normal(n).astype(np.float32)
    else:
        a = rng.integers(1, 200, n).astype(dtype.np_dtype)
    text = inspect_ir(extremes, a)
    assert "accumulate_min" in text and "accumulate_max" in text
    lo[None], hi[None] = 100, 50  # the initial values take part
    extremes(a)
    assert lo[None] == min(a.min(), 100) and hi[None] == max(a.max(), 50)


def test_bitwise_reductions(arch, rng):
    r = qd.field(qd.u32, shape=(3,))

    @qd.kernel
    def bits(a: qd.types.ndarray(dtype=qd.u32, ndim=1)):
        for i in range(a.shape[0]):
            qd.atomic_and(r[0], a[i])
            qd.atomic_or(r[1], a[i])
            qd.atomic_xor(r[2], a[i])

    a = rng.integers(0, 2**32, 50_001, dtype=np.uint64).astype(np.uint32) | np.uint32(0x10000001)
    r.from_numpy(np.array([0xFFFFFFFF, 0, 0x5], np.uint32))
    bits(a)
    np.testing.assert_array_equal(r.to_numpy(), [np.bitwise_and.reduce(a), np.bitwise_or.reduce(a),
                                                 np.bitwise_xor.reduce(a) ^ 0x5])


def test_target_index_from_an_argument_conditionals_and_inner_loops(arch, rng):
    hist = qd.field(qd.f64, shape=(4,))

    @qd.kernel
    def binned(a: qd.types.ndarray(dtype=qd.f64, ndim=1), slot: qd.i32, reps: qd.i32):
        for i in range(a.shape[0]):
            if a[i] > 0:
                for _ in range(reps):
                    hist[slot + 1] += a[i]

    a = rng.standard_normal(60_000)
    assert_reduced(inspect_ir(binned, a), "add")
    binned(a, 1, 3)
    expect = np.zeros(4)
    expect[2] = 3 * a[a > 0].sum()
    np.testing.assert_allclose(hist.to_numpy(), expect, rtol=1e-12)


def test_ndarray_target(arch, rng):
    @qd.kernel
    def total(a: qd.types.ndarray(dtype=qd.i64, ndim=1), out: qd.types.ndarray(dtype=qd.i64, ndim=1)):
        for i in range(a.shape[0]):
            out[0] += a[i] * a[i]

    a = rng.integers(-1000, 1000, 70_000)
    out = np.array([5, 0], np.int64)
    assert_reduced(inspect_ir(total, a, out), "add")
    total(a, out)
    np.testing.assert_array_equal(out, [5 + (a * a).sum(), 0])


def test_empty_range_leaves_the_target_alone(arch):
    m = qd.field(qd.f32, shape=())

    @qd.kernel
    def smallest(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
        for i in range(n):
            qd.atomic_min(m[None], a[i])

    m[None] = float("nan")
    smallest(np.ones(4, np.float32), 0)
    assert np.isnan(m[None])


def test_varying_or_observed_targets_keep_their_atomics(arch, rng):
    h = qd.field(qd.i32, shape=(4,))
    c = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=())
    seen = qd.field(qd.f32, shape=(8,))

    @qd.kernel
    def varying(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            h[a[i] % 4] += 1  # the address changes per iteration

    @qd.kernel
    def used(out: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(out.shape[0]):
            out[qd.atomic_add(c[None], 1)] = i  # the old value is used

    @qd.kernel
    def observed():
        for i in range(8):
            y[None] += 1.0
            seen[i] = y[None]  # the running value is read back

    a = rng.integers(0, 1000, 30_000).astype(np.int32)
    out = np.zeros(20_000, np.int32)
    for k, args in ((varying, (a,)), (used, (out,)), (observed, ())):
        body, final = body_and_final(inspect_ir(k, *args))
        assert "atomic_add" in body and "accumulate" not in body and not final
    varying(a)
    np.testing.assert_array_equal(h.to_numpy(), np.bincount(a % 4, minlength=4))
    used(out)
    assert c[None] == 20_000 and np.array_equal(np.sort(out), np.arange(20_000))
    observed()
    assert y[None] == 8 and set(seen.to_numpy()) <= set(range(1, 9))


def test_serialized_loop_keeps_ordered_atomics(arch):
    y = qd.field(qd.i32, shape=())
    trace = qd.field(qd.i32, shape=(6,))

    @qd.kernel
    def ordered():
        qd.loop_config(serialize=True)
        for i in range(6):
            y[None] += i
            trace[i] = y[None]

    assert "accumulate" not in inspect_ir(ordered)
    ordered()
    np.testing.assert_array_equal(trace.to_numpy(), np.cumsum(np.arange(6)))


@pytest.mark.parametrize("begin, end", [(3, 100_003), (-50_000, 50_001), (0, 40_000)])
def test_parallel_chunks_cover_the_range_exactly_once(arch, begin, end):
    """Chunks are handed out dynamically: every index runs once, and the per-chunk partial
    sums add up to the whole."""
    total = qd.field(qd.i64, shape=())

    @qd.kernel
    def mark(out: qd.types.ndarray(dtype=qd.i32, ndim=1), lo: qd.i32, hi: qd.i32):
        for i in range(lo, hi):
            out[i - lo] += 1
            total[None] += i

    out = np.zeros(end - begin, np.int32)
    mark(out, begin, end)
    assert np.all(out == 1)
    assert total[None] == sum(range(begin, end))
