"""Runtime devices: one folder per arch behind runtime/device.py. The arch table
(runtime/contract/arches.py) names each arch's device; a device's module is imported only when
asked for (it may need a driver binding a deployment does not have)."""
from __future__ import annotations

import importlib

from ..contract import arches


def available() -> tuple:
    return tuple(a.name for a in arches.TABLE if a.device is not None)


def make_device(arch: str, **options):
    entry = arches.by_name(arch)
    if entry is None or entry.device is None:
        known = "unknown arch" if entry is None else "an arch this build of qdc cannot run yet"
        raise ValueError(f"'{arch}' is {known} (available: {', '.join(available())})")
    module, cls = entry.device
    return getattr(importlib.import_module(module), cls)(**options)
