"""f64 transcendental math on the SPIR-V target (compiler/targets/fdlibm.py, emitted by spirv/math64.py): GLSL.std.450
has none, so the target emits fdlibm's algorithms. Checked three ways:
- the algorithms themselves, evaluated on numpy arrays (tests/f64_math_numpy_ops.py), against
  numpy on many arguments across magnitudes and against mpmath (their true error);
- the emitted code on the device against numpy: random arguments and special values;
- on lavapipe (whose double arithmetic is IEEE's), the device's results are bit for bit those
  of the numpy evaluation, so the first two checks cover each other.
Also: a gradient through f64 sin/exp/log against the analytic one and central differences."""
import math

import numpy as np
import pytest

import qdc as qd
from conftest import on_vulkan_device
from f64_math_numpy_ops import evaluate

F64 = qd.types.ndarray(dtype=qd.f64, ndim=1)
UNARY = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "exp": np.exp, "log": np.log, "tanh": np.tanh,
         "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos}
BINARY = {"atan2": np.arctan2, "pow": np.power}
# measured over 2M arguments each: 1 ulp from numpy (libm) at most, tanh 2 (fdlibm says "up to
# 2 ulp in [0.1, 0.2554]"); the bounds leave one ulp of margin for unseen arguments
ULP_BOUND = {**{name: 2.0 for name in (*UNARY, *BINARY)}, "tanh": 3.0}
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-310, -1e-310,
                    1e-300, 1e-20, -1e-20, 0.5, -0.5, 1.0, -1.0, 1.0000000000000002, 0.9999999999999999, 2.0, -2.0,
                    3.0, -3.0, 0.6744, math.pi / 4, math.pi / 2, math.pi, 20.0, 22.0, 709.78, 709.79, -745.1,
                    -745.2, 1e9, 2.0 ** 30, 2.0 ** 31 + 1, 2.0 ** 52, 2.0 ** 53, 2.0 ** 64, -2.0 ** 64, 1e20,
                    1e300, -1e300, 1.7976931348623157e308])


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of want's last place; 0 where both are the same NaN or infinity, inf
    where only one is (or where zeros differ in sign)."""
    with np.errstate(all="ignore"):
        same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
        error = np.abs(got - want) / np.spacing(np.abs(want))
    return np.where(same, 0.0, np.where(np.isfinite(error) & np.isfinite(want), error, np.inf))


def magnitudes(rng, n: int, low: float, high: float, signed: bool = True) -> np.ndarray:
    """n values log-uniform in [low, high], with random signs."""
    v = np.exp(rng.uniform(np.log(low), np.log(high), n))
    return v * rng.choice([-1.0, 1.0], n) if signed else v


def random_arguments(rng, n: int) -> dict:
    pow_base = magnitudes(rng, n, 1e-3, 1e3)
    pow_exponent = np.where(pow_base < 0, rng.integers(-100, 100, n), rng.uniform(-100, 100, n))
    return {"sin": (magnitudes(rng, n, 1e-12, 1e15),), "cos": (magnitudes(rng, n, 1e-12, 1e15),),
            "tan": (magnitudes(rng, n, 1e-12, 1e15),), "exp": (rng.uniform(-745, 709.7, n),),
            "log": (magnitudes(rng, n, 1e-310, 1e308, signed=False),), "tanh": (magnitudes(rng, n, 1e-12, 30),),
            "atan": (magnitudes(rng, n, 1e-12, 1e20),), "asin": (rng.uniform(-1, 1, n),),
            "acos": (rng.uniform(-1, 1, n),), "atan2": (magnitudes(rng, n, 1e-6, 1e6), magnitudes(rng, n, 1e-6, 1e6)),
            "pow": (pow_base, pow_exponent.astype(np.float64))}


def numpy_reference(name: str, *args: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {**UNARY, **BINARY}[name](*args)


# ---- the algorithms (no device) ---------------------------------------------------------------
@pytest.mark.parametrize("name", [*UNARY, *BINARY])
def test_the_algorithms_are_within_an_ulp_or_two_of_numpy(rng, name):
    args = random_arguments(rng, 200_000)[name]
    error = ulp_error(evaluate(name, *args), numpy_reference(name, *args))
    worst = int(np.argmax(error))
    assert error[worst] <= ULP_BOUND[name], (name, [a[worst] for a in args], error[worst])


@pytest.mark.parametrize("name", [*UNARY, *BINARY])
def test_the_algorithms_true_error_is_within_an_ulp_or_two(rng, name):
    """Against mpmath at 200 bits: numpy's own error does not enter."""
    mpmath = pytest.importorskip("mpmath", reason="mpmath (not a dependency) measures the true error")
    mpmath.mp.prec = 200
    args = random_arguments(rng, 400)[name]
    if name == "exp":
        args = (args[0] / 20,)  # results mpmath and floats both represent comfortably
    got = evaluate(name, *args)
    function = {"sin": mpmath.sin, "cos": mpmath.cos, "tan": mpmath.tan, "exp": mpmath.exp, "log": mpmath.log,
                "tanh": mpmath.tanh, "atan": mpmath.atan, "asin": mpmath.asin, "acos": mpmath.acos,
                "atan2": mpmath.atan2, "pow": mpmath.power}[name]
    worst = 0.0
    for i, g in enumerate(got):
        exact = function(*[mpmath.mpf(float(a[i])) for a in args])
        if exact == 0 or not mpmath.isfinite(exact) or abs(exact) < 2.0 ** -1022:
            continue
        worst = max(worst, float(abs(mpmath.mpf(float(g)) - exact) / mpmath.mpf(np.spacing(abs(float(exact))))))
    assert worst <= ULP_BOUND[name] - 0.5, (name, worst)


