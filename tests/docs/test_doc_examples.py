"""The examples of README.md and docs/api.md run as written: each document's ```python blocks, in
order, as one script, in a folder where the commands the documents show first have run
(`qdc build` of kernels/demo.py and kernels/saxpy.py for the CPU into cache/, `qdc pack`)."""
import os
import re
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTS = ["README.md", "docs/api.md"]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(document: str) -> list[str]:
    with open(os.path.join(REPO_ROOT, document), encoding="utf-8") as f:
        return PYTHON_BLOCK.findall(f.read())


@pytest.fixture(scope="module")
def deployment_folder(tmp_path_factory):
    """A folder holding what `make demo` and `qdc pack` leave: cache/ and kernels.qdc.tar.gz."""
    folder = tmp_path_factory.mktemp("deployment")
    kernels = [os.path.join(REPO_ROOT, "kernels", name) for name in ("demo.py", "saxpy.py")]
    for args in (["build", *kernels, "--cache", "cache", "--arch", "cpu", "-j", "1"],
                 ["pack", "--cache", "cache", "-o", "kernels.qdc.tar.gz"]):
        done = subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, f"qdc {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return folder


@pytest.mark.parametrize("document", DOCUMENTS)
def test_python_examples_run_as_written(document, deployment_folder):
    blocks = python_blocks(document)
    assert blocks, f"{document} has no python example"
    script = deployment_folder / (os.path.basename(document) + ".py")
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=deployment_folder, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the examples of {document} failed:\n{done.stdout}\n{done.stderr}"


def test_documents_link_only_inside_the_repository():
    """Every relative link of the user-facing documents names a file of the repository."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    documents = ["README.md", "CHANGELOG.md"] + [os.path.join("docs", d) for d in os.listdir(os.path.join(REPO_ROOT, "docs"))
                                                 if d.endswith(".md")]
    broken = []
    for document in documents:
        with open(os.path.join(REPO_ROOT, document), encoding="utf-8") as f:
            text = re.sub(r"`[^`\n]*`", "", f.read())  # code spans hold no links (`self.updates[k](...)`)
            for target in link.findall(text):
                if "://" in target:
                    continue
                path = os.path.normpath(os.path.join(REPO_ROOT, os.path.dirname(document), target))
                if not path.startswith(REPO_ROOT + os.sep) or not os.path.exists(path):
                    broken.append(f"{document}: {target}")
    assert not broken, "links to files outside the repository or missing: " + ", ".join(broken)


def test_nothing_cites_documents_outside_the_repository():
    """Code, tests and docs cite docs/api.md and docs/design.md, never the files a clone lacks."""
    outside = re.compile(r"(^|[^A-Za-z/_.-])(API|DESIGN|GPU)\.md|\.\./shared/")
    found = []
    for folder, subfolders, files in os.walk(REPO_ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("__pycache__", "cache")]
        for name in files:
            if name.endswith((".py", ".md", ".toml", ".sh", ".yaml", ".cfg", ".ini")) or name == "Makefile":
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    found += [f"{os.path.relpath(path, REPO_ROOT)}:{i}" for i, line in enumerate(f, 1)
                              if outside.search(line)]
    assert not found, "citations of documents outside the repository: " + ", ".join(found)
