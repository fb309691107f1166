"""Direct mode (docs/api.md): host access to fields and ndarrays, qd.init resets, launcher hooks."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.launcher import LaunchHooks, make_launcher


@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s


def test_field_host_indexing_follows_numpy(rng):
    x = qd.field(qd.f32, shape=(3, 5))
    ref = np.zeros((3, 5), np.float32)
    for _ in range(20):
        i, j = int(rng.integers(-3, 3)), int(rng.integers(-5, 5))
        v = float(rng.standard_normal())
        x[i, j] = v
        ref[i, j] = v
    np.testing.assert_array_equal(x.to_numpy(), ref)
    for i in range(-3, 3):
        for j in range(-5, 5):
            got = x[i, j]
            assert type(got) is float and got == float(ref[i, j])
    x[np.int64(1), np.int32(-1)] = 7
    assert x[1, 4] == 7.0


def test_scalar_field_and_integer_conversion(rng):
    n = qd.field(qd.i32, shape=())
    v = int(rng.integers(-1000, 1000))
    n[None] = v
    assert n[None] == v and n[()] == v and type(n[None]) is int
    n[None] = 2.9  # converted as numpy assignment does
    assert n[None] == 2
    small = qd.field(qd.i8, shape=3, name="small")
    small[1] = -128
    with pytest.raises(ValueError, match="'small'.*300 is out of range for i8"):
        small[1] = 300
    with pytest.raises(ValueError, match="out of range"):
        small.fill(-129)
    assert small.to_numpy().tolist() == [0, -128, 0]
    with pytest.raises(IndexError, match="x\\[None\\]"):
        n[0]


def test_index_errors_name_the_field():
    x = qd.field(qd.f32, shape=(4, 2), name="grid")
    with pytest.raises(IndexError, match="'grid'.*out of range"):
        x[4, 0]
    with pytest.raises(IndexError, match="'grid'.*out of range"):
        x[0, -3]
    with pytest.raises(IndexError, match="'grid' has 2 dimension"):
        x[1]
    with pytest.raises(TypeError, match="'grid'.*not an integer"):
        x[1.0, 0]
    with pytest.raises(TypeError, match="'grid'.*not an integer"):
        x[0:2, 0]
    with pytest.raises(TypeError, match="'grid'.*cannot store 'abc'"):
        x[0, 0] = "abc"


def test_from_numpy_checks_shape_and_converts_within_kind(rng):
    x = qd.field(qd.f32, shape=(2, 3), name="x")
    data = rng.standard_normal((2, 3))  # float64
    x.from_numpy(data)
    np.testing.assert_array_equal(x.to_numpy(), data.astype(np.float32))
    x.from_numpy([[1, 2, 3], [4, 5, 6]])  # ints into a float field, from a list
    np.testing.assert_array_equal(x.to_numpy(), np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="'x'.*shape \\(3, 2\\).*expected \\(2, 3\\)"):
        x.from_numpy(np.zeros((3, 2), np.float32))
    k = qd.field(qd.i32, shape=4, name="k")
    with pytest.raises(TypeError, match="'k'.*float64.*astype"):
        k.from_numpy(np.ones(4))
    ints = rng.integers(-100, 100, 4)
    k.from_numpy(ints)
    np.testing.assert_array_equal(k.to_numpy(), ints)
    assert k.to_numpy(dtype=np.float64).dtype == np.float64


def test_to_numpy_returns_a_copy(rng):
    x = qd.field(qd.f64, shape=8)
    data = rng.standard_normal(8)
    x.from_numpy(data)
    out = x.to_numpy()
    out[:] = 0
    np.testing.assert_array_equal(x.to_numpy(), data)


def test_fill_shape_dtype_and_grad(rng):
    x = qd.field(qd.f32, shape=(4, 3), needs_grad=True, name="x")
    assert x.shape == (4, 3) and x.dtype is qd.f32 and x.ndim == 2 and len(x) == 4
    assert x.grad.shape == (4, 3) and x.grad.dtype is qd.f32
    np.testing.assert_array_equal(x.grad.to_numpy(), np.zeros((4, 3), np.float32))
    v = float(rng.standard_normal())
    x.fill(v)
    np.testing.assert_array_equal(x.to_numpy(), np.full((4, 3), v, np.float32))
    x.grad.fill(2)
    assert x.grad[3, 2] == 2.0 and x[3, 2] == np.float32(v)
    assert qd.field(qd.i32, 3).grad is None
    with pytest.raises(TypeError, match="cannot store"):
        x.fill("zero")


def test_ndarray_host_api_and_grad(rng):
    b = qd.ndarray(qd.f32, shape=(8,), needs_grad=True)
    assert b.shape == (8,) and b.dtype is qd.f32 and b.grad.shape == (8,)
    data = rng.standard_normal(8).astype(np.float32)
    b.from_numpy(data)
    b[-1] = 5.0
    data[-1] = 5.0
    np.testing.assert_array_equal(b.to_numpy(), data)
    s = float(rng.uniform(0.5, 2.0))
    scale(b, s)
    qd.sync()
    np.testing.assert_allclose(b.to_numpy(), data * np.float32(s), rtol=1e-6)
    assert b[0] == pytest.approx(float(data[0] * np.float32(s)), rel=1e-6)
    b.grad.fill(1.5)
    np.testing.assert_array_equal(b.grad.to_numpy(), np.full(8, 1.5, np.float32))
    assert qd.ndarray(qd.i32, (2, 2)).grad is None
    with pytest.raises(TypeError, match="unsupported dtype"):
        qd.ndarray(np.complex64, 3)


@qd.kernel
def accumulate(v: qd.f32):
    for i in total:
        total[i] += v + i


total = qd.field(qd.f32, shape=16)


def test_reinit_rezeroes_and_relaunches(rng, session_cache_dir):
    v = float(rng.uniform(1, 2))
    accumulate(v)
    accumulate(v)
    np.testing.assert_allclose(total.to_numpy(), 2 * (v + np.arange(16)), rtol=1e-6)
    nd = qd.ndarray(qd.f32, 4)
    nd.fill(3.0)
    qd.init(arch=qd.cpu, cpu_max_num_threads=1, cache_dir=session_cache_dir)
    np.testing.assert_array_equal(total.to_numpy(), np.zeros(16, np.float32))
    np.testing.assert_array_equal(nd.to_numpy(), np.zeros(4, np.float32))
    accumulate(v)  # recompiled for the new runtime, bound to the new field memory
    np.testing.assert_allclose(total.to_numpy(), v + np.arange(16), rtol=1e-6)
    a = rng.random(5, dtype=np.float32)
    expected = a * np.float32(v)
    scale(a, v)
    np.testing.assert_allclose(a, expected, rtol=1e-6)


def test_failed_init_keeps_the_runtime():
    before = context.current()
    with pytest.raises((ValueError, TypeError)):
        qd.init(arch="no-such-arch")
    with pytest.raises(TypeError, match="no_such_option"):
        qd.init(arch=qd.cpu, no_such_option=1)
    assert context.current() is before


def test_fields_declared_before_any_init_work(tmp_path, session_cache_dir):
    script = tmp_path / "before_init.py"  # a file: kernels need their source
    script.write_text(textwrap.dedent("""
        import numpy as np
        import qdc as qd
        x = qd.field(qd.i32, shape=5)
        x[2] = 9                    # before qd.init: a default CPU runtime is created
        qd.init(arch=qd.cpu, cache_dir=CACHE)  # resets it: x comes back zeroed
        assert x.to_numpy().tolist() == [0, 0, 0, 0, 0]

        @qd.kernel
        def ramp():
            for i in x:
                x[i] = i * i

        ramp()
        qd.sync()
        print(x.to_numpy().tolist())
    """).replace("CACHE", repr(session_cache_dir)), encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 4, 9, 16]"


def _compiled_scale(a):
    """A second launcher for `scale`, built by hand so that it can carry hooks."""
    compiled = scale.compile((a, 1.0))
    device = context.current().device
    loaded = device.load_kernel(compiled.artifacts, compiled.meta)
    return compiled.meta, device, loaded, compiled.field_objects


def test_hooks_run_around_the_native_call(rng):
    a = rng.random(32, dtype=np.float32)
    meta, device, loaded, fields = _compiled_scale(a)
    seen = []

    def prepare(ctx):
        p = ctx.meta.params[0]
        seen.append(("prepare", ctx.args, int(ctx.words[p.slot]), int(ctx.words[p.slot + 1]), a.copy()))

    def finish():
        seen.append(("finish", a.copy()))

    launch = make_launcher(meta, device, loaded, fields, hooks=LaunchHooks(prepare, finish))
    original = a.copy()
    launch(a, 3.0)
    (_, args, ptr, n, before), (_, after) = seen
    assert args[0] is a and args[1] == 3.0
    assert ptr == a.ctypes.data and n == 32
    np.testing.assert_array_equal(before, original)               # prepare ran before the kernel
    np.testing.assert_allclose(after, original * 3, rtol=1e-6)    # finish ran after it


def test_hook_errors_propagate_and_absent_hooks_leave_no_trace(rng):
    a = rng.random(4, dtype=np.float32)
    meta, device, loaded, fields = _compiled_scale(a)

    def finish():
        raise qd.AdStackOverflowError("overflow seen by finish")

    launch = make_launcher(meta, device, loaded, fields, hooks=LaunchHooks(finish=finish))
    assert "_q_prepare" not in launch.__qdc_source__
    with pytest.raises(qd.AdStackOverflowError, match="seen by finish"):
        launch(a, 2.0)
    plain = make_launcher(meta, device, loaded, fields, hooks=LaunchHooks())
    for name in ("prepare", "finish", "lctx"):
        assert name not in plain.__qdc_source__
    before = a.copy()
    plain(a, 2.0)
    np.testing.assert_allclose(a, before * 2, rtol=1e-6)
