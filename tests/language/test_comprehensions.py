"""List and dict comprehensions in kernels, as Quadrants evaluates them: unrolled at compile time
over iterables the compiler knows, their elements run-time values (Genesis's FEM solver builds
`qd.Vector([H[j, k] for j in range(3)])`); a run-time range or condition is a located error."""
import numpy as np
import pytest

import qdc as qd

from module_util import compile_error_of


def test_comprehensions_unroll_over_compile_time_iterables(arch, rng):
    n = 6
    mats = qd.Matrix.field(3, 3, qd.f32, shape=n)
    out = qd.Vector.field(3, qd.f32, shape=n)
    extra = qd.field(qd.f32, shape=n)
    m0 = rng.standard_normal((n, 3, 3)).astype(np.float32)
    mats.from_numpy(m0)

    @qd.kernel
    def columns(scale: qd.f32):
        for i in out:
            H = mats[i]
            for k in range(3):
                out[i] += qd.Vector([H[j, k] * scale for j in range(3)])  # column k
            pairs = [H[a, b] for a in range(3) for b in range(3) if a < b]  # nested, filtered
            weights = {a: a + 1.0 for a in qd.static(range(3))}
            extra[i] = pairs[0] * weights[0] + pairs[1] * weights[1] + pairs[2] * weights[2]

    columns(0.5)
    m = m0.astype(np.float64)
    np.testing.assert_allclose(out.to_numpy(), 0.5 * m.sum(axis=2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(extra.to_numpy(), m[:, 0, 1] + 2 * m[:, 0, 2] + 3 * m[:, 1, 2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body, message", [
    ("v = qd.Vector([a[j] for j in range(n)])", "a comprehension iterates over what the compiler knows"),
    ("v = qd.Vector([a[j] for j in range(3) if a[j] > 0])", "a comprehension's condition must be known"),
])
def test_a_run_time_comprehension_is_a_located_error(tmp_path, body, message):
    err, path = compile_error_of(tmp_path, "comprehension_errors", f"""
        import numpy as np
        import qdc as qd

        @qd.kernel
        def bad(a: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
            {body}
            a[0] = v[0]
        """, np.zeros(3, np.float32), 3)
    assert message in str(err) and str(path) in str(err) and ":7:" in str(err)
