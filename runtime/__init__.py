"""The qdc runtime: loads kernels prebuilt by `qdc build` and launches them. It is all a
deployment imports, and it never imports the compiler (nor llvmlite, click or yaml), so the
`qdc-runtime` distribution (numpy, msgpack and a driver binding) is enough to run it:

    from qdc.runtime import load, ndarray, sync
    mod = load("cache", "saxpy", arch="vulkan")   # a cache folder or a `qdc pack` bundle
    x, y = ndarray(np.float32, 1024), ndarray(np.float32, 1024)
    mod.saxpy(2.0, x, y); sync()

`load(..., arch=)` chooses the device (no `qd.init`): loading makes that arch's runtime the
active one, on which `ndarray`s live (allocated, zeroed, on first use). Names resolve on first
use so that `import qdc` stays light.
"""
from __future__ import annotations

import importlib

from .contract.errors import AdStackOverflowError, CacheError, ModuleNotBuiltError, QdcError, SignatureError
from .contract.types import f16, f32, f64, i8, i16, i32, i64, u1, u8, u16, u32, u64

__all__ = ["load", "ndarray", "Ndarray", "sync", "FwdMode", "from_dlpack", "QdcError", "CacheError", "ModuleNotBuiltError",
           "SignatureError", "AdStackOverflowError", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "u1", "u8", "u16",
           "u32", "u64"]

_LAZY = {"load": ".loader", "ndarray": ".fields", "Ndarray": ".fields", "FwdMode": ".forward_mode",
         "from_dlpack": ".dlpack"}


def sync() -> None:
    """Wait until every kernel launched on the active runtime has finished, and raise the first
    error any of them hit (an `AdStackOverflowError`, a bounds error) naming its kernel."""
    context, lifecycle = _sync_modules or _import_sync_modules()
    if lifecycle._pending:
        lifecycle.materialize_pending()
    if context.has_runtime():  # nothing was ever launched otherwise: no device to start
        context.current().device.sync()


_sync_modules: tuple = ()  # (context, lifecycle) once imported: an import statement per sync costs ~0.5 us


def _import_sync_modules() -> tuple:
    global _sync_modules
    from . import context, lifecycle
    _sync_modules = (context, lifecycle)
    return _sync_modules


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'qdc.runtime' has no attribute '{name}'")
