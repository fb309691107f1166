"""The qdc-runtime wheel (packaging/runtime/pyproject.toml), built from this checkout: what a
deployment installs (tests/architecture/test_runtime_distribution.py, and the emulated aarch64
deployment of tests/devices/cpu)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT as ROOT

RUNTIME_PROJECT = os.path.join("packaging", "runtime")


def build_runtime_wheel(out) -> str:
    """The qdc-runtime wheel, built under `out` (a pathlib.Path) from a copy of the sources it
    ships (setuptools leaves build/ and egg-info folders beside pyproject.toml: not in the work
    tree, where tests run at once)."""
    src = out / "src"
    shutil.copytree(os.path.join(ROOT, RUNTIME_PROJECT), src / RUNTIME_PROJECT)
    shutil.copy(os.path.join(ROOT, "__init__.py"), src / "__init__.py")
    shutil.copytree(os.path.join(ROOT, "runtime"), src / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(out / "dist"), RUNTIME_PROJECT],
                       cwd=src, capture_output=True, text=True, timeout=300)
    if "invalid command 'bdist_wheel'" in r.stdout + r.stderr:  # setuptools before 70.1 without `wheel`
        pytest.skip("building a wheel with this setuptools needs the `wheel` package (pip install -e '.[test]')")
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (out / "dist").glob("qdc_runtime-*.whl")
    return str(wheel)
