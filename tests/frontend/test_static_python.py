"""Compile-time Python as Quadrants programs use it: a name bound from `qd.static(...)` is a
compile-time value (`BW = qd.static(flag)` then `if qd.static(BW):`), host Python inside
`qd.static` (plain functions, enumerate, zip, len, getattr, isinstance, numpy scalar
functions, a config object's attributes and methods), `bool` parameters and
`qd.types.ndarray(element_dim=...)`. Checked against the same expressions run in Python."""
import math

import numpy as np
import pytest

import qdc as qd


def _tri_idx(i, j, dim):
    """Index of (i, j), i <= j, in the row-major packing of a dim x dim upper triangle."""
    return i * dim - i * (i - 1) // 2 + (j - i)


class Config:
    def __init__(self, backward: bool, rows: int):
        self.backward, self.rows = backward, rows

    def doubled(self):
        return 2 * self.rows


@pytest.mark.parametrize("flag", [False, True])
def test_a_name_bound_from_static_is_a_compile_time_value(arch, flag):
    out = qd.field(qd.f32, shape=4)

    @qd.kernel
    def k(cfg: qd.template()):
        BW = qd.static(cfg.backward)
        rows, twice = qd.static(cfg.rows, cfg.doubled())
        if qd.static(not BW):
            out[0] = 1.0
        else:
            out[0] = 2.0
        for i in qd.static(range(rows)):  # a compile-time trip count: unrolled
            out[1] += i
        out[2] = twice
        angle = qd.static(float(np.nextafter(np.float32(math.pi), np.float32(0.0))))
        out[3] = angle

    k(Config(flag, 3))
    assert out[0] == (2.0 if flag else 1.0)
    assert out[1] == 3 and out[2] == 6
    assert out[3] == np.float32(np.nextafter(np.float32(math.pi), np.float32(0.0)))


def test_host_calls_inside_static(arch):
    n = 4
    out = qd.field(qd.i32, shape=n * (n + 1) // 2 + 8)
    caps = (3, 5, 7)

    @qd.kernel
    def k(a: qd.i32, b: qd.i32):
        for i in qd.static(range(n)):
            for j in qd.static(range(i, n)):
                out[qd.static(_tri_idx(i, j, n))] = i * 10 + j
        base = qd.static(n * (n + 1) // 2)
        for i_k, i_c in qd.static(enumerate((a, b))):  # run-time values pass through as they are
            out[base + i_k] = i_c
        for c, d in qd.static(zip(caps, reversed(caps))):
            out[base + 2] += c * d
        out[base + 3] = qd.static(len(caps))
        if qd.static(isinstance(caps, tuple) and getattr(math, "pi") > 3):
            out[base + 4] = 1
        out[base + 5] = qd.static(sum(sorted(caps)))

    k(11, 13)
    got = out.to_numpy()
    for i in range(n):
        for j in range(i, n):
            assert got[_tri_idx(i, j, n)] == i * 10 + j
    base = n * (n + 1) // 2
    assert list(got[base:base + 6]) == [11, 13, 3 * 7 + 5 * 5 + 7 * 3, 3, 1, 15]


def test_a_failing_host_call_is_a_located_error():
    def broken(v):
        return v.missing

    @qd.kernel
    def k():
        x = qd.static(broken(3))  # noqa: F841

    with pytest.raises(qd.QdcCompileError, match=r"calling .*broken\(\) inside qd.static\(\.\.\.\) at compile time "
                                                  r"raised AttributeError"):
        k()


def test_bool_parameters(arch):
    out = qd.field(qd.i32, shape=2)

    @qd.kernel
    def k(on: bool, n: qd.i32):
        if on:
            out[0] = n
        else:
            out[1] = n

    k(True, 4)
    k(False, 5)
    assert list(out.to_numpy()) == [4, 5]


def test_ndarray_element_dim(arch, rng):
    @qd.kernel
    def norms(v: qd.types.ndarray(element_dim=1), m: qd.types.ndarray(element_dim=2),
              out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in out:
            out[i] = v[i].norm() + m[i].trace()

    n = 5
    v = qd.Vector.ndarray(3, qd.f32, n)
    vv = rng.standard_normal((n, 3)).astype(np.float32)
    v.from_numpy(vv)
    mm = rng.standard_normal((n, 2, 2)).astype(np.float32)
    out = np.zeros(n, np.float32)
    norms(v, mm, out)  # a numpy array: its last element_dim axes are the element
    np.testing.assert_allclose(out, np.linalg.norm(vv, axis=1) + np.trace(mm, axis1=1, axis2=2), rtol=1e-5)


def test_the_throwaway_name_rebinds_with_any_type(arch):
    out = qd.field(qd.f32, shape=3)

    @qd.func
    def f():
        return qd.Vector([1.0, 2.0]), 3, 4.5

    @qd.func
    def g():
        return 7, qd.Matrix([[1.0, 2.0], [3.0, 4.0]])

    @qd.kernel
    def k():
        v1, _, _ = f()
        _, m = g()
        out[0] = v1[1] + m[1, 1]
        for i in range(2):
            a, _ = g()
            _, b, _ = f()
            out[1] += a + b + i
        x = 1
        x = qd.Vector([1.0, 2.0])
        out[2] = x[1]

    k()
    assert list(out.to_numpy()) == [6.0, 21.0, 2.0]


def test_host_apis_of_qdc_run_inside_static(arch):
    out = qd.field(qd.f32, shape=1)

    @qd.kernel
    def k():
        out[0] = qd.static(len(qd.runtime.contract.arches.names()) > 0)

    k()
    assert out[0] == 1.0
