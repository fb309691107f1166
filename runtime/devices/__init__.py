"""Runtime devices: one folder per arch behind runtime/device.py. `DEVICES` is the registry of
the arches of runtime/contract/arches.py this runtime can run; a device's module is imported
only when asked for (it may need a driver binding a deployment does not have)."""
from __future__ import annotations

import importlib

from ..contract.arches import ARCHES

# arch -> (module, class) of its device.
DEVICES = {"cpu": ("qdc.runtime.devices.cpu.device", "CpuDevice"),
           "cuda": ("qdc.runtime.devices.cuda.device", "CudaDevice"),
           "vulkan": ("qdc.runtime.devices.vulkan.device", "VulkanDevice"),
           "metal": ("qdc.runtime.devices.metal.device", "MetalDevice"),
           "amdgpu": ("qdc.runtime.devices.amdgpu.device", "AmdgpuDevice")}
assert set(DEVICES) <= set(ARCHES)


def available() -> tuple:
    return tuple(a for a in ARCHES if a in DEVICES)


def make_device(arch: str, **options):
    if arch not in DEVICES:
        known = "unknown arch" if arch not in ARCHES else "an arch this build of qdc cannot run yet"
        raise ValueError(f"'{arch}' is {known} (available: {', '.join(available())})")
    module, cls = DEVICES[arch]
    return getattr(importlib.import_module(module), cls)(**options)
