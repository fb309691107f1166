"""Compiler targets: one folder per arch behind the interface of base.py.

The arch table (runtime/contract/arches.py) names each arch's target module, which defines
`TARGET`. llvm/ is the lowering shared by cpu, cuda and amdgpu; spirv/ the one shared by vulkan
and metal. No target imports another, except through those shared folders.
"""
from __future__ import annotations

import importlib

from qdc.runtime.contract import arches

from .base import Capabilities, Target, TargetOption  # noqa: F401


def modules() -> dict:
    """arch -> the module defining its `TARGET`, for the arches that have a code generator."""
    return {a.name: a.target for a in arches.TABLE if a.target is not None}


TARGETS = modules()  # as the table says at import; modules() reads the table when called


def available() -> tuple:
    return tuple(modules())


def get(arch: str) -> Target:
    entry = arches.by_name(arch)
    if entry is None or entry.target is None:
        known = "unknown arch" if entry is None else "an arch with no code generator in this build of qdc"
        raise ValueError(f"'{arch}' is {known} (available: {', '.join(available())})")
    return importlib.import_module(entry.target).TARGET
