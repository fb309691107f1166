"""The CUDA device (runtime/devices/cuda) on a real GPU: memory, ranged copies, fenced frees,
forward kernels against numpy, grad kernels with adstacks against the CPU backend and central
differences, heap growth across launches, overflow then a normal launch, and a dynamic range
whose bound an earlier task computed. Skipped, with the reason, without cuda-bindings, an
NVIDIA driver or a GPU (CI); run on an NVIDIA GPU (make test-gpu)."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.devices.cuda import driver

from backend_util import check_zeroed_ranged_copies, hide_package

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time")


def _cuda_or_skip():
    try:
        from qdc.runtime.devices.cuda.device import CudaDevice
        return CudaDevice()
    except driver.CudaUnavailableError as e:
        pytest.skip(f"no CUDA GPU: {e}")


@pytest.fixture(scope="module")
def dev():
    device = _cuda_or_skip()
    yield device
    device.close()


@pytest.fixture
def on_cuda(session_cache_dir):
    _cuda_or_skip().close()
    def init(**options):
        qd.init(arch="cuda", cache_dir=session_cache_dir, **options)
        return context.current().device
    yield init
    qd.sync()
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_missing_binding_or_driver_names_the_package(monkeypatch):
    hide_package(monkeypatch, "cuda")
    with pytest.raises(driver.CudaUnavailableError, match="pip install cuda-bindings"):
        driver.load_binding()


# ---- the device itself -------------------------------------------------------------------------

def test_allocations_are_zeroed_and_copies_are_ranged(dev):
    a = check_zeroed_ranged_copies(dev)
    dev.free_after_fence(a)
    dev.sync()
    assert a.handle is None


def test_task_slices_are_whole_blocks_up_to_the_grid_cap(dev):
    launch = {"policy": "grid", "block_dim": 128}
    assert dev.task_slices(launch, 0) == 0
    assert dev.task_slices(launch, 1) == 128
    assert dev.task_slices(launch, 1000) == 8 * 128
    cap = dev.grid_cap(128)
    assert dev.task_slices(launch, 10 ** 12) == cap * 128 == dev.task_slices(launch, None)
    assert dev.task_slices({"policy": "grid", "block_dim": 1}, 1) == 1


# ---- kernels -----------------------------------------------------------------------------------

@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = a * x[i] + y[i]


def test_forward_kernels_match_numpy(on_cuda):
    on_cuda()
    n = 1 << 20
    rng = np.random.default_rng(1)
    xs, ys = rng.random(n).astype(np.float32), rng.random(n).astype(np.float32)
    x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
    x.from_numpy(xs)
    y.from_numpy(ys)
    saxpy(2.5, x, y)
    saxpy(1.0, x, y)  # same ctx words but one: re-uploaded
    np.testing.assert_allclose(y.to_numpy(), ys + 3.5 * xs, rtol=1e-6)

    f = qd.field(qd.f32, shape=(300, 7))
    s = qd.field(qd.f32, shape=())

    @qd.kernel
    def fill_and_sum(k: qd.f32):
        for i, j in f:
            f[i, j] = i * 10 + j * k
        for i, j in f:
            s[None] += f[i, j]

    fill_and_sum(0.5)
    want = np.add.outer(np.arange(300) * 10.0, np.arange(7) * 0.5)
    np.testing.assert_allclose(f.to_numpy(), want)
    assert s[None] == pytest.approx(want.sum(), rel=1e-5)


def _chain_kernel(size):
    x = qd.field(qd.f32, shape=size, needs_grad=True)
    trips = qd.field(qd.i32, shape=size)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(trips[i]):
                v = v * v * 0.45 + v * 0.5 + 0.01  # polynomial: no libdevice needed
            y[None] += v

    return chain, x, trips, y


def _grad(kernel, x, y):
    y[None] = 0
    kernel()
    x.grad.fill(0)
    y.grad[None] = 1
    kernel.grad()
    return y[None], x.grad.to_numpy()


def _chain_on(arch, cache, xs, ts):
    qd.init(arch=arch, cache_dir=cache)
    chain, x, trips, y = _chain_kernel(len(xs))
    x.from_numpy(xs)
    trips.from_numpy(ts)
    value, grad = _grad(chain, x, y)
    qd.sync()
    return value, grad, qd.adstack_heap_bytes()


def test_grad_with_adstacks_matches_cpu_and_central_differences(on_cuda, session_cache_dir):
    rng = np.random.default_rng(2)
    n = 5000
    xs = rng.uniform(0.1, 0.6, n).astype(np.float32)
    ts = rng.integers(0, 40, n).astype(np.int32)
    v_cpu, g_cpu, _ = _chain_on(qd.cpu, session_cache_dir, xs, ts)
    on_cuda()
    v_gpu, g_gpu, heap = _chain_on("cuda", session_cache_dir, xs, ts)
    assert v_gpu == pytest.approx(v_cpu, rel=1e-4)
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-4, atol=1e-6)
    # the heap holds a slice per launched thread: ceil(5000 / 256) blocks of 256, each a count
    # and 39 f32 primals (the adjoint is a local of the reverse sweep)
    assert heap >= 20 * 256 * (8 + 39 * 4)
    # central differences (float64 on the host) of the same chain, on a few elements
    def f(v, t):
        for _ in range(t):
            v = v * v * 0.45 + v * 0.5 + 0.01
        return v
    for i in range(0, n, 997):
        h = 1e-4
        fd = (f(np.float64(xs[i]) + h, ts[i]) - f(np.float64(xs[i]) - h, ts[i])) / (2 * h)
        assert g_gpu[i] == pytest.approx(fd, rel=2e-3, abs=1e-5)


def test_heap_grows_across_launches_far_beyond_a_thread_stack(on_cuda):
    on_cuda()
    chain, x, trips, y = _chain_kernel(4096)
    x.from_numpy(np.full(4096, 0.3, np.float32))
    sizes = []
    for t in (5, 50, 5000, 20000):  # 20000 f32 entries: 80 kB a thread, 330 MB in all
        trips.from_numpy(np.full(4096, t, np.int32))
        value, grad = _grad(chain, x, y)
        assert np.isfinite(grad).all() and (grad[0] > 0 if t == 5 else grad[0] >= 0)  # contracts to 0
        sizes.append(qd.adstack_heap_bytes())
    assert sizes == sorted(sizes) and sizes[-1] >= 4096 * 20000 * 4
    trips.from_numpy(np.full(4096, 3, np.int32))
    _grad(chain, x, y)
    assert qd.adstack_heap_bytes() == sizes[-1]  # never shrinks


def test_overflow_is_raised_at_sync_and_the_next_launch_works(on_cuda):
    on_cuda(ad_stack_size=8)
    chain, x, trips, y = _chain_kernel(1000)
    x.from_numpy(np.full(1000, 0.3, np.float32))
    trips.from_numpy(np.full(1000, 20, np.int32))
    y[None] = 0
    chain()
    y.grad[None] = 1
    chain.grad()
    with pytest.raises(qd.AdStackOverflowError, match=r"kernel 'chain.*8 entries allocated, 2\d required"):
        qd.sync()
    trips.from_numpy(np.full(1000, 3, np.int32))
    value, grad = _grad(chain, x, y)
    qd.sync()
    assert np.isfinite(grad).all() and grad[0] > 0


def test_dynamic_range_bound_computed_by_an_earlier_task(on_cuda, session_cache_dir):
    def run(arch):
        qd.init(arch=arch, cache_dir=session_cache_dir)
        x = qd.field(qd.f32, shape=20000, needs_grad=True)
        m = qd.field(qd.i32, shape=())
        y = qd.field(qd.f32, shape=(), needs_grad=True)

        @qd.kernel
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
        m[None] = 300
        value, grad = None, None
        y[None] = 0
        dyn(3)
        x.grad.fill(0)
        y.grad[None] = 1
        dyn.grad(3)
        value, grad = y[None], x.grad.to_numpy()
        return value, grad
    v_cpu, g_cpu = run(qd.cpu)
    on_cuda()
    v_gpu, g_gpu = run("cuda")
    assert v_gpu == pytest.approx(v_cpu, rel=1e-4)
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-4, atol=1e-6)
    assert g_gpu[899] != 0 and not g_gpu[900:].any()
