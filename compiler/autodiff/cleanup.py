"""Dead-code removal that knows about adstacks.

The generic DCE keeps every push and pop (they write memory). A stack whose top and adjoint
are never read after the rest of the gradient kernel has been simplified is dead: drop it
with all its operations, which may in turn make the values it was pushing dead. Accumulations
into an adjoint temporary nobody reads go the same way.
"""
from __future__ import annotations

from .. import ir
from ..ir.adstack import ADSTACK_OPS, AdStackAccAdjoint, AdStackAlloca, AdStackLoadTop, AdStackLoadTopAdj, TempAtomicAdd
from ..passes.dce import eliminate_dead_code, sweep


def remove_dead_adstacks(k: ir.KernelIR) -> None:
    while True:
        eliminate_dead_code(k)
        if not _sweep_once(k):
            return


def _sweep_once(k: ir.KernelIR) -> bool:
    uses = ir.users_count(k.body)
    read, adj_read, temps_read = set(), set(), set()
    for s in ir.walk(k.body):
        if isinstance(s, AdStackLoadTop):
            read.add(s.stack)
        elif isinstance(s, AdStackLoadTopAdj):
            adj_read.add(s.stack)
        elif isinstance(s, ir.TempLoad):
            temps_read.add(s.slot)

    def dead(s) -> bool:
        if isinstance(s, (AdStackLoadTop, AdStackLoadTopAdj)):
            return not uses.get(s)
        if isinstance(s, AdStackAccAdjoint):
            return s.stack not in adj_read
        if isinstance(s, ADSTACK_OPS):
            return s.stack not in read and s.stack not in adj_read
        if isinstance(s, AdStackAlloca):
            return s not in read and s not in adj_read
        if isinstance(s, TempAtomicAdd):
            return s.slot not in temps_read
        return False

    return sweep(k.body, dead)


def drop_empty_tasks(g: ir.KernelIR) -> None:
    """Remove the tasks the passes emptied and name the others in order, as their entry points
    are named: `<kernel>_grad_t<i>_<kind>`."""
    g.body.stmts = [t for t in g.body.stmts if t.body.stmts]
    for i, t in enumerate(g.tasks):
        t.task_name = f"{g.name}_grad_t{i}_{t.source_kind}"
