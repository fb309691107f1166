"""Run prebuilt kernels from a cache (or bundle) built by `qdc build kernels/`, with no compiler.

    python3 kernels/run_example.py cache

Loads the `heat` module, diffuses a hot square for 200 steps, and checks the result against
the same update written in numpy.
"""
import sys

import numpy as np

from qdc.runtime import load


def numpy_heat(t, alpha, steps):
    t = t.copy()
    for _ in range(steps):
        nxt = t.copy()
        nxt[1:-1, 1:-1] = t[1:-1, 1:-1] + alpha * (t[:-2, 1:-1] + t[2:, 1:-1] + t[1:-1, :-2] + t[1:-1, 2:]
                                                   - np.float32(4.0) * t[1:-1, 1:-1])
        t = nxt
    return t


def main(location: str) -> int:
    heat = load(location, "heat", arch="cpu")
    n = heat.T.shape[0]
    t0 = np.zeros((n, n), np.float32)
    t0[n // 4: n // 2, n // 4: n // 2] = 100.0
    t0[0, :] = 20.0
    heat.T.from_numpy(t0)
    alpha, steps = np.float32(0.2), 200
    for _ in range(steps):
        heat.step(float(alpha))
        heat.commit()
    got = heat.T.to_numpy()
    want = numpy_heat(t0, alpha, steps)
    err = float(np.abs(got - want).max())
    compiler_loaded = any(m.startswith("qdc.compiler") or m.startswith("llvmlite") for m in sys.modules)
    print(f"heat: {steps} steps on a {n}x{n} plate from {location}: centre {got[n // 2 - 1, n // 2 - 1]:.4f}, "
          f"total heat {got.sum():.1f}, max |qdc - numpy| = {err:.2e}; compiler imported: {compiler_loaded}")
    ok = err <= 1e-3 * float(np.abs(want).max()) and not compiler_loaded
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 kernels/run_example.py CACHE_DIR_OR_BUNDLE")
    sys.exit(main(sys.argv[1]))
