"""Redundant global loads: a load of the same element (the same GlobalPtr statement, which CSE
has merged) as an earlier load in the same block, with nothing in between that may write that
field or ndarray, becomes the earlier load's value.

Vector code loads every component of an element wherever the element is named (`v[f, p]` in
each iteration of an unrolled loop), and every load left in a kernel that needs a gradient costs
its adjoint an atomic add; merging them makes the gradient as cheap as if it were read once.

Straight-line code only: knowledge does not enter nested blocks, a statement with blocks (an if,
a loop) between forgets every target written inside it, and a store or atomic forgets its target;
a write to any ndarray forgets every ndarray (two arguments may be one array); a barrier or
fence (`qd.simt`) forgets everything, other threads' writes being visible after it. Other parallel
iterations writing the element in between would be a race, as in Quadrants.
"""
from __future__ import annotations

from .. import ir

_WRITES = (ir.GlobalStore, ir.AtomicRMW)


def forward_global_loads(k: ir.KernelIR) -> bool:
    mapping: dict = {}
    _block(k.body, mapping)
    ir.replace_in_task_bounds(k.body, mapping)
    return bool(mapping)


def _block(b: ir.Block, mapping: dict) -> tuple[set, bool]:
    """Forward the loads of `b` (and of its nested blocks); returns what `b` may write (targets,
    nested blocks included) and whether it holds a barrier, which its parent block forgets."""
    known: dict = {}  # GlobalPtr -> the first load of it since its target was last written
    keep = []
    written, synced = set(), False
    for s in b.stmts:
        if mapping:
            s.replace_operands(mapping)
        if isinstance(s, ir.GlobalLoad):
            earlier = known.get(s.ptr)
            if earlier is not None:
                mapping[s] = earlier
                continue
            known[s.ptr] = s
        elif isinstance(s, _WRITES):
            target = _target(s.ptr.target)
            written.add(target)
            _forget(known, {target})
        elif isinstance(s, ir.SimtSync):  # other threads' writes become visible here
            known.clear()
            synced = True
        elif s.BLOCKS:
            inner_written, inner_synced = set(), False
            for child in s.blocks():
                w, y = _block(child, mapping)
                inner_written |= w
                inner_synced |= y
            _forget(known, inner_written)
            if inner_synced:
                known.clear()
            written |= inner_written
            synced |= inner_synced
        keep.append(s)
    b.stmts = keep
    return written, synced


def _target(ref) -> tuple:
    """What a write may change: a field's buffer (its slot), or every ndarray at once."""
    if isinstance(ref, ir.SharedRef):
        return ("shared", ref.uid)
    return ("field", ref.slot, ref.is_grad) if isinstance(ref, ir.FieldRef) else ("ndarray",)


def _forget(known: dict, written: set) -> None:
    if not written:
        return
    for ptr in [p for p in known if _target(p.target) in written]:
        del known[ptr]
