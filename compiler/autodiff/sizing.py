"""Adstack capacities.

Stacks only grow in the forward sweep and only shrink in the reverse sweep, so a stack's
capacity is the most pushes any path through one forward sweep makes: the longest path of
the task's control-flow graph with a push weighing 1. The IR is structured, so this longest
path is computed exactly by one pass over the blocks, the graph's acyclic regions in order:
an `if` takes its heavier branch, a loop multiplies its body by its trip count. A loop whose
trip count is not a compile-time constant makes the bound dynamic: the stack then gets
`default_ad_stack_size` entries, with a warning naming the loop (an error under
`ad_stack_strict`). `ad_stack_size` > 0 forces its value on every stack.
"""
from __future__ import annotations

import os
import sys
import warnings

from .. import ir
from ..ir.adstack import AdStackAlloca, AdStackPush
from .checks import error


_MAX_STACKS = 0xFFFF


class DynamicBound(Exception):
    def __init__(self, loop: ir.RangeFor):
        super().__init__()
        self.loop = loop


def pushes_on_longest_path(block: ir.Block, stack: AdStackAlloca) -> int:
    """Pushes to `stack` along the heaviest path through `block`; DynamicBound if a loop with a
    run-time trip count pushes to it."""
    total = 0
    for s in block.stmts:
        if isinstance(s, AdStackPush) and s.stack is stack:
            total += 1
        elif isinstance(s, ir.If):
            total += max(pushes_on_longest_path(s.then_block, stack), pushes_on_longest_path(s.else_block, stack))
        elif isinstance(s, ir.RangeFor):
            inner = pushes_on_longest_path(s.body, stack)
            if inner:
                trip = constant_trip_count(s)
                if trip is None:
                    raise DynamicBound(s)
                total += trip * inner
    return total


def constant_trip_count(loop: ir.RangeFor) -> int | None:
    if isinstance(loop.begin, ir.Const) and isinstance(loop.end, ir.Const):
        return max(int(loop.end.value) - int(loop.begin.value), 0)
    return None


def size_stacks(k: ir.KernelIR, opts) -> list:
    """One record per stack (in stack-id order) for KernelMeta.adstack; numbers the stacks."""
    records, dynamic = [], {}
    for ti, task in enumerate(k.tasks):
        for s in task.body.stmts:
            if isinstance(s, AdStackAlloca):
                s.stack_id = len(records)
                size, source = _capacity(k, task, s, opts, dynamic)
                where = str(s.loc) if s.loc else k.name
                log(f"kernel '{k.name}' task {task.task_name}: adstack '{s.var_name}' ({s.type}) at {where}: "
                    f"{size} entries ({source})")
                records.append({"task": ti, "dtype": s.type.name, "adjoint": s.adjoint, "max_size": size,
                                "name": s.var_name, "where": where, "source": source})
    if len(records) > _MAX_STACKS or len(k.tasks) > _MAX_STACKS:  # the overflow word's 16-bit fields
        raise error(k.loc, f"kernel '{k.name}' needs {len(records)} adstacks in {len(k.tasks)} tasks; at most "
                           f"{_MAX_STACKS} of each are supported. Split the kernel")
    for loop, names in dynamic.items():
        filename, line = (loop.loc.filename, loop.loc.line) if loop.loc else ("<unknown>", 0)
        warnings.warn_explicit(
            f"kernel '{k.name}', loop at {os.path.basename(filename)}:{line}: its trip count is only known "
            f"at run time, so its adstacks ({', '.join(names)}) get default_ad_stack_size="
            f"{opts.default_ad_stack_size} entries each (an overflow is detected and raised). Set "
            f"qd.init(ad_stack_size=N) to choose, or ad_stack_strict=True to make this an error",
            UserWarning, filename, line)
    return records


def _capacity(k, task, stack, opts, dynamic: dict) -> tuple:
    if opts.ad_stack_size > 0:
        return int(opts.ad_stack_size), "ad_stack_size"
    try:
        return max(pushes_on_longest_path(task.body, stack), 1), "constant bounds"
    except DynamicBound as e:
        loop = e.loop
        if opts.ad_stack_strict:
            raise error(loop.loc, f"this loop's trip count is only known at run time, so the adstack of "
                                  f"'{stack.var_name}' in kernel '{k.name}' cannot be sized at compile time "
                                  f"(ad_stack_strict=True). Set qd.init(ad_stack_size=N) or make the bound "
                                  f"a constant") from None
        dynamic.setdefault(loop, []).append(repr(stack.var_name))
        return int(opts.default_ad_stack_size), "default_ad_stack_size"


def log(message: str) -> None:
    if "adstack" in os.environ.get("QDC_LOG", "").split(","):
        print(f"[qdc adstack] {message}", file=sys.stderr)
