"""Offloading: split a kernel's top level into tasks, the unit every backend launches.

Each top-level `RangeFor` becomes a range-for task (parallel unless serialized); each maximal
run of other top-level statements becomes a serial task. Values that cross from one task to a
later one travel through kernel temporaries (`TempStore`/`TempLoad`), except cheap expressions
of launch-time data (constants, arguments, shapes, and loads right before the loop), which are
recomputed in the consuming task so range bounds stay expressible in launch metadata.

A `LocalAtomic` (the front end's `s += v` on a kernel-scope local inside a parallel loop)
becomes a `TempAtomic` on the local's temporary, so that the iterations' updates do not race;
one on a local that stays private to a task is a plain read-modify-write.
"""
from __future__ import annotations

import linecache

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir
from .dce import eliminate_dead_code

_RECOMPUTABLE = (ir.Const, ir.ArgLoad, ir.NdarrayShape, ir.Unary, ir.Binary, ir.Cast, ir.Select, ir.GlobalPtr)


_BINARY_OF_ATOMIC = {"add": "add", "sub": "sub", "mul": "mul", "min": "min", "max": "max",
                     "and": "bit_and", "or": "bit_or", "xor": "bit_xor"}


def offload(k: ir.KernelIR) -> bool:
    chains = _flatten_graph_loops(k)
    _promote_shared_allocas(k, chains)
    _lower_private_local_atomics(k)
    groups = _group_top_level(k.body.stmts, chains)
    owner = _owners(groups)
    temp_of: dict = {}  # value -> the temporary it was passed through
    tasks = [_make_task(k, groups, owner, temp_of, gi) for gi in range(len(groups))]
    for t, g in zip(tasks, groups):
        t.graph_loops = chains.get(g[0], ())
    k.body = ir.Block()
    for t in tasks:
        k.body.append(t)
    eliminate_dead_code(k)
    k.body.stmts = [t for t in k.body.stmts if t.body.stmts]
    for i, t in enumerate(k.body.stmts):
        t.task_name = f"{k.symbol}_t{i}_{t.label or t.source_kind}"
    return True


def _make_task(k: ir.KernelIR, groups, owner, temp_of, gi: int) -> ir.Task:
    g = groups[gi]
    # The prologue and the body are compiled apart (the body may be a separate function run
    # by many threads), so each gets its own copies of imported values.
    importer = _Importer(k, groups, owner, temp_of, gi, reload_memory=False)
    if isinstance(g[0], ir.RangeFor):
        loop = g[0]
        t = ir.Task("range_for", loop.loc)
        t.serial, t.source_kind, t.ndim, t.block_dim = loop.serial, loop.kind, loop.ndim, loop.block_dim
        t.max_threads, t.label = loop.max_threads, loop.label
        bounds = _Importer(k, groups, owner, temp_of, gi, reload_memory=True)
        t.begin = bounds.value(loop.begin, t.prologue)
        t.end = bounds.value(loop.end, t.prologue)
        t.index = ir.LoopIndex(t, loop.index.type)
        importer.mapping[loop.index] = t.index
        body = list(loop.body.stmts)
    else:
        t = ir.Task("serial", g[0].loc)
        body = list(g)
    for s in body:
        importer.operands_of(s, t.body)
    for s in body:
        t.body.append(s)
    for s in ir.walk(t.body):
        s.replace_operands(importer.mapping)
    return t


def _group_top_level(stmts, chains: dict) -> list[list[ir.Stmt]]:
    """Each top-level loop a group, each run of other statements one, a run broken where the
    qd.graph.do_while loops around the statements change (`chains`)."""
    groups: list[list[ir.Stmt]] = []
    for s in stmts:
        if isinstance(s, ir.RangeFor) or not groups or isinstance(groups[-1][0], ir.RangeFor) \
                or chains.get(s, ()) != chains.get(groups[-1][0], ()):
            groups.append([s])
        else:
            groups[-1].append(s)
    return groups


def _flatten_graph_loops(k: ir.KernelIR) -> dict:
    """Top-level `GraphDoWhile`s replaced by their bodies' statements, in order; returns the
    loops around each such statement (ids into `k.graph_loops`, outermost first). The runtime
    replays the tasks of a loop's statements while its flag holds."""
    chains: dict = {}

    def flatten(stmts, chain) -> list:
        out = []
        for s in stmts:
            if isinstance(s, ir.GraphDoWhile):
                k.graph_loops.append(s.flag)
                out += flatten(s.body.stmts, chain + (len(k.graph_loops) - 1,))
                continue
            if chain:
                chains[s] = chain
            out.append(s)
        return out
    if any(isinstance(s, ir.GraphDoWhile) for s in k.body.stmts):
        k.body = ir.Block(flatten(k.body.stmts, ()))
    return chains


def _owners(groups) -> dict:
    owner = {}
    for gi, g in enumerate(groups):
        for s in g:
            owner[s] = gi
            for d in ir.walk_nested(s):
                owner[d] = gi
            if isinstance(s, ir.RangeFor):
                owner[s.index] = gi
    return owner


