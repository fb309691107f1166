"""Fills, element writes and deep copies of fields and ndarrays on every arch (cpu, vulkan, and
cuda on an NVIDIA GPU): every dtype and several shapes against numpy, writes interleaved with
launches in the order the program gives them, deep copies equal to and independent of their
source. On the CUDA driver stand-in (tests/devices/test_device_loss.py's FakeCuda, device memory
in host memory, a stream that runs when synchronised) the same API drives the stream device's
calls: memsets of the pattern's period, staged element writes that wait for nothing, one
device-to-device copy per array copied."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.devices.cuda import driver as cuda_driver

from test_device_loss import FakeCuda, StickyBinding

DTYPES = ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
SHAPES = ((1,), (1000,), (37, 5), (4099,))


def _value(rng, name):
    dtype = np.dtype({"f": "float", "i": "int", "u": "uint"}[name[0]] + name[1:])
    if dtype.kind == "f":
        return float(dtype.type(rng.uniform(-100, 100)))
    info = np.iinfo(dtype)
    return int(rng.integers(info.min, info.max, endpoint=True, dtype=dtype))


def _arrays(name, shape):
    dt = getattr(qd, name)
    return [qd.field(dt, shape=shape), qd.ndarray(dt, shape=shape), qd.Vector.field(3, dt, shape=shape)]


@pytest.mark.parametrize("name", DTYPES)
def test_fills_of_every_dtype_and_shape(arch, rng, name):
    for shape in SHAPES:
        for a in _arrays(name, shape):
            np_dtype = a.to_numpy().dtype
            background = rng.integers(0, 100, a.to_numpy().shape).astype(np_dtype)
            a.from_numpy(background)
            value = _value(rng, name)
            a.fill(value)
            np.testing.assert_array_equal(a.to_numpy(), np.full(background.shape, value, np_dtype))
            a.fill(0)
            assert not a.to_numpy().any()


def test_fills_and_element_writes_are_ordered_with_launches(arch, rng):
    n = 1000
    x = qd.ndarray(qd.f32, shape=(n,))
    f = qd.field(qd.i64, shape=(n,))

    @qd.kernel
    def step(x: qd.types.ndarray(qd.f32, ndim=1), k: qd.f32):
        for i in x:
            x[i] = x[i] * 2.0 + k
            f[i] = f[i] * 3 + i

    xs, fs = np.zeros(n, np.float32), np.zeros(n, np.int64)
    for round_ in range(6):
        value = np.float32(rng.uniform(-2, 2))
        x.fill(value)
        f.fill(round_ - 2**40)
        xs[:], fs[:] = value, round_ - 2**40
        for _ in range(20):  # writes between launches, none waited for
            i, j = (int(v) for v in rng.integers(0, n, 2))
            v = np.float32(rng.uniform(-1, 1))
            x[i] = v
            xs[i] = v
            f[j] = int(j) * 7 - 2**35
            fs[j] = int(j) * 7 - 2**35
            k = np.float32(rng.uniform(-1, 1))
            step(x, k)
            xs[:] = xs * np.float32(2) + k
            fs[:] = fs * 3 + np.arange(n)
            if rng.random() < 0.2:
                assert x[i] == xs[i] and f[j] == fs[j]  # a read in between sees everything before it
        np.testing.assert_allclose(x.to_numpy(), xs, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(f.to_numpy(), fs)


def test_deep_copies_are_equal_and_independent(arch, rng):
    n = 513
    a = qd.Vector.ndarray(2, qd.f64, shape=n, needs_grad=True)
    g = qd.field(qd.i32, shape=(n, 3))
    data, grad = rng.random((n, 2)), rng.random((n, 2))
    gdata = rng.integers(-2**31, 2**31 - 2, (n, 3)).astype(np.int32)

    @qd.kernel
    def bump(v: qd.types.ndarray(), k: qd.f64):
        for i in v:
            v[i] += k
            for j in range(3):
                g[i, j] += 1

    a.from_numpy(data)
    a.grad.from_numpy(grad)
    g.from_numpy(gdata)
    bump(a, 1.0)  # queued before the copies: they see its result
    b, h = copy.deepcopy(a), copy.deepcopy(g)
    bump(a, 10.0)  # queued after: only the originals change
    a.grad.fill(0.5)
    np.testing.assert_array_equal(b.to_numpy(), data + 1.0)
    np.testing.assert_array_equal(b.grad.to_numpy(), grad)
    np.testing.assert_array_equal(h.to_numpy(), gdata + 1)
    np.testing.assert_array_equal(a.to_numpy(), (data + 1.0) + 10.0)
    np.testing.assert_array_equal(g.to_numpy(), gdata + 2)
    b.fill(-1.0)
    h[3, 1] = 9
    np.testing.assert_array_equal(a.to_numpy(), (data + 1.0) + 10.0)
    assert g[3, 1] == gdata[3, 1] + 2 and h[3, 1] == 9


# ---- the CUDA stream device's calls, on the driver stand-in --------------------------------------

@pytest.fixture
def stand_in(monkeypatch, session_cache_dir):
    cu = StickyBinding(FakeCuda(), resets=())
    cu.binding.hip.deferred = True  # copies and memsets wait on the stream until a synchronise
    monkeypatch.setattr(cuda_driver, "load_binding", lambda: cu)
    qd.init(arch=qd.cuda, cache_dir=session_cache_dir)
    yield cu
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def _calls_during(cu, action):
    start = len(cu.log)
    action()
    return cu.log[start:]


@pytest.mark.parametrize("name", DTYPES)
def test_cuda_fills_are_memsets_of_the_patterns_period(stand_in, rng, name):
    cu = stand_in
    for shape in SHAPES:
        for a in _arrays(name, shape):
            np_dtype = a.to_numpy().dtype
            value = _value(rng, name)
            calls = [c for c in _calls_during(cu, lambda: a.fill(value))  # the fill kernel loads once
                     if c not in ("cuModuleLoadData", "cuModuleGetFunction")]
            raw = np.full(a._element_count(), value, np_dtype).tobytes()
            period = min(p for p in range(1, len(raw) + 1) if raw == raw[:p] * (len(raw) // p))
            want = {1: ["cuMemsetD8Async"], 2: ["cuMemsetD16Async"], 4: ["cuMemsetD32Async"],
                    8: ["cuLaunchKernel"]}.get(period)  # 8: the device's fill kernel
            if want is not None:
                assert calls == want
            else:  # a vector of distinct 16-bit values: staged once, doubled on the device
                assert calls[0] == "cuMemcpyHtoDAsync" and set(calls[1:]) <= {"cuMemcpyDtoDAsync"}
            np.testing.assert_array_equal(a.to_numpy(), np.full(a.to_numpy().shape, value, np_dtype))


def test_cuda_element_writes_and_deep_copies_wait_for_nothing(stand_in, rng):
    cu = stand_in
    x = qd.ndarray(qd.f32, shape=(4000,), needs_grad=True)
    xs = rng.random(4000).astype(np.float32)
    x.from_numpy(xs)
    for i in rng.integers(0, 4000, 300):
        v = np.float32(rng.random())
        calls = _calls_during(cu, lambda: x.__setitem__(int(i), v))
        assert "cuStreamSynchronize" not in calls and calls[-1] == "cuMemcpyHtoDAsync"
        xs[i] = v
    y = None

    def deep():
        nonlocal y
        y = copy.deepcopy(x)
    calls = _calls_during(cu, deep)
    assert calls.count("cuMemcpyDtoDAsync") == 2 and "cuStreamSynchronize" not in calls  # values and grad
    assert "cuMemcpyDtoHAsync" not in calls
    x.fill(3.0)
    np.testing.assert_array_equal(y.to_numpy(), xs)
    assert (x.to_numpy() == 3.0).all() and not y.grad.to_numpy().any()
