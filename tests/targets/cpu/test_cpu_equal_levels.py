"""A portable library emits a task body once for the ISA levels whose optimised code is the same
(compiler/targets/cpu/multiversion.py, `equal_levels`): the higher levels' dispatch calls the
lower level's body, and the kernel computes what numpy does."""
from __future__ import annotations

import platform
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
