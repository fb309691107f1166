"""Adstacks on the stream device (CUDA, HIP): the launcher's prepare hook sizes the runtime's
heap before any task is queued, so the device allocates no heap itself; it refuses a task
holding stacks that would run on more threads than the ctx says the heap holds. Run on the
stand-in for hip-python of test_amdgpu_device.py."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.amdgpu import linker
from qdc.runtime.devices.amdgpu import driver
from qdc.runtime.devices.amdgpu.device import AmdgpuDevice

from test_amdgpu_device import FakeHip

x = qd.field(qd.f32, shape=64, needs_grad=True)
trips = qd.field(qd.i32, shape=64)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(trips[i]):
            v = qd.sin(v) * 0.9 + 0.05
        y[None] += v


def test_a_stack_task_runs_on_the_slices_its_ctx_holds_and_no_more(rng):
    if not linker.find_lld():
        pytest.skip(f"no ld.lld to link code objects ({linker.INSTALL_HINT})")
    qd.init(arch=qd.cpu)
    k = chain._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="amdgpu", amdgpu_targets="gfx90a"), arch="amdgpu",
                                variant="grad")
    meta = compiled.meta
    stack_tasks = sorted({r["task"] for r in meta.adstack["stacks"]})
    assert stack_tasks
    dev = AmdgpuDevice(driver=driver.Driver(hip=FakeHip()))
    loaded = dev.load_kernel(compiled.artifacts, meta)
    task = stack_tasks[0]
    slices = dev.task_slices(meta.tasks[task].launch, int(rng.integers(1, 5000)))
    ctx = (ctypes.c_uint64 * meta.ctx_words)()
    ctx[meta.adstack_threads_slot] = slices  # as the prepare hook writes it
    buffers = len(dev.hip.memory)
    dev.launch_task(loaded, task, ctypes.addressof(ctx), slices)
    assert len(dev.hip.launches) == 1
    assert len(dev.hip.memory) == buffers + 1  # the ctx's device copy: no heap of the device's own
    ctx[meta.adstack_threads_slot] = slices - 1
    with pytest.raises(RuntimeError, match=rf"kernel '{meta.name}', task '{meta.tasks[task].name}': {slices} "
                                           rf"threads launched but its adstack heap holds {slices - 1}"):
        dev.launch_task(loaded, task, ctypes.addressof(ctx), slices)
    assert len(dev.hip.launches) == 1
    assert np.frombuffer(ctx, np.uint64)[meta.adstack_threads_slot] == slices - 1  # the device wrote nothing

