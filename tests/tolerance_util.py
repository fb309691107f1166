"""Comparing single-precision results with a reference near zero.

A relative tolerance alone fails whenever a result is close to 0 after cancellation: the f32
rounding of the terms (and FMA contraction, a vector library, another device) leaves an error
of a few ulps of the terms, which is huge relative to a small difference of them. The floor
here is that error: `ulps` units in the last place of the values' magnitude `scale`."""
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def assert_close_f32(actual, expected, *, rtol=1e-5, scale=None, ulps=8, err_msg=""):
    """assert_allclose(actual, expected, rtol) with atol = ulps * eps32 * scale, where `scale`
    is the magnitude of the terms that were added or subtracted to make `expected` (default:
    its largest absolute value, which is right for arrays whose values span that magnitude;
    a scalar sum or a difference of larger terms must pass the terms' magnitude)."""
    expected = np.asarray(expected, dtype=np.float64)
    if scale is None:
        scale = float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=ulps * EPS32 * scale, err_msg=err_msg)
