"""Vector and matrix locals indexed at run time: local arrays, or their scalars' terms.

The front end makes `v[i]` (a run-time `i`) of a vector local of INDEXED_MIN_COMPONENTS or more
components a `ComponentLoad` of its scalar locals, and `v[i] = x` a `ComponentStore`
(ir/local_arrays.py). Two functions here give them their meaning in code:

`group_local_arrays`, the last pass of both pipelines, makes the scalars of each such local one
`LocalArray`: its accesses at a run-time index become an `ArrayLoad` / `ArrayStore` at that index,
its scalars' own loads and stores accesses at a constant index. A local whose scalars something
else uses (an adstack, a reduction's update, another vector's view of some of them) is expanded
instead, as autodiff expands it.

`expand_component_accesses` writes the accesses out on the scalars, as selects over the
components and a conditional store to each (the form every pass understands):
forward-mode and reverse-mode autodiff run it first, so that they transform scalars only and the
gradients are those of the scalar form, exactly; their kernels keep that form.

Out-of-range indices keep the expanded form's meaning, branch-free: a read clamps the index to
the last component (`i <u n ? i : n-1`: an unsigned compare, so negative indices too), a write
sends it to one element past the components that nothing reads (`i <u n ? i : n`), so no index
writes outside the array. With `debug=True` the front end has reported such an index already
(IndexError at the next sync); the access then does the same.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir

_UNSIGNED = {32: T.u32, 64: T.u64}


def group_local_arrays(k: ir.KernelIR) -> bool:
    changed = False
    for task in k.tasks:
        accesses = [s for s in ir.walk_nested(task) if isinstance(s, ir.COMPONENT_ACCESSES)]
        if accesses:
            _Rewriter(_arrayable(task, accesses)).blocks(task.blocks())
            changed = True
    return changed


def expand_component_accesses(k: ir.KernelIR) -> bool:
    """Write every ComponentLoad and ComponentStore of `k` out on its scalars."""
    rewriter = _Rewriter({})
    rewriter.blocks([k.body])
    ir.replace_in_task_bounds(k.body, rewriter.mapping)
    return rewriter.expanded


def _arrayable(task: ir.Task, accesses: list) -> dict:
    """The vector locals of `task` that become arrays: their components (a tuple) -> whether a
    write at a run-time index needs the element past them. Those whose scalars are used but by
    their own loads and stores and by accesses to the whole local are left out."""
    local_of: dict = {}  # a component's Alloca -> the components of its local
    refused = set()
    for s in accesses:
        components = tuple(s.components)
        for var in components:
            if local_of.setdefault(var, components) != components:
                refused.update((components, local_of[var]))
    for s in ir.walk_nested(task):
        plain = s.__class__ is ir.LocalLoad or s.__class__ is ir.LocalStore
        for o in s.operands():
            components = local_of.get(o)
            if components is not None and not (plain and o is s.var) and \
                    not (isinstance(s, ir.COMPONENT_ACCESSES) and tuple(s.components) == components):
                refused.add(components)
    arrays: dict = {}
    for components in dict.fromkeys(local_of.values()):  # in program order
        if components not in refused and len({v.block for v in components}) == 1:
            arrays[components] = False
    for s in accesses:
        if s.__class__ is ir.ComponentStore and s.index.__class__ is not ir.Const and tuple(s.components) in arrays:
            arrays[tuple(s.components)] = True
    return arrays


class _Rewriter:
    """Rewrites blocks in program order: the locals of `arrays` as LocalArrays, every other
    ComponentLoad and ComponentStore on its scalars."""

    def __init__(self, arrays: dict):
        self.sink = arrays  # components -> whether the array has the element for out-of-range writes
        self.position = {var: (components, p) for components in arrays for p, var in enumerate(components)}
        self.arrays: dict = {}  # components -> its LocalArray
        self.mapping: dict = {}
        self.expanded = False

    def blocks(self, blocks) -> None:
        for b in blocks:
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
            self.blocks(s.blocks())
            replaced = self.stmt(s, emit)
            if replaced is None:
                out.append(s)
            elif replaced is not s:
                self.mapping[s] = replaced
        b.stmts = out

    def stmt(self, s: ir.Stmt, emit):
        """None: `s` stays; `s`: it is gone; another statement: `s` is gone and that replaces it."""
        cls = s.__class__
        if cls is ir.Alloca or cls is ir.LocalLoad or cls is ir.LocalStore:
            at = self.position.get(s if cls is ir.Alloca else s.var)
            if at is None:
                return None
            components, p = at
            if cls is ir.Alloca:  # the array stands where the first of its scalars did
                if components not in self.arrays:
                    self.arrays[components] = emit(ir.LocalArray(s.type, len(components) + self.sink[components],
                                                                 s.var_name, s.loc))
                return s
            index = emit(ir.Const(p, T.i32, s.loc))
            if cls is ir.LocalLoad:
                return emit(ir.ArrayLoad(self.arrays[components], index, s.loc))
            emit(ir.ArrayStore(self.arrays[components], index, s.value, s.loc))
            return s
        if cls is ir.ComponentLoad or cls is ir.ComponentStore:
            components = tuple(s.components)
            if components not in self.sink:
                self.expanded = True
                return _expanded_load(s, emit) if cls is ir.ComponentLoad else _expanded_store(s, emit) or s
            array, n = self.arrays[components], len(components)
            if cls is ir.ComponentLoad:  # outside the components: the last one
                return emit(ir.ArrayLoad(array, _array_index(s.index, n, n - 1, s.loc, emit), s.loc))
            if s.index.__class__ is not ir.Const or 0 <= s.index.value < n:  # outside: the element past them
                emit(ir.ArrayStore(array, _array_index(s.index, n, n, s.loc, emit), s.value, s.loc))
            return s
        return None


def _array_index(index: ir.Stmt, n: int, outside: int, loc, emit) -> ir.Stmt:
    """`index` as an i32 element of an array: itself where it is in [0, n), else `outside`."""
    if index.__class__ is ir.Const:
        return emit(ir.Const(index.value if 0 <= index.value < n else outside, T.i32, loc))
    if index.type.bits < 32:
        index = emit(ir.Cast(index, T.i32, loc))
    t = index.type
    unsigned = _UNSIGNED[t.bits]
    as_unsigned = index if t is unsigned else emit(ir.Cast(index, unsigned, loc))
    inside = emit(ir.Binary("lt", as_unsigned, emit(ir.Const(n, unsigned, loc)), T.u1, loc))
    picked = emit(ir.Select(inside, index, emit(ir.Const(outside, t, loc)), loc))
    return picked if t is T.i32 else emit(ir.Cast(picked, T.i32, loc))


def _hit(s, k: int, emit) -> ir.Stmt:
    return emit(ir.Binary("eq", s.index, emit(ir.Const(k, s.index.type, s.loc)), T.u1, s.loc))


def _expanded_load(s: ir.ComponentLoad, emit) -> ir.Stmt:
    """select(i == 0, v0, select(i == 1, v1, ... v[n-1])): outside [0, n), the last component."""
    values = [emit(ir.LocalLoad(var, s.loc)) for var in s.components]
    result = values[-1]
    for k in reversed(range(len(values) - 1)):
        result = emit(ir.Select(_hit(s, k, emit), values[k], result, s.loc))
    return result


def _expanded_store(s: ir.ComponentStore, emit) -> None:
    """v_k = select(i == k, x, v_k) for every k: branch-free (a run of ifs on one index made LLVM's
    optimiser superlinear, minutes at 1024 components); outside [0, n), no component changes."""
    for k, var in enumerate(s.components):
        old = emit(ir.LocalLoad(var, s.loc))
        emit(ir.LocalStore(var, emit(ir.Select(_hit(s, k, emit), s.value, old, s.loc)), s.loc))
