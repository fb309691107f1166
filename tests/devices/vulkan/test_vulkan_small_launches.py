"""Launches of fewer invocations than a workgroup on a CPU Vulkan device (lavapipe): a task left
at the device's workgroup size runs them in workgroups of one subgroup, through a pipeline of
that size made at the first such launch (runtime/devices/vulkan/pipelines.py, narrow_block), its
own-size pipeline at its first larger launch; larger launches, tasks with their own block_dim and
block-level code keep their workgroup.
Values are checked against numpy on both sides of the workgroup size. Skipped without a Vulkan
device."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.devices.vulkan import pipelines


@qd.kernel
def scaled_plus_index(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = 2.0 * x[i] + i


@qd.kernel
def scaled_in_blocks_of_64(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=64)
    for i in x:
        y[i] = 2.0 * x[i] + i


@qd.kernel
def running_sum(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(serialize=True)  # one invocation runs the loop: a serial task
    for i in range(x.shape[0]):
        total = y[i - 1] if i > 0 else 0.0
        y[i] = total + x[i]


@pytest.fixture
def narrow_launches(monkeypatch):
    """The names of the tasks each launch ran through a narrow pipeline."""
    seen = []
    real = pipelines._made

    def spy(dev, tp, slot, *args, **kwargs):
        if slot == "narrow":
            seen.append(tp.name)
        return real(dev, tp, slot, *args, **kwargs)
    monkeypatch.setattr(pipelines, "_made", spy)
    return seen


@pytest.mark.parametrize("n", [1, 7, 8, 9, 100, 255, 256, 257, 1000])
def test_launches_below_and_above_a_workgroup_match_numpy(vulkan_runtime, narrow_launches, rng, n):
    caps = vulkan_runtime.capabilities
    x = rng.standard_normal(n).astype(np.float32)
    for kernel in (scaled_plus_index, scaled_in_blocks_of_64):
        y = np.zeros(n, np.float32)
        kernel(x, y)
        np.testing.assert_allclose(y, 2 * x + np.arange(n, dtype=np.float32), rtol=1e-6)
    narrowed = caps.cpu_device and 1 <= caps.subgroup_size < caps.default_block_dim and n < caps.default_block_dim
    assert sum("'scaled_plus_index'" in name for name in narrow_launches) == int(narrowed)
    assert not any("scaled_in_blocks_of_64" in name for name in narrow_launches)


@qd.kernel
def doubled_plus_one(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = 2.0 * x[i] + 1.0


def test_each_workgroup_size_gets_its_pipeline_at_its_first_launch(vulkan_runtime, monkeypatch, rng):
    made = []  # the workgroup sizes of the pipelines made for the kernel, in order
    real = pipelines._pipeline

    def spy(dev, blob, entry, layout, block, what, *rest, **kwargs):
        if "'doubled_plus_one'" in what:
            made.append(block)
        return real(dev, blob, entry, layout, block, what, *rest, **kwargs)
    monkeypatch.setattr(pipelines, "_pipeline", spy)
    caps = vulkan_runtime.capabilities
    wide = caps.default_block_dim
    narrow = pipelines.narrow_block(caps, {"policy": "grid"}, wide)
    for n in (3, 5, wide + 1, 2 * wide, 4):
        x = rng.standard_normal(n).astype(np.float32)
        y = np.zeros(n, np.float32)
        doubled_plus_one(x, y)
        np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
        if n == 5:  # only launches below a workgroup so far: no pipeline of the task's own size yet
            assert made == ([narrow] if narrow else [wide])
    assert made == ([narrow, wide] if narrow else [wide])  # each size made once


def test_a_serial_task_runs_narrow_and_in_order(vulkan_runtime, narrow_launches, rng):
    x = rng.standard_normal(50).astype(np.float32)
    y = np.zeros(50, np.float32)
    running_sum(x, y)
    np.testing.assert_allclose(y, np.cumsum(x.astype(np.float64)), rtol=1e-5, atol=1e-5)
    caps = vulkan_runtime.capabilities
    assert bool(narrow_launches) == (caps.cpu_device and 1 <= caps.subgroup_size < caps.default_block_dim)


def test_which_tasks_get_a_narrow_workgroup(vulkan_runtime):
    caps = dataclasses.replace(vulkan_runtime.capabilities, cpu_device=True, subgroup_size=8)
    assert pipelines.narrow_block(caps, {"policy": "grid", "block_dim": 0}, 256) == 8
    assert pipelines.narrow_block(caps, {"policy": "grid"}, 256) == 8
    assert pipelines.narrow_block(caps, {"policy": "grid", "block_dim": 64}, 64) == 0  # the kernel's own
    assert pipelines.narrow_block(caps, {"policy": "grid", "block_dim": 0, "subgroup_size": 8}, 256) == 0
    assert pipelines.narrow_block(caps, {"policy": "grid"}, 8) == 0  # no smaller workgroup to take
    gpu = dataclasses.replace(caps, cpu_device=False)
    assert pipelines.narrow_block(gpu, {"policy": "grid"}, 256) == 0
