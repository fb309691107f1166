"""`qd.perf_dispatch`: a function with several registered implementations, each call running the
one measured fastest for the call's geometry.

    @qd.perf_dispatch(get_geometry_hash=lambda a, b: (a.shape, b.shape))
    def solve(a, b): ...            # the body never runs

    @solve.register
    @qd.kernel
    def solve_rows(a: ..., b: ...): ...

    @solve.register(is_compatible=lambda a, b: a.shape[0] < 1024)
    @qd.kernel
    def solve_blocks(a: ..., b: ...): ...

While a geometry (the hash of its arguments) is being measured, each call runs the compatible
implementation with the fewest trials and times it, synchronizing the device around it; after
`warmup` untimed and `active` timed calls of each (`first_warmup` the first time) the fastest on
average is used for that geometry, until `repeat_after_count` more calls or
`repeat_after_seconds` seconds have passed, when it is measured again. Every implementation must
have the same effects: each call runs exactly one of them. Where only one is compatible it runs
without measurement.
"""
from __future__ import annotations

import functools
import time

from . import sync

DEFAULT_REPEAT_AFTER_COUNT = 300


class _Geometry:
    """The measurements of one geometry: trials and timed durations per implementation."""
    __slots__ = ("trials", "times", "fastest", "calls_since", "chosen_at", "measured_once")

    def __init__(self):
        self.trials: dict = {}
        self.times: dict = {}
        self.fastest = None
        self.calls_since = 0
        self.chosen_at = 0.0
        self.measured_once = False


class PerfDispatch:
    def __init__(self, fn, get_geometry_hash, first_warmup: int, warmup: int, active: int,
                 repeat_after_count, repeat_after_seconds):
        if active < 1:
            raise ValueError(f"qd.perf_dispatch '{fn.__name__}': active must be at least 1, got {active}")
        if repeat_after_count is None and repeat_after_seconds is None:
            repeat_after_count = DEFAULT_REPEAT_AFTER_COUNT
        self.name = fn.__name__
        self.get_geometry_hash = get_geometry_hash
        self.first_warmup, self.warmup, self.active = int(first_warmup), int(warmup), int(active)
        self.repeat_after_count = repeat_after_count if repeat_after_count and repeat_after_count > 0 else None
        self.repeat_after_seconds = repeat_after_seconds if repeat_after_seconds and repeat_after_seconds > 0 else None
        self.implementations: list = []  # (function, is_compatible or None), in registration order
        self._geometries: dict = {}
        functools.update_wrapper(self, fn)

    def register(self, implementation=None, *, is_compatible=None):
        """Add an implementation (as a decorator, with or without `is_compatible=`)."""
        if implementation is None:
            return lambda f: self.register(f, is_compatible=is_compatible)
        self.implementations.append((implementation, is_compatible))
        return implementation

    def __call__(self, *args, **kwargs):
        compatible = [f for f, ok in self.implementations if ok is None or ok(*args, **kwargs)]
        if not compatible:
            raise RuntimeError(f"qd.perf_dispatch '{self.name}': none of its {len(self.implementations)} "
                               f"registered implementations is compatible with these arguments")
        if len(compatible) == 1:
            return compatible[0](*args, **kwargs)
        key = self.get_geometry_hash(*args, **kwargs)
        geometry = self._geometries.get(key)
        if geometry is None:
            geometry = self._geometries[key] = _Geometry()
        if geometry.fastest is not None and geometry.fastest in compatible and not self._expired(geometry):
            geometry.calls_since += 1
            return geometry.fastest(*args, **kwargs)
        if geometry.fastest is not None:  # measure again
            geometry.trials, geometry.times, geometry.fastest = {}, {}, None
        return self._measure(geometry, compatible, args, kwargs)

    def _expired(self, geometry: _Geometry) -> bool:
        if self.repeat_after_count is not None and geometry.calls_since >= self.repeat_after_count:
            return True
        return (self.repeat_after_seconds is not None
                and time.perf_counter() - geometry.chosen_at >= self.repeat_after_seconds)

    def _measure(self, geometry: _Geometry, compatible: list, args, kwargs):
        impl = min(compatible, key=lambda f: geometry.trials.get(f, 0))  # registration order breaks ties
        trial = geometry.trials.get(impl, 0)
        warmup = self.warmup if geometry.measured_once else self.first_warmup
        sync()
        start = time.perf_counter()
        result = impl(*args, **kwargs)
        sync()
        elapsed = time.perf_counter() - start
        geometry.trials[impl] = trial + 1
        if trial >= warmup:
            geometry.times.setdefault(impl, []).append(elapsed)
        if all(len(geometry.times.get(f, ())) >= self.active for f in compatible):
            geometry.fastest = min(compatible, key=lambda f: sum(geometry.times[f]) / len(geometry.times[f]))
            geometry.calls_since, geometry.chosen_at, geometry.measured_once = 0, time.perf_counter(), True
        return result


def perf_dispatch(*, get_geometry_hash, first_warmup: int = 1, warmup: int = 0, active: int = 1,
                  repeat_after_count: int | None = None, repeat_after_seconds: float | None = None):
    """`@qd.perf_dispatch(get_geometry_hash=...)`: see the module's docstring."""
    return lambda fn: PerfDispatch(fn, get_geometry_hash, first_warmup, warmup, active, repeat_after_count,
                                   repeat_after_seconds)
