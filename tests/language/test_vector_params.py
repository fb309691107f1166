"""Vector and matrix kernel parameters (`v: qd.math.vec3`, `m: qd.types.matrix(2, 2, qd.f32)`),
passed by value as in Quadrants: the argument forms the launcher accepts, values against numpy
on every arch of the suite, gradients and forward mode through kernels that take them,
templates and AOT instantiations, wrong shapes refused naming kernel, parameter and element,
the cache key, `--ir` and `qdc inspect`, and a built module loaded without the compiler."""
import os
import subprocess
import sys

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import cache_key
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.artifact_schema import check_kernel_meta
from qdc.runtime.contract import cpu_binding
from tolerance_util import assert_close_f32

def rand(rng, *shape, lo=-1.0, hi=1.0):
    return (lo + (hi - lo) * rng.random(shape)).astype(np.float32)


# ---- forward values -------------------------------------------------------------------------

def test_vector_matrix_and_integer_vector_parameters_against_numpy(arch, rng):
    n = 6
    out = qd.Vector.field(2, qd.f32, shape=n)

    @qd.kernel
    def run(a: qd.types.ndarray(dtype=qd.f32, ndim=1), v: qd.math.vec2, s: qd.f32,
            m: qd.types.matrix(2, 2, qd.f32), k: qd.math.ivec2, b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in out:
            out[i] = m @ (v * a[i]) + s * b[i] + float(k[0] * i - k[1])

    a, b = rand(rng, n), rand(rng, n)
    v, m, s = rand(rng, 2), rand(rng, 2, 2), float(rand(rng, 1)[0])
    k = rng.integers(-5, 5, 2)
    run(a, v, s, m, k, b)  # numpy arrays (ivec from int64 elements)
    want = (m.astype(np.float64) @ (v[:, None] * a[None, :].astype(np.float64))).T \
        + s * b[:, None] + (k[0] * np.arange(n) - k[1])[:, None]
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-5)

    v2, m2 = rand(rng, 2), rand(rng, 2, 2)
    # lists and tuples, a nested list for the matrix, qd.Vector / qd.math values, keywords
    run(a, list(map(float, v2)), s, m=[[float(x) for x in row] for row in m2], k=(int(k[0]), int(k[1])), b=b)
    want2 = (m2.astype(np.float64) @ (v2[:, None] * a[None, :].astype(np.float64))).T \
        + s * b[:, None] + (k[0] * np.arange(n) - k[1])[:, None]
    np.testing.assert_allclose(out.to_numpy(), want2, rtol=1e-5, atol=1e-5)
    run(a, qd.Vector([float(v[0]), float(v[1])]), s, qd.Matrix(m), qd.math.ivec2(int(k[0]), int(k[1])), b)
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-5)


def test_each_launch_reads_the_values_passed(arch, rng):
    """Launched on its own (the fast path), the kernel still binds the vector passed each time,
    and a vector parameter is a local: assigning to it in the kernel leaves the caller's alone."""
    out = qd.field(qd.f32, shape=3)

    @qd.kernel
    def run(v: qd.math.vec3):
        v *= 2.0
        v.y += 1.0
        for i in out:
            out[i] = v[i]

    given = rand(rng, 3)
    keep = given.copy()
    for _ in range(4):
        vals = rand(rng, 3)
        run(vals)
        np.testing.assert_allclose(out.to_numpy(), vals * 2 + [0, 1, 0], rtol=1e-6)
    run(given)
    np.testing.assert_array_equal(given, keep)
    assert kernel_of(run).launches_on_its_own()


def test_an_integer_vector_element_bounds_a_loop(arch, rng):
    """A trip count read from a vector element: the launch evaluates it per record."""
    out = qd.field(qd.f32, shape=())

    @qd.kernel
    def run(bounds: qd.math.ivec3, w: qd.math.vec2):
        for i in range(bounds[1]):
            out[None] += w[0] * i + w[1]

    w = rand(rng, 2)
    for count in rng.integers(1, 50, 3):
        out[None] = 0.0
        run([7, int(count), 9], w)
        want = w[0].astype(np.float64) * count * (count - 1) / 2 + w[1] * count
        terms = abs(w[0]) * count * (count - 1) / 2 + abs(w[1]) * count  # signed w: the sum can cancel
        assert_close_f32(out[None], want, scale=terms, ulps=int(count))


