"""The runtime-only distribution `qdc-runtime` (packaging/runtime/pyproject.toml): its wheel,
installed into a fresh virtual environment that has numpy and msgpack (plus the Vulkan binding
for vulkan) but no llvmlite, click, yaml or qdc compiler, runs kernels that this process built
with the full qdc, from a cache folder and from a `qdc pack` bundle: device arrays, `sync`,
forward mode, against numpy. With the full install, the same script imports none of them."""
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import venv

import numpy as np
import pytest

import qdc
from conftest import vulkan_unavailable_reason

from conftest import REPO_ROOT as ROOT
from runtime_wheel_util import RUNTIME_PROJECT, build_runtime_wheel
COMPILER_ONLY = ("llvmlite", "click", "yaml", "qdc.compiler", "qdc.cli")

KERNELS = """
import qdc as qd

u = qd.field(qd.f32, shape=16, needs_dual=True)
energy = qd.field(qd.f32, shape=(), needs_dual=True)


@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in x:
        y[i] = a * x[i] + y[i]


@qd.kernel
def total_energy():
    for i in u:
        energy[None] += qd.sin(u[i]) * u[i]
"""

# A deployment script: argv = arch, seed, "isolated" or "full", then caches/bundles to load from.
DEPLOY = """
import importlib.util
import sys

import numpy as np

import qdc as qd
from qdc.runtime import FwdMode, load, ndarray, sync

arch, seed, install, sources = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
rng = np.random.default_rng(seed)
for source in sources:
    mod = load(source, "deployed", arch=arch)
    xs, ys = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    a = np.float32(rng.uniform(-2, 2))
    x, y = ndarray(np.float32, xs.size), qd.ndarray(qd.f32, ys.size)
    x.from_numpy(xs)
    y.from_numpy(ys)
    mod.saxpy(float(a), x, y)
    sync()
    qd.sync()
    np.testing.assert_allclose(y.to_numpy(), a * xs + ys, rtol=1e-6, atol=1e-6, err_msg=source)

    us, direction = rng.uniform(-2, 2, 16), rng.standard_normal(16)
    mod.u.from_numpy(us.astype(np.float32))
    with FwdMode(loss=mod.energy, param=mod.u, seed=direction):
        mod.total_energy()
    us = us.astype(np.float32).astype(np.float64)
    terms, tangents = np.sin(us) * us, (np.cos(us) * us + np.sin(us)) * direction
    assert abs(mod.energy[None] - terms.sum()) <= 1e-5 * np.abs(terms).sum() + 1e-6, (source, mod.energy[None])
    assert abs(mod.energy.dual[None] - tangents.sum()) <= 1e-5 * np.abs(tangents).sum() + 1e-6, source

imported = sorted(m for m in sys.modules if any(m == c or m.startswith(c + ".") for c in %(compiler_only)r))
assert not imported, f"a deployment imported {imported}"
if install == "isolated":
    assert qd.__file__.startswith(sys.prefix), qd.__file__
    present = [c for c in %(compiler_only)r if importlib.util.find_spec(c) is not None]
    assert not present, f"installed next to qdc-runtime: {present}"
    try:
        qd.kernel
    except ModuleNotFoundError as e:
        assert "pip install qdc" in str(e), str(e)
    else:
        raise AssertionError("qd.kernel resolved without the compiler")
print("deployed", arch, len(sources))
""" % {"compiler_only": COMPILER_ONLY}


def run_qdc(*args):
    """`qdc ARGS` in this process (the full qdc)."""
    from qdc.cli.main import main
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    assert not done.value.code, f"qdc {' '.join(map(str, args))} exited with {done.value.code}"


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """[cache folder, bundle] holding module `deployed` built for cpu and vulkan."""
    root = tmp_path_factory.mktemp("prebuilt")
    (root / "deployed.py").write_text(textwrap.dedent(KERNELS), encoding="utf-8")
    cache, bundle = root / "cache", root / "deployed.qdc.tar.gz"
    run_qdc("build", root / "deployed.py", "--arch", "cpu,vulkan", "--cache", cache, "-j", "1")
    run_qdc("pack", "--cache", cache, "-o", bundle)
    return [str(cache), str(bundle)]


