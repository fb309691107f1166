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
    (tmp_path / "src" / "levels.py").write_text(SOURCE)
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
    (tmp_path / "src" / "halves.py").write_text(HALVES)
    qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "-j", 1, "--cpu-targets", "aarch64-linux")
    from qdc.runtime.cache import Cache, read_module
    import llvmlite.binding as llvm
    cache = Cache(str(tmp_path / "cache"))
    for kernel, own in (("scale", False), ("scale_half", True)):
        key = read_module(cache, "halves", "cpu")["kernels"][kernel]
        text = str(llvm.parse_bitcode(cache.lookup(key).artifacts["bc"]))  # the optimised IR of aarch64 Linux
        assert bool(re.search(rf"@{kernel}_t0\w*_chunk\.l1\(", text)) == own, kernel
