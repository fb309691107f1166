"""Kernel return values (docs/api.md): `-> qd.f32` (any scalar type), a vector/matrix type, or a
tuple of them (`tuple[...]` or Quadrants' `(qd.f32, qd.i32)`), returned from the kernel's
top-level code; the call gives Python scalars, numpy arrays for vectors/matrices, or a tuple.
"""

import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.driver.options import Options
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.errors import QdcCompileError


def test_a_reduction_returned_as_a_scalar(arch, rng):
    @qd.kernel
    def total(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
        s = 0.0
        for i in range(a.shape[0]):
            s += a[i]
        return s

    @qd.kernel
    def count_above(a: qd.types.ndarray(dtype=qd.f64, ndim=1), t: qd.f64) -> qd.i64:
        n = 0
        for i in range(a.shape[0]):
            if a[i] > t:
                n += 1
        return n

    a = rng.random(1000).astype(np.float32)
    got = total(a)
    assert isinstance(got, float)
    np.testing.assert_allclose(got, float(a.sum(dtype=np.float64)), rtol=1e-5)
    b = rng.random(513)
    t = float(rng.random())
    got = count_above(b, t)
    assert isinstance(got, int) and got == int((b > t).sum())


@pytest.mark.parametrize("dtype", ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "u1"])
def test_every_scalar_type_round_trips(arch, rng, dtype):
    t = getattr(qd, dtype)

    @qd.kernel
    def echo(v: t) -> t:
        return v

    info = np.iinfo(t.np_dtype) if dtype[0] in "iu" and dtype != "u1" else None
    if dtype == "u1":
        values = [True, False]
    elif info is not None:
        values = [int(info.min), int(info.max), int(rng.integers(info.min, info.max, dtype=t.np_dtype))]
    else:
        values = [float(t.np_dtype.type(rng.standard_normal()))]
    for v in values:
        got = echo(v)
        assert got == v and type(got) is type(v), (dtype, v, got)


def test_tuples_in_both_spellings_and_conversion_to_the_declared_type(arch, rng):
    x = qd.field(qd.f32, shape=64)

    @qd.kernel
    def stats() -> tuple[qd.f32, qd.f32, qd.i32]:
        lo = 1e30
        hi = -1e30
        n = 0
        for i in x:
            qd.atomic_min(lo, x[i])
            qd.atomic_max(hi, x[i])
            n += 1
        return lo, hi, n

    @qd.kernel
    def pair(k: qd.i32) -> (qd.f64, qd.i32):
        return k / 4, 7  # an int literal into f64 and a true division into an i32's place

    @qd.kernel
    def rounded(v: qd.f32) -> qd.i32:
        return v * 2

    v = rng.standard_normal(64).astype(np.float32)
    x.from_numpy(v)
    assert stats() == (float(v.min()), float(v.max()), 64)
    got = pair(5)
    assert got == (1.25, 7) and isinstance(got[0], float) and isinstance(got[1], int)
    assert rounded(3.75) == 7


def test_a_return_after_parallel_loops_sees_their_results(arch, rng):
    """The returned value is computed from temporaries of earlier tasks: a GPU waits for them."""
    out = qd.field(qd.f32, shape=256)

    @qd.kernel
    def work(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32) -> tuple[qd.f32, qd.f32]:
        for i in range(a.shape[0]):
            out[i] = a[i] * s
        total = 0.0
        for i in range(a.shape[0]):
            total += out[i]
        return total, out[3]

    a = rng.random(256).astype(np.float32)
    for s in (1.0, 2.5):
        got = work(a, s)
        np.testing.assert_allclose(got, (float((a * s).sum()), float(a[3] * s)), rtol=1e-5)


def test_a_returning_kernel_still_has_a_gradient(arch, rng):
    x = qd.field(qd.f32, shape=32, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy() -> qd.f32:
        for i in x:
            loss[None] += x[i] * x[i]
        return loss[None]

    v = rng.random(32).astype(np.float32)
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss):
        got = energy()
    np.testing.assert_allclose(got, float((v * v).sum()), rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * v, rtol=1e-6)
    loss.grad[None] = 1.0
    x.grad.fill(0)
    assert energy.grad() is None  # the grad kernel returns nothing
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * v, rtol=1e-6)
    assert kernel_of(energy).compile(variant="grad").meta.returns is None


