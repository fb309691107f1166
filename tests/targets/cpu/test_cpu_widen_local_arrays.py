"""Local arrays at W lanes (compiler/targets/cpu/widen_local_arrays.py) against the scalar code of
the same kernel (QDC_CPU_WIDEN=0), bit for bit, at every x86-64 level the host runs: an array
written at indices uniform across the lanes (one vector per element), at indices that differ
between lanes and under a branch some lanes skip (gathers and scatters under the lane mask), and
an array only read at varying indices (one scalar array for all lanes, gathered). The task is
widened (its launch record has `lanes`), and its arrays are varying or uniform as said."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands.inspect import kernel_ir
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH, plan
from qdc.compiler import ir
from test_cpu_widen import LEVELS, _host_runs

F32 = qd.types.ndarray(qd.f32, ndim=1)
I32 = qd.types.ndarray(qd.i32, ndim=1)


@qd.kernel
def lanes(a: F32, idx: I32, out: F32, n: qd.i32):
    for p in a:
        table = qd.Vector([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # only read: one array for every lane
        v = qd.Vector([a[p], a[p] * 2.0, 0.5, 0.25, a[p] + 1.0])
        for j in range(n):
            v[j % 5] = v[(j + 1) % 5] * 0.5 + table[(idx[p] + j) % 6]  # uniform index, varying values
            if a[p] > 0.0:  # narrow code: lanes that skip it keep their elements
                v[(idx[p] + 2 * j) % 5] = v[idx[p] % 5] + a[p]  # varying indices
        out[p] = v[0] + v[1] * 2.0 + v[2] * 4.0 + v[3] * 8.0 + v[4] * 16.0 + v[idx[p] - 2]


@pytest.mark.parametrize("level", LEVELS)
def test_lanes_match_the_scalar_code_bit_for_bit(rng, tmp_path, monkeypatch, level):
    if not _host_runs(level):
        pytest.skip(f"this CPU cannot run {level} code")
    n = int(rng.integers(40, 200))  # most sizes leave a masked remainder
    a = rng.uniform(-1, 1, n).astype(np.float32)
    idx = rng.integers(-3, 12, n).astype(np.int32)
    results, launches = {}, {}
    for widen in ("0", "1"):
        monkeypatch.setenv(SCALAR_SWITCH, widen)
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / f"cache-{widen}"), cpu_target=level, cpu_max_num_threads=16)
        out = np.zeros(n, np.float32)
        lanes(a, idx, out, 7)
        results[widen] = out
        launches[widen] = kernel_of(lanes).compile((a, idx, out, 7)).meta.tasks[0].launch
    assert "lanes" not in launches["0"] and launches["1"].get("lanes", 0) >= 4
    np.testing.assert_array_equal(results["1"].view(np.uint32), results["0"].view(np.uint32))


def test_the_plan_keeps_a_read_only_array_uniform(monkeypatch):
    monkeypatch.setenv(SCALAR_SWITCH, "1")
    qd.init(arch=qd.cpu)
    (task,) = kernel_ir(lanes).tasks
    p = plan(task)
    assert not isinstance(p, str), p
    arrays = {s.var_name: s for s in ir.walk(task.body) if isinstance(s, ir.LocalArray)}
    assert set(arrays) == {"table", "v"}
    assert arrays["v"] in p.varying and arrays["table"] not in p.varying
