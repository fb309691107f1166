"""`pip install .` ships only the packages pyproject.toml lists: every code folder must be there."""
import os
import sys

import pytest

from conftest import REPO_ROOT as ROOT


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib arrived in Python 3.11")
def test_every_code_package_is_listed_in_pyproject():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    on_disk = {"qdc"}
    for package, folder in mapping.items():
        if package == "qdc":
            continue
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                on_disk.add(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
