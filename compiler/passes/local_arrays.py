"""Vector and matrix locals indexed at run time, regrouped into local arrays (ir/local_arrays.py).

The front end keeps a vector local as one scalar local per component (frontend/vectors.py), and
lowers `v[i]` with a run-time `i` to a chain of selects over the components,

    select(i == 0, v0, select(i == 1, v1, ... v[n-1]))      (an index outside [0, n) reads v[n-1])

and `v[i] = x` to a conditional store to every component, `v_k = select(i == k, x, v_k)` (an
index outside [0, n) writes nothing). Every pass before this one, autodiff and its adstacks
included, sees scalars only, which keeps them simple and gradients exact; but a kernel that
indexes small matrices in loops (a collision narrow phase) becomes thousands of compares and
selects, which LLVM and GPU drivers spend seconds on and lavapipe runs every one of.

This pass runs last. It finds those two patterns in the simplified IR and replaces them with
one `ArrayLoad` / `ArrayStore` of a `LocalArray` that takes the place of the components:
- A select chain is such a read when its values are, at that point, what the components of
  one vector local hold (store forwarding has replaced the front end's loads by the values
  last stored, so this walks the task as store forwarding does, knowing what each component
  holds). Trailing components that hold the same value may have folded into the chain's last
  value: they must all hold it.
- The n conditional stores of one write (the same index and value, every component once, in
  one block) become one `ArrayStore` where the last of them stood, when nothing between the
  first and the last reads a component already written or holds control flow.
A local is regrouped when some access to it is one of those, it has at least MIN_COMPONENTS
components, and every other use of its components is a plain load or store (those become an
access at a constant index): a component that autodiff turned into an adstack, or a reduction
updates, keeps the local as scalars.

Out-of-range indices keep the select chain's meaning, branch-free: a read clamps the index to
the last element (`i <u n ? i : n-1`, an unsigned compare, so negative indices too), a write
sends it to one extra element past the local's components that nothing reads (`i <u n ? i : n`),
so no index writes outside the array. With `debug=True` the front end has already reported such
an index (IndexError at sync); the access then does the same.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir
from .dce import eliminate_dead_code

# Fewer components stay scalars: a chain of one or two selects costs no more than the index's
# clamp, and scalars stay in registers where an indexed array lives in memory.
MIN_COMPONENTS = 4

_UNSIGNED = {32: T.u32, 64: T.u64}


def group_local_arrays(k: ir.KernelIR) -> bool:
    changed = False
    for task in k.tasks:
        changed |= _regroup_task(task)
    if changed:
        eliminate_dead_code(k)  # the chains' selects and compares, and the loads feeding them
    return changed


def _regroup_task(task: ir.Task) -> bool:
    members = _component_locals(task)
    if not members:
        return False
    finder = _Finder(members)
    for b in task.blocks():
        finder.block(b, {})
    accessed = {g for g, _ in finder.reads.values()} | {w.group for w in finder.writes}
    chosen = _regroupable(task, members, accessed)
    if not chosen:
        return False
    merged = [w for w in finder.writes if w.group in chosen and _mergeable(w, members[w.group], finder.reads)]
    _Rewriter(members, chosen, finder.reads, merged).task(task)
    return True


def _component_locals(task: ir.Task) -> dict:
    """Vector locals of the task, group -> its component locals by position, for the groups
    whose every component is an Alloca of the task, all in one block, each once."""
    found: dict = {}
    for s in ir.walk_nested(task):
        if s.__class__ is ir.Alloca and s.component_of is not None:
            group, position = s.component_of
            found.setdefault(group, {}).setdefault(position, []).append(s)
    members = {}
    for group, by_position in found.items():
        if len(by_position) != group.size or any(len(v) != 1 for v in by_position.values()):
            continue
        order = [by_position[p][0] for p in range(group.size)]
        if len({v.block for v in order}) == 1 and order[0].type is not None and len({v.type for v in order}) == 1:
            members[group] = order
    return members


def _regroupable(task: ir.Task, members: dict, accessed: set) -> set:
    """The accessed groups of MIN_COMPONENTS or more whose components nothing uses but plain
    loads and stores."""
    candidates = {g for g in accessed if g.size >= MIN_COMPONENTS}
    if not candidates:
        return set()
    group_of = {v: g for g in candidates for v in members[g]}
    for s in ir.walk_nested(task):
        plain = s.__class__ is ir.LocalLoad or s.__class__ is ir.LocalStore
        for o in s.operands():
            g = group_of.get(o)
            if g is not None and not (plain and o is s.var):
                candidates.discard(g)
    return candidates


def _eq_index(cond, k: int):
    """`i` where `cond` is `i == k` (k a constant), else None."""
    if cond.__class__ is not ir.Binary or cond.op != "eq":
        return None
    a, b = cond.a, cond.b
    if b.__class__ is ir.Const and a.__class__ is not ir.Const:
        const, index = b, a
    elif a.__class__ is ir.Const and b.__class__ is not ir.Const:
        const, index = a, b
    else:
        return None
    if not index.type.is_integral or index.type is T.u1 or const.value != k:
        return None
    return index


class _Write:
    """The conditional stores of one `v[index] = value`, by position, in `block`."""
    __slots__ = ("group", "index", "value", "stores", "block")

    def __init__(self, group, index, value, stores: dict, block: ir.Block):
        self.group, self.index, self.value, self.stores, self.block = group, index, value, stores, block


class _Finder:
    """Walks a task in program order knowing, as store forwarding does, what each component
    local holds; collects the select chains that read a vector local (`reads`: root select ->
    (group, index)) and the complete sets of conditional stores that write one (`writes`)."""

    def __init__(self, members: dict):
        self.members = members
        self.heads = {order[0]: g for g, order in members.items()}
        self.same: dict = {}  # a load -> the value its local was known to hold
        self.reads: dict = {}
        self.writes: list = []
        self.written: dict = {}  # statement with blocks -> component locals written inside it

    def block(self, b: ir.Block, known: dict) -> None:
        known = dict(known)
        open_writes: dict = {}  # (group, index, value) -> {position: store}
        for s in b.stmts:
            cls = s.__class__
            if cls is ir.LocalLoad:
                if s.var.component_of is not None:
                    held = known.get(s.var)
                    if held is None:
                        known[s.var] = s
                    else:
                        self.same[s] = held
            elif cls is ir.LocalStore:
                if s.var.component_of is not None:
                    self.conditional_store(s, known, open_writes, b)
                    known[s.var] = s.value
            elif cls is ir.Select:
                self.chain(s, known)
            elif cls is ir.LocalAccumulate or cls is ir.LocalAtomic:
                known.pop(s.var, None)
            elif s.BLOCKS:
                written = self.locals_written(s)
                inner = known
                if isinstance(s, (ir.RangeFor, ir.While)):
                    inner = {v: value for v, value in known.items() if v not in written}
                for child in s.blocks():
                    self.block(child, inner)
                for v in written:
                    known.pop(v, None)

    def holds(self, known: dict, var, value) -> bool:
        held = known.get(var)
        return held is not None and self.same.get(held, held) is self.same.get(value, value)

    def chain(self, root: ir.Select, known: dict) -> None:
        index = _eq_index(root.cond, 0)
        if index is None or not known:
            return
        values, node = [], root
        while True:
            values.append(node.a)
            node = node.b
            if node.__class__ is not ir.Select or _eq_index(node.cond, len(values)) is not index:
                break
        for head, group in self.heads.items():
            if group.size <= len(values) or not self.holds(known, head, values[0]):
                continue
            order = self.members[group]
            if order[0].type is root.type and \
                    all(self.holds(known, order[p], values[p]) for p in range(1, len(values))) and \
                    all(self.holds(known, order[p], node) for p in range(len(values), group.size)):
                self.reads[root] = (group, index)
                return

    def conditional_store(self, s: ir.LocalStore, known: dict, open_writes: dict, b: ir.Block) -> None:
        """`v_k = select(i == k, x, v_k)`: one of the stores of `v[i] = x`."""
        group, position = s.var.component_of
        value = s.value
        if group not in self.members or value.__class__ is not ir.Select:
            return
        index = _eq_index(value.cond, position)
        if index is None or not self.holds(known, s.var, value.b):
            return
        key = (group, index, value.a)
        stores = open_writes.get(key)
        if stores is None or position in stores:  # a write begins
            stores = open_writes[key] = {}
        stores[position] = s
        if len(stores) == group.size:
            del open_writes[key]
            self.writes.append(_Write(group, index, value.a, stores, b))

    def locals_written(self, s: ir.Stmt) -> set:
        got = self.written.get(s)
        if got is None:
            got = set()
            for child in s.blocks():
                for d in child.stmts:
                    if isinstance(d, (ir.LocalStore, ir.LocalAccumulate, ir.LocalAtomic)):
                        got.add(d.var)
                    elif d.BLOCKS:
                        got |= self.locals_written(d)
            self.written[s] = got
        return got


def _mergeable(w: _Write, components: list, reads: dict) -> bool:
    """Whether the stores of `w` may become one store where the last stands: between the first
    and the last, no control flow, and no read of the local but of components not yet written."""
    stores = set(w.stores.values())
    at = {s: i for i, s in enumerate(w.block.stmts) if s in stores}
    first, last = min(at.values()), max(at.values())
    mine, done = set(components), set()
    for s in w.block.stmts[first:last + 1]:
        if s in stores:
            done.add(s.var)
            continue
        if s.BLOCKS or isinstance(s, (ir.Break, ir.Continue)) or reads.get(s, (None,))[0] is w.group:
            return False
        for o in s.operands():
            if o in mine and (s.__class__ is not ir.LocalLoad or o in done):
                return False
    return True


class _Rewriter:
    def __init__(self, members: dict, chosen: set, reads: dict, merged: list):
        self.reads = {root: gi for root, gi in reads.items() if gi[0] in chosen}
        self.component = {v: (g, p) for g in chosen for p, v in enumerate(members[g])}
        self.first = {members[g][0]: g for g in chosen}
        self.sink = {w.group for w in merged}  # groups with an element for out-of-range writes
        self.merged_last, self.merged_rest = {}, set()
        for w in merged:
            order = sorted(w.stores.values(), key=w.block.stmts.index)
            self.merged_last[order[-1]] = w
            self.merged_rest.update(order[:-1])
        self.arrays: dict = {}  # group -> its LocalArray
        self.mapping: dict = {}

    def resolve(self, v: ir.Stmt) -> ir.Stmt:
        return self.mapping.get(v, v)

    def task(self, task: ir.Task) -> None:
        for b in task.blocks():
            self.block(b)

    def block(self, b: ir.Block) -> None:
        out: list = []

        def emit(s):
            s.block = b
            out.append(s)
            return s

        for s in b.stmts:
            if self.mapping:
                s.replace_operands(self.mapping)
            for child in s.blocks():
                self.block(child)
            cls = s.__class__
            if cls is ir.Alloca and s in self.component:
                group = self.first.get(s)
                if group is not None:
                    length = group.size + (group in self.sink)
                    self.arrays[group] = emit(ir.LocalArray(s.type, length, s.var_name, s.loc))
                continue
            if cls is ir.LocalLoad and s.var in self.component:
                group, position = self.component[s.var]
                position_const = emit(ir.Const(position, T.i32, s.loc))
                self.mapping[s] = emit(ir.ArrayLoad(self.arrays[group], position_const, s.loc))
                continue
            if cls is ir.LocalStore and s.var in self.component:
                if s in self.merged_rest:
                    continue
                group, position = self.component[s.var]
                w = self.merged_last.get(s)
                if w is None:
                    at, value = emit(ir.Const(position, T.i32, s.loc)), s.value
                else:  # v[i] = x: i outside the components writes the extra element
                    at = _clamped(emit, self.resolve(w.index), group.size, group.size, s.loc)
                    value = self.resolve(w.value)
                emit(ir.ArrayStore(self.arrays[group], at, value, s.loc))
                continue
            read = self.reads.get(s)
            if read is not None:  # v[i]: i outside the components reads the last one
                group, index = read
                at = _clamped(emit, self.resolve(index), group.size, group.size - 1, s.loc)
                self.mapping[s] = emit(ir.ArrayLoad(self.arrays[group], at, s.loc))
                continue
            out.append(s)
        b.stmts = out


def _clamped(emit, index: ir.Stmt, n: int, outside: int, loc) -> ir.Stmt:
    """`index` as an i32 in [0, n], `outside` where it is not in [0, n) (an unsigned compare)."""
    if index.type.bits < 32:
        index = emit(ir.Cast(index, T.i32, loc))
    t = index.type
    unsigned = _UNSIGNED[t.bits]
    as_unsigned = index if t is unsigned else emit(ir.Cast(index, unsigned, loc))
    inside = emit(ir.Binary("lt", as_unsigned, emit(ir.Const(n, unsigned, loc)), T.u1, loc))
    picked = emit(ir.Select(inside, index, emit(ir.Const(outside, t, loc)), loc))
    return picked if t is T.i32 else emit(ir.Cast(picked, T.i32, loc))