def test_a_matrix_returned_from_matrix_parameters(arch, rng):
    @qd.kernel
    def product(a: qd.math.mat3, b: qd.math.mat3) -> qd.math.mat3:
        return a @ b.transpose()

    a, b = rand(rng, 3, 3), rand(rng, 3, 3)
    np.testing.assert_allclose(product(a, b), a.astype(np.float64) @ b.T, rtol=1e-5, atol=1e-6)


# ---- wrong arguments ------------------------------------------------------------------------

def test_wrong_shapes_and_values_are_refused_naming_kernel_parameter_and_element(arch):
    out = qd.field(qd.f32, shape=2)

    @qd.kernel
    def touch(v: qd.math.vec3, m: qd.types.matrix(2, 2, qd.f32)):
        for i in out:
            out[i] = v[i] + m[i, i]

    good_m = np.eye(2, dtype=np.float32)
    out.fill(-7.0)
    cases = [
        ([1.0, 2.0], good_m, ValueError, r"kernel 'touch', argument 'v': expected a vector\(3, f32\).*shape \(2,\)"),
        (np.zeros((3, 1)), good_m, ValueError, r"argument 'v'.*numpy array of shape \(3, 1\)"),
        (3.0, good_m, TypeError, r"argument 'v': expected a vector\(3, f32\).*got float"),
        ("abc", good_m, TypeError, r"argument 'v'"),
        ([1.0, "x", 3.0], good_m, TypeError, r"kernel 'touch', argument 'v', element \[1\]: expected a f32"),
        ([0.0, 1.0, 2.0], [1.0, 0.0, 0.0, 1.0], ValueError, r"argument 'm': expected a matrix\(2, 2, f32\)"),
        ([0.0, 1.0, 2.0], [[1.0, 0.0], [0.0]], ValueError, r"argument 'm'"),
        ([0.0, 1.0, 2.0], [[1.0, 0.0], [None, 1.0]], TypeError, r"argument 'm', element \[1, 0\]"),
        (out, good_m, TypeError, r"argument 'v'.*a vector parameter takes a value"),
    ]
    for v, m, error, message in cases:
        with pytest.raises(error, match=message):
            touch(v, m)
    np.testing.assert_array_equal(out.to_numpy(), [-7.0, -7.0])  # nothing ran
    with pytest.raises(TypeError, match="touch"):
        touch([1.0, 2.0, 3.0])  # a missing argument, reported by Python naming the kernel


def test_out_of_range_integer_elements_are_refused(arch):
    out = qd.field(qd.i32, shape=())

    @qd.kernel
    def put(k: qd.types.vector(2, qd.u8)):
        out[None] = k[0] + k[1]

    put([200, 55])
    assert out[None] == 255
    with pytest.raises(ValueError, match=r"argument 'k', element \[0\]: 256 is out of range for u8"):
        put([256, 0])
    with pytest.raises(TypeError, match=r"argument 'k', element \[1\]: expected a u8 scalar \(an integer\)"):
        put([1, 2.5])


def test_an_oversized_vector_annotation_is_a_compile_error():
    @qd.kernel
    def big(v: qd.types.vector(65, qd.f32)):
        pass

    with pytest.raises(qd.QdcCompileError, match="parameter 'v' of kernel 'big'.*at most 64"):
        big(np.zeros(65, np.float32))


# ---- autodiff ---------------------------------------------------------------------------------

def test_gradients_with_respect_to_fields_scaled_by_a_vector_parameter(arch, rng):
    n = 8
    x = qd.Vector.field(3, qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy(w: qd.math.vec3, m: qd.math.mat3, steps: qd.math.ivec2):
        for i in x:
            v = x[i]
            for _ in range(steps[1]):  # dynamic: its carried vector lives on adstacks
                v = qd.sin(m @ v) * 0.9
            loss[None] += w.dot(v)

    xv, w, m = rand(rng, n, 3), rand(rng, 3), rand(rng, 3, 3) * 0.5
    steps = int(rng.integers(2, 6))
    x.from_numpy(xv)

    def reference(xs):
        v = xs.astype(np.float64)
        for _ in range(steps):
            v = np.sin(v @ m.T.astype(np.float64)) * 0.9
        return (v @ w.astype(np.float64)).sum()

    with qd.ad.Tape(loss=loss):
        energy(w, m, [0, steps])
    assert float(loss[None]) == pytest.approx(float(reference(xv)), rel=1e-4, abs=1e-5)
    eps, want = 1e-6, np.zeros((n, 3))
    for i in range(n):
        for c in range(3):
            d = np.zeros((n, 3))
            d[i, c] = eps
            want[i, c] = (reference(xv + d) - reference(xv - d)) / (2 * eps)
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-3, atol=1e-4)

    x.grad.fill(0)  # k.grad(...) by hand: the same arguments, also as other forms
    loss.grad[None] = 1.0
    energy.grad(tuple(map(float, w)), m.tolist(), np.array([0, steps]))
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-3, atol=1e-4)


