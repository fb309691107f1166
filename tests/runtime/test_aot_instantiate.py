"""`name = qd.aot.instantiate(kernel, **template_args)` (docs/api.md): `qdc build` compiles each
declared instantiation (and its gradient), `load` exposes `mod.name` without the template
parameters; kernel return values work in loaded modules too. Built with the real `qdc build`
command, loaded in a fresh process that never imports the compiler."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from conftest import vulkan_unavailable_reason
from qdc.compiler.commands import build as build_mod
from qdc.runtime.bundle import open_store
from qdc.runtime.cache import read_module

MODULE = '''
import qdc as qd

a = qd.field(qd.f32, shape=8, needs_grad=True)
b = qd.field(qd.f32, shape=16, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def weighted(x: qd.template(), scale: qd.template(), w: qd.f32) -> qd.f32:
    s = 0.0
    for i in x:
        v = x[i] * x[i] * scale * w
        loss[None] += v
        s += v
    return s


@qd.kernel
def stats(v: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> tuple[qd.f32, qd.i32]:
    s = 0.0
    n = 0
    for i in range(v.shape[0]):
        s += v[i]
        if v[i] > 0.5:
            n += 1
    return s, n


weighted_a = qd.aot.instantiate(weighted, x=a, scale=2.0)
weighted_b = qd.aot.instantiate(weighted, x=b, scale=3)
'''

RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "tplmod", arch=arch)
assert not hasattr(m, "weighted"), "a template kernel is built only through its instantiations"
va, vb = rng.random(8).astype(np.float32), rng.random(16).astype(np.float32)
m.a.from_numpy(va); m.b.from_numpy(vb)
w = float(np.float32(rng.random()))
got = m.weighted_a(w)
assert np.isclose(got, (va.astype(np.float64) ** 2 * 2.0 * w).sum(), rtol=1e-5), ("a", got)
got = m.weighted_b(w)
assert np.isclose(got, (vb.astype(np.float64) ** 2 * 3 * w).sum(), rtol=1e-5), ("b", got)
m.loss.grad[None] = 1.0
m.weighted_b.grad(w)
assert np.allclose(m.b.grad.to_numpy(), 2 * vb * 3 * w, rtol=1e-5), "grad b"
assert np.allclose(m.a.grad.to_numpy(), 0), "grad a untouched"
v = rng.random(100).astype(np.float32)
s, n = m.stats(v)
assert isinstance(s, float) and isinstance(n, int)
assert np.isclose(s, v.astype(np.float64).sum(), rtol=1e-5) and n == int((v > 0.5).sum()), (s, n)
leaked = sorted(k for k in sys.modules if k.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK no compiler")
'''


@pytest.fixture
def module_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "tplmod.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    return src


def _archs() -> list[str]:
    return ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])


def test_instantiations_are_built_and_loaded_without_the_compiler(module_dir, tmp_path, rng):
    cache = str(tmp_path / "cache")
    archs = _archs()
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(module_dir), "--cache", cache,
                        "--arch", ",".join(archs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # per arch: stats, weighted_a (+ grad), weighted_b (+ grad)
    assert f"{3 * len(archs)} kernels + {2 * len(archs)} gradients in 1 module" in r.stdout, r.stdout
    record = read_module(open_store(cache), "tplmod", "cpu")
    assert sorted(record["kernels"]) == ["stats", "weighted_a", "weighted_a.grad", "weighted_b", "weighted_b.grad"]
    assert record["kernels"]["weighted_a"] != record["kernels"]["weighted_b"]
    script = tmp_path / "run.py"
    script.write_text(RUN, encoding="utf-8")
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK no compiler" in r.stdout, (arch, r.stdout + r.stderr)
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(module_dir), "--cache", cache,
                        "--arch", ",".join(archs)], capture_output=True, text=True)
    assert r.returncode == 0 and " 0 built, " in r.stdout, r.stdout + r.stderr  # all cache hits


def test_an_instantiation_runs_in_direct_mode(arch, rng):
    x = qd.field(qd.f32, shape=12, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def cube(f: qd.template(), c: qd.template(), w: qd.f32) -> qd.f32:
        for i in f:
            loss[None] += f[i] * f[i] * f[i] * c * w
        return loss[None]

    inst = qd.aot.instantiate(cube, f=x, c=0.5)
    v = rng.random(12).astype(np.float32)
    x.from_numpy(v)
    with qd.ad.Tape(loss=loss):
        got = inst(2.0)
    np.testing.assert_allclose(got, float((v.astype(np.float64) ** 3).sum()), rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), 3 * v * v, rtol=1e-5)
    x.grad.fill(0)
    loss.grad[None] = 1.0
    inst.grad(4.0)
    np.testing.assert_allclose(x.grad.to_numpy(), 6 * v * v, rtol=1e-5)
    assert "instantiation cube" in repr(inst)


def test_instantiate_needs_a_kernel_with_templates():
    @qd.kernel
    def plain(s: qd.f32):
        pass

    with pytest.raises(TypeError, match="has no qd.template\\(\\) parameters"):
        qd.aot.instantiate(plain)
    with pytest.raises(TypeError, match="needs a @qd.kernel"):
        qd.aot.instantiate(lambda: None)


def test_a_template_kernel_without_instantiations_is_not_built(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "lonely.py").write_text(textwrap.dedent('''
        import qdc as qd
        x = qd.field(qd.f32, shape=4)

        @qd.kernel
        def fill(f: qd.template(), v: qd.f32):
            for i in f:
                f[i] = v
    '''), encoding="utf-8")
    lines = []
    report = build_mod.build([str(src)], ["cpu"], qd.init(arch=qd.cpu), str(tmp_path / "cache"),
                             out=lines.append, log=lines.append)
    assert report.ok and report.built == 0 and report.kernels == 0, lines


def test_an_instantiation_runs_under_forward_mode(arch, rng):
    x = qd.field(qd.f32, shape=4, needs_dual=True)
    y = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def f(a: qd.template(), s: qd.f32):
        for i in a:
            y[None] += a[i] * a[i] * s

    v = rng.random(4).astype(np.float32)
    x.from_numpy(v)
    inst = qd.aot.instantiate(f, a=x)
    for k in range(4):
        seed = [0.0] * 4
        seed[k] = 1.0
        y[None] = 0
        with qd.ad.FwdMode(loss=y, param=x, seed=seed):
            inst(2.0)
        np.testing.assert_allclose(y.dual[None], 4 * v[k], rtol=1e-6)
        np.testing.assert_allclose(y[None], 2 * (v.astype(np.float64) ** 2).sum(), rtol=1e-5)
