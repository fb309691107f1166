"""Simplification: store forwarding, constant folding, CSE, redundant global loads and dead-code
elimination, repeated until nothing changes (each exposes work for the others: a forwarded
constant folds, folded operands make expressions equal, replaced statements die)."""
from __future__ import annotations

from .. import ir
from .constant_fold import constant_fold
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .load_forward import forward_global_loads
from .store_forward import eliminate_dead_stores, forward_stores

_STEPS = (forward_stores, constant_fold, eliminate_common_subexpressions, forward_global_loads,
          eliminate_dead_stores, eliminate_dead_code)
_MAX_ROUNDS = 8  # a bound for safety; real kernels settle in two or three


def simplify(k: ir.KernelIR) -> bool:
    """Run the steps in turn, round after round, until a whole round changes nothing (at most
    _MAX_ROUNDS). A step that changed nothing leaves the IR as it found it, so once the last
    len(_STEPS) steps run changed nothing, the rest of the round would too: it is not run."""
    changed_any = False
    unchanged_steps = 0  # how many of the last steps run changed nothing
    for _ in range(_MAX_ROUNDS):
        for step in _STEPS:
            if unchanged_steps == len(_STEPS):
                return changed_any
            if step(k):
                changed_any = True
                unchanged_steps = 0
            else:
                unchanged_steps += 1
    return changed_any