def test_forward_mode_with_a_vector_parameter_before_an_ndarray(rng):
    """FwdMode maps each argument to its records: the ndarray after a vector keeps its dual."""
    qd.init(arch=qd.cpu)
    n = 5
    a = qd.ndarray(qd.f32, shape=(n,), needs_dual=True)
    out = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def weigh(w: qd.math.vec2, arr: qd.types.ndarray(dtype=qd.f32, ndim=1),
              p: qd.types.ndarray(dtype=qd.math.vec3, ndim=1)):  # an ndarray of vectors keeps its element axes
        for i in range(arr.shape[0]):
            out[None] += w[0] * arr[i] * arr[i] * p[i].sum() + w[1] * arr[i]

    av, w, pv = rand(rng, n), rand(rng, 2), rand(rng, n, 3)
    a.from_numpy(av)
    seed = rand(rng, n)
    with qd.ad.FwdMode(loss=out, param=a, seed=list(map(float, seed))):
        weigh(w, a, pv)
    want = ((2 * w[0] * av.astype(np.float64) * pv.astype(np.float64).sum(1) + w[1]) * seed).sum()
    assert float(out.dual[None]) == pytest.approx(float(want), rel=1e-5, abs=1e-6)


# ---- templates, the cache key, the fast entry, dumps -----------------------------------------

def test_template_parameters_mixed_with_vector_parameters(arch, rng):
    a = qd.Vector.field(2, qd.f32, shape=4)
    b = qd.Vector.field(2, qd.f32, shape=7)

    @qd.kernel
    def shift(f: qd.template(), d: qd.math.vec2, scale: qd.template()):
        for i in f:
            f[i] = f[i] * scale + d

    av, bv, d1, d2 = rand(rng, 4, 2), rand(rng, 7, 2), rand(rng, 2), rand(rng, 2)
    a.from_numpy(av)
    b.from_numpy(bv)
    shift(a, d1, 2.0)
    shift(b, d2, 3.0)
    shift(a, list(map(float, d2)), 2.0)  # through the dispatch of an existing variant
    assert_close_f32(a.to_numpy(), (av * 2 + d1) * 2 + d2, rtol=1e-5)
    assert_close_f32(b.to_numpy(), bv * 3 + d2, rtol=1e-5)
    inst = qd.aot.instantiate(shift, f=b, scale=0.5)
    inst(d1)
    assert_close_f32(b.to_numpy(), (bv * 3 + d2) * 0.5 + d1, rtol=1e-5)


def _summing_kernel(annotation, out):
    @qd.kernel
    def total(v: annotation):
        out[None] = v.sum()
    return total


def test_a_vec3_and_a_vec4_parameter_are_different_kernels(rng):
    qd.init(arch=qd.cpu)
    out = qd.field(qd.f32, shape=())
    three, four = _summing_kernel(qd.math.vec3, out), _summing_kernel(qd.math.vec4, out)
    keys = [cache_key.kernel_key(k.fn, kernel_of(k).params, direct_options(), "cpu").key for k in (three, four)]
    assert keys[0] != keys[1]
    v3, v4 = rand(rng, 3), rand(rng, 4)
    three(v3)
    assert float(out[None]) == pytest.approx(float(v3.astype(np.float64).sum()), rel=1e-6, abs=1e-6)
    four(v4)
    assert float(out[None]) == pytest.approx(float(v4.astype(np.float64).sum()), rel=1e-6, abs=1e-6)
    f64 = _summing_kernel(qd.types.vector(3, qd.f64), out)
    assert cache_key.kernel_key(f64.fn, kernel_of(f64).params, direct_options(), "cpu").key != keys[0]


