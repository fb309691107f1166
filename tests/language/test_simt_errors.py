"""qd.simt where it cannot work: on the CPU (no blocks of threads), in gradients without an
exact adjoint (atomic min/max on a SharedArray), and misused; each a located compile error
naming the construct."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.targets.base import TargetCannotExpress



def assert_located(error, source: str, message: str, file: str = __file__) -> None:
    """`error` is at the line holding `source`, in `file` (this one by default), and says `message`."""
    text = str(error)
    assert file.rstrip("c") in text and source in text and message in text, text
    assert "internal compiler error" not in text


@qd.kernel
def subgroup_sum(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(x.shape[0]):
        y[i] = qd.simt.subgroup.reduce_all_add(x[i])


@qd.kernel
def block_barrier(x: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(x.shape[0]):
        qd.simt.block.sync()
        x[i] = 1.0


def test_the_cpu_refuses_block_level_code_at_its_line():
    with pytest.raises(TargetCannotExpress) as e:
        block_barrier(np.zeros(64, np.float32))
    assert_located(e.value, "qd.simt.block.sync()", "qd.simt.block.sync() needs a GPU arch")
    with pytest.raises(TargetCannotExpress) as e:
        subgroup_sum(np.zeros(64, np.float32), np.zeros(64, np.float32))
    assert_located(e.value, "qd.simt.subgroup.reduce_all_add(x[i])",
                   "qd.simt.subgroup.reduce_all_add() needs a GPU arch (cuda, amdgpu, vulkan, metal): target 'cpu' "
                   "runs no blocks of threads")


@qd.kernel
def shared_maximum(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(x.shape[0]):
        top = qd.simt.block.SharedArray((1,), qd.f32)
        if qd.simt.block.thread_idx() == 0:
            top[0] = -1e30
        qd.simt.block.sync()
        qd.atomic_max(top[0], x[i])
        qd.simt.block.sync()
        y[i] = top[0]


def test_derivatives_without_an_exact_adjoint_are_refused(vulkan_runtime):
    x = qd.ndarray(qd.f32, shape=(64,), needs_grad=True)
    y = qd.ndarray(qd.f32, shape=(64,), needs_grad=True)
    with pytest.raises(qd.QdcCompileError) as e:
        shared_maximum.grad(x, y)
    assert_located(e.value, "qd.atomic_max(top[0], x[i])", "atomic max on a SharedArray has no exact gradient")


@qd.kernel
def shared_outside_a_loop(x: qd.types.ndarray(qd.f32, ndim=1)):
    s = qd.simt.block.SharedArray((4,), qd.f32)
    for i in range(x.shape[0]):
        x[i] = s[0]


@qd.kernel
def shared_of_runtime_shape(x: qd.types.ndarray(qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        s = qd.simt.block.SharedArray((x.shape[0],), qd.f32)
        x[i] = s[0]


@qd.kernel
def block_dim_not_whole_subgroups(x: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=12)
    for i in range(x.shape[0]):
        x[i] = qd.simt.block.reduce_add(x[i], 12, qd.f32)


def test_misused_shared_arrays_and_block_sizes(vulkan_runtime):
    x = np.zeros(64, np.float32)
    with pytest.raises(qd.QdcCompileError) as e:
        shared_outside_a_loop(x)
    assert_located(e.value, "qd.simt.block.SharedArray((4,), qd.f32)", "must be made inside a parallel for loop")
    with pytest.raises(qd.QdcCompileError) as e:
        shared_of_runtime_shape(x)
    assert_located(e.value, "qd.simt.block.SharedArray((x.shape[0],), qd.f32)", "compile-time int or tuple")
    with pytest.raises(qd.QdcCompileError) as e:
        block_dim_not_whole_subgroups(x)
    assert_located(e.value, "qd.simt.block.reduce_add(x[i], 12, qd.f32)", "positive multiple of the subgroup size")


@qd.kernel
def lane_ids(out: qd.types.ndarray(qd.i32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(out.shape[0]):
        out[i] = qd.simt.subgroup.invocation_id()


def test_a_device_of_another_subgroup_size_refuses_the_kernel_at_load(vulkan_runtime, session_cache_dir):
    size = vulkan_runtime.capabilities.subgroup_size
    other = 64 if size != 64 else 32
    qd.init(arch=qd.vulkan, vulkan_subgroup_size=other, cache_dir=session_cache_dir)
    with pytest.raises(ValueError, match=f"built for subgroups of {other} lanes, the Vulkan device .* has {size}"):
        lane_ids(np.zeros(64, np.int32))


@qd.kernel
def tiles_of_32_lanes(x: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(x.shape[0]):
        x[i] = qd.simt.subgroup.reduce_all_add_tiled(x[i], 5)


@qd.kernel
def scan_tiles_of_32_lanes(x: qd.types.ndarray(qd.i32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in range(x.shape[0]):
        x[i] = qd.simt.subgroup.inclusive_add_tiled(x[i], 5)


def test_tiles_wider_than_the_subgroup_are_refused():
    # 16-lane subgroups (lavapipe's widest): shuffles across 32-lane tiles would read lanes that do not exist
    from qdc.compiler.driver import kernel as K
    from qdc.compiler.driver.options import Options
    for kernel, source in ((tiles_of_32_lanes, "qd.simt.subgroup.reduce_all_add_tiled(x[i], 5)"),
                           (scan_tiles_of_32_lanes, "qd.simt.subgroup.inclusive_add_tiled(x[i], 5)")):
        k = kernel._primal
        with pytest.raises(qd.QdcCompileError) as e:
            K.compile_kernel(k.fn, k.params, Options(arch="vulkan", vulkan_subgroup_size=16), arch="vulkan")
        assert_located(e.value, source, "must fit in a subgroup")
        K.compile_kernel(k.fn, k.params, Options(arch="vulkan", vulkan_subgroup_size=32), arch="vulkan")