def trig_error(name: str, x: np.ndarray, got: np.ndarray, error: np.ndarray) -> np.ndarray:
    """`error`, with sin/cos/tan from 2^53 on checked to be NaN (math64.py's docstring) and left out."""
    if name not in ("sin", "cos", "tan"):
        return error
    huge = np.isfinite(x) & (np.abs(x) >= 2.0 ** 53)
    assert np.isnan(got[huge]).all(), name
    return np.where(huge, 0.0, error)


def test_the_algorithms_follow_numpy_on_special_values():
    for name in UNARY:
        got = evaluate(name, SPECIAL)
        error = trig_error(name, SPECIAL, got, ulp_error(got, numpy_reference(name, SPECIAL)))
        assert error.max() <= 2, (name, SPECIAL[np.argmax(error)])
    x, y = (a.ravel() for a in np.meshgrid(SPECIAL, SPECIAL))
    for name in BINARY:
        error = ulp_error(evaluate(name, x, y), numpy_reference(name, x, y))
        worst = int(np.argmax(error))
        assert error[worst] <= 2, (name, x[worst], y[worst])


def test_sin_cos_tan_of_large_arguments(rng):
    """2^30 <= |x| < 2^53 take the split reduction (math64.py, reduce_large); near multiples of
    pi/2 the reduced argument is tiny, and its relative error shows."""
    x = magnitudes(rng, 200_000, 2.0 ** 30, 2.0 ** 53)
    near = rng.integers(2 ** 30, 2 ** 52, 20_000).astype(np.float64) * (np.pi / 2)
    for name in ("sin", "cos", "tan"):
        for args in (x, near):
            error = ulp_error(evaluate(name, args), numpy_reference(name, args))
            assert error.max() <= ULP_BOUND[name], (name, args[np.argmax(error)])


def test_pow_of_negative_bases_integer_exponents_and_near_one(rng):
    n = 200_000
    base = -np.exp(rng.uniform(-7, 7, n))
    exponent = rng.integers(-300, 300, n).astype(np.float64)
    error = ulp_error(evaluate("pow", base, exponent), numpy_reference("pow", base, exponent))
    assert error.max() <= 2
    near_one = 1 + rng.uniform(-2.0 ** -20, 2.0 ** -20, n)  # with |y| > 2^31: log2 from its series
    huge = magnitudes(rng, n, 2.0 ** 31, 1e12)
    error = ulp_error(evaluate("pow", near_one, huge), numpy_reference("pow", near_one, huge))
    assert error.max() <= 2


