"""Tasks whose bounds sit in device memory (an ndarray or field element, a temporary an earlier
task computed) compute their grid on the Vulkan device and are dispatched indirectly
(compiler/targets/vulkan/target.py, runtime/devices/vulkan/pipelines.py): the launch never reads
the bound back, and the grid is exact up to the grid cap, where the grid-stride loop covers the
rest. On lavapipe (or any Vulkan device); skipped cleanly without one."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context, sizeexpr_eval


def vulkan_device():
    try:
        qd.init(arch=qd.vulkan)
        return context.current().device
    except Exception as e:  # no loader, no driver, no device
        pytest.skip(f"no Vulkan device: {e}")


@pytest.fixture
def no_read_back(monkeypatch):
    """Fails the test if a launch reads a trip count from device memory."""
    def refuse(*args):
        raise AssertionError("a launch read its bound back from the device")
    monkeypatch.setattr(sizeexpr_eval, "read_element", refuse)


@qd.kernel
def numbered(out: qd.types.ndarray(qd.i32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    for i in range(n[()]):
        out[i] = i + 1


@qd.kernel
def root_count(out: qd.types.ndarray(qd.i32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    m = 0
    while m * m < n[()]:  # a serial task leaves m in a temporary, the loop's bound
        m += 1
    for i in range(m):
        out[i] = 7


@qd.kernel(graph=True)
def blocks_of_64(out: qd.types.ndarray(qd.i32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    qd.loop_config(block_dim=64)
    for i in range((n[()] + 63) // 64 * 64):
        if i < n[()]:
            out[i] = qd.simt.block.thread_idx() + 1000 * (i // 64)


def grid_words(dev, kernel: str):
    """The grid words (x, y, z workgroups) the last launch of `kernel`'s task wrote, where the
    device maps its memory (lavapipe); else None."""
    tp = next(t for t in dev._pipeline_objects if f"'{kernel}'" in t.name)
    buf, offset = tp.grid_at
    dev.sync()
    if buf.mapped is None:
        return None
    return np.frombuffer(bytes(buf.mapped[offset:offset + 12]), np.uint32).tolist()


@pytest.mark.parametrize("count", [0, 1, 300, 300_001])
def test_a_bound_in_an_ndarray(no_read_back, count):
    dev = vulkan_device()
    size = 300_001  # past lavapipe's grid cap (1024 workgroups of 256): the grid-stride loop runs the rest
    out = qd.ndarray(qd.i32, shape=(size,))
    out.fill(-1)
    n = qd.ndarray(qd.i32, shape=())
    n.from_numpy(np.array(count, np.int32))
    numbered(out, n)
    want = np.full(size, -1, np.int32)
    want[:count] = np.arange(1, count + 1)
    np.testing.assert_array_equal(out.to_numpy(), want)
    block = dev.block_dim({})
    words = grid_words(dev, "numbered")
    if words is not None:  # the exact grid, up to the cap
        assert words == [min(-(-count // block), dev.grid_cap(block)), 1, 1]


def test_a_bound_an_earlier_task_computed(no_read_back):
    vulkan_device()
    out = qd.ndarray(qd.i32, shape=(64,))
    n = qd.ndarray(qd.i32, shape=())
    for count, live in ((2000, 45), (1, 1), (0, 0)):  # ceil(sqrt(n))
        out.fill(0)
        n.from_numpy(np.array(count, np.int32))
        root_count(out, n)
        want = np.zeros(64, np.int32)
        want[:live] = 7
        np.testing.assert_array_equal(out.to_numpy(), want)


def test_whole_blocks_of_a_block_level_task(no_read_back):
    vulkan_device()
    out = qd.ndarray(qd.i32, shape=(200,))
    n = qd.ndarray(qd.i32, shape=())
    for count in (200, 65, 3):
        out.fill(-1)
        n.from_numpy(np.array(count, np.int32))
        blocks_of_64(out, n)
        want = np.full(200, -1, np.int32)
        i = np.arange(count)
        want[:count] = i % 64 + 1000 * (i // 64)
        np.testing.assert_array_equal(out.to_numpy(), want)


def test_the_records_name_the_grid_words():
    vulkan_device()
    from qdc.compiler.driver import kernel as K
    from qdc.compiler.driver.options import Options
    k = numbered._primal
    meta = K.compile_kernel(k.fn, k.params, Options(arch="vulkan"), arch="vulkan").meta
    (task,) = meta.tasks
    assert task.launch["grid_temp"] + 2 <= meta.num_temps
    k = root_count._primal
    meta = K.compile_kernel(k.fn, k.params, Options(arch="vulkan"), arch="vulkan").meta
    assert [("grid_temp" in t.launch) for t in meta.tasks] == [False, True]  # the serial task: one invocation


def test_replayed_launches_compute_their_grid_anew(no_read_back):
    dev = vulkan_device()
    out = qd.ndarray(qd.i32, shape=(1000,))
    n = qd.ndarray(qd.i32, shape=())
    for count in (10, 700, 3, 700):
        out.fill(-1)
        n.from_numpy(np.array(count, np.int32))
        qd.sync()
        numbered(out, n)  # on the idle device: a replay of the recorded launch, its grid computed again
        want = np.full(1000, -1, np.int32)
        want[:count] = np.arange(1, count + 1)
        np.testing.assert_array_equal(out.to_numpy(), want)
    assert any("'numbered'" in tp.name for tp in dev._replays.by_task)
