"""A portable library emits a task body once for the ISA levels whose optimised code is the same
(compiler/targets/cpu/multiversion.py, `equal_levels`): the higher levels' dispatch calls the
lower level's body, and the kernel computes what numpy does."""
from __future__ import annotations

import platform
import re
import textwrap

import numpy as np
import pytest

from qdc.runtime.loader import load

from remote_util import qdc

# One atomic per element at a data-dependent address: scalar code, which LLVM's vectorisers
# leave alone at every level.
SOURCE = textwrap.dedent('''
    import qdc as qd

    F = qd.types.ndarray(dtype=qd.f32, ndim=1)
    I = qd.types.ndarray(dtype=qd.i32, ndim=1)


    @qd.kernel
    def histogram(values: F, bins: I, counts: F):
        for i in range(values.shape[0]):
            counts[bins[i]] += values[i] * 0.5
''')


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")
def test_equal_levels_are_emitted_once_and_run(tmp_path, rng):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "levels.py").write_text(SOURCE, encoding="utf-8")
    qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "-j", 1)  # portable: x86-64-v2/v3/v4
    from qdc.runtime.cache import Cache, read_module
    cache = Cache(str(tmp_path / "cache"))
    key = read_module(cache, "levels", "cpu")["kernels"]["histogram"]
    optimised = cache.lookup(key).artifacts["bc"]
    import llvmlite.binding as llvm
    text = str(llvm.parse_bitcode(optimised))
    bodies = [line for line in text.splitlines() if line.startswith("define internal") and "_chunk.l" in line]
    assert 1 <= len(bodies) < 3 and "_chunk.l0" in bodies[0], bodies  # x86-64-v4 runs v3's (LLVM 20)
    mod = load(str(tmp_path / "cache"), "levels")
    n = 1000 + int(rng.integers(0, 100))
    values = rng.random(n, dtype=np.float32)
    bins = rng.integers(0, 7, n).astype(np.int32)
    counts = np.zeros(7, np.float32)
    mod.histogram(values, bins, counts)
    expected = np.zeros(7, np.float64)
    np.add.at(expected, bins, values.astype(np.float64) * 0.5)
    np.testing.assert_allclose(counts, expected, rtol=1e-5)


def _bodies(*levels: str) -> str:
    """Optimised IR with one task body per level, each `levels[i]` as its code."""
    return "".join(f'define internal void @"t_chunk.l{i}"(ptr %"c") #{i} {{\nentry:\n{code}  ret void\n}}\n\n'
                   for i, code in enumerate(levels))


def test_what_a_higher_level_compiles_differently_is_kept_per_family():
    from qdc.compiler.targets.cpu.isa_levels import LEVELS
    from qdc.compiler.targets.cpu.multiversion import equal_levels
    fma = '  %"r" = call float @llvm.fmuladd.f32(float 1.0, float 2.0, float 3.0)\n'
    half = '  %"h" = fadd half 0xH3C00, 0xH3C00\n'
    mul64 = '  %"m" = mul <2 x i64> zeroinitializer, zeroinitializer\n'
    arm, x86 = LEVELS["aarch64"], LEVELS["x86_64"]
    # armv8-a fuses multiply-adds as armv8.2-a does: one body; x86-64-v3 has FMA, v2 not.
    assert equal_levels(_bodies(fma, fma, fma), ["t_chunk"], arm) == {("t_chunk", 1): 0, ("t_chunk", 2): 0}
    assert equal_levels(_bodies(fma, fma, fma), ["t_chunk"], x86) == {}
    # Half arithmetic is armv8.2-a's (FEAT_FP16), and SVE's since it has armv8.2-a's.
    assert equal_levels(_bodies(half, half, half), ["t_chunk"], arm) == {("t_chunk", 2): 1}
    # SVE multiplies 64-bit lanes of NEON-sized vectors, NEON cannot.
    assert equal_levels(_bodies(mul64, mul64, mul64), ["t_chunk"], arm) == {("t_chunk", 1): 0}
    # A level without a description shares nothing.
    other = (arm[0], arm[1]._replace(name="unknown"))
    assert equal_levels(_bodies(fma, fma), ["t_chunk"], other) == {}


HALVES = textwrap.dedent('''
    import qdc as qd

    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i] * 3.0

    @qd.kernel
    def scale_half(a: qd.types.ndarray(dtype=qd.f16, ndim=1), b: qd.types.ndarray(dtype=qd.f16, ndim=1)):
        for i in range(a.shape[0]):
            b[i] = a[i] * qd.f16(3.0)
''')


def test_armv8_2_a_optimises_only_half_arithmetic_apart(tmp_path):
    """armv8.2-a's task bodies are armv8-a's, made once before optimisation, unless they hold
    what its optimiser weighs differently (half arithmetic: isa_levels.OPTIMISED_ALIKE_UNLESS)."""
    from qdc.compiler.targets import lld
    if not lld.find("ld.lld"):
        pytest.skip(f"no ld.lld {lld.MIN_LLD}+ ({lld.INSTALL_HINT})")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "halves.py").write_text(HALVES, encoding="utf-8")
    qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "-j", 1, "--cpu-targets", "aarch64-linux")
    from qdc.runtime.cache import Cache, read_module
    import llvmlite.binding as llvm
    cache = Cache(str(tmp_path / "cache"))
    for kernel, own in (("scale", False), ("scale_half", True)):
        key = read_module(cache, "halves", "cpu")["kernels"][kernel]
        text = str(llvm.parse_bitcode(cache.lookup(key).artifacts["bc"]))  # the optimised IR of aarch64 Linux
        assert bool(re.search(rf"@{kernel}_t0\w*_chunk\.l1\(", text)) == own, kernel


