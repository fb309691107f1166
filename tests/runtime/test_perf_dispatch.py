"""qd.perf_dispatch: each call runs exactly one compatible implementation; a geometry is measured
(warmup, then `active` timed calls of each) and then runs the fastest, until it is measured again."""
import time

import numpy as np
import pytest

import qdc as qd


def make_dispatch(delays: dict, calls: list, **options):
    @qd.perf_dispatch(get_geometry_hash=lambda a, n: (a.shape, n), **options)
    def work(a, n):
        ...

    for name, delay in delays.items():
        def impl(a, n, name=name, delay=delay):
            calls.append(name)
            time.sleep(delay)
            a[:] += n
        impl.__name__ = name
        work.register(impl)
    return work


def test_measures_then_runs_the_fastest():
    calls = []
    work = make_dispatch({"slow": 0.02, "fast": 0.0}, calls, first_warmup=1, active=2, repeat_after_count=0)
    a = np.zeros(4)
    for _ in range(10):
        work(a, 1)
    np.testing.assert_array_equal(a, 10)  # one implementation per call, never two
    assert calls[:6].count("slow") == 3 and calls[:6].count("fast") == 3  # 1 warmup + 2 timed each
    assert calls[6:] == ["fast"] * 4


def test_repeat_after_count_measures_again_and_geometries_are_separate():
    calls = []
    work = make_dispatch({"a": 0.0, "b": 0.01}, calls, first_warmup=0, warmup=0, active=1, repeat_after_count=3)
    x = np.zeros(2)
    for _ in range(2 + 3 + 2):  # measure (2), 3 chosen calls, measure again (2)
        work(x, 1)
    assert calls == ["a", "b", "a", "a", "a", "a", "b"]
    y = np.zeros(3)  # another shape: another geometry, measured from the start
    calls.clear()
    work(y, 1)
    work(y, 1)
    assert sorted(calls) == ["a", "b"]


def test_compatibility_filters():
    calls = []

    @qd.perf_dispatch(get_geometry_hash=lambda n: n)
    def pick(n):
        ...

    @pick.register(is_compatible=lambda n: n < 10)
    def small(n):
        calls.append("small")
        return n

    @pick.register(is_compatible=lambda n: n >= 10)
    def large(n):
        calls.append("large")
        return -n

    assert pick(3) == 3 and pick(30) == -30 and calls == ["small", "large"]

    @qd.perf_dispatch(get_geometry_hash=lambda n: n)
    def none(n):
        ...

    none.register(lambda n: n, is_compatible=lambda n: False)
    with pytest.raises(RuntimeError, match="none of its 1 registered implementations"):
        none(1)


def test_dispatches_kernels(rng):
    @qd.perf_dispatch(get_geometry_hash=lambda a: a.shape)
    def double(a):
        ...

    @double.register
    @qd.kernel
    def double_loop(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] *= 2

    @double.register
    @qd.kernel
    def double_serial(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        qd.loop_config(serialize=True)
        for i in range(a.shape[0]):
            a[i] = a[i] + a[i]

    a0 = rng.standard_normal(64).astype(np.float32)
    a = a0.copy()
    for _ in range(5):
        double(a)
    np.testing.assert_array_equal(a, a0 * 32)
