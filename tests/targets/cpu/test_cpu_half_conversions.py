"""f16 conversions in CPU code of every x86-64 level: below F16C (x86-64-v2), and f64 -> f16 at
every level, LLVM calls the compiler runtime, which the kernel's module defines itself
(compiler/targets/cpu/half_conversions.py); a library that left them undefined did not load.
Every half, and floats and doubles around every half and halfway between two, against numpy's
conversions bit for bit (NaN: any quiet NaN)."""
import tempfile

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.targets.cpu.isa_levels import level_by_name
from qdc.runtime.devices.cpu.device import host_features

TARGETS = ("x86-64-v2", "x86-64-v3", "x86-64-v4", "portable")

H1 = qd.types.ndarray(dtype=qd.f16, ndim=1)
F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)
D1 = qd.types.ndarray(dtype=qd.f64, ndim=1)


@qd.kernel
def convert(h: H1, h_wide: F1, f: F1, f_half: H1, d: D1, d_half: H1, sums: H1):
    for i in range(h.shape[0]):
        h_wide[i] = qd.cast(h[i], qd.f32)
    for i in range(f.shape[0]):
        f_half[i] = qd.cast(f[i], qd.f16)
        d_half[i] = qd.cast(d[i], qd.f16)
        sums[i] = f_half[i] + d_half[i]  # f16 arithmetic: widened, added, rounded back


def _runs_here(target: str) -> bool:
    if target == "portable":
        return True
    found = level_by_name(target)
    return found is not None and set(found[1].requires) <= set(host_features())


def _same(got, want):
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16 if got.itemsize == 2 else np.uint32),
                                  want[~nan].view(np.uint16 if want.itemsize == 2 else np.uint32))


@pytest.mark.parametrize("target", TARGETS)
def test_half_conversions_match_numpy(rng, target):
    if not _runs_here(target):
        pytest.skip(f"this CPU cannot run {target} code")
    qd.init(arch=qd.cpu, cpu_target=target, cache_dir=tempfile.mkdtemp(prefix="qdc-half-"))
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    wide = halves.astype(np.float64)
    finite = wide[np.isfinite(wide)]
    ordered = np.unique(finite)
    halfway = (ordered[:-1] + ordered[1:]) / 2  # ties: to even
    doubles = np.concatenate([halfway, np.nextafter(halfway, np.inf), np.nextafter(halfway, -np.inf),
                              rng.uniform(-7e4, 7e4, 4000), rng.uniform(-1e-4, 1e-4, 4000) * rng.random(4000),
                              [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.99, 1e300, 2.0 ** -25,
                               2.0 ** -24, 3 * 2.0 ** -26]])
    n = len(doubles)
    outputs = (np.zeros(65536, np.float32), np.zeros(n, np.float16), np.zeros(n, np.float16), np.zeros(n, np.float16))
    with np.errstate(over="ignore", invalid="ignore"):
        floats = doubles.astype(np.float32)  # halfway points of halves are floats exactly
        convert(halves, outputs[0], floats, outputs[1], doubles, outputs[2], outputs[3])
        _same(outputs[0], halves.astype(np.float32))
        _same(outputs[1], floats.astype(np.float16))
        _same(outputs[2], doubles.astype(np.float16))
        want_sums = (floats.astype(np.float16).astype(np.float32) + doubles.astype(np.float16).astype(np.float32))
        _same(outputs[3], want_sums.astype(np.float16))
