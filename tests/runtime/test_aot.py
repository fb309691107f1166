"""Ahead of time: `qdc build kernels/`, then `qdc.runtime.load` with no compiler, bundles,
and integrity checks that stop anything from being loaded."""
import io
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.runtime.contract import artifact as A
from qdc.runtime.cache import Cache, entry_path, read_module
from qdc.runtime.devices.cpu.device import CpuDevice
from qdc.runtime.loader import load

from conftest import REPO_ROOT as ROOT
KERNELS = os.path.join(ROOT, "kernels")


def qdc_cli(*args):
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The example kernels built once into a cache for this file's tests (never modified)."""
    cache = str(tmp_path_factory.mktemp("aot") / "cache")
    r = qdc_cli("build", KERNELS, "--cache", cache, "-j", "2")
    assert r.returncode == 0, r.stderr
    assert " 0 cached, 0 failed" in r.stdout  # the summary is on stdout, errors on stderr
    return cache


@pytest.fixture
def cache_copy(built, tmp_path):
    dest = str(tmp_path / "cache")
    shutil.copytree(built, dest)
    return dest


LOAD_AND_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)

saxpy = load(cache, "saxpy")
x, y = rng.random(1000).astype(np.float32), rng.random(1000).astype(np.float32)
a = np.float32(rng.random())
want = a * x + y
saxpy.saxpy(float(a), x, y)
assert np.allclose(y, want, rtol=1e-6), "saxpy"

red = load(cache, "reduction", arch="cpu")
v = (rng.random(5000) - 0.5).astype(np.float32)
w = rng.random(5000).astype(np.float32)
red.sum_of(v)
assert np.isclose(red.total[None], v.astype(np.float64).sum(), rtol=1e-9), "sum"
red.dot(v, w)
assert np.isclose(red.total[None], (v.astype(np.float64) * w).sum(), rtol=1e-6), "dot"
red.max_abs(v)
assert red.largest[None] == np.abs(v).max(), "max"

nb = load(cache, "nbody")
n = nb.pos.shape[0]
pos = rng.random((n, 3)).astype(np.float32)
vel = (rng.random((n, 3)) - 0.5).astype(np.float32)
mass = rng.random(n).astype(np.float32)
nb.pos.from_numpy(pos); nb.vel.from_numpy(vel); nb.mass.from_numpy(mass)
dt = 1e-3
nb.kick(dt); nb.drift(dt)
p, m = pos.astype(np.float64), mass.astype(np.float64)
d = p[None, :, :] - p[:, None, :]
r2 = (d ** 2).sum(-1) + 1e-2 ** 2
s = m[None, :] / (r2 * np.sqrt(r2))
np.fill_diagonal(s, 0.0)
acc = (d * s[:, :, None]).sum(1)
v_ref = vel + dt * acc
assert np.allclose(nb.vel.to_numpy(), v_ref, rtol=1e-3, atol=1e-3), "nbody kick"
assert np.allclose(nb.pos.to_numpy(), pos + dt * v_ref, rtol=1e-4, atol=1e-5), "nbody drift"