def _promote_shared_allocas(k: ir.KernelIR, chains: dict) -> None:
    """A top-level local touched by several tasks becomes a kernel temporary."""
    owner = _owners(_group_top_level(k.body.stmts, chains))
    users: dict = {}
    for s in ir.walk(k.body):
        if isinstance(s, (ir.LocalLoad, ir.LocalStore, ir.LocalAtomic)) and s.var.block is k.body:
            users.setdefault(s.var, set()).add(owner[s])
    slots = {}
    for var, gs in users.items():
        if gs - {owner[var]}:
            slots[var] = k.num_temps
            k.num_temps += 1
            k.temp_types.append(var.type)
    if not slots:
        return
    mapping = {}
    for block in [k.body] + [b for s in ir.walk(k.body) for b in s.blocks()]:
        for i, s in enumerate(block.stmts):
            if isinstance(s, ir.LocalLoad) and s.var in slots:
                new = ir.TempLoad(slots[s.var], s.type, s.loc)
            elif isinstance(s, ir.LocalStore) and s.var in slots:
                new = ir.TempStore(slots[s.var], s.value, s.loc)
            elif isinstance(s, ir.LocalAtomic) and s.var in slots:
                new = ir.TempAtomic(s.op, slots[s.var], s.value, s.loc)
            else:
                continue
            new.block = block
            block.stmts[i] = new
            mapping[s] = new
    for s in ir.walk(k.body):
        s.replace_operands(mapping)
    k.body.stmts = [s for s in k.body.stmts if s not in slots]


def _lower_private_local_atomics(k: ir.KernelIR) -> None:
    """A `LocalAtomic` whose local was not promoted is seen by one thread only (the local is
    declared in the same task): `var = op(var, value)`, returning the old value. One on a
    kernel-scope local inside a parallel loop must have become a `TempAtomic`: lowering it
    here would race, so it is an error (a compiler bug, reported at the user's line)."""
    for loop in (s for s in k.body.stmts if isinstance(s, ir.RangeFor) and not s.serial):
        for s in ir.walk_nested(loop):
            if isinstance(s, ir.LocalAtomic) and s.var.block is k.body:
                raise _located(s.loc, f"internal error: the update of '{s.var.var_name}' in this parallel "
                                      f"loop could not be made atomic")
    for block in [k.body] + [b for s in ir.walk(k.body) for b in s.blocks()]:
        for s in [s for s in block.stmts if isinstance(s, ir.LocalAtomic)]:
            old = ir.LocalLoad(s.var, s.loc)
            new = ir.Binary(_BINARY_OF_ATOMIC[s.op], old, s.value, s.type, s.loc)
            store = ir.LocalStore(s.var, new, s.loc)
            at = block.stmts.index(s)
            block.stmts[at:at + 1] = [old, new, store]
            for n in (old, new, store):
                n.block = block
            s.block = None
            ir.replace_uses(k.body, {s: old})


def _located(loc: ir.SourceLoc | None, message: str) -> QdcCompileError:
    if loc is None:
        return QdcCompileError(message)
    return QdcCompileError(message, loc.filename, loc.line, loc.col, linecache.getline(loc.filename, loc.line) or None)


class _Importer:
    """Makes values defined by earlier groups available to group `gi`. `reload_memory`: the
    destination runs before anything of group `gi` (a prologue), so a global load of the
    previous group may be repeated there instead of passing through a temporary."""

    def __init__(self, k, groups, owner, temp_of, gi, reload_memory: bool):
        self.k, self.groups, self.owner, self.temp_of, self.gi = k, groups, owner, temp_of, gi
        self.reload_memory = reload_memory
        self.mapping: dict = {}

    def operands_of(self, s, dest: ir.Block):
        for d in [s, *ir.walk_nested(s)]:
            for o in d.operands():
                if self.owner.get(o, self.gi) != self.gi:
                    self.value(o, dest)

    def value(self, v, dest: ir.Block):
        if v in self.mapping:
            return self.mapping[v]
        src = self.owner.get(v)
        if src is None or src == self.gi:
            return v
        if self.recomputable(v, src):
            for o in v.operands():
                self.value(o, dest)
            new = ir.clone_stmt(v, self.mapping)
            dest.append(new)
            self.owner[new] = self.gi
            return new
        slot = self.temp_of.get(v)
        if slot is None:
            slot = self.temp_of[v] = self.pass_through_temp(v, src)
        load = dest.append(ir.TempLoad(slot, v.type, v.loc))
        self.owner[load] = self.gi
        self.mapping[v] = load
        return load

    def pass_through_temp(self, v, src) -> int:
        """Store `v` into a new temporary right after its definition; returns the slot."""
        slot = self.k.num_temps
        self.k.num_temps += 1
        self.k.temp_types.append(v.type)
        store = ir.TempStore(slot, v, v.loc)
        blk = v.block
        blk.stmts.insert(blk.stmts.index(v) + 1, store)
        store.block = blk
        if blk.parent is None:  # top level: keep the group list in step
            g = self.groups[src]
            g.insert(g.index(v) + 1, store)
        self.owner[store] = src
        return slot

    def recomputable(self, v, src) -> bool:
        if isinstance(v, ir.GlobalLoad):
            # Repeat a load only if nothing after it, before the consumer, can change memory.
            g = self.groups[src]
            if not self.reload_memory or src != self.gi - 1 or v not in g:
                return False
            after = g[g.index(v) + 1:]
            if any(not (s.PURE or isinstance(s, (ir.GlobalLoad, ir.LocalLoad, ir.Alloca, ir.LocalStore)))
                   for s in after):
                return False
        elif not isinstance(v, _RECOMPUTABLE):
            return False
        return all(self.recomputable(o, self.owner.get(o, src)) for o in v.operands())