def _scatter_body(index: str, extra: int, loops: int = 1) -> str:
    """A chunk's generated IR: `loops` loops over the iterations in a stack slot, each adding 1.0
    atomically at `ptr[index]` (`%".8"`: the element the loop loads; `%".5"`: the iteration),
    with `extra` instructions more."""
    blocks = ['allocas:\n  %"i" = alloca i64\n  store i64 %".2", ptr %"i"\n  br label %"loop.head.0"\n']
    for k in range(loops):
        after = f"loop.head.{k + 1}" if k + 1 < loops else "loop.exit"
        blocks.append(
            f'loop.head.{k}:\n  %".5" = load i64, ptr %"i"\n  %".6" = icmp slt i64 %".5", %".3"\n'
            f'  br i1 %".6", label %"loop.body.{k}", label %"{after}"\n'
            f'loop.body.{k}:\n  %".7" = getelementptr i32, ptr %".1", i64 %".5"\n  %".8" = load i32, ptr %".7"\n'
            f'  %".9" = getelementptr float, ptr %".1", i32 {index}\n'
            f'  %".10" = atomicrmw fadd ptr %".9", float 1.0 monotonic\n'
            + "".join(f'  %"x{n}" = fadd float 1.0, 2.0\n' for n in range(extra))
            + f'  %".11" = add i64 %".5", 1\n  store i64 %".11", ptr %"i"\n  br label %"loop.head.{k}"\n')
    blocks.append("loop.exit:\n  ret void\n")
    return 'define internal void @"t_chunk"(ptr %".1", i64 %".2", i64 %".3", i1 %".4")\n{\n' + "".join(blocks) + "}\n"


def test_never_vectorised_bodies():
    """One loop that updates, with an atomic, an element at an index it loads (a scatter), in a
    body too large for LLVM's runtime unrolling: alike at every x86-64 level. Not: a small body
    (unrolled per level), an element at an index of the iteration itself (the copy for a thread
    alone may vectorise), two loops, no atomic."""
    from qdc.compiler.targets.cpu.multiversion import NEVER_UNROLLED, never_vectorised
    large = NEVER_UNROLLED
    assert never_vectorised(_scatter_body('%".8"', large))
    assert not never_vectorised(_scatter_body('%".8"', 5))
    assert not never_vectorised(_scatter_body('%".5"', large))
    assert not never_vectorised(_scatter_body('%".8"', large, loops=2))
    assert not never_vectorised(_scatter_body('%".8"', large).replace("atomicrmw fadd ptr", "load float, ptr"))


SCATTER = textwrap.dedent('''
    import qdc as qd

    V = qd.types.ndarray(dtype=qd.f32, ndim=2)
    I = qd.types.ndarray(dtype=qd.i32, ndim=1)


    @qd.kernel
    def splat(values: V, cells: I, grid: V):
        for p in range(values.shape[0]):
            base = cells[p]
            w = values[p, 0]
            for k in qd.static(range(12)):
                grid[base + k, 0] += w * (k + 1.0) + values[p, 1]
                grid[base + k, 1] += w * w - values[p, 2] * k
''')


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")
def test_scatter_is_optimised_once_and_runs(tmp_path, rng):
    """A portable library's scatter task (never_vectorised) has one body, the lowest level's,
    made before LLVM optimises anything, and computes what numpy does."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "scatter.py").write_text(SCATTER, encoding="utf-8")
    qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "-j", 1)  # portable: x86-64-v2/v3/v4
    from qdc.runtime.cache import Cache, read_module
    import llvmlite.binding as llvm
    cache = Cache(str(tmp_path / "cache"))
    key = read_module(cache, "scatter", "cpu")["kernels"]["splat"]
    text = str(llvm.parse_bitcode(cache.lookup(key).artifacts["bc"]))
    assert re.findall(r"^define internal .*@(splat_t0_range_chunk\.l\d)\(", text, re.M) == ["splat_t0_range_chunk.l0"]
    mod = load(str(tmp_path / "cache"), "scatter")
    n = 500 + int(rng.integers(0, 100))
    values = rng.random((n, 3), dtype=np.float32)
    cells = rng.integers(0, 40, n).astype(np.int32)
    grid = np.zeros((52, 2), np.float32)
    mod.splat(values, cells, grid)
    want = np.zeros((52, 2), np.float64)
    v = values.astype(np.float64)
    for k in range(12):
        np.add.at(want[:, 0], cells + k, v[:, 0] * (k + 1.0) + v[:, 1])
        np.add.at(want[:, 1], cells + k, v[:, 0] * v[:, 0] - v[:, 2] * k)
    np.testing.assert_allclose(grid, want, rtol=1e-4, atol=1e-4)
