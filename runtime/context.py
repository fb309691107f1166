"""The process-wide runtime: which device is active. `qd.init` replaces it (fields then
re-materialise, zeroed, on the new device), also after the device was lost
(runtime/device.py, "Loss"): the lost device is released first, without waiting for it."""
from __future__ import annotations

import itertools
import weakref

from . import devices
from .contract.errors import DeviceLostError
from .device import Device

_generation = itertools.count(1)
# Objects (live kernel launchers) whose `invalidate()` must run when the runtime is replaced,
# so that their hot path needs no per-launch check of which runtime is active.
_dependents: "weakref.WeakSet" = weakref.WeakSet()


class Runtime:
    def __init__(self, arch: str = "cpu", cpu_max_num_threads: int | None = None):
        self.arch = arch
        self.device: Device = make_device(arch, cpu_max_num_threads)
        self.generation = next(_generation)


def make_device(arch: str, cpu_max_num_threads: int | None = None) -> Device:
    options = {"num_threads": cpu_max_num_threads} if arch == "cpu" else {}
    return devices.make_device(arch, **options)


_current: Runtime | None = None


def current() -> Runtime:
    global _current
    if _current is None:
        _current = Runtime("cpu")
    return _current


def reset(arch: str = "cpu", cpu_max_num_threads: int | None = None) -> Runtime:
    """Replace the active runtime: fields and ndarrays re-materialise, zeroed, on first use. A
    loss of the replaced device that nobody has seen yet raises once the new runtime is active."""
    global _current
    old = _current
    unseen_loss = _wait_for_loss(old.device) if old is not None else None
    if old is not None and old.device.lost is not None:
        # Before the new device: CUDA can only make a working context once the lost one is reset.
        _abandon(old.device)
    new = Runtime(arch, cpu_max_num_threads)  # may raise (unknown arch): keep the old one then
    _current = new
    for dependent in list(_dependents):
        dependent.invalidate()
    if old is not None and old.device.lost is None:
        _retire(old.device)
    if unseen_loss is not None:
        raise unseen_loss
    return _current


def _wait_for_loss(device: Device) -> DeviceLostError | None:
    """Wait for `device`'s work; the DeviceLostError of a loss found now (one found before was
    raised then)."""
    if device.lost is not None:
        return None
    try:
        device.wait()
    except DeviceLostError as e:
        return e
    return None


def _abandon(device: Device) -> None:
    """Release a lost device (its memory is gone; each device's close waits for nothing that
    could hang): a failure of its cleanup is no news, the loss was reported."""
    try:
        device.close()
    except Exception:  # noqa: BLE001
        pass


def _retire(device: Device) -> None:
    """Finish the replaced device's work and release it (a GPU device holds driver objects and
    threads, which tests that re-initialise hundreds of times must not pile up). Its errors
    still raise here, after the new runtime is in place: a launch's error is never lost (nor
    hidden by a failing close, which still destroys the device)."""
    try:
        device.sync()
    except BaseException:
        try:
            device.close()
        except Exception:  # noqa: BLE001 (the launch's error is the one to report)
            pass
        raise
    device.close()


def has_runtime() -> bool:
    return _current is not None


def on_reset(dependent) -> None:
    """Call `dependent.invalidate()` at every future `reset` (held weakly)."""
    _dependents.add(dependent)


def for_arch(arch: str) -> Runtime:
    """The active runtime if it targets `arch`, else a fresh one made active."""
    rt = current()
    return rt if rt.arch == arch else reset(arch)
