"""Adstack heap slices per CPU thread: a task lowered W iterations at a time
(compiler/targets/cpu/widen.py) gives each of its lanes a slice, so a thread takes W of them."""
from __future__ import annotations


def heap_slices_per_thread(compiled) -> int:
    """The most slices one thread takes in any task of `compiled` (a CompiledKernel) that holds
    adstacks: its launch record's `lanes`, 1 for scalar code."""
    return max([t.launch.get("lanes", 1) for t in compiled.meta.tasks if t.adstacks] or [1])
