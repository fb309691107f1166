"""Adstack capacities.

Stacks only grow in the forward sweep and only shrink in the reverse sweep, so a stack's
capacity is the most pushes any path through one forward sweep makes: the longest path of
the task's control-flow graph with a push weighing 1. The IR is structured, so this longest
path is computed exactly by one pass over the blocks, the graph's acyclic regions in order:
an `if` takes its heavier branch, a loop multiplies its body by its trip count. This is the
"Bellman-Ford" stage: every bound a compile-time constant.

A loop whose trip count is known only at launch makes the bound dynamic. It is then captured
as a `SizeExpr` (sizeexpr_builder.py) stored in the stack's record, which the runtime
evaluates against the launch's data right before every launch (runtime/adstack.py). Only a
bound outside that grammar gets `default_ad_stack_size` entries, with a warning naming the
construct it could not express (an error under `ad_stack_strict`). `ad_stack_size` > 0
forces its value on every stack.

How many thread slices the stack's task dispatches is not here: the task record (artifact
format v4) has the task's trip count and launch policy, and the runtime asks the device
(Device.task_slices) for the slices a launch really uses.
"""
from __future__ import annotations

import os
import warnings

from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.contract.log import log

from .. import ir
from ..ir.adstack import AdStackAlloca, AdStackPush
from .checks import error
from .sizeexpr_builder import SizeExprBuilder


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
        elif isinstance(s, (ir.RangeFor, ir.While)):
            inner = pushes_on_longest_path(s.body, stack)
            if inner:
                trip = constant_trip_count(s)
                if trip is None:
                    raise DynamicBound(s)
                total += trip * inner
    return total


def constant_trip_count(loop) -> int | None:
    if isinstance(loop, ir.RangeFor) and isinstance(loop.begin, ir.Const) and isinstance(loop.end, ir.Const):
        return max(int(loop.end.value) - int(loop.begin.value), 0)
    return None


class _Sizer:
    """Sizes every stack of one gradient kernel; collects the fallback warnings."""

    def __init__(self, k: ir.KernelIR, opts):
        self.k, self.opts = k, opts
        self.builder = SizeExprBuilder(k)  # one per kernel: it memoises bounds of shared values
        self.fallbacks: dict = {}  # (loc, reason) -> names of the stacks that fell back

    def capacity(self, stack: AdStackAlloca) -> tuple:
        """(capacity, source, size_expr nodes)."""
        if self.opts.ad_stack_size > 0:
            return int(self.opts.ad_stack_size), "ad_stack_size", []
        try:
            return max(pushes_on_longest_path(stack.block, stack), 1), "constant bounds", []
        except DynamicBound as e:
            loop = e.loop
        expr = self.builder.stack_capacity(stack)
        if expr is not None:
            if isinstance(expr, se.Const):  # folded to a constant after all
                return max(expr.value, 1), "constant bounds", []
            # max_size is then only what a reader of the record sees without evaluating it
            return int(self.opts.default_ad_stack_size), "size_expr", se.to_nodes(expr)
        loc = self.builder.failure_loc or loop.loc
        reason = self.builder.failure_reason or "unknown construct"
        if self.opts.ad_stack_strict:
            raise error(loc, f"the adstack of '{stack.var_name}' in kernel '{self.k.name}' cannot be sized: its "
                             f"loop's trip count is only known at run time and {reason} (ad_stack_strict=True). "
                             f"Bound the loop by scalar arguments, integer fields, ndarray shapes or elements "
                             f"(combined with + - * max min), or set qd.init(ad_stack_size=N)") from None
        self.fallbacks.setdefault((loc, reason), []).append(repr(stack.var_name))
        return int(self.opts.default_ad_stack_size), "default_ad_stack_size", []

    def warn_fallbacks(self) -> None:
        for (loc, reason), names in self.fallbacks.items():
            filename, line = (loc.filename, loc.line) if loc else ("<unknown>", 0)
            warnings.warn_explicit(
                f"kernel '{self.k.name}', {os.path.basename(filename)}:{line}: a loop's trip count is only "
                f"known at run time and {reason}, so its adstacks ({', '.join(names)}) get "
                f"default_ad_stack_size={self.opts.default_ad_stack_size} entries each (an overflow is detected "
                f"and raised). Bound the loop by arguments, integer fields, ndarray shapes or elements, set "
                f"qd.init(ad_stack_size=N), or ad_stack_strict=True to make this an error",
                UserWarning, filename, line)


def size_stacks(k: ir.KernelIR, opts) -> list:
    """One record per stack (in stack-id order) for KernelMeta.adstack; numbers the stacks."""
    records = []
    sizer = _Sizer(k, opts)
    for ti, task in enumerate(k.tasks):
        for s in task.body.stmts:
            if isinstance(s, AdStackAlloca):
                s.stack_id = len(records)
                size, source, nodes = sizer.capacity(s)
                where = str(s.loc) if s.loc else k.name
                shown = se.to_text(se.from_nodes(nodes), [p.name for p in k.params],
                                   [f.name for f in k.fields]) if nodes else f"{size} entries"
                log("adstack", f"kernel '{k.name}' task {task.task_name}: adstack '{s.var_name}' ({s.type}) at "
                    f"{where}: {shown} ({source})")
                records.append({"task": ti, "dtype": s.type.name, "adjoint": s.adjoint, "max_size": size,
                                "name": s.var_name, "where": where, "source": source, "size_expr": nodes})
    if len(records) > _MAX_STACKS or len(k.tasks) > _MAX_STACKS:  # the overflow word's 16-bit fields
        raise error(k.loc, f"kernel '{k.name}' needs {len(records)} adstacks in {len(k.tasks)} tasks; at most "
                           f"{_MAX_STACKS} of each are supported. Split the kernel")
    sizer.warn_fallbacks()
    return records

