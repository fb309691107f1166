"""Row structure for multi-dimensional range-for tasks: no division per iteration.

The front end flattens `for i, j in qd.ndrange(h, w)` (and struct-fors over 2-D and higher
fields and ndarrays) into one index k over [0, h*w) and recovers the coordinates with
`k % w` and `k // w` (deeper dimensions repeat this on the quotient). An integer division
per element costs more than the body of a stencil, and it hides from the backend that
consecutive indices walk a row. This pass recognises that decomposition and records it on
the task instead: the extents move to `chunk_init` (`Task.axes`) and the body reads the
coordinates as `Task.axis_index`, which a backend may produce however suits it (the CPU walks
each chunk row by row; a GPU may divide once per thread).

Only tasks the front end flattened (`Task.ndim` >= 2) are considered, so a user's own
`i // w` in a 1-D loop is left alone; there the divisor need not be positive. It runs last,
on forward kernels: the reverse-mode passes see the plain form.
"""
from __future__ import annotations

from .. import ir
from .dce import eliminate_dead_code
from .reductions import hoist, is_invariant


def split_task_index(k: ir.KernelIR) -> bool:
    changed = False
    for t in k.tasks:
        if t.kind == "range_for" and t.ndim >= 2 and not t.axis_index:
            changed |= _split(t)
    if changed:  # the divisions and remainders the coordinates replace
        eliminate_dead_code(k)
    return changed


def _split(t: ir.Task) -> bool:
    written_temps = {s.slot for s in ir.walk(t.body) if isinstance(s, (ir.TempStore, ir.TempAtomic))}
    levels = []  # innermost first: (extent, remainder stmt or None, quotient stmt or None)
    value = t.index
    while value is not None and len(levels) < t.ndim - 1:
        level = _divided_by_one_extent(t.body, value)
        if level is None or not is_invariant(level[0], written_temps):
            break
        levels.append(level)
        value = level[2]
    if not levels:
        return False
    hoisted: dict = {}
    t.axes = [hoist(extent, t.chunk_init, hoisted) for extent, _, _ in reversed(levels)]
    t.axis_index = [ir.LoopIndex(t, t.index.type) for _ in range(len(levels) + 1)]
    mapping = {}
    for depth, (_, remainder, _) in enumerate(levels):
        if remainder is not None:
            mapping[remainder] = t.axis_index[len(levels) - depth]
    if levels[-1][2] is not None:
        mapping[levels[-1][2]] = t.axis_index[0]
    ir.replace_uses(t.body, mapping)
    return True


def _divided_by_one_extent(body: ir.Block, value: ir.Stmt):
    """(extent, value % extent, value // extent) when the top level of `body` divides `value`
    by a single extent of the index type (either statement may be absent), else None."""
    found = {"mod": [], "floordiv": []}
    for s in body.stmts:
        if isinstance(s, ir.Binary) and s.op in found and s.a is value:
            found[s.op].append(s)
    uses = found["mod"] + found["floordiv"]
    if not uses or len(found["mod"]) > 1 or len(found["floordiv"]) > 1:
        return None
    extent = uses[0].b
    if any(not _same_value(u.b, extent) for u in uses) or extent.type is not value.type:
        return None
    return (extent, found["mod"][0] if found["mod"] else None,
            found["floordiv"][0] if found["floordiv"] else None)


def _same_value(a: ir.Stmt, b: ir.Stmt) -> bool:
    return a is b or (isinstance(a, ir.Const) and isinstance(b, ir.Const) and a.value == b.value
                      and a.type is b.type)
