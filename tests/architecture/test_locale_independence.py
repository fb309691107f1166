"""qdc behaves the same under any locale, an ASCII one included (LC_ALL=C with PYTHONUTF8=0).

- every file qdc, its tests, tools and benchmarks open as text names its encoding (Python's
  default is the locale's, which a C library loaded in the process may even change);
- the messages qdc prints are ASCII (a report must not fail on its own punctuation);
- `qdc` prints a kernel source line that holds non-ASCII characters under an ASCII locale.
Read statically from the source files.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

from conftest import REPO_ROOT as ROOT

PRODUCT = ("compiler", "runtime", "cli", "quadrants_compat")
EVERYTHING = PRODUCT + ("tests", "tools", "bench", "kernels")


def _sources(parts):
    for part in parts:
        for folder, _, names in os.walk(os.path.join(ROOT, part)):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def _mode(call: ast.Call, position: int):
    node = call.args[position] if len(call.args) > position else \
        next((k.value for k in call.keywords if k.arg == "mode"), None)
    return node.value if isinstance(node, ast.Constant) else "r" if node is None else "?"


def _kernel_bodies(tree: ast.AST) -> set:
    """The nodes inside qd.kernel / qd.func functions: the front end reads those, Python never runs them."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and any("kernel" in ast.unparse(d) or "func" in ast.unparse(d) for d in node.decorator_list)
            for inner in ast.walk(node)}


def _text_io_without_encoding(tree: ast.AST):
    skip = _kernel_bodies(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in skip or any(k.arg == "encoding" for k in node.keywords):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and "b" not in _mode(node, 1):
            yield node.lineno, "open"
        elif isinstance(func, ast.Attribute) and func.attr == "fdopen" and "b" not in _mode(node, 1):
            yield node.lineno, "os.fdopen"
        elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "write_text"):
            yield node.lineno, func.attr


def test_every_text_file_names_its_encoding():
    found = [f"{path}:{line}: {what}(...) without encoding=" for path, tree in _sources(EVERYTHING)
             for line, what in _text_io_without_encoding(tree)]
    assert not found, "\n".join(found)


def _docstrings(tree: ast.AST) -> set:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, kinds) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_messages_are_ascii():
    found = []
    for path, tree in _sources(PRODUCT):
        docs = _docstrings(tree)
        found += [f"{path}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and not n.value.isascii()]
    assert not found, "\n".join(found)


def _qdc(*args, cwd):
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONIOENCODING="")
    run = subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], cwd=cwd, env=env, capture_output=True)
    return run.returncode, (run.stdout + run.stderr).decode("utf-8")


def test_the_cli_builds_lists_and_reports_non_ascii_names_under_an_ascii_locale(tmp_path):
    (tmp_path / "kernels").mkdir()
    source = textwrap.dedent("""\
        import qdc as qd

        @qd.kernel
        def gr\u00fcn(a: qd.types.ndarray(qd.f32, ndim=1)):
            for i in a:
                a[i] = 2.0  # caf\u00e9 \u2192 arrow
        """)
    (tmp_path / "kernels" / "farben.py").write_text(source, encoding="utf-8")
    code, out = _qdc("build", "kernels", "--arch", "cpu", "--cache", "c", cwd=tmp_path)
    assert code == 0 and "1 built" in out, out
    code, out = _qdc("ls", "--cache", "c", cwd=tmp_path)
    assert code == 0 and ("gr\\xfcn" in out or "gr\u00fcn" in out), out  # not a UnicodeEncodeError

    broken = source.replace("2.0  #", "undefined_name  #")
    (tmp_path / "kernels" / "farben.py").write_text(broken, encoding="utf-8")
    code, out = _qdc("build", "kernels", "--arch", "cpu", "--cache", "c", cwd=tmp_path)
    assert code != 0 and "Traceback" not in out, out
    assert "farben.py:6:" in out and "error:" in out and "undefined_name" in out, out
