"""How the CPU's chunks touch memory that only the iteration's own lane uses
(compiler/targets/cpu/widen_plan.py, `_invariant_loads` and `own_updates`): in width-W chunks,
loads of the same element on every iteration of an inner loop are read once before it; in every
chunk, atomics at an element no other iteration writes are plain read-modify-writes (width-W:
gathers and scatters at AVX-512, a loop over the lanes below it). Results must equal the scalar
code's bit for bit at every level this host runs, on one thread and on several, and the analysis
must refuse what it cannot prove."""
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
from qdc.compiler.targets.cpu.multiversion import function_definitions
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH, WidenPlan, plan
from test_cpu_widen import LEVELS, _host_runs, _same_bits

SOURCE = '''
import qdc as qd

N = 300
pos = qd.field(qd.f32, shape=(N, 3))
vel = qd.field(qd.f32, shape=(N, 3))
nearest = qd.field(qd.f32, shape=N)
hits = qd.field(qd.i32, shape=(N, 2))
m = qd.field(qd.i32, shape=())
index = qd.field(qd.i32, shape=N)
shared = qd.field(qd.f32, shape=N)


@qd.kernel
def pairs(dt: qd.f32):
    for i in range(N):
        ax, ay, near, count = 0.0, 0.0, 1e9, 0
        for j in range(m[None]):
            if j != i:
                dx = pos[j, 0] - pos[i, 0]
                dy = pos[j, 1] - pos[i, 1]
                r2 = dx * dx + dy * dy + 0.01
                s = pos[i, 2] / (r2 * qd.sqrt(r2))
                ax += dx * s
                ay += dy * s
                near = qd.min(near, r2)
                if r2 < 0.05:
                    count += 1
        vel[i, 0] += dt * ax
        vel[i, 1] -= dt * ay
        qd.atomic_min(nearest[i], near)
        hits[i, 0] += count
        qd.atomic_xor(hits[i, 1], count + i)


@qd.kernel
def scattered(dt: qd.f32):
    for i in range(N):
        acc = 0.0
        for j in range(m[None]):
            acc += pos[j, 0] * pos[i, 0]
            pos[(i + j) % N, 2] += 0.0
        shared[i] += acc * dt
        shared[index[i]] += dt


@qd.kernel
def drift(dt: qd.f32):
    for i, k in pos:
        pos[i, k] += dt * vel[i, k]


@qd.kernel
def racing(dt: qd.f32):
    for i, k in pos:
        pos[i, k] += dt * vel[i, k]
        pos[(i + 1) % N, k] += dt
'''


def _import(tmp_path, monkeypatch, stem: str):
    path = tmp_path / f"{stem}_{uuid.uuid4().hex[:8]}.py"
    path.write_text(SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(path.stem)


def _plan(module, name: str) -> WidenPlan:
    opts = build_mod._options_for(options.Options().update(cpu_target="x86-64-v4"), "cpu")
    fn = kernel_of(getattr(module, name))
    compiled = compile_kernel(fn.fn, build_mod._params_for_aot(fn, opts), opts, "cpu")
    found = plan(compiled.ir.tasks[0])
    assert isinstance(found, WidenPlan), found
    return found


def test_what_only_the_lanes_own_iteration_touches(tmp_path, monkeypatch):
    module = _import(tmp_path, monkeypatch, "own_plan")
    p = _plan(module, "pairs")
    assert sorted(s.op for s in p.own_updates) == ["add", "add", "min", "sub", "xor"]
    [(loop, loads)] = p.invariant_loads.items()  # pos[i, 0], pos[i, 1], pos[i, 2]: not pos[j, k]
    assert len(loads) == 3 and all(load.ptr.indices[0] is p.task.index for load in loads)
    q = _plan(module, "scattered")
    # shared[] is also updated at a data-dependent element, pos[] written inside the loop
    assert not q.own_updates and not q.invariant_loads


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("threads", [1, 2])
def test_own_updates_and_hoisted_loads_match_the_scalar_code(rng, tmp_path, monkeypatch, level, threads):
    if not _host_runs(level):
        pytest.skip(f"this host does not run {level} code")
    module = _import(tmp_path, monkeypatch, f"own_{level.replace('-', '_')}_{threads}")
    n = 300
    start = {"pos": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
             "vel": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
             "nearest": rng.uniform(0, 0.5, n).astype(np.float32),
             "hits": rng.integers(0, 1 << 20, (n, 2)).astype(np.int32)}
    trips = n - int(rng.integers(0, 20))
    runs = {}
    for widen in ("0", "1"):
        monkeypatch.setenv(SCALAR_SWITCH, widen)
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / f"cache-{widen}"), cpu_target=level,
                cpu_max_num_threads=threads)
        for name, value in start.items():
            getattr(module, name).from_numpy(value)
        module.m[None] = trips
        module.pairs(0.01)
        module.pairs(0.02)
        runs[widen] = [module.vel.to_numpy(), module.nearest.to_numpy(), module.hits.to_numpy()]
    _same_bits(runs["0"], runs["1"], f"{level}, {threads} thread(s)")
    assert not np.array_equal(runs["1"][0], start["vel"])
    qd.sync()


def test_scalar_chunks_update_their_own_elements_without_atomics(rng, tmp_path, monkeypatch):
    """`for i, k in pos: pos[i, k] += ...` has no atomic instruction left (nor LLVM's copy of the
    loop for a thread that runs alone); a field also updated at another iteration's element keeps
    its atomics. Both compute what numpy does, on one thread and on several."""
    module = _import(tmp_path, monkeypatch, "own_scalar")
    opts = build_mod._options_for(options.Options(), "cpu")
    for name, atomic in (("drift", False), ("racing", True)):
        fn = kernel_of(getattr(module, name))
        text = compile_kernel(fn.fn, build_mod._params_for_aot(fn, opts), opts, "cpu").artifacts["ll"].decode()
        chunks = "".join(body for body_name, body in function_definitions(text).items() if "_chunk" in body_name)
        assert chunks and ("atomicrmw" in chunks) == atomic, name
    n, f = 300, np.float32
    pos, vel = rng.uniform(-1, 1, (n, 3)).astype(f), rng.uniform(-1, 1, (n, 3)).astype(f)
    for threads in (1, 2):
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "cache"), cpu_max_num_threads=threads)
        module.pos.from_numpy(pos)
        module.vel.from_numpy(vel)
        module.drift(0.5)
        np.testing.assert_array_equal(module.pos.to_numpy(), pos + f(0.5) * vel)
        module.pos.from_numpy(pos)
        module.racing(0.25)
        want = pos + f(0.25) * vel
        np.testing.assert_allclose(module.pos.to_numpy(), want + f(0.25), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")
def test_own_updates_are_scatters_at_avx512_and_never_atomics(tmp_path, monkeypatch):
    """x86-64-v4's body scatters the lanes' updates; no level's body has an atomic instruction
    (`lock`) for them."""
    from qdc.compiler.targets.cpu import codegen
    from qdc.compiler.targets.cpu.target import TARGET
    module = _import(tmp_path, monkeypatch, "own_asm")
    opts = build_mod._options_for(options.Options().update(cpu_target="portable"), "cpu")
    fn = kernel_of(module.pairs)
    compiled = compile_kernel(fn.fn, build_mod._params_for_aot(fn, opts), opts, "cpu")
    out = codegen.compile_kernel(compiled.ir, compiled.meta, 3, False, "portable", keep_assembly=True,
                                 target=TARGET)
    assert "vscatter" in out["asm:x86-64-v4"]
    for level in LEVELS:
        assert "lock" not in out[f"asm:{level}"], level
