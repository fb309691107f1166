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


@qd.kernel
def pair_sums(pos: F, out: F):
    for i in range(pos.shape[0]):
        near, closest = 0.0, 1e9
        for j in range(pos.shape[0]):
            if j != i:
                d = pos[j] - pos[i]
                near += 1.0 / qd.sqrt(d * d + 0.01)
                closest = qd.min(closest, qd.abs(d))
        out[i] = near + closest


@qd.kernel
def pair_chain(pos: F, out: F):
    for i in range(pos.shape[0]):
        v = 0.0
        for j in range(pos.shape[0]):
            v = v * 0.5 + 1.0 / qd.sqrt(pos[j] - pos[i] + v * v + 1.0)
        out[i] = v
'''

def import_source(tmp_path, monkeypatch, source: str, stem: str):
    path = tmp_path / f"{stem}_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source, encoding="utf-8")
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
    sums = _launch(module, "pair_sums", "x86-64-v4")  # carries only a sum and a minimum: one AVX-512 register
    assert sums["lanes"] == 16 and "carry only accumulations" in sums["lanes_reason"]
    assert _launch(module, "pair_sums", "x86-64-v3")["lanes"] == 32  # narrower levels keep four registers
    chained = _launch(module, "pair_chain", "x86-64-v4")  # v feeds its own next value: four
    assert chained["lanes"] == 64 and "lanes_reason" not in chained


@x86
def test_gathers_are_gather_instructions_at_every_level_that_has_them(tmp_path, monkeypatch):
    """LLVM's generic x86-64-v3 tuning would load a masked gather's lanes one by one, each behind
    a branch; the width-W chunks are compiled with +fast-gather there, as x86-64-v4 is."""
    from qdc.compiler.targets.cpu import codegen
    from qdc.compiler.targets.cpu.target import TARGET
    module = import_source(tmp_path, monkeypatch, SOURCE, "costed_asm")
    opts = build_mod._options_for(options.Options().update(cpu_target="portable"), "cpu")
    fn = kernel_of(module.gather)
    compiled = compile_kernel(fn.fn, build_mod._params_for_aot(fn, opts), opts, "cpu")
    out = codegen.compile_kernel(compiled.ir, compiled.meta, 3, False, "portable", keep_assembly=True,
                                 target=TARGET)
    assert "vgather" in out["asm:x86-64-v3"] and "vgather" in out["asm:x86-64-v4"]
    assert "vgather" not in out["asm:x86-64-v2"]


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
    m = 200 + int(rng.integers(0, 40))  # the one-register lanes of an all-pairs sum
    p = rng.uniform(-1.0, 1.0, m).astype(np.float32)
    sums = np.zeros(m, np.float32)
    module.pair_sums(p, sums)
    d = (p[None, :] - p[:, None]).astype(np.float64)
    np.fill_diagonal(d, np.inf)
    near = np.where(np.isinf(d), 0.0, 1.0 / np.sqrt(np.where(np.isinf(d), 1.0, d * d + 0.01))).sum(axis=1)
    np.testing.assert_allclose(sums, near + np.abs(d).min(axis=1), rtol=2e-5)
    qd.sync()
