"""Serial range-fors on a device that stops long-running shader invocations: lavapipe stops an
invocation after 65,535 loop iterations in all, silently, which cut Genesis's serialized setup
loops (a 230,401-cell support table filled by one invocation) and so its contacts. Such a device
runs a serial range-for as one dispatch per chunk of iterations, in order. Checked against numpy
on lavapipe's own limit and on a small one (many chunks, a last chunk past the launch's count),
with inner loops and with ranges not starting at 0; skipped without a Vulkan device."""
import dataclasses

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.devices.vulkan import pipelines


@qd.kernel
def init_support(support_list_start: qd.types.ndarray(), records_vid: qd.types.ndarray(),
                 list_start: qd.types.ndarray(), vid: qd.types.ndarray(), serial: qd.template()):
    qd.loop_config(serialize=serial)
    for i_cell in range(support_list_start.shape[0]):
        list_start[i_cell] = support_list_start[i_cell]

    qd.loop_config(serialize=serial)
    for i_cell in range(records_vid.shape[0]):
        for i_k in qd.static(range(2)):
            vid[2 * i_cell + i_k] = records_vid[i_cell, i_k]


@qd.kernel
def prefix_sums(a: qd.types.ndarray(), width: qd.i32, first: qd.i32):
    qd.loop_config(serialize=True)
    for i in range(first, a.shape[0]):
        total = a[i - 1]
        for k in range(width):  # inner iterations count against the device's limit too
            total += 1
        a[i] = total - width + a[i]


def _lavapipe(vulkan_runtime):
    if not vulkan_runtime.capabilities.loop_iteration_limit:
        pytest.skip(f"the Vulkan device '{vulkan_runtime.capabilities.name}' stops no long invocation")


def test_serialized_setup_loops_past_the_limit_equal_numpy(vulkan_runtime, rng):
    _lavapipe(vulkan_runtime)
    n_cells = 230401
    starts = np.cumsum(rng.integers(0, 3, n_cells)).astype(np.int32)
    records = rng.integers(0, 1000, (n_cells - 1, 2)).astype(np.int32)
    list_start, vid = qd.ndarray(qd.i32, shape=(n_cells,)), qd.ndarray(qd.i32, shape=(2 * (n_cells - 1),))
    init_support(starts, records, list_start, vid, True)
    np.testing.assert_array_equal(list_start.to_numpy(), starts)
    np.testing.assert_array_equal(vid.to_numpy(), records.ravel())


@pytest.mark.parametrize("limit", [160, 16 * 1000])
def test_chunked_serial_loops_keep_their_order(vulkan_runtime, monkeypatch, rng, limit):
    """A small limit (chunks of limit/16 iterations) on the device's pipelines, built anew."""
    _lavapipe(vulkan_runtime)
    monkeypatch.setattr(vulkan_runtime, "capabilities",
                        dataclasses.replace(vulkan_runtime.capabilities, loop_iteration_limit=limit))
    for n, width, first in ((1, 0, 1), (11, 1, 1), (12345, 3, 7), (70001, 0, 1)):
        start = rng.integers(-5, 5, n).astype(np.int64)
        a = qd.ndarray(qd.i64, shape=(n,))
        a.from_numpy(start)
        prefix_sums(a, width, first)
        want = start.copy()
        want[first - 1:] = np.cumsum(start[first - 1:])
        np.testing.assert_array_equal(a.to_numpy(), want, err_msg=f"n={n}")
    assert {tp.chunk for tp in vulkan_runtime.__dict__["_pipeline_objects"] if "prefix_sums" in tp.name} == \
        {limit // pipelines.SERIAL_CHUNK_SHARE}


def test_only_serial_range_fors_run_in_chunks(vulkan_runtime):
    _lavapipe(vulkan_runtime)
    list_start, vid = qd.ndarray(qd.i32, shape=(4,)), qd.ndarray(qd.i32, shape=(6,))
    init_support(np.arange(4, dtype=np.int32), np.ones((3, 2), np.int32), list_start, vid, False)
    prefix_sums(qd.ndarray(qd.i64, shape=(4,)), 0, 1)
    chunks = {(tp.name.split("'")[1], tp.chunk) for tp in vulkan_runtime.__dict__["_pipeline_objects"]}
    chunk = vulkan_runtime.capabilities.loop_iteration_limit // pipelines.SERIAL_CHUNK_SHARE
    assert ("init_support", 0) in chunks and ("init_support", chunk) not in chunks
    assert ("prefix_sums", chunk) in chunks and ("prefix_sums", 0) not in chunks
