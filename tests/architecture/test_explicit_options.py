"""Options travel as arguments: `qdc build` makes one Options per build and hands it down (build ->
compile_kernel -> front end, passes, targets); direct mode's is the one `qd.init` set, which
only the top floor (the kernel objects, test_contract_boundary.TOP_FLOOR) reads and hands
down the same way. The one process-wide Options is direct mode's, in compiler/jit/api.py; the
default types of Python-scope declarations follow it, or a build's import context
(runtime/contract/python_scope.py). Read from the source, as the other boundary tests are."""
import ast
import os

from test_contract_boundary import COMPILER, PACKAGE, _on_top_floor, _python_files

DIRECT_MODE_STATE = {"direct_options", "set_direct", "_set_direct"}
HOLDER = "compiler/jit/api.py"  # qd.init: the one module that holds direct mode's Options


def _sources():
    for path in _python_files(COMPILER):
        yield os.path.relpath(path, PACKAGE).replace(os.sep, "/"), ast.parse(open(path, encoding="utf-8").read())


def _names(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.rpartition(".")[2])
    return out


def test_only_the_top_floor_reads_direct_modes_options():
    readers = [rel for rel, tree in _sources() if _names(tree) & DIRECT_MODE_STATE and not _on_top_floor(rel)]
    assert readers == [], "below the kernel objects options come as an argument, never from qd.init's state"


def _module_level_options(tree) -> list[int]:
    """Lines where the module itself (not a function) makes an Options()."""
    lines = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Options":
                lines.append(node.lineno)
    return lines


def test_the_one_process_wide_options_is_direct_modes():
    holders = {rel: lines for rel, tree in _sources() if (lines := _module_level_options(tree))}
    assert list(holders) == [HOLDER], holders


def test_the_checks_see_what_they_look_for():
    tree = ast.parse("from x import direct_options\ncurrent = Options()\ndef f():\n    return Options()\n")
    assert "direct_options" in _names(tree)
    assert _module_level_options(tree) == [2]