def test_metadata_records_the_returns_and_is_checked():
    @qd.kernel
    def k(n: qd.i32) -> tuple[qd.f32, qd.i32]:
        return n * 1.5, n

    @qd.kernel
    def none(n: qd.i32):
        pass

    meta = kernel_of(k).compile().meta
    d = meta.to_dict()
    assert d["returns"]["values"] == [["f32", []], ["i32", []]] and d["returns"]["tuple"] is True
    assert A.KernelMeta.from_dict(d).returns == d["returns"]
    assert "returns" not in kernel_of(none).compile().meta.to_dict()
    for bad in ({**d["returns"], "slots": [0, 99]}, {**d["returns"], "values": [["f99", []], ["i32", []]]},
                {**d["returns"], "tuple": False}, {**d["returns"], "extra": 1}):
        with pytest.raises(ValueError, match="returns"):
            A.KernelMeta.from_dict({**d, "returns": bad})
    # a kernel without a return value launches through code with no trace of one
    none(1)
    assert "_q_result" not in none.__qdc_source__
    assert "return _q_result()" in kernel_of(k)._launchers[("forward", ())][1].__qdc_source__


def _error(kernel, *args) -> QdcCompileError:
    with pytest.raises(QdcCompileError) as e:
        kernel(*args)
    return e.value


def test_returns_outside_top_level_code_are_located_errors():
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def in_loop() -> qd.f32:
        for i in x:
            return x[i]  # here

    @qd.kernel
    def in_if(v: qd.f32) -> qd.f32:
        if v > 0:
            return v  # here
        return -v

    @qd.kernel
    def code_after(v: qd.f32) -> qd.f32:
        return v
        x[0] = v  # here

    @qd.kernel
    def missing(v: qd.f32) -> qd.f32:  # here
        x[0] = v

    @qd.kernel
    def undeclared(v: qd.f32):
        return v  # here

    @qd.kernel
    def wrong_count(v: qd.f32) -> tuple[qd.f32, qd.f32]:
        return v  # here

    @qd.kernel
    def bad_type(v: qd.f32) -> str:  # here
        return v

    cases = [(in_loop, "top-level code: not inside a loop"), (in_if, "not inside a loop .* or a run-time if"),
             (code_after, "return must be its last statement"), (missing, "does not end with a return"),
             (undeclared, "declares no return type"), (wrong_count, "declares 2 return values .* returns one value"),
             (bad_type, "unsupported return type")]
    for kernel, message in cases:
        e = _error(kernel, 1.0) if kernel is not in_loop else _error(kernel)
        assert re.search(message, str(e)), (kernel.__name__, str(e))
        assert e.source_line is not None and "# here" in e.source_line, (kernel.__name__, str(e))


def test_the_cuda_target_generates_ptx_for_a_returning_kernel():
    """The PTX path handles the return's temporaries (assembled by ptxas in test_cuda_target)."""
    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> tuple[qd.f32, qd.i32]:
        s = 0.0
        for i in range(a.shape[0]):
            s += a[i]
        return s, a.shape[0]

    kern = kernel_of(k)
    compiled = K.compile_kernel(kern.fn, kern.params, Options(arch="cuda"), arch="cuda")
    ptx = compiled.artifacts["ptx"].decode()
    assert re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M) == [t.entry for t in compiled.meta.tasks]
    assert compiled.meta.returns["values"] == [["f32", []], ["i32", []]]
    from qdc.compiler.targets.cuda import toolkit
    gpu = toolkit.assembling_gpu("sm_70") if toolkit.ptxas_path() is not None else None
    if gpu is not None:
        toolkit.assemble(ptx, gpu)


def test_vectors_and_matrices_return_as_numpy_arrays(arch, rng):
    x = qd.field(qd.f32, shape=50)

    @qd.kernel
    def centroid_and_spread() -> tuple[qd.math.vec2, qd.types.matrix(2, 2, qd.f32), qd.i32]:
        s = qd.Vector([0.0, 0.0])
        for i in x:
            s += qd.Vector([x[i], x[i] * x[i]])
        m = qd.Matrix([[s[0], s[1]], [s[1] * 2, s[0] - 1]])
        return s / 50, m, 50

    @qd.kernel
    def scaled(a: qd.f64) -> qd.types.vector(3, qd.f64):
        return qd.Vector([a, a * 2, a * 3])

    @qd.kernel
    def wrong_shape(a: qd.f32) -> qd.math.vec3:
        return qd.Vector([a, a])  # here

    v = rng.random(50).astype(np.float32)
    x.from_numpy(v)
    mean, m, n = centroid_and_spread()
    s = np.array([v.astype(np.float64).sum(), (v.astype(np.float64) ** 2).sum()])
    assert mean.shape == (2,) and mean.dtype == np.float32 and m.shape == (2, 2) and n == 50
    np.testing.assert_allclose(mean, s / 50, rtol=1e-5)
    np.testing.assert_allclose(m, [[s[0], s[1]], [2 * s[1], s[0] - 1]], rtol=1e-5)
    a = float(rng.random())
    got = scaled(a)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [a, 2 * a, 3 * a])
    e = _error(wrong_shape, 1.0)
    assert "shape (3,) but returns one of shape (2,)" in str(e) and "# here" in e.source_line
