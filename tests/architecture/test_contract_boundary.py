"""The compiler reaches the runtime only through runtime/contract/ (the ABI that generated code
depends on), and every arch's cache key covers the whole contract, so a change to an ABI
constant can never leave a stale entry that the runtime would load and run.

The compiler has two floors:
- the top floor works with `@qd.kernel` objects: direct mode (compiler/jit/: the kernel
  objects, qd.init, Tape, FwdMode, qd.aot, and the offline cache's lookups and stores),
  `qdc build` (compiler/commands/build.py, which imports kernel modules and stores their
  entries in a cache folder or a remote store), kernel manifests (compiler/manifest/: recorded
  by the offline cache, built through `qdc build`) and the IR of a kernel
  (compiler/commands/inspect.py). Like a deployment it is a client of the runtime, and may use
  all of it.
- everything below makes code (language, front end, IR, passes, autodiff, targets, and the
  driver's options, cache keys and compile_kernel). What it makes must follow from what the
  cache key hashes, compiler/ and runtime/contract/, so it takes from the runtime only the
  contract, and it never imports the top floor. What the language shares with the runtime's
  data objects in Python scope (the default types of declarations, the classes that make
  fields and ndarrays) is in the contract too: runtime/contract/python_scope.py.
"""
import ast
import os
import shutil

import pytest

import qdc as qd
from qdc.compiler.driver import cache_key
from qdc.compiler.driver.options import Options
from qdc.runtime.contract.arches import ARCHES

PACKAGE = os.path.dirname(os.path.abspath(qd.__file__))
COMPILER = os.path.join(PACKAGE, "compiler")
CONTRACT = os.path.join(PACKAGE, "runtime", "contract")

TOP_FLOOR = ("compiler/jit/", "compiler/manifest/", "compiler/commands/")
TOP_FLOOR_MODULES = tuple("qdc." + p.rstrip("/").removesuffix(".py").replace("/", ".") for p in TOP_FLOOR)
# Imports below the top floor that are allowed anyway: none (Python-scope objects are made
# through the contract's python_scope.device_arrays).
ALLOWED: dict = {}


def _on_top_floor(rel: str) -> bool:
    return any(rel.startswith(p) if p.endswith("/") else rel == p for p in TOP_FLOOR)


def _python_files(folder: str):
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _module_name(path: str, package_dir: str) -> str:
    rel = os.path.relpath(path, package_dir)[:-3].replace(os.sep, ".")
    return "qdc." + (rel[:-len(".__init__")] if rel.endswith(".__init__") else rel)


def _is_module(name: str, package_dir: str) -> bool:
    where = os.path.join(package_dir, *name.split(".")[1:])
    return os.path.exists(where + ".py") or os.path.isdir(where)


def _imported_modules(path: str, package_dir: str = PACKAGE):
    """(line, module) for every import in `path` (a file of the qdc package at `package_dir`),
    those inside functions included; a relative import resolved against the file's package,
    `from P import name` as P.name when that is a module of qdc."""
    module = _module_name(path, package_dir)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if _is_module(sub, package_dir) else base


def _contract_violation(rel: str, imported: str) -> bool:
    if not (imported == "qdc.runtime" or imported.startswith("qdc.runtime.")):
        return False
    if imported == "qdc.runtime.contract" or imported.startswith("qdc.runtime.contract."):
        return False
    return rel not in ALLOWED.get(imported, ())


def _below_the_top_floor():
    for path in _python_files(COMPILER):
        rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
        if not _on_top_floor(rel):
            yield rel, path


def test_the_compiler_imports_the_runtime_only_through_the_contract():
    problems = []
    for rel, path in _below_the_top_floor():
        problems += [f"{rel}:{line}: imports {imported}" for line, imported in _imported_modules(path)
                     if _contract_violation(rel, imported)]
    assert not problems, "the compiler takes from the runtime only what runtime/contract/ holds:\n" + \
        "\n".join(problems)


