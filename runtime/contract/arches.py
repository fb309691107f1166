"""The one table of arches qdc knows (docs/api.md). Everything that lists arches derives from it:
the package root's constants (`qd.cpu`, ...), `qd.init(arch=...)` and `qd.gpu`, the `qdc build
--arch` choices, the compiler's targets (compiler/targets) and the runtime's devices
(runtime/devices). Adding an arch is a row here, its target's folder and its device's folder.

Targets and devices are named by module, imported only when used: the runtime never imports the
compiler, and a deployment without a device's driver binding never imports that device.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str
    # `qd.gpu` tries the GPU arches in table order and takes the first that starts.
    gpu: bool
    # The module defining the compiler's `TARGET` (compiler/targets/base.py); None: none yet.
    target: str | None
    # (module, class) of the runtime's device (runtime/device.py); None: none yet.
    device: tuple[str, str] | None


TABLE = (
    Arch("cpu", gpu=False, target="qdc.compiler.targets.cpu.target",
         device=("qdc.runtime.devices.cpu.device", "CpuDevice")),
    Arch("cuda", gpu=True, target="qdc.compiler.targets.cuda.target",
         device=("qdc.runtime.devices.cuda.device", "CudaDevice")),
    Arch("vulkan", gpu=True, target="qdc.compiler.targets.vulkan.target",
         device=("qdc.runtime.devices.vulkan.device", "VulkanDevice")),
    Arch("metal", gpu=True, target="qdc.compiler.targets.metal.target",
         device=("qdc.runtime.devices.metal.device", "MetalDevice")),
    Arch("amdgpu", gpu=True, target="qdc.compiler.targets.amdgpu.target",
         device=("qdc.runtime.devices.amdgpu.device", "AmdgpuDevice")),
)


def names() -> tuple[str, ...]:
    """Every arch's name, in table order (read when called, so that a test may patch TABLE)."""
    return tuple(a.name for a in TABLE)


def by_name(name: str) -> Arch | None:
    return next((a for a in TABLE if a.name == name), None)


ARCHES = names()
GPU_ARCHES = tuple(a.name for a in TABLE if a.gpu)
