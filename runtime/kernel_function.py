"""The function a kernel is called through: one implementation for the kernels that
`qdc.runtime.load` returns (loader.py) and the direct-mode ones that `@qd.kernel` returns
(compiler/jit/kernel.py, which builds on it).

A launch is one call of that function with nothing in front of it: once the kernel is loaded
on the active runtime, the function's `__code__` is the launch code (launcher.py, "Owners"),
or for a kernel with template parameters its dispatch. Until then its code is a stub that
hands the arguments to the owner's `_slow_call`, which loads (or compiles), launches and makes
the function launch directly again (`launch_directly`). The stub comes back at `qd.init`
(the launcher's `invalidate`) and while kernel calls are observed: inside a FwdMode a call
launches the kernel's forward_ad variant, inside a Tape every launch is recorded, so both
need every call to reach a slow path (`observe_calls`). Each kernel takes its launch code
back at its first call after the last observer left.

The variants of a kernel are attributes of its function: `function.grad` (reverse mode) and,
for a prebuilt kernel, `function.forward_ad`.
"""
from __future__ import annotations

import weakref

from . import lifecycle
from .launcher import stub_function

# The kernel functions whose code is launch code now: the ones `observe_calls` must stub.
_direct: "weakref.WeakSet[KernelFunction]" = weakref.WeakSet()
_observers = 0  # FwdModes and Tapes whose `with` body runs


def observe_calls() -> None:
    """A FwdMode or Tape body begins: until the matching `stop_observing_calls`, every kernel
    call takes its owner's slow path."""
    global _observers
    _observers += 1
    stub_direct_kernels()


def stub_direct_kernels() -> None:
    """Send every kernel's next call through its slow path once (runtime/lifecycle.py)."""
    for kernel in list(_direct):
        kernel.function.__code__ = kernel.stub_code
    _direct.clear()


lifecycle.on_pending(stub_direct_kernels)


def stop_observing_calls() -> None:
    global _observers
    _observers -= 1


class KernelFunction:
    """Owns `function`, a plain Python function with the kernel's parameters (`params`; None:
    any arguments) named `code_name`, whose stub calls `self._slow_call`. `variants`:
    attribute name -> callable set on the function (`grad`, `forward_ad`)."""

    def __init__(self, code_name: str, params: list[str] | None, variants: dict):
        self.function = stub_function(code_name, params, self._stub_call)
        self.stub_code = self.function.__code__
        for attribute, call in variants.items():
            setattr(self.function, attribute, call)

    def _stub_call(self, *args, **kwargs):
        if lifecycle._pending:
            lifecycle.materialize_pending()
        return self._slow_call(*args, **kwargs)

    def _slow_call(self, *args, **kwargs):
        raise NotImplementedError

    def launch_directly(self, code) -> None:
        """Make `code` (a launch function's, or a template dispatch's) the function's own, so
        that calls skip the slow path; while calls are observed the stub stays."""
        if _observers:
            self.function.__code__ = self.stub_code
            return
        self.function.__code__ = code
        _direct.add(self)

    def launches_directly(self, code) -> bool:
        """Whether the function's next call runs `code` itself."""
        return self.function.__code__ is code
