"""Types and promotion (docs/api.md): weak literals, default_ip/default_fp, locals typed by their
first assignment, every scalar parameter type, f16, u1, and 64-bit integer paths."""
import numpy as np

import qdc as qd

SCALAR_TYPES = [qd.i8, qd.i16, qd.i32, qd.i64, qd.u8, qd.u16, qd.u32, qd.u64, qd.f16, qd.f32, qd.f64, qd.u1]


def test_weak_literals_take_the_typed_operand_type(rng):
    out = qd.field(qd.f64, shape=8)

    @qd.kernel
    def k(v: qd.f64, h: qd.f32, i: qd.i32):
        out[0] = v * 0.7          # exact f64 product: 0.7 is not rounded to f32
        out[1] = h * 0.7          # f32 product
        a = 0.1                   # a literal alone is default_fp (f32)
        out[2] = a
        out[3] = i / 3            # int / int is true division in default_fp
        out[4] = i + 0.5          # i32 + float literal -> default_fp
        out[5] = i // 2 * 2.0
        out[6] = 2 ** 40 + i      # a big int literal widens to i64
        out[7] = (3 + 4) / 8      # constant folded in Python

    v, h, i = float(rng.random()), float(rng.random()), int(rng.integers(-10**6, 10**6))
    k(v, h, i)
    f32 = np.float32
    got = out.to_numpy()
    assert got[0] == v * 0.7
    assert got[1] == f32(f32(h) * f32(0.7))
    assert got[2] == f32(0.1)
    assert got[3] == f32(f32(i) / f32(3))
    assert got[4] == f32(f32(i) + f32(0.5))
    assert got[5] == f32(i // 2 * 2)
    assert got[6] == 2 ** 40 + i
    assert got[7] == 7 / 8


def test_default_fp_f64_changes_literals_and_division(rng, session_cache_dir):
    qd.init(arch=qd.cpu, default_fp=qd.f64, cache_dir=session_cache_dir)
    out = qd.field(qd.f64, shape=3)

    @qd.kernel
    def k(i: qd.i32):
        a = 0.1
        out[0] = a
        out[1] = i / 3
        out[2] = qd.sqrt(i * 1.0 + 2)

    i = int(rng.integers(1, 10**6))
    k(i)
    assert out.to_numpy().tolist() == [0.1, i / 3, np.sqrt(i + 2.0)]


def test_default_ip_i64(session_cache_dir):
    qd.init(arch=qd.cpu, default_ip=qd.i64, cache_dir=session_cache_dir)
    out = qd.field(qd.i64, shape=2)

    @qd.kernel
    def k():
        a = 2 ** 31      # default_ip is i64: no wrap-around
        out[0] = a * 4
        out[1] = int(3.7) * 2 ** 33

    k()
    assert out.to_numpy().tolist() == [2 ** 33, 3 * 2 ** 33]


def test_integer_promotion_signed_and_unsigned(rng):
    out = qd.field(qd.i64, shape=7)

    @qd.kernel
    def k(u: qd.u32, s: qd.i32, b: qd.u8, w: qd.i64):
        out[0] = u + s            # u32 + i32 -> u32 (unsigned wins at equal width)
        out[1] = b + s            # u8 + i32 -> i32
        out[2] = w + u            # i64 + u32 -> i64
        out[3] = b * 100          # the literal takes u8: wraps modulo 256
        out[4] = u > s            # compared as u32: s wraps to a large value
        out[5] = qd.cast(s, qd.u8)
        out[6] = b * 1000         # a literal too large for u8 widens the operation to i32

    u = int(rng.integers(0, 100))
    s = -int(rng.integers(101, 1000))
    b = int(rng.integers(1, 255))
    w = int(rng.integers(-2**40, 2**40))
    k(u, s, b, w)
    assert out.to_numpy().tolist() == [(u + s) % 2**32, b + s, w + u, (b * 100) % 256, 0, s % 256, b * 1000]


def test_locals_typed_by_first_assignment(rng):
    out = qd.field(qd.f32, shape=5)

    @qd.kernel
    def k(x: qd.f32):
        n = 0            # i32 local
        n = x            # converted (truncated toward zero)
        f = 1.5          # f32 local
        f = n + 1        # converted to f32
        b = x > 0        # u1 local
        b = 7            # converted to u1 (True)
        c: qd.f64 = 1    # an annotation fixes the type
        c = c / 3
        out[0] = n
        out[1] = f
        out[2] = b
        out[3] = c * 3 - 1  # f64 arithmetic: exactly 0
        n += 2.9            # augmented assignment also converts back to i32
        out[4] = n

    x = float(rng.uniform(-50, 50))
    k(x)
    t = int(np.float32(x))
    assert out.to_numpy().tolist() == [t, t + 1, 1.0, 0.0, int(t + 2.9)]


def test_scalar_parameters_of_every_type(rng):
    outs = {t.name: qd.field(t, shape=2) for t in SCALAR_TYPES}
    o = [outs[t.name] for t in SCALAR_TYPES]

    @qd.kernel
    def k(a: qd.i8, b: qd.i16, c: qd.i32, d: qd.i64, e: qd.u8, f: qd.u16, g: qd.u32, h: qd.u64,
          p: qd.f16, q: qd.f32, r: qd.f64, s: qd.u1):
        o[0][0], o[1][0], o[2][0], o[3][0] = a, b, c, d
        o[4][0], o[5][0], o[6][0], o[7][0] = e, f, g, h
        o[8][0], o[9][0], o[10][0], o[11][0] = p, q, r, s
        o[0][1], o[1][1], o[2][1], o[3][1] = a + 1, b + 1, c + 1, d + 1
        o[4][1], o[5][1], o[6][1], o[7][1] = e + 1, f + 1, g + 1, h + 1
        o[8][1], o[9][1], o[10][1], o[11][1] = p * 2, q * 2, r * 2, not s

    values = []
    for t in SCALAR_TYPES:
        if t.is_float:
            values.append(float(t.np_dtype.type(rng.standard_normal() * 100)))
        elif t is qd.u1:
            values.append(bool(rng.integers(0, 2)))
        else:
            info = np.iinfo(t.np_dtype)
            values.append(int(rng.integers(info.min, info.max, dtype=t.np_dtype, endpoint=True)))
    values[3] = 2**62 + 12345      # beyond 2**31
    values[7] = 2**64 - 2          # beyond 2**63
    k(*values)
    for t, v in zip(SCALAR_TYPES, values):
        got = outs[t.name].to_numpy()
        npt = t.np_dtype.type
        with np.errstate(over="ignore"):
            second = (not v) if t is qd.u1 else (npt(v) * npt(2) if t.is_float else npt(v) + npt(1))
        assert got.tolist() == [npt(v), second], t.name


def test_f16_arithmetic_fields_and_math(rng):
    h = qd.field(qd.f16, shape=64)
    out = qd.field(qd.f32, shape=64)

    @qd.kernel
    def k(s: qd.f16):
        for i in h:
            v = h[i] * s + 0.5          # f16 arithmetic
            h[i] = v
            out[i] = qd.sqrt(abs(v)) if v < 2 else qd.floor(v)

    x = rng.uniform(-4, 4, 64).astype(np.float16)
    s = float(np.float16(rng.uniform(0.5, 1.5)))
    h.from_numpy(x)
    k(s)
    v = (x * np.float16(s) + np.float16(0.5)).astype(np.float16)
    np.testing.assert_allclose(h.to_numpy(), v, rtol=1e-3)
    ref = np.where(v < 2, np.sqrt(np.abs(v.astype(np.float32))), np.floor(v.astype(np.float32)))
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=2e-3)


