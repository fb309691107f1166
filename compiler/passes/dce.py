"""Dead-code elimination: drop pure statements and allocas nobody reads."""
from __future__ import annotations

from .. import ir


def eliminate_dead_code(k: ir.KernelIR) -> bool:
    changed_any = False
    while True:
        uses = ir.users_count(k.body)
        loaded = {s.var for s in ir.walk(k.body) if isinstance(s, ir.LocalLoad)}
        changed = _sweep(k.body, uses, loaded)
        changed_any |= changed
        if not changed:
            return changed_any


def _sweep(block: ir.Block, uses: dict, loaded: set) -> bool:
    changed = False
    keep = []
    for s in block.stmts:
        for b in s.blocks():
            changed |= _sweep(b, uses, loaded)
        dead = (s.PURE or isinstance(s, (ir.LocalLoad, ir.GlobalLoad, ir.TempLoad))) and not uses.get(s)
        if isinstance(s, ir.LocalStore) and s.var not in loaded:
            dead = True
        if isinstance(s, ir.Alloca) and not uses.get(s):
            dead = True
        if isinstance(s, ir.If) and not s.then_block.stmts and not s.else_block.stmts:
            dead = True
        if dead:
            changed = True
        else:
            keep.append(s)
    block.stmts = keep
    return changed
