"""Dead-code elimination: drop what nothing observes — unused pure statements and loads,
stores to locals (and temporaries) that are never read, unused locals, and control flow
left empty (an `if` with empty branches, a serial `for` with an empty body)."""
from __future__ import annotations

from collections import Counter

from .. import ir

_LOADS = (ir.LocalLoad, ir.GlobalLoad, ir.TempLoad, ir.ComponentLoad, ir.ArrayLoad)


def eliminate_dead_code(k: ir.KernelIR) -> bool:
    changed_any = False
    while True:
        sweep = _Sweep(*_uses_and_reads(k))
        changed = sweep.block(k.body)
        changed_any |= changed
        if not changed or not sweep.left_dead:  # another sweep would find nothing: skip it
            return changed_any


def _uses_and_reads(k: ir.KernelIR) -> tuple[dict, Counter, Counter]:
    """`ir.users_count(k.body)`, and how many times each local and temporary is read, in one walk
    (a loop over each block's list, nested blocks by recursion: the pass's hottest loop, where
    `ir.walk`'s generator cost a third)."""
    uses: dict = {}
    read_vars, read_temps = Counter(), Counter(k.returns["slots"] if k.returns else ())  # the launcher reads those
    atomics = []
    get = uses.get

    def count(stmts: list) -> None:
        for s in stmts:
            for o in s.operands():
                uses[o] = get(o, 0) + 1
            kind = _COUNTED.get(s.__class__)
            if kind is None:
                kind = ir.class_kind(s.__class__, _COUNTED_CLASSES, _COUNTED)
            if kind == 0:
                read_vars[s.var] += 1
            elif kind == 1:
                read_temps[s.slot] += 1
            elif kind == 2:
                atomics.append(s)
            elif kind == 3:
                for o in ir.task_bounds(s):
                    uses[o] = get(o, 0) + 1
            elif kind == 4:
                for var in s.components:
                    read_vars[var] += 1
            if s.BLOCKS:
                for b in s.blocks():
                    count(b.stmts)

    count(k.body.stmts)
    for s in atomics:  # an atomic's old value, when used, is a read (its users come later: counted now)
        if get(s):
            if isinstance(s, ir.LocalAtomic):
                read_vars[s.var] += 1
            else:
                read_temps[s.slot] += 1
    return uses, read_vars, read_temps


# What _uses_and_reads does with a statement, by the first of these classes it is an instance of
# (none: nothing but its operands), looked up once per class.
_COUNTED_CLASSES = (ir.LocalLoad, ir.TempLoad, (ir.LocalAtomic, ir.TempAtomic), ir.Task, ir.ComponentLoad)
_COUNTED: dict = {}


class _Sweep:
    """Remove dead statements visiting users before what they use (a block backwards, a
    statement's nested blocks before it): removing one releases its operands and the locals it
    reads, so a whole dead chain goes in one sweep. A read earlier in a loop than the store it
    sees (the previous iteration's) is visited after it: such stores go in the next sweep.

    `left_dead` says whether a statement this sweep kept may have died after it was looked at,
    so that one more sweep is needed: a kept statement lost its last user, a local or temporary
    lost its last read (a store to it may have been kept), or an atomic lost its last user (its
    old value no longer counts as a read). Otherwise a sweep finds nothing: large kernels are
    mostly swept once instead of twice."""

    def __init__(self, uses: dict, read_vars: Counter, read_temps: Counter):
        self.uses, self.read_vars, self.read_temps = uses, read_vars, read_temps
        self.kept: set = set()
        self.left_dead = False

    def block(self, block: ir.Block) -> bool:
        changed = False
        keep = []
        for s in reversed(block.stmts):
            if s.BLOCKS:
                for b in reversed(s.blocks()):
                    changed |= self.block(b)
            if _is_dead(s, self.uses, self.read_vars, self.read_temps):
                changed = True
                self.release(s)
            else:
                keep.append(s)
                self.kept.add(s)
        keep.reverse()
        block.stmts = keep
        return changed

    def release(self, s: ir.Stmt) -> None:
        uses = self.uses
        for o in s.operands():
            uses[o] -= 1
            if not uses[o] and (o in self.kept or isinstance(o, _ATOMICS)):
                self.left_dead = True
        if isinstance(s, ir.LocalLoad):
            self.read_vars[s.var] -= 1
            self.left_dead |= not self.read_vars[s.var]
        elif isinstance(s, ir.TempLoad):
            self.read_temps[s.slot] -= 1
            self.left_dead |= not self.read_temps[s.slot]
        elif isinstance(s, ir.ComponentLoad):
            for var in s.components:
                self.read_vars[var] -= 1
                self.left_dead |= not self.read_vars[var]


_ATOMICS = (ir.LocalAtomic, ir.TempAtomic)


def _is_dead(s: ir.Stmt, uses: dict, read_vars: set, read_temps: set) -> bool:
    rule = _DEATH_RULES.get(s.__class__)
    if rule is None:
        rule = _DEATH_RULES[s.__class__] = _death_rule(s.__class__)
    unused_dies, kind = rule
    if unused_dies and not uses.get(s):
        return True
    if kind is None:
        return False
    if kind == "local_write":
        return not read_vars[s.var]
    if kind == "component_write":  # a write of one of the components, none of which is read
        return not any(read_vars[var] for var in s.components)
    if kind == "local_atomic":
        return not read_vars[s.var] and not uses.get(s)
    if kind == "temp_store":
        return not read_temps[s.slot]
    if kind == "temp_atomic":
        return not read_temps[s.slot] and not uses.get(s)
    if kind == "if":
        return not s.then_block.stmts and not s.else_block.stmts
    return not s.body.stmts  # a RangeFor: its bounds are pure values, the loop has no effect


def _death_rule(cls: type) -> tuple:
    """(whether a statement of class `cls` dies when unused, which of _is_dead's other rules
    applies to it): worked out once per class, _is_dead runs for every statement of every sweep."""
    unused_dies = bool(cls.PURE) or issubclass(cls, _LOADS) or issubclass(cls, ir.Alloca)
    kinds = (((ir.LocalStore, ir.LocalAccumulate), "local_write"), (ir.ComponentStore, "component_write"),
             (ir.LocalAtomic, "local_atomic"),
             (ir.TempStore, "temp_store"), (ir.TempAtomic, "temp_atomic"), (ir.If, "if"), (ir.RangeFor, "range_for"))
    return unused_dies, next((kind for c, kind in kinds if issubclass(cls, c)), None)


_DEATH_RULES: dict = {}


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
