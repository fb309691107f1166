"""Adjoints in registers: a stack none of whose pushes can follow one of its adjoint operations
keeps its top entry's adjoint in a local, and loses its adjoint slot.

An adstack entry holds a primal and an adjoint; a push writes the value and a zero adjoint,
`ad_stack_acc_adjoint` adds to the top entry's adjoint, `ad_stack_load_top_adj` reads it. In
the gradient of a dynamic loop (task_adjoint.py) each iteration pushes in its forward sweep and
then, in its reverse sweep, pops, reads and accumulates; no push comes after the first adjoint
operation. Then no entry below the top ever has a nonzero adjoint (an adjoint only grows on
the top, and an entry that was the top before a later push had none yet), so the top's adjoint
is a local R: accumulate is `R = R + v`, read is `R`, a pop makes it 0 (the new top's), and
so does the stack's declaration, which empties the stack. The entries then carry the primal
only: half the heap, and a push writes, a pop reads, one word instead of two (plus the adjoint
written back). The additions are the same, in the same order: gradients are bit for bit those
of the heap's adjoint.

"No push after an adjoint operation" is decided on the task's code: every push of the stack
comes before every adjoint operation in program order, and no loop that the stack's
declaration is outside of holds both a push and an adjoint operation (a later iteration's
push would follow an earlier iteration's accumulation).
"""
from __future__ import annotations

from .. import ir
from ..ir.adstack import AdStackAccAdjoint, AdStackAlloca, AdStackLoadTopAdj, AdStackPop, AdStackPush

_LOOPS = (ir.RangeFor, ir.While, ir.Task)


def adjoints_in_registers(k: ir.KernelIR) -> None:
    for task in k.tasks:
        uses = _stack_uses(task)
        for stack, record in uses.items():
            if _eligible(record):
                _rewrite(task, stack)


class _Uses:
    """Where a stack is declared and operated on: program positions and enclosing loops."""

    def __init__(self):
        self.alloca_loops: frozenset = frozenset()
        self.push_positions, self.adjoint_positions = [], []
        self.push_loops, self.adjoint_loops = set(), set()


def _stack_uses(task: ir.Task) -> dict:
    uses: dict = {}
    position = 0

    def visit(block: ir.Block, loops: tuple) -> None:
        nonlocal position
        for s in block.stmts:
            position += 1
            if isinstance(s, AdStackAlloca):
                uses.setdefault(s, _Uses()).alloca_loops = frozenset(loops)
            elif isinstance(s, AdStackPush):
                record = uses.setdefault(s.stack, _Uses())
                record.push_positions.append(position)
                record.push_loops.update(loops)
            elif isinstance(s, (AdStackAccAdjoint, AdStackLoadTopAdj)):
                record = uses.setdefault(s.stack, _Uses())
                record.adjoint_positions.append(position)
                record.adjoint_loops.update(loops)
            inner = loops + (s,) if isinstance(s, _LOOPS) else loops
            for b in s.blocks():
                visit(b, inner)

    visit(task.body, (task,))
    return uses


def _eligible(record: _Uses) -> bool:
    if not record.adjoint_positions:
        return False
    if record.push_positions and max(record.push_positions) > min(record.adjoint_positions):
        return False
    return not ((record.push_loops - record.alloca_loops) & (record.adjoint_loops - record.alloca_loops))


def _rewrite(task: ir.Task, stack: AdStackAlloca) -> None:
    t = stack.type
    register = ir.Alloca(t, f"{stack.var_name}.adj" if stack.var_name else "adj", stack.loc)
    replaced: dict = {}

    def zero(loc) -> list:
        c = ir.Const(0.0, t, loc)
        return [c, ir.LocalStore(register, c, loc)]

    def rewrite(block: ir.Block) -> None:
        out = []
        for s in block.stmts:
            for b in s.blocks():
                rewrite(b)
            if s is stack:
                out += [s, register] + zero(s.loc)
            elif isinstance(s, AdStackAccAdjoint) and s.stack is stack:
                old = ir.LocalLoad(register, s.loc)
                total = ir.Binary("add", old, s.value, t, s.loc)
                out += [old, total, ir.LocalStore(register, total, s.loc)]
            elif isinstance(s, AdStackLoadTopAdj) and s.stack is stack:
                load = ir.LocalLoad(register, s.loc)
                replaced[s] = load
                out.append(load)
            elif isinstance(s, AdStackPop) and s.stack is stack:
                out += [s] + zero(s.loc)
            else:
                out.append(s)
        block.stmts = []
        for s in out:
            block.append(s)

    for b in task.blocks():
        rewrite(b)
    for b in task.blocks():
        ir.replace_uses(b, replaced)
    stack.adjoint = False
