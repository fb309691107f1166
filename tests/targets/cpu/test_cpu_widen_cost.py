"""The cost model of W (compiler/targets/cpu/widen_plan.py, `_size_lanes`): four vector registers
of lanes where an inner loop's chain has latency to hide, one where a task only gathers, fewer
where lane-by-lane accesses would blow up the code; the launch record says why, as `qdc inspect`
shows it, and the narrower code computes what numpy does."""
from __future__ import annotations

import platform
import uuid

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver import options
from qdc.compiler.driver.kernel import compile_kernel
from qdc.compiler.jit.kernel import kernel_of
from qdc.runtime.adstack import describe_launch

SOURCE = '''
import qdc as qd

F = qd.types.ndarray(dtype=qd.f32, ndim=1)
G = qd.types.ndarray(dtype=qd.f32, ndim=2)


@qd.kernel
def chain(x: F, n: qd.i32):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(n):
            v = qd.sin(v) * 0.9 + 0.1
        x[i] = v


@qd.kernel
def short_chain(x: F, n: qd.i32):
    for i in range(16):
        v = x[i]
        for _ in range(n):
            v = qd.sin(v) * 0.9 + 0.1
        x[i] = v


@qd.kernel
def gather(pos: F, g: G, out: F):
    for i in range(pos.shape[0]):
        c = qd.cast(pos[i] * 8.0, qd.i32)
        out[i] = g[c, 0] * 0.5 + g[c + 1, 1] - g[c, 2] * pos[i]


@qd.kernel
def many_gathers(pos: F, g: G, out: F):
    for i in range(pos.shape[0]):
        c = qd.cast(pos[i] * 8.0, qd.i32)
        acc = 0.0
        for k in qd.static(range(6)):
            for j in qd.static(range(3)):
                acc += g[c + k, j] * (k + j + 1.0)
        out[i] = acc


@qd.kernel
def chain_gather(pos: F, g: G, out: F, n: qd.i32):
    for i in range(pos.shape[0]):
        v = pos[i]
        for _ in range(n):
            c = qd.cast(v * 8.0, qd.i32)
            v = (g[c, 0] + g[c, 1] + g[c, 2] + g[c + 1, 0] + g[c + 1, 1] + g[c + 1, 2]) * 0.1 + v * 0.3
        out[i] = v
'''

def import_source(tmp_path, monkeypatch, source: str, stem: str):
    path = tmp_path / f"{stem}_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(path.stem)


x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")


def _launch(module, name: str, cpu_target: str) -> dict:
    opts = build_mod._options_for(options.Options().update(cpu_target=cpu_target), "cpu")
    kernel = getattr(module, name)
    fn = kernel_of(kernel)
    params = build_mod._params_for_aot(fn, opts)
    return compile_kernel(fn.fn, params, opts, "cpu").meta.tasks[0].launch


@x86
def test_lanes_by_what_the_task_does(tmp_path, monkeypatch):
    module = import_source(tmp_path, monkeypatch, SOURCE, "costed")
    chain = _launch(module, "chain", "x86-64-v4")
    assert chain["lanes"] == 64 and "lanes_reason" not in chain  # 4 AVX-512 registers of f32
    gather = _launch(module, "gather", "x86-64-v4")  # 3 gathers: 64 lanes keep more of them in flight
    assert gather["lanes"] == 64 and "lanes_reason" not in gather
    many = _launch(module, "many_gathers", "x86-64-v4")  # 18 lane-by-lane loads: one register
    assert many["lanes"] == 16 and many["lanes_reason"].startswith("1 vector register of lanes: 18 accesses")
    costly = _launch(module, "chain_gather", "x86-64-v4")  # 6 lane-by-lane loads a step: 2 registers
    assert costly["lanes"] == 32, costly
    assert costly["lanes_reason"].startswith("2 vector registers of lanes")
    assert "6 accesses at data-dependent addresses" in costly["lanes_reason"]
    assert "(code size)" in describe_launch(costly)
    short = _launch(module, "short_chain", "x86-64-v4")  # 16 iterations: one register of 16 lanes
    assert short["lanes"] == 16 and "the range has 16 iterations" in short["lanes_reason"]
    assert _launch(module, "short_chain", "x86-64-v2")["lanes"] == 16  # still 4 SSE registers
    portable = _launch(module, "gather", "portable")  # the most lanes of any level: x86-64-v4's
    assert portable["lanes"] == 64 and portable["lanes_reason"] == "scalar code at x86-64-v2 (no gathers)"
    lowest = _launch(module, "gather", "x86-64-v2")  # no gather instructions: the scalar code
    assert "lanes" not in lowest and "no gather instructions" in lowest["scalar"]


def test_narrower_lanes_compute_what_numpy_does(tmp_path, monkeypatch, rng):
    module = import_source(tmp_path, monkeypatch, SOURCE, "costed_run")
    n = 1000 + int(rng.integers(0, 64))
    pos = rng.uniform(0.05, 0.95, n).astype(np.float32)
    g = rng.uniform(-0.1, 0.1, (10, 3)).astype(np.float32)
    out = np.zeros(n, np.float32)
    module.gather(pos, g, out)
    c = (pos * np.float32(8.0)).astype(np.int32)
    expected = g[c, 0] * np.float32(0.5) + g[c + 1, 1] - g[c, 2] * pos
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    steps = 5
    module.chain_gather(pos, g, out, steps)
    v, f = pos.copy(), np.float32
    for _ in range(steps):  # in f32 as the kernel does, so that every step gathers the same cells
        c = (v * f(8.0)).astype(np.int32)
        total = g[c, 0] + g[c, 1] + g[c, 2] + g[c + 1, 0] + g[c + 1, 1] + g[c + 1, 2]
        v = total * f(0.1) + v * f(0.3)
    np.testing.assert_allclose(out, v, rtol=1e-6, atol=1e-7)
    qd.sync()
