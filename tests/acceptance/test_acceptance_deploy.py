"""Acceptance tests of docs/api.md for deployment, written from the page alone:
`qdc verify` of a cache and of a bundle with flipped bytes, `qdc.CacheError` naming a corrupted
file at load, `qdc pack` reproducibility, `cpu_target` names, and modules built by `qdc build`
loaded from a cache folder and from a bundle by `qdc.runtime.load` in a fresh process in which
llvmlite and qdc's compiler cannot be imported: kernels, their gradients (adstacks sized from live
data) and `qd.aot.instantiate` kernels without their template parameters, against numpy."""
import gzip
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import qdc
import qdc as qd
from test_acceptance_cli_config import HEAT, OTHER, build_ok, files_under, qdc_cmd, run_fill, write_modules


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """kernels/ (heat.py, other.py) built for the CPU into cache/."""
    root = tmp_path_factory.mktemp("deploy")
    write_modules(root / "kernels", heat=HEAT, other=OTHER)
    build_ok("kernels", "--arch", "cpu", "--cache", "cache", "-j", "2", cwd=root)
    return root


def flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x5A
    open(path, "wb").write(bytes(data))


# ---- verify ---------------------------------------------------------------------------------

def test_verify_names_each_corrupted_file_in_a_cache(project, tmp_path):
    rc, out = qdc_cmd("verify", "--cache", project / "cache")
    assert rc == 0, out
    cache = tmp_path / "cache"
    shutil.copytree(project / "cache", cache)
    victims = sorted(files_under(cache).items(), key=lambda kv: -kv[1])[:2]
    for rel, _ in victims:
        flip_byte(cache / rel)
    rc, out = qdc_cmd("verify", "--cache", cache)
    assert rc == 1, out
    assert "Traceback" not in out, out
    for rel, _ in victims:
        assert rel in out, (rel, out)


def test_loading_a_corrupted_artifact_is_a_cache_error_naming_it(project, tmp_path):
    cache = tmp_path / "cache"
    build_ok(project / "kernels" / "other.py", "--cache", cache)  # every file belongs to `other`
    rel = max(files_under(cache).items(), key=lambda kv: kv[1])[0]
    flip_byte(cache / rel)
    with pytest.raises(qdc.CacheError) as info:
        run_fill(str(cache))
    assert os.path.basename(rel) in str(info.value) and rel.split("/")[-2] in str(info.value), str(info.value)


