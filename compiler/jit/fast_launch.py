"""The kernel functions that launch on their own now (their `__code__` is the launch code,
see kernel.py), so that a Tape or a FwdMode can send every kernel call back through the slow
path that records it."""
from __future__ import annotations

import weakref

_FAST: weakref.WeakSet = weakref.WeakSet()  # Kernels whose function launches on its own now


def launches_on_its_own(kernel) -> None:
    """Note that `kernel`'s function now runs its launch code directly."""
    _FAST.add(kernel)


def suspend_fast_launches() -> None:
    """Send every kernel function's next call through `_slow_call` (a Tape records them there);
    each takes its launch code back by itself at its first call outside the Tape."""
    for kernel in list(_FAST):
        kernel.function.__code__ = kernel._stub
    _FAST.clear()
