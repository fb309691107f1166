"""Element-wise range-for tasks on CUDA load and store four elements at a time
(compiler/targets/cuda/vectorize.py): the PTX of saxpy, a copy and a mixed-type body has 128-bit
ld.v4/st.v4 and assembles; a body that reads another index, loads after a store, has control
flow, atomics, 8-byte or 2-D elements keeps scalar accesses only. On every arch (cuda on a GPU)
the results equal numpy's for ranges of every length modulo 4, ranges that do not start at 0
(the scalar loop then covers them), arrays passed twice, fields and ndarrays."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit

F32 = qd.types.ndarray(qd.f32, ndim=1)
I32 = qd.types.ndarray(qd.i32, ndim=1)
U32 = qd.types.ndarray(qd.u32, ndim=1)
F64 = qd.types.ndarray(qd.f64, ndim=1)


@qd.kernel
def saxpy(a: qd.f32, x: F32, y: F32):
    for i in x:
        y[i] = a * x[i] + y[i]


@qd.kernel
def copy(x: F32, y: F32):
    for i in x:
        y[i] = x[i]


@qd.kernel
def mixed(k: qd.i32, x: F32, n: I32, u: U32, out: F32):
    for i in x:
        v = x[i] * 2.0 + qd.cast(n[i], qd.f32)
        u[i] = qd.cast(n[i] + k, qd.u32) ^ u[i]
        out[i] = v


@qd.kernel
def offset_range(start: qd.i32, x: F32, y: F32):
    for i in range(start, x.shape[0]):
        y[i] = x[i] + 1.0


@qd.kernel
def neighbour(x: F32, y: F32):
    for i in range(x.shape[0] - 1):
        y[i] = x[i + 1]


@qd.kernel
def load_after_store(x: F32, y: F32):
    for i in x:
        y[i] = 1.0
        x[i] = y[i] + x[i]


@qd.kernel
def branchy(x: F32, y: F32):
    for i in x:
        if x[i] > 0:
            y[i] = x[i]


@qd.kernel
def doubles(x: F64, y: F64):
    for i in x:
        y[i] = x[i] * 2.0


VECTOR = ("saxpy", "copy", "mixed")
SCALAR = ("neighbour", "load_after_store", "branchy", "doubles")


def _ptx(name: str) -> str:
    qd.init(arch=qd.cpu)
    k = globals()[name]._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda")
    return compiled.artifacts["ptx"].decode()


@pytest.mark.parametrize("name", VECTOR + SCALAR)
def test_element_wise_bodies_load_and_store_128_bits(name):
    ptx = _ptx(name)
    vector = "ld.v4" in ptx or "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx
    assert vector == (name in VECTOR) and ("st.v4" in ptx or "st.global.v4" in ptx) == (name in VECTOR)
    if toolkit.ptxas_path() is not None and toolkit.assembling_gpu("sm_70") is not None:
        toolkit.assemble(ptx, toolkit.assembling_gpu("sm_70"))


LENGTHS = (0, 1, 3, 4, 5, 7, 8, 1000, 4099)


def test_results_equal_numpy_for_every_length_and_alias(arch, rng):
    for n in LENGTHS:
        xs, ys = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        x, y = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n,))
        x.from_numpy(xs)
        y.from_numpy(ys)
        saxpy(2.5, x, y)
        np.testing.assert_array_equal(y.to_numpy(), np.float32(2.5) * xs + ys)
        copy(y, x)
        np.testing.assert_array_equal(x.to_numpy(), np.float32(2.5) * xs + ys)
        saxpy(0.5, x, x)  # one array passed twice
        np.testing.assert_array_equal(x.to_numpy(), np.float32(0.5) * (np.float32(2.5) * xs + ys) * 1
                                      + (np.float32(2.5) * xs + ys))
        for start in (1, 2, 3, 5):
            x.from_numpy(xs)
            y.from_numpy(ys)
            offset_range(start, x, y)
            want = ys.copy()
            want[start:] = xs[start:] + np.float32(1.0)
            np.testing.assert_array_equal(y.to_numpy(), want)


def test_mixed_types_and_numpy_arguments(arch, rng):
    for n in (5, 64, 1001):
        xs = rng.standard_normal(n).astype(np.float32)
        ns = rng.integers(-1000, 1000, n).astype(np.int32)
        us = rng.integers(0, 2**32, n, dtype=np.uint32)
        out = np.zeros(n, np.float32)
        u = us.copy()
        mixed(7, xs, ns, u, out)  # numpy arrays: the device copies them in and out
        np.testing.assert_array_equal(out, xs * np.float32(2.0) + ns.astype(np.float32))
        np.testing.assert_array_equal(u, (ns + 7).astype(np.uint32) ^ us)


def test_fields_are_element_wise_too(arch, rng):
    n = 1003
    a, b = qd.field(qd.f32, shape=n), qd.field(qd.f32, shape=n)

    @qd.kernel
    def scale(k: qd.f32):
        for i in a:
            b[i] = a[i] * k

    data = rng.standard_normal(n).astype(np.float32)
    a.from_numpy(data)
    scale(3.0)
    np.testing.assert_array_equal(b.to_numpy(), data * np.float32(3.0))
