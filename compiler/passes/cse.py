"""Common-subexpression elimination of pure statements within their dominating scope.

A pure statement (see `Stmt.PURE`) equal to an earlier one — same class, type, attributes
and operands — that is visible at its position (earlier in the same block or in an
enclosing block) is replaced by the earlier one. Each task starts a fresh scope, and so do
its prologue, chunk blocks and body, which become separate functions.
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T

from .. import ir


def eliminate_common_subexpressions(k: ir.KernelIR) -> bool:
    mapping: dict = {}
    _cse_block(k.body, {}, mapping)
    ir.replace_in_task_bounds(k.body, mapping)
    return bool(mapping)


def _cse_block(b: ir.Block, available: dict, mapping: dict) -> None:
    """`available`: the pure statements visible at the block's start by key; what the block adds
    to it is taken out again when it ends (a key it adds is new: one already there is a match),
    rather than each nested block working on a copy of its enclosing blocks' keys."""
    added = []
    keep = []
    for s in b.stmts:
        if mapping:
            s.replace_operands(mapping)
        if not s.BLOCKS:
            pass
        elif isinstance(s, ir.Task):
            for child in s.blocks():
                _cse_block(child, {}, mapping)
        else:
            for child in s.blocks():
                _cse_block(child, available, mapping)
        if s.PURE:
            key = _key(s)
            if key in available:
                mapping[s] = available[key]
                continue
            available[key] = s
            added.append(key)
        keep.append(s)
    b.stmts = keep
    for key in added:
        del available[key]


def _key(s: ir.Stmt) -> tuple:
    return (s.__class__, s.type,
            tuple([a if a.__class__ in _AS_THEMSELVES else _attr_key(a) for a in map(s.__getattribute__, s.ATTRS)]),
            tuple(map(id, s.operands())))


# Attributes of these exact classes are their own key (most are: operator names, dtypes, slots),
# which spares _attr_key's checks for each of the hundreds of thousands of statements of a large
# kernel; subclasses (bool, numpy's float64) still go through them.
_AS_THEMSELVES = frozenset({str, int, type(None), T.DataType})


def _attr_key(a):
    if isinstance(a, ir.NdarrayRef):  # made afresh at every access: compare by what it names
        return ("ndarray", a.arg_index, a.is_grad)
    if isinstance(a, ir.FieldRef):
        return ("field", a.slot, a.is_grad)
    if isinstance(a, float):  # 0.0 == -0.0 in Python, but they are different constants
        return (a, math.copysign(1.0, a)) if not math.isnan(a) else ("nan", id(a))
    if isinstance(a, bool):  # True == 1 in Python
        return ("bool", a)
    return a
