"""The adstack heap: capacities, growth, and the always-on overflow check."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import adstack, context
from autodiff_util import run_grad
from cpu_lanes_util import heap_slices_per_thread

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")


def sin_chain_reference(xs, n):
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for _ in range(n):
        d, v = d * np.cos(v) * 0.9, np.sin(v) * 0.9 + 0.05
    return v, d


def make_sin_chain(size, dtype=qd.f32):
    x = qd.field(dtype, shape=size, needs_grad=True)
    trips = qd.field(qd.i32, shape=size)
    y = qd.field(dtype, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(trips[i]):
                v = qd.sin(v) * 0.9 + 0.05
            y[None] += v

    return chain, x, trips, y


def test_capacity_4096_with_eight_f64_loop_carried_variables(rng, session_cache_dir):
    qd.init(arch=qd.cpu, ad_stack_size=4096, cache_dir=session_cache_dir)
    x = qd.field(qd.f64, shape=8, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def eight():
        for i in x:
            a = x[i]
            b, c, d, e, f, g, h = a * 0.5, a + 0.1, a * a, 0.3 - a, a * 0.2, a + 0.7, 1.0 - a * a
            for _ in range(n[None]):
                a, b, c, d = qd.sin(b) * 0.5 + a * 0.5, qd.cos(c) * 0.9, qd.tanh(d + a), qd.sin(e) * 0.8
                e, f, g, h = qd.cos(f) * 0.7, qd.sin(g + h) * 0.9, qd.tanh(h) + 0.1, qd.sin(a * b) * 0.5
            y[None] += a + b + c + d + e + f + g + h

    stacks = eight.grad.compile().meta.adstack["stacks"]
    assert len(stacks) == 8 and all(r["max_size"] == 4096 and r["dtype"] == "f64" for r in stacks)
    x.from_numpy(rng.uniform(0, 1, 8))
    n[None] = 3000
    from autodiff_util import check_against_central_diff
    check_against_central_diff(eight, y, [x], rtol=1e-4, atol=1e-8)
    slices = min(context.current().device.num_threads, 8)  # never more slices than iterations
    assert qd.adstack_heap_bytes() >= slices * 8 * (8 + 4096 * 16)


def test_heap_grows_on_demand_and_is_reused():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    def chain_of(length):
        @qd.kernel
        def chain():
            for i in x:
                v = x[i]
                for _ in range(length):
                    v = qd.sin(v)
                y[None] += v
        return chain

    assert qd.adstack_heap_bytes() == 0
    small, big = chain_of(10), chain_of(3000)
    small.grad()
    # 4 iterations are too little work to wake the worker threads: one thread runs them, taking
    # a slice per lane where the task runs W iterations at a time (cpu_lanes_util.py)
    threads = heap_slices_per_thread(small.grad.compile())
    # one f32 stack: the count, then the first store and one entry per iteration (the primal, 4
    # bytes: the adjoint is a local of the reverse sweep), the slice 8-byte aligned
    small_slice = (8 + 11 * 4 + 7) // 8 * 8
    assert qd.adstack_heap_bytes() == threads * small_slice
    big.grad()
    needed = threads * ((8 + 3001 * 4 + 7) // 8 * 8)
    assert qd.adstack_heap_bytes() == max(needed, 2 * threads * small_slice)
    small.grad()
    assert qd.adstack_heap_bytes() == needed  # reused, never shrunk
    heap = adstack.heap_for(context.current())
    heap.ensure(needed + 1, "test")  # doubling: max(required, 2 * current)
    assert heap.nbytes == 2 * needed


def test_heap_growth_retries_at_exactly_required(monkeypatch):
    heap = adstack.heap_for(context.current())
    heap.ensure(1000, "test")
    real = heap.device.allocate
    asked = []

    def allocate(nbytes):
        asked.append(nbytes)
        if nbytes > 1500:
            raise MemoryError
        return real(nbytes)

    monkeypatch.setattr(heap.device, "allocate", allocate)
    heap.ensure(1200, "test")
    assert asked == [2000, 1200] and heap.nbytes == 1200
    with pytest.raises(MemoryError, match="kernel 'big': cannot allocate 5000 bytes.*ad_stack_size"):
        heap.ensure(5000, "big")
    assert heap.nbytes == 1200


def test_exactly_at_capacity_succeeds_and_one_past_raises(rng, session_cache_dir):
    capacity = 32
    qd.init(arch=qd.cpu, ad_stack_size=capacity, cache_dir=session_cache_dir)
    chain, x, trips, y = make_sin_chain(4)
    xs = rng.uniform(0, 1, 4).astype(np.float32)
    x.from_numpy(xs)
    trips.fill(capacity - 1)  # the first store, then one push per iteration: exactly full
    g = run_grad(chain, x, y)
    np.testing.assert_allclose(g, sin_chain_reference(xs, capacity - 1)[1], rtol=1e-4)
    trips[2] = capacity
    with pytest.raises(qd.AdStackOverflowError) as info:
        run_grad(chain, x, y)
    e = info.value
    assert (e.kernel, e.allocated, e.required) == ("chain", capacity, capacity + 1)
    assert "chain" in str(e) and e.task in str(e) and f"{capacity} entries allocated" in str(e)
    trips[2] = capacity - 1  # the flag was cleared: the next launch runs normally
    np.testing.assert_allclose(run_grad(chain, x, y), sin_chain_reference(xs, capacity - 1)[1], rtol=1e-4)


def test_multithreaded_overflow_leaves_other_slices_intact(rng, session_cache_dir):
    qd.init(arch=qd.cpu, ad_stack_size=16, cpu_max_num_threads=2, cache_dir=session_cache_dir)
    size = 4096
    chain, x, trips, y = make_sin_chain(size)
    xs = rng.uniform(0, 1, size).astype(np.float32)
    x.from_numpy(xs)
    trips.fill(10)
    run_grad(chain, x, y)  # sizes the heap; then make it larger than two slices, with guard bytes
    heap = adstack.heap_for(context.current())
    stride = heap.nbytes // 2
    heap.ensure(4 * stride, "test")
    heap.alloc.host[:] = 0xAB
    trips_now = np.full(size, 10, np.int32)
    trips_now[: size // 2] = 1000  # the first thread's elements overflow by far
    trips.from_numpy(trips_now)
    with pytest.raises(qd.AdStackOverflowError) as info:
        run_grad(chain, x, y)
    assert info.value.required == 1001 and info.value.allocated == 16
    # Which worker takes which chunk is the scheduler's choice (on a loaded machine one thread can
    # take them all), so only the two slices as a whole are known to have been written.
    assert not np.all(heap.alloc.host[:2 * stride] == 0xAB)
    assert np.all(heap.alloc.host[2 * stride:] == 0xAB)  # nothing written past the two slices
    got = x.grad.to_numpy()[size // 2:]
    np.testing.assert_allclose(got, sin_chain_reference(xs[size // 2:], 10)[1], rtol=1e-4)
    trips.fill(10)
    run_grad(chain, x, y)  # the overflow word was cleared with the error: this launch reports nothing


def test_clean_exit_after_caught_overflow_and_logging(tmp_path):
    script = tmp_path / "overflow.py"
    script.write_text(textwrap.dedent(f"""
        import warnings
        import qdc as qd
        qd.init(arch=qd.cpu, ad_stack_size=8, cache_dir={str(tmp_path / 'cache')!r})
        x = qd.field(qd.f32, shape=64, needs_grad=True)
        n = qd.field(qd.i32, shape=())
        y = qd.field(qd.f32, shape=(), needs_grad=True)

        @qd.kernel
        def chain():
            for i in x:
                v = x[i]
                for _ in range(n[None]):
                    v = qd.sin(v)
                y[None] += v

        n[None] = 100
        chain()
        try:
            chain.grad()
        except qd.AdStackOverflowError as e:
            print("caught:", e.required)
    """), encoding="utf-8")
    env = dict(os.environ, QDC_LOG="adstack")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "caught: 101" in done.stdout
    assert "[qdc adstack]" in done.stderr and "8 entries (ad_stack_size)" in done.stderr
    assert "Traceback" not in done.stderr


def test_kernel_without_adstack_allocates_nothing():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def linear():
        for i in x:
            y[None] += x[i] * 3.0

    linear()
    linear.grad()
    assert qd.adstack_heap_bytes() == 0
    assert linear.grad.compile().meta.adstack_slot is None
