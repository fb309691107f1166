"""Acceptance tests of docs/api.md's Running kernels and Configuration, written from the
page alone: `qd.init(arch=...)` strings and constants, `qd.gpu`, GPU launch semantics on Vulkan,
argument errors naming kernel and parameter, read-only arrays and memmaps, fields and ndarrays
from Python, options through `qd.init`, `qdc.yaml` and `[tool.qdc]`, and ahead of time:
`qd.aot.instantiate` + `qdc build` + `load` in a subprocess that never imports the compiler
(forward mode, overflow and argument errors there too)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from conftest import vulkan_unavailable_reason


def _f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("spelling", ["cpu", qd.cpu])
def test_init_arch_string_and_constant(spelling, session_cache_dir, rng):
    qd.init(arch=spelling, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=5)
    v = _f32(rng, 5)
    x.from_numpy(v)

    @qd.kernel
    def inc():
        for i in x:
            x[i] += 1

    inc()
    np.testing.assert_allclose(x.to_numpy(), v + 1, rtol=1e-6)


def test_gpu_takes_a_working_gpu(session_cache_dir, rng):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch=qd.gpu, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=64)
    v = _f32(rng, 64)
    x.from_numpy(v)

    @qd.kernel
    def sq():
        for i in x:
            x[i] = x[i] * x[i]

    sq()
    np.testing.assert_allclose(x.to_numpy(), v * v, rtol=1e-6)
    qd.init(arch="vulkan", cache_dir=session_cache_dir)


def test_vulkan_debug_bounds_error_raised_by_host_read(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", debug=True, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=8)
    off = qd.field(qd.i32, shape=())

    @qd.kernel
    def shifted():
        for i in range(8):
            x[i + off[None]] = 1.0

    off[None] = 3
    with pytest.raises(IndexError) as info:
        shifted()
        x.to_numpy()
    assert "shifted" in str(info.value)


@qd.kernel
def _axpy(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        b[i] = b[i] + a[i] * s


@pytest.mark.parametrize("bad,kind", [
    (lambda: _axpy(np.zeros(4, np.float64), np.zeros(4, np.float32), 1.0), "dtype"),
    (lambda: _axpy(np.zeros((4, 2), np.float32), np.zeros(4, np.float32), 1.0), "rank"),
    # non-contiguous arrays are copied in and written back; one that no copy can be written back to is refused
    (lambda: _axpy(np.zeros(4, np.float32), np.broadcast_to(np.zeros(1, np.float32), (4,)), 1.0), "read-only"),
    (lambda: _axpy(np.zeros(4, np.float32), np.zeros(4, np.float32)), "missing"),
])
def test_argument_mistakes_name_kernel_and_parameter(bad, kind):
    with pytest.raises((TypeError, ValueError)) as info:
        bad()
    msg = str(info.value)
    assert "_axpy" in msg, msg
    assert {"dtype": "'a'", "rank": "'a'", "read-only": "'b'", "missing": "'s'"}[kind] in msg or \
        {"dtype": " a", "rank": " a", "read-only": " b", "missing": " s"}[kind] in msg, msg


def test_read_only_array_for_read_parameter_accepted_written_refused(rng):
    a = _f32(rng, 6)
    a.flags.writeable = False
    b = np.zeros(6, np.float32)
    _axpy(a, b, 2.0)
    np.testing.assert_allclose(b, 2 * a)
    before = b.copy()
    b.flags.writeable = False
    with pytest.raises(ValueError) as info:
        _axpy(_f32(rng, 6), b, 1.0)
    assert "_axpy" in str(info.value) and "b" in str(info.value)
    np.testing.assert_array_equal(b, before)


def test_field_python_access(arch, rng):
    x = qd.field(qd.f64, shape=(3, 4), needs_grad=True)
    assert x.shape == (3, 4)
    assert x.dtype == qd.f64
    v = rng.standard_normal((3, 4))
    x.from_numpy(v)
    assert x[1, 2] == v[1, 2]
    x[2, 3] = 7.25
    v[2, 3] = 7.25
    got = x.to_numpy()
    assert got.dtype == np.float64 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, v)
    x.fill(-1.5)
    np.testing.assert_array_equal(x.to_numpy(), -1.5)
    assert x.grad.shape == (3, 4)
    np.testing.assert_array_equal(x.grad.to_numpy(), 0)
    s = qd.field(qd.i32, shape=())
    s[None] = 41
    assert s[None] == 41 and isinstance(s[None], int)


def test_qd_ndarray_with_grad(arch, rng):
    @qd.kernel
    def sumsq(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            out[0] += a[i] * a[i]

    a = qd.ndarray(qd.f32, shape=(10,), needs_grad=True)
    out = qd.ndarray(qd.f32, shape=(1,), needs_grad=True)
    v = _f32(rng, 10)
    a.from_numpy(v)
    sumsq(a, out)
    np.testing.assert_allclose(out.to_numpy()[0], float((v.astype(np.float64) ** 2).sum()), rtol=1e-5)
    out.grad.from_numpy(np.ones(1, np.float32))
    sumsq.grad(a, out)
    np.testing.assert_allclose(a.grad.to_numpy(), 2 * v, rtol=1e-6)


def test_default_fp_option_makes_literals_f64(session_cache_dir):
    qd.init(arch=qd.cpu, default_fp=qd.f64, cache_dir=session_cache_dir)

    @qd.kernel
    def third() -> qd.f64:
        v = 1.0
        return v / 3.0

    assert third() == 1.0 / 3.0


def test_unknown_init_option_is_refused(session_cache_dir):
    with pytest.raises((TypeError, ValueError)):
        qd.init(arch=qd.cpu, ad_stack_sise=4, cache_dir=session_cache_dir)


AOT_MODULE = '''
import qdc as qd

u = qd.field(qd.f32, shape=10, needs_grad=True)
v = qd.field(qd.f32, shape=6, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def power_sum(f: qd.template(), p: qd.template(), w: qd.f32) -> qd.f32:
    for i in f:
        loss[None] += f[i] ** p * w
    return loss[None]


@qd.kernel
def bounds(a: qd.types.NDArray[qd.f32, 1]) -> tuple[qd.f32, qd.f32]:
    lo = a[0]
    hi = a[0]
    for i in range(a.shape[0]):
        qd.atomic_min(lo, a[i])
        qd.atomic_max(hi, a[i])
    return lo, hi


pos = qd.Vector.field(3, qd.f32, shape=16)
rot = qd.Matrix.field(3, 3, qd.f32, shape=())


@qd.kernel
def spin(field: qd.template(), dt: qd.f32) -> qd.f32:
    for i in field:
        field[i] = rot[None] @ field[i] * dt + qd.math.vec3(0, 0, 1)
    return rot[None].determinant()


spin_pos = qd.aot.instantiate(spin, field=pos)
cube_u = qd.aot.instantiate(power_sum, f=u, p=3)
square_v = qd.aot.instantiate(power_sum, p=2, f=v)
'''


AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "breadth_aot", arch=arch)
uu = rng.uniform(-1, 1, 10).astype(np.float32)
vv = rng.uniform(-1, 1, 6).astype(np.float32)
m.u.from_numpy(uu); m.v.from_numpy(vv)
w = 0.75
got = m.cube_u(w)
assert np.isclose(got, (uu.astype(np.float64) ** 3 * w).sum(), rtol=1e-5, atol=1e-6), got
m.loss[None] = 0.0
got = m.square_v(w)
assert np.isclose(got, (vv.astype(np.float64) ** 2 * w).sum(), rtol=1e-5), got
m.loss.grad[None] = 1.0
m.square_v.grad(w)
assert np.allclose(m.v.grad.to_numpy(), 2 * vv * w, rtol=1e-5), m.v.grad.to_numpy()
a = rng.standard_normal(50).astype(np.float32)
lo, hi = m.bounds(a)
assert (lo, hi) == (float(a.min()), float(a.max())), (lo, hi)
assert not hasattr(m, "spin") and not hasattr(m, "power_sum")
R = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
P = rng.uniform(-1, 1, (16, 3)).astype(np.float32)
m.rot.from_numpy(R); m.pos.from_numpy(P)
det = m.spin_pos(0.5)
assert np.isclose(det, np.linalg.det(R.astype(np.float64)), rtol=1e-4, atol=1e-6), det
assert np.allclose(m.pos.to_numpy(), P @ R.T * 0.5 + [0, 0, 1], rtol=1e-5, atol=1e-6)
assert isinstance(m.adstack_heap_bytes(), int)
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
'''


def test_aot_instantiate_build_and_load_without_compiler(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    (src / "breadth_aot.py").write_text(textwrap.dedent(AOT_MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    r = subprocess.run(["qdc", "build", str(src), "--cache", cache, "--arch", ",".join(archs)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN, encoding="utf-8")
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, (arch, r.stdout + r.stderr)


def test_options_from_qdc_yaml_and_pyproject(tmp_path):
    mod = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def k():
    for i in x:
        y[None] += x[i] * 2
'''
    for kind in ("yaml", "pyproject"):
        proj = tmp_path / kind
        (proj / "kernels").mkdir(parents=True)
        (proj / "kernels" / "optmod.py").write_text(mod, encoding="utf-8")
        if kind == "yaml":
            (proj / "qdc.yaml").write_text("cache_dir: from_file_cache\nopt_level: 1\n", encoding="utf-8")
        else:
            (proj / "pyproject.toml").write_text('[tool.qdc]\ncache_dir = "from_file_cache"\nopt_level = 1\n', encoding="utf-8")
        r = subprocess.run(["qdc", "build", "kernels", "--arch", "cpu"], cwd=proj, capture_output=True, text=True)
        assert r.returncode == 0, (kind, r.stdout + r.stderr)
        assert (proj / "from_file_cache").is_dir(), (kind, os.listdir(proj), r.stdout)
        # a flag wins over the file
        r = subprocess.run(["qdc", "build", "kernels", "--arch", "cpu", "--cache", "flag_cache"], cwd=proj,
                           capture_output=True, text=True)
        assert r.returncode == 0 and (proj / "flag_cache").is_dir(), (kind, r.stdout + r.stderr)


def test_vector_field_python_access(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=(4,))
    assert v.shape == (4,)
    data = _f32(rng, 4, 3)
    v.from_numpy(data)
    assert v.to_numpy().shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(v[2]), data[2])

    @qd.kernel
    def cross_z():
        for i in v:
            v[i] = v[i].cross(qd.Vector([0.0, 0.0, 1.0]))

    cross_z()
    np.testing.assert_allclose(v.to_numpy(), np.cross(data, [0, 0, 1]), rtol=1e-6, atol=1e-7)


def test_cpu_debug_bounds_error_names_kernel(rng, session_cache_dir):
    qd.init(arch=qd.cpu, debug=True, cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def past_end(off: qd.i32):
        for i in range(8):
            x[i + off] = 1.0

    with pytest.raises(IndexError) as info:
        past_end(2)
    assert "past_end" in str(info.value)
    past_end(0)
    np.testing.assert_array_equal(x.to_numpy(), 1.0)


@pytest.mark.parametrize("options", [dict(opt_level=0), dict(cpu_max_num_threads=1), dict(fast_math=True)])
def test_code_options_give_the_same_results(options, rng, session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, **options)
    x = qd.field(qd.f32, shape=1000, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def f():
        for i in x:
            y[None] += qd.exp(x[i]) * 0.5

    v = _f32(rng, 1000)
    x.from_numpy(v)
    with qd.ad.Tape(loss=y):
        f()
    np.testing.assert_allclose(y[None], float(np.exp(v.astype(np.float64)).sum() * 0.5), rtol=1e-4)
    np.testing.assert_allclose(x.grad.to_numpy(), np.exp(v) * 0.5, rtol=1e-5)


def test_default_ip_i64(session_cache_dir):
    qd.init(arch=qd.cpu, default_ip=qd.i64, cache_dir=session_cache_dir)

    @qd.kernel
    def big() -> qd.i64:
        v = 1
        qd.loop_config(serialize=True)
        for _ in range(40):
            v = v * 2
        return v

    assert big() == 2 ** 40


def test_read_only_memmap_argument(tmp_path, rng):
    path = tmp_path / "a.bin"
    data = _f32(rng, 16)
    data.tofile(path)
    ro = np.memmap(path, dtype=np.float32, mode="r", shape=(16,))
    b = np.zeros(16, np.float32)
    _axpy(ro, b, 3.0)
    np.testing.assert_allclose(b, 3 * data, rtol=1e-6)
    with pytest.raises(ValueError) as info:
        _axpy(b, ro, 1.0)
    assert "_axpy" in str(info.value) and "b" in str(info.value)


def test_ndarray_python_access(arch, rng):
    b = qd.ndarray(qd.f32, shape=(4, 3), needs_grad=True)
    assert tuple(b.shape) == (4, 3) and b.dtype == qd.f32
    v = _f32(rng, 4, 3)
    b.from_numpy(v)
    np.testing.assert_array_equal(b.to_numpy(), v)
    b[1, 2] = 5.0
    assert b[1, 2] == 5.0
    assert b.grad is not None and tuple(b.grad.shape) == (4, 3)
    np.testing.assert_array_equal(b.grad.to_numpy(), 0)


def test_from_numpy_wrong_shape_is_refused():
    x = qd.field(qd.f32, shape=(3, 4))
    with pytest.raises((ValueError, TypeError)):
        x.from_numpy(np.zeros((4, 3), np.float32))


def test_keyword_arguments_to_a_kernel(arch, rng):
    a, b = _f32(rng, 8), _f32(rng, 8)
    want = b + a * np.float32(0.5)
    _axpy(b=b, a=a, s=0.5)
    np.testing.assert_allclose(b, want, rtol=1e-6)


def test_init_arch_vulkan_string(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    for spelling in ("vulkan", qd.vulkan):
        qd.init(arch=spelling, cache_dir=session_cache_dir)
        x = qd.field(qd.i32, shape=33)

        @qd.kernel
        def ids():
            for i in x:
                x[i] = i * i

        ids()
        np.testing.assert_array_equal(x.to_numpy(), np.arange(33) ** 2)


AOT_AD_MODULE = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
n = qd.field(qd.i32, shape=4)
y = qd.field(qd.f32, shape=(), needs_grad=True)
p = qd.field(qd.f32, shape=3, needs_dual=True)
r = qd.field(qd.f32, shape=(), needs_dual=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[i]):
            v = qd.sin(v) + 0.1
        y[None] += v


@qd.kernel
def cubes():
    for i in p:
        r[None] += p[i] * p[i] * p[i]


@qd.kernel
def scaled(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s
'''


AOT_AD_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load, FwdMode
import qdc.runtime as rt

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "breadth_ad", arch=arch)

# forward mode without the compiler
pv = rng.uniform(-1, 1, 3).astype(np.float32)
sd = rng.uniform(-1, 1, 3).astype(np.float32)
m.p.from_numpy(pv)
with FwdMode(loss=m.r, param=m.p, seed=[float(s) for s in sd]):
    m.cubes()
assert np.isclose(m.r.dual[None], float((3 * pv.astype(np.float64) ** 2 * sd).sum()), rtol=1e-5, atol=1e-6)

# built with --ad-stack-size 8: an overflow names kernel and capacities, then a launch works
x0 = rng.uniform(-1, 1, 4).astype(np.float32)
m.x.from_numpy(x0)
m.n.from_numpy(np.array([2, 20, 3, 1], np.int32))
m.y.grad[None] = 1.0
err = None
try:
    m.chain.grad()
    m.x.grad.to_numpy()
except Exception as e:
    err = e
assert err is not None and type(err).__name__ == "AdStackOverflowError", repr(err)
assert "chain" in str(err) and "8" in str(err), str(err)
trips = [2, 5, 3, 1]
m.n.from_numpy(np.array(trips, np.int32))
m.x.grad.fill(0); m.y.grad[None] = 1.0
m.chain.grad()
want = []
for v, t in zip(x0.astype(np.float64), trips):
    g = 1.0
    for _ in range(t):
        g *= np.cos(v); v = np.sin(v) + 0.1
    want.append(g)
assert np.allclose(m.x.grad.to_numpy(), want, rtol=1e-4, atol=1e-6), (m.x.grad.to_numpy(), want)
assert m.adstack_heap_bytes() > 0

# argument errors name kernel and parameter
for bad in (lambda: m.scaled(np.zeros(3, np.float64), 1.0), lambda: m.scaled(np.zeros(3, np.float32))):
    try:
        bad()
    except (TypeError, ValueError) as e:
        assert "scaled" in str(e), str(e)
    else:
        raise AssertionError("no error")
ro = np.ones(3, np.float32); ro.flags.writeable = False
try:
    m.scaled(ro, 2.0)
except ValueError as e:
    assert "scaled" in str(e) and "a" in str(e)
else:
    raise AssertionError("read-only array written")
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
'''


def test_vector_and_matrix_fields_from_python(arch, rng):
    v = qd.Vector.field(3, qd.f32, shape=4, needs_grad=True)
    w = qd.field(qd.math.vec3, shape=(2, 2))
    m = qd.Matrix.field(2, 3, qd.f32, shape=2)
    v[1] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(np.asarray(v[1]), [1, 2, 3])
    assert v.grad.to_numpy().shape == (4, 3)
    assert w.shape == (2, 2) and w.to_numpy().shape == (2, 2, 3)
    w.fill(1.5)
    np.testing.assert_array_equal(w.to_numpy(), 1.5)
    data = _f32(rng, 2, 2, 3)
    m.from_numpy(data)
    np.testing.assert_array_equal(np.asarray(m[1]), data[1])
    assert m.dtype == qd.f32


def test_field_index_errors_from_python():
    x = qd.field(qd.f32, shape=3, name="temperature")
    with pytest.raises(IndexError) as info:
        x[5] = 1.0
    assert "temperature" in str(info.value)
    with pytest.raises(IndexError):
        x[0, 1]


CHAIN_MODULE = '''
import qdc as qd

x = qd.field(qd.f32, shape=4, needs_grad=True)
n = qd.field(qd.i32, shape=4)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[i]):
            v = qd.sin(v) + 0.1
        y[None] += v
'''


CHAIN_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

m = load(sys.argv[1], "chainmod", arch="cpu")
m.x.from_numpy(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
m.n.from_numpy(np.array([1, 30, 1, 1], np.int32))
m.y.grad[None] = 1.0
try:
    m.chain.grad()
    print("no overflow")
except Exception as e:
    print(type(e).__name__, str(e))
'''


def test_code_option_from_pyproject_reaches_the_build_and_a_flag_wins(tmp_path):
    proj = tmp_path / "proj"
    (proj / "kernels").mkdir(parents=True)
    (proj / "kernels" / "chainmod.py").write_text(CHAIN_MODULE, encoding="utf-8")
    (proj / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.qdc]\nad_stack_size = 8\n', encoding="utf-8")
    (tmp_path / "run.py").write_text(CHAIN_RUN, encoding="utf-8")

    def build_and_run(*flags):
        cache = str(tmp_path / ("cache" + "".join(flags).replace("-", "_")))
        r = subprocess.run(["qdc", "build", "kernels", "--cache", cache, *flags], cwd=proj,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run([sys.executable, str(tmp_path / "run.py"), cache], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    out = build_and_run()
    assert "AdStackOverflowError" in out and "chain" in out and "8 entries" in out, out
    assert build_and_run("--ad-stack-size", "64").strip() == "no overflow"


def test_vulkan_launches_async_and_sync_and_return_wait(rng, session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip("no Vulkan device")
    qd.init(arch="vulkan", cache_dir=session_cache_dir)
    x = qd.field(qd.f32, shape=4096)

    @qd.kernel
    def step():
        for i in x:
            x[i] = x[i] * 0.5 + 1.0

    @qd.kernel
    def total() -> qd.f32:
        s = 0.0
        for i in x:
            s += x[i]
        return s

    v = _f32(rng, 4096)
    x.from_numpy(v)
    want = v.astype(np.float64)
    for _ in range(10):
        step()
        want = want * 0.5 + 1.0
    qd.sync()
    np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-5)
    step()
    want = want * 0.5 + 1.0
    np.testing.assert_allclose(total(), want.sum(), rtol=1e-4)  # the return waits for the launch


def test_aot_forward_mode_overflow_and_argument_errors_without_compiler(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    (src / "breadth_ad.py").write_text(textwrap.dedent(AOT_AD_MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    r = subprocess.run(["qdc", "build", str(src), "--cache", cache, "--arch", ",".join(archs), "--ad-stack-size", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_AD_RUN, encoding="utf-8")
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, (arch, r.stdout + r.stderr)


def test_every_documented_option_is_accepted_by_init_and_bad_values_refused(session_cache_dir, rng):
    qd.init(arch=qd.cpu, opt_level=2, fast_math=False, default_fp=qd.f32, default_ip=qd.i32, debug=False,
            ad_stack_size=0, default_ad_stack_size=256, ad_stack_strict=False, cache_dir=session_cache_dir,
            cpu_max_num_threads=2, cpu_target="native", cuda_arch="sm_80", amdgpu_targets="gfx90a")
    x = qd.field(qd.f32, shape=64)
    v = _f32(rng, 64)
    x.from_numpy(v)

    @qd.kernel
    def halve():
        for i in x:
            x[i] = x[i] * 0.5

    halve()
    np.testing.assert_array_equal(x.to_numpy(), v * np.float32(0.5))
    for bad in (dict(opt_level=5), dict(default_fp=qd.i32), dict(default_ip=qd.f32), dict(ad_stack_size=-1),
                dict(cpu_target="pentium9000"), dict(cuda_arch="sm_5"), dict(arch="nonsense")):
        with pytest.raises(ValueError):
            qd.init(**{"arch": qd.cpu, "cache_dir": session_cache_dir, **bad})


def test_init_without_arch_runs_on_the_cpu(session_cache_dir):
    qd.init(cache_dir=session_cache_dir)
    x = qd.field(qd.i32, shape=5)

    @qd.kernel
    def ids():
        for i in x:
            x[i] = i * 3

    ids()
    np.testing.assert_array_equal(x.to_numpy(), np.arange(5) * 3)