leaked = sorted(m for m in sys.modules if m.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK no compiler")
'''


def test_built_modules_load_and_run_without_the_compiler(built, tmp_path, rng):
    script = tmp_path / "run.py"
    script.write_text(LOAD_AND_RUN, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), built, str(int(rng.integers(1 << 30)))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "OK no compiler" in r.stdout, r.stderr


def test_run_example_checks_against_numpy(built):
    r = subprocess.run([sys.executable, os.path.join(KERNELS, "run_example.py"), built], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    assert "compiler imported: False" in r.stdout


def test_second_build_is_all_cache_hits(cache_copy):
    entries = len(Cache(cache_copy).entries())
    assert entries >= 12  # 12 forward kernels, plus reverse-mode variants where available
    r = qdc_cli("build", KERNELS, "--cache", cache_copy)
    assert r.returncode == 0, r.stderr
    assert f": 0 built, {entries} cached, 0 failed" in r.stdout
    assert len(r.stdout.splitlines()) == 1  # no kernel compiled: nothing but the summary (-v names the hits)
    assert len(Cache(cache_copy).entries()) == entries


def test_loaded_module_exposes_fields_and_kernels(built, rng):
    heat = load(built, "heat")
    assert heat.T.shape == (128, 128) and heat.T.dtype is qd.f32 and heat.T.name == "T"
    demo = load(built, "demo")
    assert demo.x.grad is not None and demo.n.grad is None
    demo.n[None] = 7
    xs = rng.random(16).astype(np.float32)
    demo.x.from_numpy(xs)
    demo.compute()
    ref = xs.astype(np.float64)
    for _ in range(7):
        ref = ref * 0.95 + 0.01
    np.testing.assert_allclose(demo.y[None], ref.sum(), rtol=1e-5)
    demo.y.grad[None] = 1.0
    demo.compute.grad()
    np.testing.assert_allclose(demo.x.grad.to_numpy(), np.full(16, 0.95 ** 7), rtol=1e-5)
    assert demo.adstack_heap_bytes() == qd.adstack_heap_bytes() >= 0


def _artifact_files(cache, module):
    """Every file the module's loading depends on: its record and each entry's files."""
    record = read_module(Cache(cache), module, "cpu")
    files = [os.path.join(cache, "modules", "cpu", f"{module}.msgpack")]
    for key in record["kernels"].values():
        base = os.path.join(cache, *entry_path(key).split("/"))
        files += sorted(os.path.join(base, f) for f in os.listdir(base) if f != "last_use")
    return files


def _flip(path, where=0.5):
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * where)] ^= 0x01
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("which", ["module record", "meta.msgpack", "kernel.so", "kernel.bc", "kernel.ir"])
def test_a_flipped_byte_is_caught_by_verify_and_load(cache_copy, which, monkeypatch):
    files = _artifact_files(cache_copy, "reduction")
    target = files[0] if which == "module record" else [f for f in files if f.endswith(which)][-1]
    _flip(target)
    r = CliRunner().invoke(cli, ["verify", "--cache", cache_copy])
    assert r.exit_code == 1
    assert target in r.output and "1 bad" in r.output

    loaded = []
    monkeypatch.setattr(CpuDevice, "load_library", lambda self, *a: loaded.append(a) or pytest.fail("loaded"))
    with pytest.raises(qd.CacheError) as e:
        load(cache_copy, "reduction")
    assert target in str(e.value)
    assert loaded == []  # the other, intact kernels of the module were not loaded either


def test_format_version_mismatch_is_a_cache_error(cache_copy):
    path = os.path.join(cache_copy, "modules", "cpu", "saxpy.msgpack")
    import msgpack
    head = msgpack.unpackb(open(path, "rb").read())
    head[2] = A.FORMAT_VERSION + 1
    open(path, "wb").write(msgpack.packb(head))
    with pytest.raises(qd.CacheError, match=f"format version {A.FORMAT_VERSION + 1}") as e:
        load(cache_copy, "saxpy")
    assert path in str(e.value)
    assert CliRunner().invoke(cli, ["verify", "--cache", cache_copy]).exit_code == 1


def test_load_argument_errors_are_clear(built, tmp_path):
    with pytest.raises(TypeError, match="module must be"):
        load(built, 3)
    with pytest.raises(TypeError, match="cache folder, bundle path or remote URL"):
        load(None, "saxpy")
    with pytest.raises(ValueError, match="unknown arch 'tpu'"):
        load(built, "saxpy", arch="tpu")
    with pytest.raises(FileNotFoundError, match="not found .*available: demo, diffmpm, heat, nbody"):
        load(built, "nosuch")
    with pytest.raises(FileNotFoundError, match="not built for arch 'cuda'.*built for: cpu"):
        load(built, "saxpy", arch="cuda")
    with pytest.raises(FileNotFoundError, match="no qdc cache or bundle"):
        load(str(tmp_path / "missing"), "saxpy")
    with pytest.raises(ValueError, match="invalid module name"):
        load(built, "../saxpy")


def test_pack_is_reproducible_and_loads(built, tmp_path, rng):
    runner = CliRunner()
    out1, out2 = str(tmp_path / "a.tar.gz"), str(tmp_path / "b.tar.gz")
    assert runner.invoke(cli, ["pack", "--cache", built, "-o", out1]).exit_code == 0
    assert runner.invoke(cli, ["pack", "--cache", built, "-o", out2]).exit_code == 0
    assert open(out1, "rb").read() == open(out2, "rb").read()
    with tarfile.open(out1) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.mode, m.uid, m.gid) for m in members} == {(0, 0o644, 0, 0)}
    assert runner.invoke(cli, ["verify", "--cache", out1]).exit_code == 0

    saxpy = load(out1, "saxpy")
    x, y = rng.random(100).astype(np.float32), rng.random(100).astype(np.float32)
    want = np.float32(0.5) * x + y
    saxpy.saxpy(0.5, x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)


def _tar_gz(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.mark.parametrize("evil", ["../escape.txt", "/abs/escape.txt", "modules/../../escape.txt"])
def test_bundle_entries_that_escape_are_refused(built, tmp_path, evil):
    good = str(tmp_path / "good.tar.gz")
    assert CliRunner().invoke(cli, ["pack", "--cache", built, "-o", good]).exit_code == 0
    with tarfile.open(good) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_tar_gz(members + [(evil, b"pwned")]))
    with pytest.raises(qd.CacheError, match="could escape the bundle"):
        load(str(bad), "saxpy")
    assert not (tmp_path.parent / "escape.txt").exists()


def test_names_that_clash_with_the_loaded_module_are_refused(tmp_path):
    """A field named like the loaded module's own attributes would silently replace them."""
    (tmp_path / "clash.py").write_text(
        "import qdc as qd\n"
        "adstack_heap_bytes = qd.field(qd.f32, shape=4)\n"
        "_private = qd.field(qd.f32, shape=4)\n"
        "@qd.kernel\n"
        "def touch():\n"
        "    for i in adstack_heap_bytes:\n"
        "        adstack_heap_bytes[i] = _private[i] + 1.0\n", encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = qdc_cli("build", str(tmp_path / "clash.py"), "--cache", cache)
    assert r.returncode == 0, r.stderr
    with pytest.raises(qd.QdcError, match="'adstack_heap_bytes', which clashes"):
        load(cache, "clash")
    (tmp_path / "ok.py").write_text((tmp_path / "clash.py").read_text(encoding="utf-8").replace("adstack_heap_bytes", "out"), encoding="utf-8")
    assert qdc_cli("build", str(tmp_path / "ok.py"), "--cache", cache).returncode == 0
    mod = load(cache, "ok")
    mod._private.from_numpy(np.arange(4, dtype=np.float32))  # an underscore name is an ordinary field
    mod.touch()
    np.testing.assert_array_equal(mod.out.to_numpy(), np.arange(4, dtype=np.float32) + 1)