def deploy(python, target, rng, install, sources):
    """Run the deployment script in a fresh interpreter. The runtime-only venv is isolated (-I);
    the full install is whatever provides qdc to this process, PYTHONPATH included (a GPU host
    may have qdc on the path rather than installed)."""
    isolated = install != "full"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") or k == "PYTHONPATH" and not isolated}
    seed = int(rng.integers(2**63))
    flags = ["-I"] if isolated else ["-s"]
    r = subprocess.run([python, *flags, "-c", DEPLOY, target, str(seed), install, *sources], env=env, cwd=os.sep,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "deployed" in r.stdout, r.stdout + r.stderr


def skip_unless_target_runs_here(target):
    if target == "vulkan" and vulkan_unavailable_reason() is not None:
        pytest.skip(f"vulkan: {vulkan_unavailable_reason()}")


TARGETS = ["cpu", "vulkan"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_deployment_imports_no_compiler_with_the_full_install(target, prebuilt, rng):
    skip_unless_target_runs_here(target)
    deploy(sys.executable, target, rng, "full", prebuilt)


# ---- the runtime-only distribution ----------------------------------------------------------

def _pyproject(path) -> dict:
    import tomllib
    with open(os.path.join(ROOT, path, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib arrived in Python 3.11")
def test_runtime_distribution_ships_every_runtime_package_and_only_those():
    runtime, full = _pyproject(RUNTIME_PROJECT), _pyproject(".")
    on_disk = {"qdc"} | {"qdc." + os.path.relpath(d, ROOT).replace(os.sep, ".")
                         for d, _, files in os.walk(os.path.join(ROOT, "runtime"))
                         if "__init__.py" in files and "__pycache__" not in d}
    assert set(runtime["tool"]["setuptools"]["packages"]) == on_disk
    assert runtime["project"]["version"] == full["project"]["version"] == qdc.__version__
    assert sorted(re.match(r"[\w.-]+", d).group() for d in runtime["project"]["dependencies"]) == ["msgpack", "numpy"]
    assert set(runtime["project"]["optional-dependencies"]) == set(full["project"]["optional-dependencies"]) - {"test", "bench"}


def _requirement_closure(names) -> list:
    """The installed distributions `names` need at run time (extras left out), themselves included."""
    seen, todo = {}, list(names)
    while todo:
        name = re.match(r"[\w.-]+", todo.pop()).group().lower().replace("_", "-")
        if name in seen:
            continue
        seen[name] = dist = importlib.metadata.distribution(name)
        todo += [r for r in dist.requires or [] if "extra ==" not in r]
    return list(seen.values())


def _link_into(site_packages: str, names) -> None:
    """Make the installed distributions `names` (and what they need) importable in a venv by
    linking their top-level folders and files: no network, no copy of numpy."""
    for dist in _requirement_closure(names):
        tops = {str(f).split("/")[0] for f in dist.files or []} - {"..", "__pycache__"}
        for top in tops:
            target = os.path.join(site_packages, top)
            if not os.path.lexists(target):
                os.symlink(dist.locate_file(top), target)


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory):
    """(python of a fresh venv with only numpy, msgpack and the qdc-runtime wheel, its site-packages)."""
    out = tmp_path_factory.mktemp("runtime_dist")
    wheel = build_runtime_wheel(out)
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(out / "venv")
    python = str(out / "venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    site_packages = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    _link_into(site_packages, ["numpy", "msgpack"])
    r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
                        "--disable-pip-version-check", wheel], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # numpy and msgpack satisfy its requirements offline
    return python, site_packages


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_only_install_runs_prebuilt_kernels(target, prebuilt, runtime_venv, rng):
    skip_unless_target_runs_here(target)
    python, site_packages = runtime_venv
    if target == "vulkan":
        try:
            _link_into(site_packages, ["vulkan"])
        except importlib.metadata.PackageNotFoundError as e:
            pytest.skip(f"the Vulkan binding is not installed here ({e})")
        probe = subprocess.run([python, "-I", "-c", "import vulkan"], capture_output=True, text=True)
        if probe.returncode:
            pytest.skip(f"the Vulkan binding does not import in the runtime-only venv: {probe.stderr[-300:]}")
    deploy(python, target, rng, "isolated", prebuilt)