# ---- the emitted code, on the device ----------------------------------------------------------
def _unary_kernel():
    @qd.kernel
    def unary(x: F64, out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
        for i in range(x.shape[0]):
            v = x[i]
            out[0, i] = qd.sin(v)
            out[1, i] = qd.cos(v)
            out[2, i] = qd.tan(v)
            out[3, i] = qd.exp(v)
            out[4, i] = qd.log(v)
            out[5, i] = qd.tanh(v)
            out[6, i] = qd.atan(v)
            out[7, i] = qd.asin(v)
            out[8, i] = qd.acos(v)
    return unary


def _binary_kernel():
    @qd.kernel
    def binary(x: F64, y: F64, out: qd.types.ndarray(dtype=qd.f64, ndim=2)):
        for i in range(x.shape[0]):
            out[0, i] = qd.atan2(x[i], y[i])
            out[1, i] = qd.pow(x[i], y[i])
            out[2, i] = x[i] ** y[i]
    return binary


def _run_unary(x: np.ndarray) -> np.ndarray:
    out = np.zeros((len(UNARY), len(x)))
    _unary_kernel()(np.ascontiguousarray(x), out)
    return out


def _run_binary(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.zeros((3, len(x)))
    _binary_kernel()(np.ascontiguousarray(x), np.ascontiguousarray(y), out)
    return out


def _check_device(arch, name: str, got: np.ndarray, *args: np.ndarray) -> None:
    want = numpy_reference(name, *args)
    error = ulp_error(got, want)
    if arch == "vulkan":  # SPIR-V's f64 sin/cos/tan are fdlibm's here; the CPU's are libm's, CUDA's libdevice's
        error = trig_error(name, args[0], got, error)
    worst = int(np.argmax(error))
    assert error[worst] <= ULP_BOUND[name], (arch, name, [a[worst] for a in args], got[worst], want[worst])
    if arch == "vulkan" and on_vulkan_device("llvmpipe"):  # IEEE doubles: the same bits as numpy's twin
        twin = evaluate(name, *args)
        assert ((got == twin) | (np.isnan(got) & np.isnan(twin))).all(), name


def test_f64_math_on_the_device_matches_numpy(arch, rng):
    n = 20_000
    arguments = random_arguments(rng, n)
    for row, name in enumerate(UNARY):
        # each function's own domain, plus a spread of magnitudes every function sees
        x = np.concatenate([arguments[name][0], magnitudes(rng, 2000, 1e-300, 1e300)])
        _check_device(arch, name, _run_unary(x)[row], x)
    for row, name in enumerate(BINARY):
        x, y = arguments[name]
        got = _run_binary(x, y)
        _check_device(arch, name, got[row], x, y)
        if name == "pow":
            _check_device(arch, name, got[2], x, y)


def test_f64_math_on_the_device_special_values(arch):
    got = _run_unary(SPECIAL)
    for row, name in enumerate(UNARY):
        _check_device(arch, name, got[row], SPECIAL)
    x, y = (a.ravel() for a in np.meshgrid(SPECIAL, SPECIAL))
    got = _run_binary(x, y)
    for row, name in enumerate(BINARY):
        _check_device(arch, name, got[row], x, y)


def test_gradient_through_f64_sin_exp_log(arch, rng):
    n = 64
    x = qd.field(qd.f64, shape=n, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in x:
            v = x[i]
            loss[None] += qd.sin(v) * qd.exp(0.3 * v) + qd.log(v * v + 1.0)

    def value(v):
        x.from_numpy(v)
        loss[None] = 0.0
        f()
        return loss[None]

    v = rng.uniform(-3, 3, n)
    value(v)
    loss.grad[None] = 1.0
    f.grad()
    g = x.grad.to_numpy()
    analytic = np.exp(0.3 * v) * (np.cos(v) + 0.3 * np.sin(v)) + 2 * v / (v * v + 1)
    np.testing.assert_allclose(g, analytic, rtol=1e-12, atol=1e-12)
    eps = 1e-6
    for j in range(0, n, 9):
        e = np.zeros(n)
        e[j] = eps
        central = (value(v + e) - value(v - e)) / (2 * eps)
        assert g[j] == pytest.approx(central, rel=1e-7, abs=1e-7)