def test_nothing_below_the_top_floor_imports_it():
    problems = []
    for rel, path in _below_the_top_floor():
        problems += [f"{rel}:{line}: imports {imported}" for line, imported in _imported_modules(path)
                     if any(imported == m or imported.startswith(m + ".") for m in TOP_FLOOR_MODULES)]
    assert not problems, "the code-making floor never reaches up to the kernel objects or `qdc build`:\n" + \
        "\n".join(problems)


def test_the_boundary_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    fake = tmp_path / "qdc"
    (fake / "compiler" / "passes").mkdir(parents=True)
    (fake / "runtime" / "contract").mkdir(parents=True)
    for name in ("device.py", "contract/error_slot.py"):
        (fake / "runtime" / name).write_text("", encoding="utf-8")
    (fake / "compiler" / "passes" / "p.py").write_text(
        "from qdc.runtime.contract.error_slot import BOUNDS_WORD\n"
        "def f():\n    from ...runtime import device\n"
        "def g():\n    import qdc.runtime.device\n", encoding="utf-8")
    found = [m for _, m in _imported_modules(str(fake / "compiler" / "passes" / "p.py"), str(fake))]
    assert found == ["qdc.runtime.contract.error_slot", "qdc.runtime.device", "qdc.runtime.device"]
    assert [_contract_violation("compiler/passes/p.py", m) for m in found] == [False, True, True]


# ---- the cache key covers the contract -------------------------------------------------------

_probe_x = qd.field(qd.f32, shape=4)


def _probe_kernel():
    for i in _probe_x:
        _probe_x[i] = _probe_x[i] * 2.0 + 1.0


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """A copy of compiler/ and runtime/contract/ that a test may edit."""
    root = tmp_path_factory.mktemp("qdc-sources")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(COMPILER, root / "compiler", ignore=ignore)
    shutil.copytree(CONTRACT, root / "runtime" / "contract", ignore=ignore)
    return root


def _keys(root, monkeypatch) -> dict:
    monkeypatch.setattr(cache_key, "__file__", str(root / "compiler" / "driver" / "cache_key.py"))
    cache_key._FINGERPRINTS.clear()
    try:
        return {arch: cache_key.kernel_key(_probe_kernel, [], Options(), arch).key for arch in ARCHES}
    finally:
        cache_key._FINGERPRINTS.clear()


def _changed_constant(source: str) -> str:
    """`source` with its first module-level constant (an UPPER_CASE name bound to an int or
    str literal) given another value; with one more constant where it has none."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.isupper() and isinstance(node.value, ast.Constant) \
                and type(node.value.value) in (int, str):
            lines = source.splitlines(keepends=True)
            line = lines[node.lineno - 1]
            value = node.value.value
            new = repr(value + 1 if isinstance(value, int) else value + "_changed")
            lines[node.lineno - 1] = line[:node.value.col_offset] + new + line[node.value.end_col_offset:]
            return "".join(lines)
    return source + "\nABI_REVISION = 2\n"


@pytest.mark.parametrize("name", sorted(os.path.relpath(p, CONTRACT) for p in _python_files(CONTRACT)))
def test_changing_an_abi_constant_of_the_contract_changes_every_archs_cache_key(name, source_copy, monkeypatch):
    path = source_copy / "runtime" / "contract" / name
    original = path.read_text(encoding="utf-8")
    before = _keys(source_copy, monkeypatch)
    changed = _changed_constant(original)
    assert changed != original
    path.write_text(changed, encoding="utf-8")
    try:
        after = _keys(source_copy, monkeypatch)
    finally:
        path.write_text(original, encoding="utf-8")
    assert [arch for arch in ARCHES if after[arch] == before[arch]] == [], \
        f"runtime/contract/{name} changed, yet these arches keep their cache keys"
    assert _keys(source_copy, monkeypatch) == before  # the same sources give the same keys