def _tamper_member(bundle, out_path) -> str:
    """Copy of the gzip'd tar `bundle` with one byte flipped inside its largest member's data;
    the member's name."""
    raw = gzip.decompress(open(bundle, "rb").read())
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        member = max((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.size)
    data = bytearray(raw)
    data[member.offset_data + member.size // 2] ^= 0x5A
    open(out_path, "wb").write(gzip.compress(bytes(data)))
    return member.name


def test_verify_a_bundle_and_its_corruptions(project, tmp_path):
    bundle = tmp_path / "kernels.qdc.tar.gz"
    rc, out = qdc_cmd("pack", "--cache", project / "cache", "-o", bundle)
    assert rc == 0 and bundle.is_file(), out
    rc, out = qdc_cmd("verify", "--cache", bundle)
    assert rc == 0, out
    rc, out = qdc_cmd("verify", bundle)  # `qdc verify [--cache DIR|BUNDLE]`
    assert rc == 0, out

    flipped = tmp_path / "flipped.qdc.tar.gz"
    shutil.copy(bundle, flipped)
    flip_byte(flipped)
    rc, out = qdc_cmd("verify", "--cache", flipped)
    assert rc == 1 and "flipped.qdc.tar.gz" in out and "Traceback" not in out, out

    if not tarfile.is_tarfile(bundle):
        pytest.skip("the bundle is not a tar archive: members cannot be tampered with one by one")
    member_bad = tmp_path / "member.qdc.tar.gz"
    name = _tamper_member(bundle, member_bad)
    rc, out = qdc_cmd("verify", "--cache", member_bad)
    assert rc == 1 and name in out and "Traceback" not in out, (name, out)


# ---- pack and deployment --------------------------------------------------------------------

def test_pack_twice_gives_the_same_bytes(project, tmp_path):
    for name in ("one.qdc.tar.gz", "two.qdc.tar.gz"):
        rc, out = qdc_cmd("pack", "--cache", project / "cache", "-o", tmp_path / name)
        assert rc == 0, out
    assert (tmp_path / "one.qdc.tar.gz").read_bytes() == (tmp_path / "two.qdc.tar.gz").read_bytes()


def test_two_builds_of_the_same_sources_pack_to_the_same_bytes(project, tmp_path):
    """The same modules from the same files: once as a folder, once file by file."""
    build_ok(project / "kernels", "--cache", tmp_path / "at_once", "-j", "1")
    for name in ("heat", "other"):
        build_ok(project / "kernels" / f"{name}.py", "--cache", tmp_path / "one_by_one", "-j", "1")
    bundles = []
    for name in ("at_once", "one_by_one"):
        bundles.append(tmp_path / f"{name}.qdc.tar.gz")
        rc, out = qdc_cmd("pack", "--cache", tmp_path / name, "-o", bundles[-1])
        assert rc == 0, out
    assert bundles[0].read_bytes() == bundles[1].read_bytes()


DEPLOY_RUN = r'''
import importlib.abc
import sys


MISSING = ("llvmlite", "click", "yaml", "qdc.compiler", "qdc.cli")


class NotInstalled(importlib.abc.MetaPathFinder):
    """A deployment with numpy and msgpack only: no llvmlite, none of the command's packages,
    no qdc compiler."""
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in MISSING):
            raise ImportError(f"No module named {name!r} (not installed here)")
        return None


sys.meta_path.insert(0, NotInstalled())

import numpy as np
from qdc.runtime import load

source, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
m = load(source, "heat", arch="cpu")

x0 = rng.uniform(-1, 1, 16).astype(np.float32)
for steps in (int(rng.integers(3, 12)), int(rng.integers(300, 400))):  # the second beyond 256 slots
    m.x.from_numpy(x0)
    m.x.grad.fill(0)
    m.n[None] = steps
    m.y[None] = 0.0
    m.compute()
    v, dv = x0.astype(np.float64), np.ones(16)
    for _ in range(steps):
        dv *= np.cos(v) * 0.95
        v = np.sin(v) * 0.95 + 0.01
    assert np.isclose(m.y[None], v.sum(), rtol=1e-4, atol=1e-5), (steps, m.y[None], v.sum())
    m.y.grad[None] = 1.0
    m.compute.grad()
    np.testing.assert_allclose(m.x.grad.to_numpy(), dv, rtol=1e-3, atol=1e-6)

a = rng.standard_normal(37).astype(np.float32)
want = a * np.float32(1.5)
m.scale(a, 1.5)
np.testing.assert_array_equal(a, want)
cube = m.cube_x()  # an instantiation: no template parameters left
assert np.isclose(cube, (x0.astype(np.float64) ** 3).sum(), rtol=1e-4, atol=1e-5), cube
leaked = sorted(k for k in sys.modules if any(k == m or k.startswith(m + ".") for m in MISSING))
assert not leaked, leaked
print("DEPLOYED")
'''


@pytest.mark.parametrize("source", ["cache", "bundle"])
def test_deployment_without_llvmlite_runs_kernels_and_gradients(project, tmp_path, rng, source):
    where = project / "cache"
    if source == "bundle":
        where = tmp_path / "kernels.qdc.tar.gz"
        rc, out = qdc_cmd("pack", "--cache", project / "cache", "-o", where)
        assert rc == 0, out
    script = tmp_path / "deploy.py"
    script.write_text(DEPLOY_RUN, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), str(where), str(int(rng.integers(1 << 30)))],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "DEPLOYED" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("cpu_target", ["portable", "native", "x86-64-v2", "haswell"])
def test_cpu_target_names_build_code_that_runs_here(tmp_path, rng, cpu_target):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 CPU names")
    if cpu_target == "haswell":
        flags = open("/proc/cpuinfo", encoding="utf-8").read() if os.path.exists("/proc/cpuinfo") else ""
        if not all(f in flags.split() for f in ("avx2", "fma", "bmi2")):
            pytest.skip("this host is not a haswell-level CPU")
    write_modules(tmp_path / "kernels", other=OTHER)
    build_ok("kernels", "--cache", "c", "--cpu-target", cpu_target, cwd=tmp_path)
    np.testing.assert_array_equal(run_fill(str(tmp_path / "c"), 11), np.arange(8) * 11)

    qd.init(arch=qd.cpu, cpu_target=cpu_target, cache_dir=str(tmp_path / "direct"))  # direct mode takes it too
    x = qd.field(qd.f32, shape=100)
    v = rng.uniform(-3, 3, 100).astype(np.float32)
    x.from_numpy(v)

    @qd.kernel
    def smooth():
        for i in x:
            x[i] = qd.sin(x[i]) * 0.5 + x[i] * x[i]

    smooth()
    np.testing.assert_allclose(x.to_numpy(), np.sin(v.astype(np.float64)) * 0.5 + v.astype(np.float64) ** 2,
                               rtol=1e-6, atol=1e-6)
