"""`x ** n` of a float base and an integer exponent is computed by repeated squaring
(compiler/targets/spirv/powers.py on SPIR-V): on Vulkan the correctly rounded x^n (checked
against exact rational arithmetic, bit for bit), on the CPU and CUDA within an ulp of it; never GLSL's
exp2(n * log2(x)), which was off by ~1e-6 relative on f32."""
import math
from fractions import Fraction

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.spirv import tools

SIGNIFICAND_BITS = {qd.f32: 24, qd.f64: 53}


def correctly_rounded(x: float, n: int, dtype) -> float:
    """x^n rounded once (to nearest, ties to even) to `dtype`, from the exact rational power;
    for results in the normal range."""
    exact = Fraction(x) ** n
    if exact == 0:
        return 0.0
    exponent = math.frexp(float(exact))[1]
    scale = Fraction(2) ** (SIGNIFICAND_BITS[dtype] - exponent)
    return float(Fraction(round(exact * scale)) / scale)


def powers_kernel(dtype, exponent_dtype=qd.i32):
    arr = qd.types.ndarray(dtype=dtype, ndim=1)

    @qd.kernel
    def powers(x: arr, n: qd.types.ndarray(dtype=exponent_dtype, ndim=1), out: arr):
        for i in range(x.shape[0]):
            out[i] = x[i] ** n[i]
    return powers


def random_bases(rng, dtype, count):
    """Magnitudes in [0.2, 8] (f32) / [0.01, 100] (f64), either sign: |x|^40 stays normal."""
    low, high = (0.2, 8.0) if dtype is qd.f32 else (0.01, 100.0)
    magnitude = np.exp(rng.uniform(np.log(low), np.log(high), count))
    return (magnitude * rng.choice([-1.0, 1.0], count)).astype(dtype.np_dtype)


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64], ids=lambda t: t.name)
def test_run_time_integer_exponents_are_correctly_rounded(arch, rng, dtype):
    count = 2000
    x = random_bases(rng, dtype, count)
    n = rng.integers(-40, 41, count).astype(np.int32)
    out = np.zeros(count, dtype.np_dtype)
    powers_kernel(dtype)(x, n, out)
    want = np.array([correctly_rounded(float(a), int(k), dtype) for a, k in zip(x, n)], dtype.np_dtype)
    if arch == "vulkan":
        np.testing.assert_array_equal(out, want)
    else:  # the CPU's and CUDA's pow are within an ulp of it
        np.testing.assert_allclose(out, np.power(x.astype(np.float64), n.astype(np.float64)),
                                   rtol=2.0 * np.finfo(dtype.np_dtype).eps)


def test_the_reported_f32_power_is_exact(arch):
    x, n = np.float32(-2.2538111), 21  # x^21 = -25779106.90...: GLSL's Pow was ~30 off
    out = np.zeros(1, np.float32)
    powers_kernel(qd.f32)(np.array([x]), np.array([n], np.int32), out)
    assert out[0] == correctly_rounded(float(x), n, qd.f32)
    assert abs(float(out[0]) - float(Fraction(float(x)) ** n)) <= 1.0  # half an ulp (2) at 2^24


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64], ids=lambda t: t.name)
def test_special_values_follow_c_pow(arch, dtype):
    npt = dtype.np_dtype
    bases = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 2.0, -3.0, 2.0 ** 100 if dtype is qd.f32 else 2.0 ** 600]  # overflow, underflow to 0
    exponents = [-3, -2, -1, 0, 1, 2, 3]
    x = np.array([b for b in bases for _ in exponents], npt)
    n = np.array(exponents * len(bases), np.int32)
    out = np.zeros(len(x), npt)
    powers_kernel(dtype)(x, n, out)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), n.astype(np.float64)).astype(npt)
    special = ~np.isfinite(want) | (want == 0) | (np.abs(want) == 1)
    np.testing.assert_array_equal(out[special], want[special])  # NaN where NaN, signed zeros and infinities
    if arch == "vulkan":  # the rest correctly rounded; the CPU's and CUDA's pow within an ulp
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out[~special], want[~special], rtol=2.0 * np.finfo(npt).eps)


def test_sixty_four_bit_exponents(arch, rng):
    x = random_bases(rng, qd.f64, 300)
    n = rng.integers(-40, 41, 300)
    n[:2] = [2**40 + 1, -(2**40) - 1]  # odd: (-1) ** n keeps the sign
    x[:2] = [-1.0, -1.0]
    out = np.zeros(300, np.float64)
    powers_kernel(qd.f64, qd.i64)(x, n.astype(np.int64), out)
    assert out[:2].tolist() == [-1.0, -1.0]
    want = [correctly_rounded(float(a), int(k), qd.f64) for a, k in zip(x[2:], n[2:])]
    np.testing.assert_allclose(out[2:], want, rtol=0 if arch == "vulkan" else 2.0 * np.finfo(np.float64).eps)


def test_constant_exponents_unroll_to_the_same_values(arch, rng):
    @qd.kernel
    def constant(x: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i in range(x.shape[0]):
            out[i, 0] = x[i] ** 13
            out[i, 1] = x[i] ** -11
            out[i, 2] = x[i] ** 40.0
    x = random_bases(rng, qd.f32, 500)
    out = np.zeros((500, 3), np.float32)
    constant(x, out)
    looped = np.zeros(500, np.float32)
    for column, k in enumerate((13, -11, 40)):
        powers_kernel(qd.f32)(x, np.full(500, k, np.int32), looped)
        np.testing.assert_array_equal(out[:, column], looped)


def _spirv_module(kernel) -> bytes:
    k = kernel._primal
    return K.compile_kernel(k.fn, k.params, Options(), arch="vulkan").artifacts["spirv_t0"]


@pytest.mark.parametrize("dtype", [qd.f32, qd.f64], ids=lambda t: t.name)
def test_integer_powers_never_use_glsl_pow(dtype):
    module = _spirv_module(powers_kernel(dtype))
    assert tools.validate(module) is None
    text = tools.disassemble(module)
    assert " Pow " not in text and "OpLoopMerge" in text  # a loop over the exponent's bits
