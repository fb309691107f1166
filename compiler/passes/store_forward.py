"""Store-to-load forwarding and dead-store elimination for locals (`Alloca`).

Forwarding: walking a block in order, the value of a local is known after a store to it (or
a load of it) in that block; a later load of the local becomes that value. Knowledge flows
into nested blocks, except that a loop body forgets every local the loop writes (the body
may see the previous iteration's value); after an `if` or a loop, every local written
anywhere inside it is forgotten. Tasks are independent: nothing is known at a task's start.

Dead stores: a store followed in the same block by another store to the same local, with
no read of the local and no `break`/`continue` in between (nested blocks included), is
dropped.
"""
from __future__ import annotations

from .. import ir

_WRITES = (ir.LocalStore, ir.LocalAccumulate, ir.LocalAtomic)
# A ComponentStore may write any of its components, a ComponentLoad read any (ir/local_arrays.py).


def forward_stores(k: ir.KernelIR) -> bool:
    mapping: dict = {}
    removed = _Forwarder(mapping).block(k.body, {})
    ir.replace_in_task_bounds(k.body, mapping)
    return removed


# What _Forwarder.block does with a statement, by the first of these classes it is an instance of
# (none: only its nested blocks, if any), looked up once per class.
_KIND_CLASSES = (ir.LocalLoad, ir.LocalStore, (ir.LocalAccumulate, ir.LocalAtomic), ir.Task, ir.ComponentStore)
_KINDS: dict = {}


class _Forwarder:
    def __init__(self, mapping: dict):
        self.mapping = mapping  # forwarded load -> its value
        self.written: dict = {}  # statement with blocks -> locals written inside it (memo)

    def resolve(self, v):
        while v in self.mapping:
            v = self.mapping[v]
        return v

    def block(self, b: ir.Block, known: dict) -> bool:
        """Forward within `b` given the locals `known` on entry; returns whether a load went."""
        known = dict(known)
        keep, changed = [], False
        for s in b.stmts:
            if self.mapping:
                s.replace_operands(self.mapping)
            kind = _KINDS.get(s.__class__)
            if kind is None:
                kind = ir.class_kind(s.__class__, _KIND_CLASSES, _KINDS)
            if kind == 0:  # a load
                value = known.get(s.var)
                if value is not None:
                    self.mapping[s] = self.resolve(value)
                    changed = True
                    continue
                known[s.var] = s
            elif kind == 1:  # a store
                known[s.var] = s.value
            elif kind == 2:  # an update of unknown result
                known.pop(s.var, None)
            elif kind == 3:
                for child in s.blocks():
                    changed |= self.block(child, {})
            elif kind == 4:
                for var in s.components:
                    known.pop(var, None)
            elif s.BLOCKS:
                changed |= self.nested(s, known)
            keep.append(s)
        b.stmts = keep
        return changed

    def nested(self, s: ir.Stmt, known: dict) -> bool:
        written = self.locals_written(s)
        inner = known
        if isinstance(s, (ir.RangeFor, ir.While)):
            inner = {v: val for v, val in known.items() if v not in written}
        changed = False
        for child in s.blocks():
            changed |= self.block(child, inner)
        for v in written:
            known.pop(v, None)
        return changed

    def locals_written(self, s: ir.Stmt) -> set:
        """The locals written anywhere inside `s`, made from its nested statements' own sets
        (each statement is looked at once, however deep the nesting)."""
        got = self.written.get(s)
        if got is None:
            got = set()
            for child in s.blocks():
                for d in child.stmts:
                    if isinstance(d, _WRITES):
                        got.add(d.var)
                    elif isinstance(d, ir.ComponentStore):
                        got.update(d.components)
                    elif d.BLOCKS:
                        got |= self.locals_written(d)
            self.written[s] = got
        return got


def eliminate_dead_stores(k: ir.KernelIR) -> bool:
    return _dead_stores_in(k.body, {})


_READS = (ir.LocalLoad, ir.LocalAccumulate, ir.LocalAtomic)
# What _dead_stores_in does with a statement without blocks, by the first of these classes it is
# an instance of (none: nothing), looked up once per class.
_DEAD_STORE_CLASSES = (ir.LocalStore, (ir.Break, ir.Continue), _READS, ir.ComponentLoad)
_DEAD_STORE_KINDS: dict = {}


def _dead_stores_in(b: ir.Block, inside: dict) -> bool:
    """`inside`: statement with blocks -> (whether a break/continue is in it, locals read in
    it), filled bottom-up as the nested blocks are done (each statement looked at once)."""
    changed = False
    pending: dict = {}  # local -> its last store in this block, not read since
    dead = set()
    for s in b.stmts:
        if s.BLOCKS:
            for child in s.blocks():
                changed |= _dead_stores_in(child, inside)
            jumps, reads = _nested_summary(s, inside)
            if jumps:
                pending.clear()
            for var in reads:
                pending.pop(var, None)
            continue
        kind = _DEAD_STORE_KINDS.get(s.__class__)
        if kind is None:
            kind = ir.class_kind(s.__class__, _DEAD_STORE_CLASSES, _DEAD_STORE_KINDS)
        if kind == 0:  # a store
            if s.var in pending:
                dead.add(pending[s.var])
            pending[s.var] = s
        elif kind == 1:  # break, continue
            pending.clear()
        elif kind == 2:  # a read
            pending.pop(s.var, None)
        elif kind == 3:
            for var in s.components:
                pending.pop(var, None)
    if dead:
        b.stmts = [s for s in b.stmts if s not in dead]
    return changed or bool(dead)


def _nested_summary(s: ir.Stmt, inside: dict) -> tuple[bool, set]:
    got = inside.get(s)
    if got is None:
        jumps, reads = False, set()
        for child in s.blocks():
            for d in child.stmts:
                if isinstance(d, (ir.Break, ir.Continue)):
                    jumps = True
                elif isinstance(d, _READS):
                    reads.add(d.var)
                elif isinstance(d, ir.ComponentLoad):
                    reads.update(d.components)
                if d.BLOCKS:
                    inner_jumps, inner_reads = _nested_summary(d, inside)
                    jumps |= inner_jumps
                    reads |= inner_reads
        got = inside[s] = (jumps, reads)
    return got
