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
    changed_any = False
    for _ in range(_MAX_ROUNDS):
        changed = False
        for step in _STEPS:
            changed |= bool(step(k))
        changed_any |= changed
        if not changed:
            break
    return changed_any