def test_u1_values_fields_and_conditions(rng):
    flags = qd.field(qd.u1, shape=100)
    count = qd.field(qd.i32, shape=())

    @qd.kernel
    def k(x: qd.types.ndarray(dtype=qd.f32, ndim=1), invert: qd.u1):
        for i in flags:
            f = x[i] > 0.5
            if invert:
                f = not f
            flags[i] = f
            if flags[i]:
                count[None] += 1
            count[None] += flags[i] and not invert  # bools add as integers

    x = rng.random(100).astype(np.float32)
    invert = bool(rng.integers(0, 2))
    k(x, invert)
    expect = (x > 0.5) != invert
    np.testing.assert_array_equal(flags.to_numpy(), expect)
    assert count[None] == expect.sum() + (0 if invert else expect.sum())


def test_i64_paths_do_not_overflow(rng):
    acc = qd.field(qd.i64, shape=3)

    @qd.kernel
    def k(base: qd.i64, n: qd.i32):
        for i in range(base, base + n):     # i64 loop bounds beyond 2**31
            acc[0] += i
            qd.atomic_max(acc[1], i * 3)
        total = qd.cast(0, qd.i64)
        for j in range(n):
            total += j * 3000000000        # the literal widens the product to i64
        acc[2] = total

    base = int(rng.integers(2**32, 2**40))
    n = int(rng.integers(100, 1000))
    k(base, n)
    r = np.arange(base, base + n, dtype=np.int64)
    assert acc.to_numpy().tolist() == [int(r.sum()), int(r.max()) * 3, 3000000000 * n * (n - 1) // 2]
