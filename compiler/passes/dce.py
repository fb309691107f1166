"""Dead-code elimination: drop what nothing observes — unused pure statements and loads,
stores to locals (and temporaries) that are never read, unused locals, and control flow
left empty (an `if` with empty branches, a serial `for` with an empty body)."""
from __future__ import annotations

from .. import ir

_LOADS = (ir.LocalLoad, ir.GlobalLoad, ir.TempLoad)


def eliminate_dead_code(k: ir.KernelIR) -> bool:
    changed_any = False
    while True:
        uses = ir.users_count(k.body)
        read_vars, read_temps = set(), set(k.returns["slots"] if k.returns else ())  # the launcher reads those
        for s in ir.walk(k.body):
            if isinstance(s, ir.LocalLoad):
                read_vars.add(s.var)
            elif isinstance(s, ir.TempLoad):
                read_temps.add(s.slot)
            elif isinstance(s, ir.LocalAtomic) and uses.get(s):  # its old value is a read
                read_vars.add(s.var)
            elif isinstance(s, ir.TempAtomic) and uses.get(s):
                read_temps.add(s.slot)
        changed = sweep(k.body, lambda s: _is_dead(s, uses, read_vars, read_temps))
        changed_any |= changed
        if not changed:
            return changed_any


def _is_dead(s: ir.Stmt, uses: dict, read_vars: set, read_temps: set) -> bool:
    if (s.PURE or isinstance(s, _LOADS) or isinstance(s, ir.Alloca)) and not uses.get(s):
        return True
    if isinstance(s, (ir.LocalStore, ir.LocalAccumulate)):
        return s.var not in read_vars
    if isinstance(s, ir.LocalAtomic):
        return s.var not in read_vars and not uses.get(s)
    if isinstance(s, ir.TempStore):
        return s.slot not in read_temps
    if isinstance(s, ir.TempAtomic):
        return s.slot not in read_temps and not uses.get(s)
    if isinstance(s, ir.If):
        return not s.then_block.stmts and not s.else_block.stmts
    if isinstance(s, ir.RangeFor):  # its bounds are pure values: the loop has no effect
        return not s.body.stmts
    return False


def sweep(block: ir.Block, dead) -> bool:
    """Remove, bottom-up through nested blocks, every statement for which `dead(s)` holds."""
    changed = False
    keep = []
    for s in block.stmts:
        for b in s.blocks():
            changed |= sweep(b, dead)
        if dead(s):
            changed = True
        else:
            keep.append(s)
    block.stmts = keep
    return changed
