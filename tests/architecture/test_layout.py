"""The folder layout is the architecture (docs/design.md, Layout): these import boundaries keep it so.

- the runtime never imports the compiler (a deployment has no compiler and no llvmlite);
- the front end, IR, passes and autodiff know no target;
- no target imports another, except the shared llvm/ (cpu, cuda, amdgpu) and spirv/ (vulkan, metal);
- no device imports another device.
Imports are read statically from every source file, the lazy ones inside functions included.
"""
from __future__ import annotations

import ast
import os

import pytest

from conftest import REPO_ROOT as ROOT
PARTS = {"compiler": "qdc.compiler", "runtime": "qdc.runtime", "cli": "qdc.cli"}
SHARED_TARGETS = {"llvm", "spirv"}


def _module_of(path: str) -> tuple[str, bool]:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    is_pkg = rel[-1] == "__init__"
    if is_pkg:
        rel = rel[:-1]
    return ".".join([PARTS[rel[0]]] + rel[1:]), is_pkg


def _imports(path: str, mod: str, is_pkg: bool) -> list[tuple[str, int]]:
    """Every module `path` (module `mod`) imports: absolute names; `from a import b` also yields a.b."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((target, node.lineno))
            out += [(f"{target}.{a.name}", node.lineno) for a in node.names]
    return out


def _sources(*folders: str) -> list[str]:
    found = []
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    return sorted(found)


def _violations(paths, forbidden, module_of=_module_of) -> list[str]:
    bad = []
    for path in paths:
        mod, is_pkg = module_of(path)
        for name, line in _imports(path, mod, is_pkg):
            reason = forbidden(mod, name)
            if reason:
                bad.append(f"{os.path.basename(path)}:{line}: imports {name} ({reason})")
    return bad


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_runtime_never_imports_the_compiler():
    def forbidden(mod, name):
        if _under(name, "qdc.compiler") or _under(name, "llvmlite") or _under(name, "qdc.cli"):
            return "a deployment has neither"
    assert _violations(_sources("runtime"), forbidden) == []


def test_backend_neutral_stages_import_no_target():
    def forbidden(mod, name):
        if _under(name, "qdc.compiler.targets"):
            return "frontend, ir, passes and autodiff know no target"
    folders = [os.path.join("compiler", f) for f in ("frontend", "ir", "passes", "autodiff")]
    assert _violations(_sources(*folders), forbidden) == []


def _family(mod: str, prefix: str) -> str | None:
    """The backend folder `mod` belongs to under `prefix` (None for the interface modules there)."""
    if not _under(mod, prefix) or mod == prefix:
        return None
    first = mod[len(prefix) + 1:].split(".")[0]
    return first if os.path.isdir(os.path.join(ROOT, *prefix.split(".")[1:], first)) else None


def test_targets_import_no_other_target_but_the_shared_ones():
    def forbidden(mod, name):
        own, other = _family(mod, "qdc.compiler.targets"), _family(name, "qdc.compiler.targets")
        if own and other and other != own and other not in SHARED_TARGETS:
            return f"target {own} must not reach into target {other}"
        if own in SHARED_TARGETS and other and other not in SHARED_TARGETS:
            return f"the shared {own}/ lowering must not depend on a target"
    assert _violations(_sources(os.path.join("compiler", "targets")), forbidden) == []


def test_devices_import_no_other_device():
    def forbidden(mod, name):
        own, other = _family(mod, "qdc.runtime.devices"), _family(name, "qdc.runtime.devices")
        if own and other and other != own:
            return f"device {own} must not reach into device {other}"
    assert _violations(_sources(os.path.join("runtime", "devices")), forbidden) == []


@pytest.mark.parametrize("folder", ["compiler/language", "compiler/frontend", "compiler/ir", "compiler/passes",
                                    "compiler/autodiff", "compiler/driver", "compiler/jit", "compiler/commands",
                                    "compiler/targets/llvm",
                                    "compiler/targets/cpu", "compiler/targets/metal", "compiler/targets/amdgpu",
                                    "runtime/contract", "runtime/devices/cpu", "runtime/devices/metal",
                                    "runtime/devices/amdgpu"])
def test_each_stage_and_backend_has_its_folder(folder):
    assert os.path.isfile(os.path.join(ROOT, folder, "__init__.py"))


def test_the_checker_sees_a_violation(tmp_path):
    """The boundary checks are not vacuous: a lazy relative import of the compiler is reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ...compiler.driver import kernel\n", encoding="utf-8")

    def forbidden(mod, name):
        return "compiler" if _under(name, "qdc.compiler") else None
    found = _violations([str(probe)], forbidden, module_of=lambda p: ("qdc.runtime.devices.probe", False))
    assert found == ["probe.py:2: imports qdc.compiler.driver (compiler)",
                     "probe.py:2: imports qdc.compiler.driver.kernel (compiler)"]


def test_another_targets_code_leaves_a_targets_cache_entries_valid(tmp_path, monkeypatch):
    """The compiler fingerprint is per target: a file added to another target's folder (here a
    stand-in `vulkan` target registered for the test) changes that target's fingerprint and not
    the CPU's, while a change to a backend-neutral stage changes both."""
    from qdc.compiler import targets
    from qdc.compiler.driver import cache_key
    from qdc.compiler.targets.base import Target

    root = tmp_path / "qdc"
    compiler = root / "compiler"
    for folder in ("language", "frontend", "ir", "passes", "autodiff", "driver", "targets/llvm", "targets/cpu",
                   "targets/spirv", "targets/vulkan"):
        (compiler / folder).mkdir(parents=True)
        (compiler / folder / "__init__.py").write_text("", encoding="utf-8")
    (root / "runtime" / "contract").mkdir(parents=True)
    for f in ("compiler/__init__.py", "compiler/targets/__init__.py", "compiler/targets/base.py",
              "runtime/contract/__init__.py"):
        (root / f).write_text("", encoding="utf-8")

    class Stand_in(Target):
        source_folders = ("spirv", "vulkan")
    monkeypatch.setitem(targets.TARGETS, "vulkan", "stand-in")
    real_get = targets.get
    monkeypatch.setattr(targets, "get", lambda arch: Stand_in() if arch == "vulkan" else real_get(arch))
    monkeypatch.setattr(cache_key, "__file__", str(compiler / "driver" / "cache_key.py"))

    def fingerprints():
        cache_key._FINGERPRINTS.clear()
        return cache_key.compiler_fingerprint("cpu"), cache_key.compiler_fingerprint("vulkan")

    try:
        cpu0, vk0 = fingerprints()
        (compiler / "targets" / "vulkan" / "codegen.py").write_text("SPIRV = 1\n", encoding="utf-8")
        cpu1, vk1 = fingerprints()
        assert cpu1 == cpu0 and vk1 != vk0
        (compiler / "passes" / "new_pass.py").write_text("def run(k): pass\n", encoding="utf-8")
        cpu2, vk2 = fingerprints()
        assert cpu2 != cpu1 and vk2 != vk1
        (compiler / "targets" / "cpu" / "codegen.py").write_text("X = 1\n", encoding="utf-8")
        cpu3, vk3 = fingerprints()
        assert cpu3 != cpu2 and vk3 == vk2
    finally:
        cache_key._FINGERPRINTS.clear()
