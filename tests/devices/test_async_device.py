"""The asynchronous device protocol, checked on the CPU: per-task launches then sync
(QDC_CPU_LAUNCH=tasks) give what the fused fast path gives; errors are reported at sync by the
launch that made them; memory is zeroed, copies are ranged, element reads copy one element."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime import sizeexpr_eval as ev
from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.contract.error_slot import ERROR_SLOT_WORDS
from qdc.runtime.device import Allocation, DeviceCapabilities
from qdc.runtime.devices.cpu.device import CpuDevice

# ---- kernels re-run both ways ------------------------------------------------------------------

xs = qd.field(qd.f32, shape=64, needs_grad=True)
total = qd.field(qd.f32, shape=(), needs_grad=True)
trips = qd.field(qd.i32, shape=64)


@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = a * x[i] + y[i]


@qd.kernel
def temps_cross_tasks(out: qd.types.ndarray(qd.i32, ndim=1), m: qd.i32):
    n = 0
    while n * n < m:  # a serial task computes n: a temporary read by the next task's range
        n += 1
    s = n * 3
    for i in range(n):
        out[i] = i + s


@qd.kernel
def sin_chain():
    for i in xs:
        v = xs[i]
        for _ in range(trips[i]):  # an adstack sized from a field at every launch
            v = qd.sin(v) * 0.9 + 0.05
        total[None] += v


@qd.kernel
def reduce_into(x: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
    out[0] = 0.0
    for i in x:
        out[0] += x[i]  # a thread-local reduction, one atomic per chunk


def _run_selection():
    """Results of a representative selection: scalars and arrays, temporaries across tasks,
    a reduction returning a value, forward and grad with adstacks."""
    out = {}
    rng = np.random.default_rng(3)
    x = rng.random(5000).astype(np.float32)
    y = np.ones(5000, np.float32)
    saxpy(2.0, x, y)
    out["saxpy"] = y
    o = np.zeros(16, np.int32)
    temps_cross_tasks(o, 10)
    out["temps"] = o
    r = np.zeros(1, np.float32)
    reduce_into(x, r)
    out["reduce"] = r
    xs.from_numpy(np.linspace(0.1, 1.0, 64).astype(np.float32))
    trips.from_numpy(np.arange(64, dtype=np.int32) % 7)
    total[None] = 0.0
    sin_chain()
    total.grad[None] = 1.0
    xs.grad.fill(0.0)
    sin_chain.grad()
    out["forward"], out["grad"] = total[None], xs.grad.to_numpy()
    return out


@pytest.fixture
def cpu_launch(monkeypatch):
    """Switch the CPU launch mode: qd.init makes a new device, which reads QDC_CPU_LAUNCH."""
    def switch(mode, **options):
        monkeypatch.setenv("QDC_CPU_LAUNCH", mode)
        qd.init(arch=qd.cpu, **options)
        assert context.current().device.launch_mode == mode
    yield switch
    monkeypatch.delenv("QDC_CPU_LAUNCH", raising=False)
    qd.init(arch=qd.cpu)


def test_task_launches_then_sync_match_the_fused_path(cpu_launch):
    cpu_launch("fused")
    want = _run_selection()
    assert list(want["temps"][:4]) == [12, 13, 14, 15]
    cpu_launch("tasks")
    got = _run_selection()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)  # sums: any order


def test_the_async_path_launches_each_task_with_its_slices(cpu_launch, monkeypatch):
    cpu_launch("tasks")
    device = context.current().device
    calls = []
    launch_task = CpuDevice.launch_task
    monkeypatch.setattr(CpuDevice, "launch_task",
                        lambda self, loaded, task, ctx, slices: calls.append((task, slices)) or
                        launch_task(self, loaded, task, ctx, slices))
    o = np.zeros(16, np.int32)
    temps_cross_tasks(o, 10)  # n = 4, read back from the temporary after the first task ran
    assert list(o[:5]) == [12, 13, 14, 15, 0]
    assert calls == [(0, 1), (1, 1)], calls  # 4 iterations: one thread slice
    calls.clear()
    big = np.zeros(200_000, np.int32)
    temps_cross_tasks(big, 150_000 * 10_000)
    n = int(np.ceil(np.sqrt(150_000 * 10_000)))
    assert calls[-1] == (1, min(n, device.num_threads))
    assert big[n - 1] == n - 1 + 3 * n and big[n] == 0


@qd.kernel
def out_of_bounds(a: qd.types.ndarray(qd.f32, ndim=1), k: qd.i32):
    for i in range(4):
        a[i + k] = 1.0


@qd.kernel
def fine(a: qd.types.ndarray(qd.f32, ndim=1)):
    for i in range(4):
        a[i] = 2.0


def test_bounds_errors_are_raised_after_the_task_launches(cpu_launch):
    cpu_launch("tasks", debug=True)
    a = np.zeros(6, np.float32)
    with pytest.raises(IndexError, match=r"kernel 'out_of_bounds': index 6 out of range for ndarray 'a' of shape \(6,\)"):
        out_of_bounds(a, 3)
    out_of_bounds(a, 2)  # the slot was cleared: nothing to report
    assert a[5] == 1.0


def test_deferred_errors_name_the_kernel_that_made_them(cpu_launch):
    cpu_launch("tasks-deferred", debug=True)
    a = np.zeros(6, np.float32)
    out_of_bounds(a, 3)  # no error yet: an asynchronous launch reports at sync
    fine(a)
    with pytest.raises(IndexError, match="kernel 'out_of_bounds'"):
        qd.sync()
    qd.sync()  # reported once
    fine(a)
    out_of_bounds(a, 5)
    out_of_bounds(a, 0)
    with pytest.raises(IndexError, match=r"kernel 'out_of_bounds': index 6"):  # the first failing launch's
        qd.sync()


def test_adstack_overflow_is_reported_at_sync(cpu_launch):
    cpu_launch("tasks-deferred", ad_stack_size=4)
    xs.from_numpy(np.full(64, 0.5, np.float32))
    trips.fill(9)
    sin_chain()
    qd.sync()
    sin_chain.grad()
    with pytest.raises(qd.AdStackOverflowError, match="kernel 'sin_chain_grad'|kernel 'sin_chain"):
        qd.sync()
    trips.fill(1)
    sin_chain.grad()
    qd.sync()


# ---- the device protocol on the CPU -----------------------------------------------------------

def test_allocations_are_zeroed_and_copies_are_ranged():
    d = CpuDevice(1)
    a = d.allocate(64)
    assert not a.host.any()
    d.copy_to_device(a, np.arange(4, dtype=np.int32), offset=8)
    out = np.empty(2, np.int32)
    d.copy_to_host(a, out, offset=12)
    assert list(out) == [1, 2]
    with pytest.raises(ValueError, match="does not fit"):
        d.copy_to_host(a, np.empty(4, np.int64), offset=40)
    d.free_after_fence(a)  # synchronous: freed at once
    assert a.host is None


def test_error_slots_are_distinct_and_reported_once():
    d = CpuDevice(1)
    slots = [d.acquire_error_slot() for _ in range(70)]
    assert len({s.address for s in slots}) == 70
    seen = []
    slots[1].host[0] = 7
    d.watch(slots[0], lambda w: seen.append(("a", int(w[0]))))
    d.watch(slots[1], lambda w: ValueError(f"b {int(w[0])}"))
    with pytest.raises(ValueError, match="b 7"):
        d.sync()
    assert seen == [] and not slots[1].host.any()
    d.sync()
    assert len(slots[0].host) == ERROR_SLOT_WORDS


def test_task_slices_follow_the_native_dispatch_rule():
    d = CpuDevice(8)
    cpu = {"policy": "cpu_chunks", "parallel_from": 100}
    assert [d.task_slices(cpu, n) for n in (0, 1, 99, 100, 5000)] == [0, 1, 1, 8, 8]
    assert d.task_slices({"policy": "cpu_chunks", "parallel_from": 0}, 10 ** 6) == 1
    assert d.task_slices(cpu, None) == 8
    with pytest.raises(ValueError, match="grid"):
        d.task_slices({"policy": "grid", "block_dim": 64}, 10)


def test_host_memory_is_a_capability():
    d = CpuDevice(1)
    assert d.capabilities.host_memory and d.capabilities.synchronous and d.capabilities.fused_launch
    assert not CpuDevice(1, launch="tasks").capabilities.fused_launch
    with pytest.raises(ValueError, match="QDC_CPU_LAUNCH"):
        CpuDevice(1, launch="bogus")


class _DeviceMemoryCpu(CpuDevice):
    """A CPU device that pretends its memory is the device's: no host views, copies counted."""
    def __init__(self):
        super().__init__(1)
        self.capabilities = DeviceCapabilities(host_memory=False, synchronous=True, fused_launch=True)
        self.copies = []

    def allocate(self, nbytes):
        a = super().allocate(nbytes)
        return Allocation(a.ptr, a.nbytes, None, a)

    def copy_to_host(self, alloc, dst, offset=0):
        self.copies.append((offset, dst.nbytes))
        super().copy_to_host(alloc.handle, dst, offset)

    def copy_to_device(self, alloc, src, offset=0):
        super().copy_to_device(alloc.handle, src, offset)


def test_element_reads_are_ranged_reads_on_device_memory():
    rt = context.reset("cpu")
    rt.device = device = _DeviceMemoryCpu()
    try:
        f = qd.field(qd.i32, shape=(100, 10))
        f.from_numpy(np.arange(1000, dtype=np.int32).reshape(100, 10))
        device.copies.clear()
        assert f[7, 3] == 73 and f[-1, -1] == 999
        assert device.copies == [(73 * 4, 4), (999 * 4, 4)]
        f[2, 2] = -5
        device.copies.clear()
        tree = se.Add(se.FieldLoad(0, [se.Const(2), se.Const(2)]), se.Const(10))
        assert ev.evaluate(tree, ev.LaunchEnv([], [f])) == 5  # max(-5 + 10, 0)
        assert device.copies == [(22 * 4, 4)]
    finally:
        qd.init(arch=qd.cpu)