def test_metadata_has_one_record_per_element_and_no_python_entry():
    qd.init(arch=qd.cpu)
    out = qd.field(qd.f32, shape=())

    @qd.kernel
    def run(s: qd.f32, m: qd.math.mat2, a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        out[None] = s * m[1, 0] + a[0]

    compiled = kernel_of(run).compile((1.0, np.eye(2), np.zeros(3, np.float32)))
    meta = compiled.meta
    assert [(p.name, p.kind, p.element_shape) for p in meta.params] == \
        [("s", "scalar", ())] + [("m", "scalar", (2, 2))] * 4 + [("a", "ndarray", ())]
    assert [(x.name, x.first, x.count) for x in meta.arguments] == [("s", 0, 1), ("m", 1, 4), ("a", 5, 1)]
    assert meta.record_names() == ["s", "m[0, 0]", "m[0, 1]", "m[1, 0]", "m[1, 1]", "a"]
    assert not cpu_binding.python_entry_possible(meta)
    assert "arg_load m[1, 0] : f32" in compiled.artifacts["ir"].decode()
    d = meta.to_dict()
    assert A.KernelMeta.from_dict(d).record_names() == meta.record_names()
    d["params"] = d["params"][:3] + d["params"][4:]  # a matrix missing an element
    with pytest.raises(ValueError, match="element records of vector parameter 'm'"):
        check_kernel_meta(d)
    run(2.0, [[0.0, 0.0], [3.0, 0.0]], np.full(3, 0.5, np.float32))
    assert out[None] == pytest.approx(6.5)


# ---- ahead of time --------------------------------------------------------------------------

MODULE = '''
import qdc as qd

out = qd.Vector.field(3, qd.f32, shape=5, needs_grad=True)
x = qd.Vector.field(3, qd.f32, shape=5, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def affine(m: qd.math.mat3, t: qd.math.vec3, s: qd.f32):
    for i in x:
        out[i] = m @ x[i] * s + t


@qd.kernel
def score(w: qd.math.vec3):
    for i in x:
        loss[None] += w.dot(x[i] * x[i])


@qd.kernel
def offset(f: qd.template(), d: qd.math.vec3):
    for i in f:
        f[i] += d


offset_out = qd.aot.instantiate(offset, f=out)
'''

LOAD = r'''
import sys
import numpy as np
from qdc.runtime import load

mod = load(sys.argv[1], "vecmod", arch="cpu")
rng = np.random.default_rng(int(sys.argv[2]))
xv = rng.random((5, 3)).astype(np.float32)
m, t, w, d = (rng.random((3, 3)).astype(np.float32), rng.random(3).astype(np.float32),
              rng.random(3).astype(np.float32), rng.random(3).astype(np.float32))
mod.x.from_numpy(xv)
mod.affine(m, list(map(float, t)), 2.0)
want = (xv.astype(np.float64) @ m.T.astype(np.float64)) * 2 + t
assert np.allclose(mod.out.to_numpy(), want, rtol=1e-5), "affine"
mod.offset_out(tuple(map(float, d)))
assert np.allclose(mod.out.to_numpy(), want + d, rtol=1e-5), "instantiation"
mod.score(w)
assert np.isclose(mod.loss[None], (xv.astype(np.float64) ** 2 @ w).sum(), rtol=1e-5), "score"
mod.loss.grad[None] = 1.0
mod.score.grad(w)
assert np.allclose(mod.x.grad.to_numpy(), 2 * xv * w, rtol=1e-5), "gradient"
try:
    mod.affine(m, [1.0, 2.0], 2.0)
except ValueError as e:
    assert "kernel 'affine', argument 't'" in str(e), e
else:
    raise AssertionError("a wrong shape was accepted")
leaked = sorted(n for n in sys.modules if n.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
'''


def test_built_vector_kernels_load_and_run_without_the_compiler(tmp_path, rng):
    (tmp_path / "vecmod.py").write_text(MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "vecmod.py"), "--cache", cache],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (tmp_path / "load.py").write_text(LOAD, encoding="utf-8")
    r = subprocess.run([sys.executable, str(tmp_path / "load.py"), cache, str(int(rng.integers(1 << 30)))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "inspect", "vecmod.affine", "--cache", cache],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "param     m: matrix(3, 3, f32)" in r.stdout and "param     t: vector(3, f32)" in r.stdout
    assert r.stdout.count("param ") == 3
