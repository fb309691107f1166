"""Simplification: store forwarding, constant folding, CSE, redundant global loads and dead-code
elimination, repeated until nothing changes (each exposes work for the others: a forwarded
constant folds, folded operands make expressions equal, replaced statements die)."""
from __future__ import annotations

from .. import ir
from .constant_fold import constant_fold
from .cse import eliminate_common_subexpressions as cse
from .dce import eliminate_dead_code
from .load_forward import forward_global_loads
from .store_forward import eliminate_dead_stores, forward_stores

_STEPS = (forward_stores, constant_fold, cse, forward_global_loads, eliminate_dead_stores, eliminate_dead_code)
_MAX_ROUNDS = 8  # a bound for safety; real kernels settle in two or three

# The steps a change made by each step may give work to; any other step finds nothing in the IR
# it changed that it did not find before. Each step finds nothing when run again on the IR it
# left (each walks the kernel in program order, so what it replaces is replaced before its
# uses are looked at; dead-code elimination sweeps until nothing dies), so none names itself.
# - forward_stores replaces loads of locals by values: operands become constants or equal
#   (folding, CSE), reads of locals go (dead stores) and values lose users (dead code). What
#   the loads of a local see depends only on the stores and loads of locals, which it keeps.
# - constant_fold replaces statements by constants or operands: equal constants and operands
#   (CSE), operands that lose users (dead code). It changes no local's stores or loads and no
#   GlobalPtr (only their operands: two become one through CSE, which then names load forwarding).
# - cse makes operands the same statement (`a - a` folds), merges the GlobalPtrs of one element
#   (load forwarding) and drops statements (their operands lose users).
# - forward_global_loads: as CSE (equal operands, removed loads).
# - eliminate_dead_stores drops a store overwritten before any read: its value loses a user.
#   The loads of the local see what they saw (the store was never the one they read).
# - eliminate_dead_code drops unused values and loads, stores to unread locals and empty
#   control flow: a read removed between two stores makes the first dead. Removing a read or an
#   unused value changes no operand, no write to memory and no store a load sees.
_GIVES_WORK_TO = {
    forward_stores: {constant_fold, cse, eliminate_dead_stores, eliminate_dead_code},
    constant_fold: {cse, eliminate_dead_code},
    cse: {constant_fold, forward_global_loads, eliminate_dead_code},
    forward_global_loads: {constant_fold, cse, eliminate_dead_code},
    eliminate_dead_stores: {eliminate_dead_code},
    eliminate_dead_code: {eliminate_dead_stores},
}


def simplify(k: ir.KernelIR) -> bool:
    """Run the steps in turn, round after round, skipping a step that has nothing to do: one
    that ran since the last change that gives it work (_GIVES_WORK_TO). Stops when no step has
    anything left to do (or after _MAX_ROUNDS rounds). Runs the very steps that would change the
    IR when every step is run in turn until a whole round changes nothing, in the same order:
    the steps skipped are those that would find nothing, so the result is the same."""
    changed_any = False
    to_do = set(_STEPS)
    for _ in range(_MAX_ROUNDS):
        for step in _STEPS:
            if not to_do:
                return changed_any
            if step not in to_do:
                continue
            to_do.discard(step)
            if step(k):
                changed_any = True
                to_do |= _GIVES_WORK_TO[step]
    return changed_any
