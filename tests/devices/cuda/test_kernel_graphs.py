"""`@qd.kernel(graph=True)` on every arch: the same results as plain launches, forward and
gradient (adstacks included), with arguments and trip counts that change between launches, a
range bound computed by an earlier task of the launch, and an adstack overflow inside a replay
raised at sync (the next replay works). On CUDA the launches are graph replays (counted); on the
CUDA driver stand-in (test_device_loss.py's FakeCuda) the graphs themselves are checked: one
capture per grid tuple, replays that launch the captured tasks, trip counts from an earlier task
not read back, old graphs destroyed only after a fence."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.devices.cuda import driver as cuda_driver
from qdc.runtime.devices.stream import GRAPHS_PER_KERNEL

from test_amdgpu_device import FakeHip
from test_device_loss import FakeCuda, StickyBinding

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")


def _replays():
    return getattr(context.current().device, "graph_replays", 0)


def _pair(make):
    """The kernel `make(decorator)` defines, plain and with graph=True."""
    return make(qd.kernel), make(qd.kernel(graph=True))


def test_the_decorator_takes_graph_as_a_keyword_only():
    with pytest.raises(TypeError, match=r"keywords \(@qd.kernel\(graph=True\)\)"):
        qd.kernel(True)


def test_forward_replays_equal_plain_launches_with_changing_arguments(arch, rng):
    n = 3000
    x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
    total = qd.field(qd.f32, shape=())

    def make(decorator):
        @decorator
        def step(a: qd.f32, m: qd.i32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
            for i in range(m):  # a trip count from an argument: another grid when it changes
                y[i] = a * x[i] + y[i]
            for i in x:
                x[i] = x[i] * 0.5 + 1.0
            for i in range(1):
                total[None] += y[0]
        return step

    plain, graph = _pair(make)
    results = []
    for kernel in (plain, graph):
        x.from_numpy(np.linspace(-1, 1, n).astype(np.float32))
        y.fill(0.25)
        total[None] = 0
        before = _replays()
        for a, m in ((2.0, n), (-1.5, n), (0.5, 17), (3.0, n), (1.0, 0), (0.75, 17)):
            kernel(a, m, x, y)
        results.append((x.to_numpy(), y.to_numpy(), total[None], _replays() - before))
    (x0, y0, t0, r0), (x1, y1, t1, r1) = results
    np.testing.assert_array_equal(x1, x0)
    np.testing.assert_array_equal(y1, y0)
    assert t1 == t0 and r0 == 0
    assert r1 == (6 if arch == "cuda" else 0)


def _chain(decorator, n):
    x = qd.field(qd.f32, shape=n, needs_grad=True)
    trips = qd.field(qd.i32, shape=n)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @decorator
    def chain(k: qd.f32):
        for i in x:
            v = x[i]
            for _ in range(trips[i]):
                v = v * v * 0.45 + v * 0.5 + k
            y[None] += v
    return chain, x, trips, y


def _grad(kernel, x, y, k):
    y[None] = 0
    kernel(k)
    x.grad.fill(0)
    y.grad[None] = 1
    kernel.grad(k)
    return y[None], x.grad.to_numpy()


def test_gradient_replays_equal_plain_launches_as_trip_counts_change(arch, rng):
    n = 2000
    xs = rng.uniform(0.1, 0.6, n).astype(np.float32)
    rounds = [(rng.integers(0, t, n).astype(np.int32), k)  # the heap grows between replays, then not
              for t, k in ((5, 0.01), (40, 0.02), (3, 0.0), (40, 0.01))]
    runs = []
    for decorator in (qd.kernel, qd.kernel(graph=True)):
        chain, x, trips, y = _chain(decorator, n)
        x.from_numpy(xs)
        out = []
        before = _replays()
        for ts, k in rounds:
            trips.from_numpy(ts)
            out.append(_grad(chain, x, y, k))
        runs.append((out, _replays() - before))
    (plain, r0), (graph, r1) = runs
    for (v0, g0), (v1, g1) in zip(plain, graph):
        assert v1 == pytest.approx(v0, rel=1e-6)
        np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-7)
    assert r0 == 0 and r1 == (8 if arch == "cuda" else 0)  # forward and grad, 4 times


def test_a_bound_computed_by_an_earlier_task_is_read_on_the_device(arch):
    results = []
    for decorator in (qd.kernel, qd.kernel(graph=True)):
        x = qd.field(qd.f32, shape=20000, needs_grad=True)
        m = qd.field(qd.i32, shape=())
        y = qd.field(qd.f32, shape=(), needs_grad=True)

        @decorator
        def dyn(k: qd.i32):
            n = 0
            for j in range(k):  # an earlier task computes the range bound: a temporary
                n += m[None]
            for i in range(n):
                v = x[i]
                for _ in range(i % 7):
                    v = v * 0.9 + 0.1 * v * v
                y[None] += v

        x.from_numpy(np.linspace(0.1, 0.9, 20000).astype(np.float32))
        out = []
        for k, bound in ((3, 300), (5, 3000), (2, 10)):
            m[None] = bound
            y[None] = 0
            dyn(k)
            x.grad.fill(0)
            y.grad[None] = 1
            dyn.grad(k)
            out.append((y[None], x.grad.to_numpy()))
        results.append(out)
    for (v0, g0), (v1, g1) in zip(*results):
        assert v1 == pytest.approx(v0, rel=1e-6)
        np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-7)
    assert results[1][1][1][14999] != 0 and not results[1][1][1][15000:].any()


def test_an_overflow_inside_a_replay_is_raised_at_sync_and_the_next_replay_works(arch, session_cache_dir):
    qd.init(arch=arch, cache_dir=session_cache_dir, ad_stack_size=8)
    chain, x, trips, y = _chain(qd.kernel(graph=True), 1000)
    x.from_numpy(np.full(1000, 0.3, np.float32))
    trips.from_numpy(np.full(1000, 3, np.int32))
    _grad(chain, x, y, 0.01)  # replayed once without overflow
    trips.from_numpy(np.full(1000, 20, np.int32))
    y[None] = 0
    chain(0.01)
    y.grad[None] = 1
    with pytest.raises(qd.AdStackOverflowError, match=r"kernel 'chain.*8 entries allocated, 2\d required"):
        chain.grad(0.01)  # a synchronous device (cpu) raises here, the others at the sync
        qd.sync()
    trips.from_numpy(np.full(1000, 3, np.int32))
    value, grad = _grad(chain, x, y, 0.01)
    qd.sync()
    assert np.isfinite(grad).all() and grad[0] > 0


# ---- the graphs themselves, on the CUDA driver stand-in --------------------------------------------

class CapturingHip(FakeHip):
    """FakeHip whose launches go into the graph being captured, if any."""

    def __init__(self):
        super().__init__()
        self.capture = None

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if self.capture is not None:
            self.capture.append((f, gx, bx, params))
            return (0,)
        return super().hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)


class GraphCuda(FakeCuda):
    """FakeCuda with stream capture and executable graphs (lists of the captured launches)."""

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1

    def __init__(self):
        self.hip = CapturingHip()
        self.instantiated, self.destroyed, self.replayed = [], [], []

    def cuStreamBeginCapture(self, stream, mode):
        assert self.hip.capture is None and mode == 1
        self.hip.capture = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        graph, self.hip.capture = self.hip.capture, None
        return 0, graph

    def cuGraphInstantiateWithFlags(self, graph, flags):
        self.instantiated.append(tuple(graph))
        return 0, self.instantiated[-1]

    def cuGraphLaunch(self, graph, stream):
        self.replayed.append(graph)
        self.hip.launches.extend(graph)
        return (0,)

    def cuGraphDestroy(self, graph):
        return (0,)

    def cuGraphExecDestroy(self, graph):
        self.destroyed.append(graph)
        return (0,)


@pytest.fixture
def graph_cuda(monkeypatch, session_cache_dir):
    cu = StickyBinding(GraphCuda(), resets=())
    monkeypatch.setattr(cuda_driver, "load_binding", lambda: cu)
    qd.init(arch=qd.cuda, cache_dir=session_cache_dir)
    yield cu.binding
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_one_capture_per_grid_then_replays(graph_cuda):
    cu = graph_cuda
    x = qd.ndarray(qd.f32, shape=(5000,))

    @qd.kernel(graph=True)
    def two(m: qd.i32, x: qd.types.ndarray(qd.f32, ndim=1)):
        for i in range(m):
            x[i] += 1.0
        for i in x:
            x[i] *= 2.0

    dev = context.current().device
    block = dev.default_block_dim
    for m in (1000, 1000, 300, 1000, 300, 0):
        start = len(cu.hip.launches)
        two(m, x)
        grids = [gx for _f, gx, _b, _p in cu.hip.launches[start:]]
        assert grids == ([-(-m // block)] if m else []) + [-(-5000 // block)]
    assert len(cu.instantiated) == 3 and len(cu.replayed) == 6  # grids (4, 20), (2, 20), (0, 20)
    assert cu.replayed[0] is cu.replayed[1] is cu.replayed[3]
    for m in range(1, GRAPHS_PER_KERNEL + 2):  # more grids than a kernel keeps: the oldest go
        two(m * block, x)
    assert not cu.destroyed  # evicted, but replays of them may still be queued: destroyed after a fence
    qd.sync()
    assert cu.destroyed and all(g in cu.instantiated for g in cu.destroyed)
    assert cu.replayed[-1] not in cu.destroyed and len(cu.instantiated) - len(cu.destroyed) == GRAPHS_PER_KERNEL


def test_a_bound_from_an_earlier_task_is_not_read_back_during_a_replay(graph_cuda):
    cu = graph_cuda
    x = qd.field(qd.f32, shape=20000)
    m = qd.field(qd.i32, shape=())

    @qd.kernel(graph=True)
    def dyn(k: qd.i32):
        n = 0
        for j in range(k):
            n += m[None]
        for i in range(n):
            x[i] += 1.0

    dev = context.current().device
    dyn(3)
    qd.sync()
    start, reads = len(cu.hip.launches), cu.hip.log.count("read")
    dyn(4)
    *_, (_, grid, block, _) = cu.hip.launches[start:]
    assert grid == dev.grid_cap(block)  # the grid cap: its loop reads the bound on the device
    assert cu.hip.log.count("read") == reads  # nothing read back during the launch
    assert len(cu.instantiated) == 1


@qd.kernel(graph=True)
def _iterate_on_device(x: qd.types.ndarray(qd.f32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0),
                       outer: qd.types.ndarray(qd.i32, ndim=0), inner: qd.types.ndarray(qd.i32, ndim=0)):
    while qd.graph.do_while(outer):
        inner[()] = n[()]
        while qd.graph.do_while(inner):
            for i in range(x.shape[0]):
                x[i] = x[i] * 0.5 + 1.0
            inner[()] = inner[()] - 1
        outer[()] = outer[()] - 1


def test_do_while_loops_run_on_the_device_where_the_driver_has_conditional_nodes(arch, rng, monkeypatch):
    """On CUDA 12.4+ a graph=True kernel's do_while loops are conditional WHILE nodes (with
    QDC_CUDA_DEVICE_LOOPS=1): one graph replay a launch, no flag read back; the results are the
    host loop's (the plain kernel's)."""
    monkeypatch.setenv("QDC_CUDA_DEVICE_LOOPS", "1")
    x0 = rng.standard_normal(5000).astype(np.float32)
    results, replays = [], []
    for kernel in (_iterate_on_device, _plain_iterate):
        x = qd.ndarray(qd.f32, shape=x0.shape)
        x.from_numpy(x0)
        outer, inner, n = (qd.ndarray(qd.i32, shape=()) for _ in range(3))
        n.from_numpy(np.array(3, np.int32))
        outer.from_numpy(np.array(4, np.int32))
        before = _replays()
        kernel(x, n, outer, inner)
        replays.append(_replays() - before)
        results.append((x.to_numpy(), int(outer.to_numpy()), int(inner.to_numpy())))
    want = x0.astype(np.float64)
    for _ in range(12):
        want = want * 0.5 + 1.0
    for got, o, i in results:
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert (o, i) == (0, 0)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    path = _iterate_on_device.__qdc_launcher__.path
    if arch != "cuda":
        assert path.name == "graph_loops", path
        return
    if path.name != "device_loops" and "not found" in path.why:
        pytest.skip(f"the host loop ran: {path.why}")
    assert path.name == "device_loops" and replays == [1, 0], (path, replays)


@qd.kernel
def _plain_iterate(x: qd.types.ndarray(qd.f32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0),
                   outer: qd.types.ndarray(qd.i32, ndim=0), inner: qd.types.ndarray(qd.i32, ndim=0)):
    while qd.graph.do_while(outer):
        inner[()] = n[()]
        while qd.graph.do_while(inner):
            for i in range(x.shape[0]):
                x[i] = x[i] * 0.5 + 1.0
            inner[()] = inner[()] - 1
        outer[()] = outer[()] - 1
