"""Import shim: Quadrants' tests run unchanged on qdc (cpu)."""
import dataclasses
import types as _types

import qdc as _q
from qdc.compiler.driver import options as _o

_KNOWN = {f.name for f in dataclasses.fields(_o.Options)} - {"target_values"}
x64 = "cpu"
arm64 = "cpu"
_cfg = _types.SimpleNamespace(arch="cpu")


def init(arch=None, **kw):
    kw = {k: v for k, v in kw.items() if k in _KNOWN}
    arch = "cpu" if arch in (None, "x64", "arm64") else arch
    _cfg.arch = arch
    for k, v in kw.items():
        setattr(_cfg, k, v)
    return _q.init(arch=arch, **kw)


def reset():
    r = getattr(_q, "reset", None)
    if r is not None:
        r()


lang = _types.SimpleNamespace(impl=_types.SimpleNamespace(current_cfg=lambda: _cfg,
                                                        get_runtime=lambda: _types.SimpleNamespace(prog=None)))
extension = _types.SimpleNamespace(adstack="adstack", sparse="sparse", quant="quant", data64="data64",
                                  quant_basic="quant_basic", dynamic_index="dynamic_index", bls="bls",
                                  assertion="assertion", extfunc="extfunc", mesh="mesh")


def __getattr__(name):
    return getattr(_q, name)

from qdc import QdcCompileError as _CE  # noqa: E402
QuadrantsSyntaxError = QuadrantsTypeError = QuadrantsCompilationError = QuadrantsNameError = _CE
QuadrantsIndexError = _CE
QuadrantsAssertionError = AssertionError
QuadrantsRuntimeError = RuntimeError
