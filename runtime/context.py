"""The process-wide runtime: which device is active. `qd.init` replaces it (fields then
re-materialise, zeroed, on the new device)."""
from __future__ import annotations

import itertools

from .device import Device

_generation = itertools.count(1)


class Runtime:
    def __init__(self, arch: str = "cpu", cpu_max_num_threads: int | None = None):
        self.arch = arch
        self.device: Device = make_device(arch, cpu_max_num_threads)
        self.generation = next(_generation)


def make_device(arch: str, cpu_max_num_threads: int | None = None) -> Device:
    if arch == "cpu":
        from .cpu import CpuDevice
        return CpuDevice(cpu_max_num_threads)
    raise ValueError(f"arch '{arch}' is not available in this build of qdc (available: cpu)")


_current: Runtime | None = None


def current() -> Runtime:
    global _current
    if _current is None:
        _current = Runtime("cpu")
    return _current


def reset(arch: str = "cpu", cpu_max_num_threads: int | None = None) -> Runtime:
    global _current
    if _current is not None:
        _current.device.sync()
    _current = Runtime(arch, cpu_max_num_threads)
    return _current


def for_arch(arch: str) -> Runtime:
    """The active runtime if it targets `arch`, else a fresh one made active."""
    rt = current()
    return rt if rt.arch == arch else reset(arch)
