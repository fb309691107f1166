"""Compiler targets: one folder per arch behind the interface of base.py.

`TARGETS` is the registry: the arches of runtime/contract/arches.py that have a code generator
in this build. llvm/ is the lowering shared by cpu, cuda and amdgpu; spirv/ will be the one
shared by vulkan and metal. No target imports another, except through those shared folders.
"""
from __future__ import annotations

import importlib

from qdc.runtime.contract.arches import ARCHES

from .base import Capabilities, Target  # noqa: F401

# arch -> module defining `TARGET`, imported on first use (a target may pull in heavy toolchains).
TARGETS = {"cpu": "qdc.compiler.targets.cpu.target", "cuda": "qdc.compiler.targets.cuda.target",
           "vulkan": "qdc.compiler.targets.vulkan.target", "metal": "qdc.compiler.targets.metal.target",
           "amdgpu": "qdc.compiler.targets.amdgpu.target"}
assert set(TARGETS) <= set(ARCHES)


def available() -> tuple:
    return tuple(a for a in ARCHES if a in TARGETS)


def get(arch: str) -> Target:
    if arch not in TARGETS:
        known = "unknown arch" if arch not in ARCHES else "an arch with no code generator in this build of qdc"
        raise ValueError(f"'{arch}' is {known} (available: {', '.join(available())})")
    return importlib.import_module(TARGETS[arch]).TARGET
