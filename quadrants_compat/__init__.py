"""Quadrants programs on qdc: after `qdc.install_as_quadrants()`, `import quadrants` is qdc.

The module `quadrants` is the `qdc` package itself, so every name a program reaches through it
is qdc's own object (qdc defines Quadrants' names: the tensor API, `qd.data_oriented`,
`qd.perf_dispatch`, the logging names, Quadrants' `qd.init` options). The submodules programs
import by name are modules of this package (`quadrants.lang`, `quadrants.lang.impl`,
`quadrants._logging`, `quadrants.algorithms`, ...) or qdc's (`quadrants.math`, `quadrants.ad`);
any other submodule is a ModuleNotFoundError naming it. A name qdc does not offer is an
AttributeError naming it (`qd.root`: SNodes are not part of qdc's language).

`python -m qdc.as_quadrants SCRIPT [ARGS...]` runs a script this way.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# `quadrants.<name>` -> the module that stands for it
SUBMODULES = {
    "quadrants": "qdc",
    "quadrants.lang": "qdc.quadrants_compat.lang",
    "quadrants.lang.impl": "qdc.quadrants_compat.impl",
    "quadrants.lang._template_mapper": "qdc.quadrants_compat.template_mapper",
    "quadrants._logging": "qdc.quadrants_compat.logging",
    "quadrants.algorithms": "qdc.compiler.language.algorithms",
    "quadrants.types": "qdc.quadrants_compat.types",
    "quadrants.math": "qdc.compiler.language.mathlib",
    "quadrants.ad": "qdc.compiler.jit.ad",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # already executed: it is the target module itself


class QuadrantsFinder(importlib.abc.MetaPathFinder):
    """Resolves `quadrants` and its submodules to qdc's modules (first on sys.meta_path)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "quadrants" and not fullname.startswith("quadrants."):
            return None
        module = SUBMODULES.get(fullname)
        if module is None:
            raise ModuleNotFoundError(f"qdc stands in for Quadrants here (qdc.install_as_quadrants()) and has no "
                                      f"module '{fullname}'; it offers {', '.join(sorted(SUBMODULES))}",
                                      name=fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(module))


def install() -> None:
    """`qdc.install_as_quadrants()`: every later `import quadrants` resolves to qdc. Calling it
    twice is harmless; calling it after the real Quadrants was imported is a RuntimeError (the
    program would hold objects of both)."""
    if any(isinstance(f, QuadrantsFinder) for f in sys.meta_path):
        return
    loaded = sorted(m for m in sys.modules if m == "quadrants" or m.startswith("quadrants."))
    if loaded and sys.modules["quadrants" if "quadrants" in loaded else loaded[0]] is not importlib.import_module("qdc"):
        raise RuntimeError("qdc.install_as_quadrants() must run before anything imports quadrants "
                           f"(already imported: {', '.join(loaded[:3])})")
    sys.meta_path.insert(0, QuadrantsFinder())
    _install_hooks()


def installed() -> bool:
    return any(isinstance(f, QuadrantsFinder) for f in sys.meta_path)


def _install_hooks() -> None:
    from . import impl
    impl.install_hooks()
