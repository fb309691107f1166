"""How many threads one compile may use (the CPU target compiles a large kernel's module parts in
parallel: targets/cpu/parallel_llvm.py): by default the cores this process may run on, in direct
mode what `qd.init(num_compile_threads=N)` says (Quadrants' option); `qdc build
-j N` shares the cores among the processes it compiles in (`threads_beside`), so that together
they use no more than the machine's, and `-j 1` compiles on one thread.
"""
from __future__ import annotations

import contextlib
import os

_configured: int | None = None  # set by limited_threads (a build); None: _chosen's
_chosen: int | None = None  # qd.init(num_compile_threads=N) (Quadrants' option); None: the cores


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this OS (macOS)
        return max(1, os.cpu_count() or 1)


def compile_threads() -> int:
    """How many threads compile one kernel."""
    if _configured is not None:
        return _configured
    return _cores() if _chosen is None else _chosen


def set_compile_threads(threads: int | None) -> None:
    """Direct mode's threads from now on (`qd.init(num_compile_threads=N)`); None: the cores."""
    global _chosen
    _chosen = threads


def threads_beside(processes: int) -> int:
    """The threads of each of `processes` compiling processes: the cores shared among them."""
    return max(1, _cores() // max(1, processes))


@contextlib.contextmanager
def limited_threads(threads: int):
    """compile_threads() is `threads` inside the block (a build worker forked in it keeps it)."""
    global _configured
    saved, _configured = _configured, threads
    try:
        yield
    finally:
        _configured = saved
