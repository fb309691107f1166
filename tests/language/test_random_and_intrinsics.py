"""qd.random (counter-based, the same stream on every backend), qd.stop_grad, qd.ad.no_grad,
qd.raw_div / raw_mod / bit_shr and the qd.types predicates.

Streams are checked against an independent Python Philox-4x32-10 (itself checked against
Random123's known-answer vectors) with the documented counter and key layout
(compiler/passes/intrinsics.py); statistics on 2**20 draws per backend use bounds a correct
generator exceeds with probability below 1e-8."""
import math

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

MASK = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Philox-4x32-10 as Salmon et al. define it, on Python ints."""
    c, (k0, k1) = list(counter), key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK]
    return c


def reference_words(seed, launch, index, draw, task=0):
    key = (seed & MASK, ((seed >> 32) ^ (launch >> 32) ^ (task * 0x9E3779B9)) & MASK)
    return philox4x32_10((index & MASK, (index >> 32) & MASK, launch & MASK, draw), key)


def test_reference_philox_matches_random123_known_answers():
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32_10((MASK,) * 4, (MASK, MASK)) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@qd.kernel
def draw_words(out: qd.types.ndarray(dtype=qd.u32, ndim=2), rounds: qd.i32):
    for i in range(out.shape[0]):
        out[i, 0] = qd.random(qd.u32)       # call site 0
        for k in range(rounds):            # draws in a loop continue after the call sites
            out[i, 2 + k] = qd.random(qd.u32)
        out[i, 1] = qd.random(qd.u32)       # call site 1


@qd.kernel
def draw_floats(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f64, ndim=1),
                c: qd.types.ndarray(dtype=qd.i64, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = qd.random()
        b[i] = qd.random(qd.f64)
        c[i] = qd.random(dtype=qd.i64)


def _init(arch, session_cache_dir, seed):
    qd.init(arch=arch, cache_dir=session_cache_dir, random_seed=seed)


def test_streams_follow_seed_launch_iteration_and_call_site(arch, session_cache_dir, rng):
    seed = int(rng.integers(0, 1 << 64, dtype=np.uint64))
    _init(arch, session_cache_dir, seed)
    rows, rounds = 48, 3
    firsts = []
    for launch in range(2):
        out = np.zeros((rows, 2 + rounds), np.uint32)
        draw_words(out, rounds)
        for i in rng.choice(rows, 6, replace=False):
            want = [reference_words(seed, launch, int(i), d)[0] for d in (0, 2, 3, 4, 1)]
            assert [int(w) for w in out[i, [0, 2, 3, 4, 1]]] == want, (arch, launch, i)
        firsts.append(out.copy())
    assert not np.array_equal(firsts[0], firsts[1])  # successive launches draw anew
    _init(arch, session_cache_dir, seed)  # the same seed again: the same numbers
    again = np.zeros((rows, 2 + rounds), np.uint32)
    draw_words(again, rounds)
    np.testing.assert_array_equal(again, firsts[0])
    _init(arch, session_cache_dir, seed ^ 1)  # another seed: others
    draw_words(again, rounds)
    assert (again != firsts[0]).mean() > 0.99


def test_float_and_64_bit_draws_are_built_from_the_words(arch, session_cache_dir, rng):
    seed = int(rng.integers(0, 1 << 32))
    _init(arch, session_cache_dir, seed)
    n = 40
    a, b, c = np.zeros(n, np.float32), np.zeros(n, np.float64), np.zeros(n, np.int64)
    draw_floats(a, b, c)
    for i in range(n):
        w = [reference_words(seed, 0, i, d) for d in range(3)]
        assert a[i] == (w[0][0] >> 8) * 2.0 ** -24
        assert b[i] == ((w[1][0] >> 5) * 2.0 ** 26 + (w[1][1] >> 6)) * 2.0 ** -53
        assert int(c[i]) == np.int64(np.uint64(w[2][0] | (w[2][1] << 32)).view(np.int64))


@qd.kernel
def uniform_f32(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(out.shape[0]):
        out[i] = qd.random(qd.f32)


@qd.kernel
def uniform_i32(out: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(out.shape[0]):
        out[i] = qd.random(qd.i32)


def test_statistics_of_a_million_draws(arch, session_cache_dir, rng):
    _init(arch, session_cache_dir, int(rng.integers(0, 1 << 63)))
    n = 1 << 20
    x = np.zeros(n, np.float32)
    uniform_f32(x)
    assert x.min() >= 0.0 and x.max() < 1.0
    # mean and variance of U[0, 1): 1/2 and 1/12, within 6 standard errors
    assert abs(x.mean(dtype=np.float64) - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(x.var(dtype=np.float64) - 1 / 12) < 6 * math.sqrt((1 / 80 - 1 / 144) / n)
    counts = np.bincount((x * 64).astype(np.int64), minlength=64)
    chi_square = ((counts - n / 64) ** 2 / (n / 64)).sum()
    assert chi_square < 155.1, chi_square  # chi2(63 degrees of freedom) exceeds it with p = 1e-9
    ints = np.zeros(n, np.int32)
    uniform_i32(ints)
    ones = np.unpackbits(ints.view(np.uint8)).mean()  # every bit is a fair coin
    assert abs(ones - 0.5) < 6 * math.sqrt(0.25 / (32 * n))
    pairs = np.bincount(((x[:-1] * 16).astype(np.int64) * 16 + (x[1:] * 16).astype(np.int64)), minlength=256)
    chi_square = ((pairs - (n - 1) / 256) ** 2 / ((n - 1) / 256)).sum()
    assert chi_square < 414.6, chi_square  # neighbouring iterations are independent (255 dof, p = 1e-9)


@qd.kernel
def top_level_draws(out: qd.types.ndarray(dtype=qd.u32, ndim=1)):
    out[0] = qd.random(qd.u32)  # a serial task
    for i in range(1, out.shape[0]):
        out[i] = qd.random(qd.u32)
    out[0] += qd.random(qd.u32) * 0  # another serial task: its own stream
    out[out.shape[0] - 1] = qd.random(qd.u32)


def test_each_task_has_its_own_stream(session_cache_dir):
    _init("cpu", session_cache_dir, 5)
    out = np.zeros(4, np.uint32)
    top_level_draws(out)
    assert out[0] == reference_words(5, 0, 0, 0, task=0)[0]
    assert out[1] == reference_words(5, 0, 0, 0, task=1)[0]  # the first iteration of range(1, n) is number 0
    assert out[3] == reference_words(5, 0, 0, 1, task=2)[0]  # the second draw of the last serial task


def test_cuda_ptx_of_a_kernel_that_draws_is_built():
    k = draw_words._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda")
    ptx = compiled.artifacts["ptx"].decode()
    assert compiled.meta.random and ".entry" in ptx
    assert compiled.meta.random_slot == compiled.meta.ctx_words - 2


def test_only_kernels_that_draw_have_random_words():
    k = uniform_f32._primal
    meta = K.compile_kernel(k.fn, k.params, Options(arch="cpu"), arch="cpu").meta
    assert meta.random and "random" in meta.to_dict()
    plain = K.compile_kernel(scaled._primal.fn, scaled._primal.params, Options(arch="cpu"), arch="cpu").meta
    assert not plain.random and plain.random_slot is None and "random" not in plain.to_dict()


def test_random_seed_is_checked():
    for bad in (-1, 1 << 64, 1.5, "7"):
        with pytest.raises(ValueError, match="random_seed"):
            qd.init(arch=qd.cpu, random_seed=bad)


def test_random_needs_a_number_type():
    @qd.kernel
    def bad(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        out[0] = qd.random(qd.u1)
    with pytest.raises(qd.QdcCompileError, match="float or integer"):
        bad(np.zeros(1, np.float32))


# ---- gradients: zero through qd.random, none through qd.stop_grad -------------------------

@qd.kernel
def noisy_loss(x: qd.types.ndarray(dtype=qd.f32, ndim=1), loss: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        loss[0] += qd.sin(x[i]) + qd.random() * 0.25


@qd.kernel
def stopped(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        v = qd.Vector([x[i], 2.0 * x[i]])
        w = qd.stop_grad(v)
        y[i] = x[i] * qd.stop_grad(x[i]) + v.dot(w) + qd.exp(qd.stop_grad(qd.sin(x[i])))


def test_gradient_through_random_is_zero(arch, rng):
    x = qd.ndarray(qd.f32, shape=32, needs_grad=True)
    x.from_numpy(rng.uniform(-2, 2, 32).astype(np.float32))
    loss = qd.ndarray(qd.f32, shape=1, needs_grad=True)
    noisy_loss(x, loss)
    loss.grad.from_numpy(np.ones(1, np.float32))
    noisy_loss.grad(x, loss)
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(x.to_numpy()), rtol=1e-5, atol=1e-6)


@qd.kernel
def scaled_by_draws(x: qd.types.ndarray(dtype=qd.f32, ndim=1), drawn: qd.types.ndarray(dtype=qd.f32, ndim=2),
                    loss: qd.types.ndarray(dtype=qd.f32, ndim=1), k: qd.i32):
    for i in range(x.shape[0]):
        r = qd.random()
        drawn[k, i] = r
        loss[0] += x[i] * x[i] * r * qd.cast(k + 1, qd.f32)


def test_gradient_launches_draw_what_their_forward_launch_drew(arch, rng):
    """d/dx of x^2 r (k + 1) is 2 x r (k + 1) with the r the forward launch drew: a Tape replays
    each recorded launch's draws (three launches, each its own), a plain .grad the last forward's."""
    n = 40
    x = qd.ndarray(qd.f32, shape=n, needs_grad=True)
    xs = rng.uniform(-2, 2, n).astype(np.float32)
    x.from_numpy(xs)
    drawn = qd.ndarray(qd.f32, shape=(3, n))
    loss = qd.ndarray(qd.f32, shape=1, needs_grad=True)
    with qd.ad.Tape(loss=loss):
        for k in range(3):
            scaled_by_draws(x, drawn, loss, k)
    r = drawn.to_numpy()
    assert len(np.unique(r)) == r.size  # three launches, three different streams
    want = sum(2 * xs * r[k] * (k + 1) for k in range(3))
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5, atol=1e-5)
    x.grad.fill(0)
    loss.grad.from_numpy(np.ones(1, np.float32))
    scaled_by_draws(x, drawn, loss, 1)
    scaled_by_draws.grad(x, drawn, loss, 1)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * xs * drawn.to_numpy()[1] * 2, rtol=1e-5, atol=1e-5)


def test_stop_grad_blocks_the_gradient(arch, rng):
    n = 24
    xs = rng.uniform(-2, 2, n).astype(np.float32)
    x = qd.ndarray(qd.f32, shape=n, needs_grad=True)
    y = qd.ndarray(qd.f32, shape=n, needs_grad=True)
    x.from_numpy(xs)
    stopped(x, y)
    value = xs * xs + 5 * xs * xs + np.exp(np.sin(xs))
    np.testing.assert_allclose(y.to_numpy(), value, rtol=1e-5, atol=1e-5)
    y.grad.from_numpy(np.ones(n, np.float32))
    stopped.grad(x, y)
    derivative = xs + 5 * xs  # only the unstopped factors: d/dx [x*c + (x, 2x).(c1, c2)]
    np.testing.assert_allclose(x.grad.to_numpy(), derivative, rtol=1e-5, atol=1e-5)


@qd.kernel
def square_sum(x: qd.types.ndarray(dtype=qd.f32, ndim=1), loss: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        loss[0] += x[i] * x[i]


@qd.kernel
def add_cubes(x: qd.types.ndarray(dtype=qd.f32, ndim=1), loss: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        loss[0] += x[i] * x[i] * x[i]


@qd.ad.no_grad
def add_cubes_without_gradient(x, loss):
    add_cubes(x, loss)


def test_no_grad_kernels_run_but_are_not_differentiated(rng):
    xs = rng.uniform(-1, 1, 16).astype(np.float32)
    for scope in ("decorator", "with"):
        x = qd.ndarray(qd.f32, shape=16, needs_grad=True)
        loss = qd.ndarray(qd.f32, shape=1, needs_grad=True)
        x.from_numpy(xs)
        with qd.ad.Tape(loss=loss):
            square_sum(x, loss)
            if scope == "decorator":
                add_cubes_without_gradient(x, loss)
            else:
                with qd.ad.no_grad():
                    add_cubes(x, loss)
        np.testing.assert_allclose(loss.to_numpy()[0], (xs * xs + xs ** 3).sum(dtype=np.float64), rtol=1e-5)
        np.testing.assert_allclose(x.grad.to_numpy(), 2 * xs, rtol=1e-5, atol=1e-6)  # no 3x² from the cubes
    assert add_cubes_without_gradient.__name__ == "add_cubes_without_gradient"


# ---- C-style arithmetic and shifts ------------------------------------------------------------

def _c_division(a, b):
    """numpy's truncating division and remainder (fmod keeps the dividend's sign)."""
    remainder = np.fmod(a, b)
    return (a - remainder) // b, remainder


@pytest.mark.parametrize("dtype", [qd.i32, qd.i64, qd.u32, qd.i8])
def test_raw_div_and_raw_mod_of_integers_truncate(arch, rng, dtype):
    @qd.kernel
    def c_divmod(a: qd.types.ndarray(dtype=dtype, ndim=1), b: qd.types.ndarray(dtype=dtype, ndim=1),
                 q: qd.types.ndarray(dtype=dtype, ndim=1), r: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(a.shape[0]):
            q[i] = qd.raw_div(a[i], b[i])
            r[i] = qd.raw_mod(a[i], b[i])

    info = np.iinfo(dtype.np_dtype)
    n = 256
    a = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype.np_dtype)
    b = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype.np_dtype)
    small = rng.integers(max(info.min, -9), 10, n, dtype=dtype.np_dtype)  # small divisors exercise every sign case
    b = np.where(rng.random(n) < 0.7, small, b)
    b[b == 0] = 3
    if info.min < 0:
        b[(a == info.min) & (b == -1)] = 7  # C leaves INT_MIN / -1 undefined
    q, r = np.zeros_like(a), np.zeros_like(a)
    c_divmod(a, b, q, r)
    want_q, want_r = _c_division(a, b)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(r, want_r)


def assert_close_to_dividend(got, want, dividend, eps):
    assert np.all(np.abs(got - want) <= 4 * eps * np.maximum(np.abs(dividend), 1.0)), np.abs(got - want).max()


@pytest.mark.xfail_arch("vulkan", device="llvmpipe", strict=False,
                        reason="lavapipe's OpFRem is x - y * trunc(x / y): off by up to |y| when x / y rounds "
                               "across an integer (NVIDIA's is within a rounding of |x|)")
@pytest.mark.parametrize("dtype", [qd.f32, qd.f64])
def test_raw_mod_of_floats_is_fmod_and_raw_div_divides(arch, rng, dtype):
    @qd.kernel
    def c_divmod(a: qd.types.ndarray(dtype=dtype, ndim=1), b: qd.types.ndarray(dtype=dtype, ndim=1),
                 q: qd.types.ndarray(dtype=dtype, ndim=1), r: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(a.shape[0]):
            q[i] = qd.raw_div(a[i], b[i])
            r[i] = qd.raw_mod(a[i], b[i])

    n = 256
    a = (rng.uniform(-1e3, 1e3, n) * rng.choice([1e-3, 1, 1e3], n)).astype(dtype.np_dtype)
    b = rng.uniform(-30, 30, n).astype(dtype.np_dtype)
    a[:4] = [0.0, -0.0, 7.5, -7.5]
    q, r = np.zeros_like(a), np.zeros_like(a)
    c_divmod(a, b, q, r)
    np.testing.assert_allclose(q, a / b, rtol=1e-6 if dtype is qd.f32 else 1e-14)
    want = np.fmod(a, b)
    if arch == "cpu":  # fmod is exact, and so is the CPU's
        np.testing.assert_array_equal(r, want)
    else:  # CUDA's libdevice fmod is exact too; NVIDIA's OpFRem is within a rounding of |a|
        assert_close_to_dividend(r, want, a, np.finfo(dtype.np_dtype).eps)
    np.testing.assert_array_equal(np.signbit(r[want != 0]), np.signbit(want[want != 0]))
    np.testing.assert_array_equal(np.signbit(r[:2]), [False, True])  # a zero dividend keeps its sign


@pytest.mark.parametrize("dtype", [qd.i32, qd.i8, qd.u16, qd.i64])
def test_bit_shr_is_a_logical_shift(arch, rng, dtype):
    @qd.kernel
    def shift(x: qd.types.ndarray(dtype=dtype, ndim=1), n: qd.types.ndarray(dtype=dtype, ndim=1),
              out: qd.types.ndarray(dtype=dtype, ndim=1)):
        for i in range(x.shape[0]):
            out[i] = qd.bit_shr(x[i], n[i])

    info = np.iinfo(dtype.np_dtype)
    bits = 8 * dtype.nbytes
    x = rng.integers(info.min, info.max, 200, endpoint=True, dtype=dtype.np_dtype)
    n = rng.integers(0, bits, 200, dtype=dtype.np_dtype)
    out = np.zeros_like(x)
    shift(x, n, out)
    unsigned = np.dtype(f"u{dtype.nbytes}")
    want = (x.view(unsigned) >> n.astype(unsigned)).view(dtype.np_dtype)
    np.testing.assert_array_equal(out, want)


def test_python_scope_versions_agree_with_c():
    assert (qd.raw_div(-7, 2), qd.raw_mod(-7, 2), qd.raw_div(7, -2), qd.raw_mod(7, -2)) == (-3, -1, -3, 1)
    assert qd.raw_mod(-7.5, 2.0) == -1.5 and qd.raw_div(1.0, 4) == 0.25
    assert qd.bit_shr(-1, 28) == 15 and qd.bit_shr(np.int8(-128), 1) == 64
    assert 0.0 <= qd.random() < 1.0 and isinstance(qd.random(qd.i32), int)
    assert qd.stop_grad(2.5) == 2.5


# ---- type predicates ------------------------------------------------------------------------

def test_type_predicates_as_in_quadrants():
    types = qd.types
    assert [types.is_integral(t) for t in (qd.i8, qd.u64, qd.u1, qd.f16, qd.f64)] == [True, True, True, False, False]
    assert [types.is_real(t) for t in (qd.f16, qd.f32, qd.f64, qd.i32)] == [True, True, True, False]
    assert [types.is_signed(t) for t in (qd.i8, qd.i64, qd.u8, qd.u32)] == [True, True, False, False]
    assert types.is_tensor(qd.math.vec3) and not types.is_tensor(qd.f32) and not types.is_real(qd.math.vec3)
    assert types.is_integral(int) and types.is_real(float)
    with pytest.raises(TypeError, match="integer type"):
        types.is_signed(qd.f32)


@qd.kernel
def halve_if_real(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        if qd.static(qd.types.is_real(qd.f32)):
            a[i] = a[i] * 0.5
        if qd.static(qd.types.is_signed(qd.u8)):
            a[i] = -1.0


def test_type_predicates_are_compile_time_in_kernels(rng):
    a = rng.uniform(-4, 4, 8).astype(np.float32)
    want = a * np.float32(0.5)
    halve_if_real(a)
    np.testing.assert_array_equal(a, want)


@qd.kernel
def scaled(x: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        x[i] = x[i] * 2.0
