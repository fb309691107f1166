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
# Steps that find nothing when run again on the IR they left. CSE: a statement's key is final
# when it is looked at (its operands, defined before it, were replaced already), so two
# statements it kept never have equal keys within one scope.
_IDEMPOTENT = (eliminate_common_subexpressions,)


def simplify(k: ir.KernelIR) -> bool:
    """Run the steps in turn, round after round, until a whole round changes nothing (at most
    _MAX_ROUNDS). A step that changed nothing leaves the IR as it found it, so once the last
    len(_STEPS) steps run changed nothing, the rest of the round would too: it is not run; nor
    is an idempotent step when every other step changed nothing since it changed the IR."""
    changed_any = False
    unchanged_steps = 0  # how many of the last steps run changed nothing
    last_change = None  # the step that changed the IR last
    for _ in range(_MAX_ROUNDS):
        for step in _STEPS:
            if unchanged_steps == len(_STEPS):
                return changed_any
            if unchanged_steps == len(_STEPS) - 1 and step is last_change and step in _IDEMPOTENT:
                return changed_any  # it would look at the IR it left
            if step(k):
                changed_any = True
                unchanged_steps = 0
                last_change = step
            else:
                unchanged_steps += 1
    return changed_any
