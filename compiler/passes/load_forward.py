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
    ir.replace_uses(k.body, mapping)
    return bool(mapping)


def _block(b: ir.Block, mapping: dict) -> None:
    known: dict = {}  # GlobalPtr -> the first load of it since its target was last written
    keep = []
    for s in b.stmts:
        s.replace_operands(mapping)
        if isinstance(s, ir.GlobalLoad):
            earlier = known.get(s.ptr)
            if earlier is not None:
                mapping[s] = earlier
                continue
            known[s.ptr] = s
        elif isinstance(s, _WRITES):
            _forget(known, {_target(s.ptr.target)})
        elif isinstance(s, ir.SimtSync):  # other threads' writes become visible here
            known.clear()
        elif s.blocks():
            for child in s.blocks():
                _block(child, mapping)
            _forget(known, {_target(w.ptr.target) for w in ir.walk_nested(s) if isinstance(w, _WRITES)})
            if any(isinstance(w, ir.SimtSync) for w in ir.walk_nested(s)):
                known.clear()
        keep.append(s)
    b.stmts = keep


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
