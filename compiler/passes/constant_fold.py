"""Constant folding: an operation whose operands are all constants becomes a constant,
computed with the exact semantics the backends implement (wrap-around, Python // and %).
Algebraic identities that hold bit-exactly (`x - 0`, `x * 1`, `x | 0`, `select(true, a, b)`,
...) reduce to an existing operand; `x + 0.0` is not one of them (-0.0 + 0.0 is +0.0)."""
from __future__ import annotations

import math

import numpy as np

from qdc.runtime.contract import types as T

from .. import ir


def constant_fold(k: ir.KernelIR) -> bool:
    mapping: dict = {}
    changed = _fold_block(k.body, mapping)
    ir.replace_in_task_bounds(k.body, mapping)
    return changed


def _fold_block(block: ir.Block, mapping: dict) -> bool:
    changed = False
    keep = []
    for s in block.stmts:
        if mapping:  # empty until something folds (and in a round that changes nothing)
            s.replace_operands(mapping)
        if s.BLOCKS:
            for b in s.blocks():
                changed |= _fold_block(b, mapping)
        elif isinstance(s, _FOLDABLE) and _may_fold(s):  # the only classes _evaluate and _identity act on
            value = _evaluate(s)
            if value is not None:
                new = ir.Const(value, s.type, s.loc)
                new.block = block
                keep.append(new)
                mapping[s] = new
                changed = True
                continue
            same = _identity(s)
            if same is not None:
                mapping[s] = mapping.get(same, same)
                changed = True
                continue
        keep.append(s)
    block.stmts = keep
    return changed


_FOLDABLE = (ir.Cast, ir.Binary, ir.Unary, ir.Select)


def _may_fold(s) -> bool:
    """Whether _evaluate or _identity may act on `s`: a binary operation needs a constant
    operand or the same one twice (most of a kernel's have neither: they are not looked at)."""
    return not isinstance(s, ir.Binary) or isinstance(s.a, ir.Const) or isinstance(s.b, ir.Const) or s.a is s.b


def wrap(value, t: T.DataType):
    """Represent `value` as type `t` does (integers wrap, floats round to t's precision)."""
    if t is T.u1:
        return bool(value)
    if t.is_float:
        return float(np.array(value, dtype=t.np_dtype))
    value = int(value) & ((1 << t.bits) - 1)
    if t.kind == "int" and value >= 1 << (t.bits - 1):
        value -= 1 << t.bits
    return value


def convert(value, t: T.DataType):
    """`value` (a typed constant) converted to `t` as the backends convert at run time: integers
    wrap, floats saturate into integer types (truncating), None for a non-finite float -> integer."""
    if t.is_integral and t is not T.u1 and isinstance(value, float):
        if not math.isfinite(value):
            return None
        info = np.iinfo(t.np_dtype)
        value = min(max(math.trunc(value), info.min), info.max)  # saturating
    return wrap(value, t)


def _evaluate(s):
    if isinstance(s, ir.Cast) and isinstance(s.x, ir.Const):
        return convert(s.x.value, s.type)
    if isinstance(s, ir.Binary) and isinstance(s.a, ir.Const) and isinstance(s.b, ir.Const):
        return _binary(s.op, s.a.value, s.b.value, s.a.type, s.type)
    if isinstance(s, ir.Unary) and isinstance(s.x, ir.Const) and s.op in ("neg", "not", "bit_not", "abs"):
        x = s.x.value
        v = {"neg": lambda: -x, "not": lambda: not x, "bit_not": lambda: ~x, "abs": lambda: abs(x)}[s.op]()
        return wrap(v, s.type)
    return None


def _binary(op, a, b, t: T.DataType, rt: T.DataType):
    if op in ir.COMPARISONS:
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[op]
    if t.is_float:
        if op in ("add", "sub", "mul", "min", "max"):
            v = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                 "min": lambda: min(a, b), "max": lambda: max(a, b)}[op]()
            return wrap(v, t)
        return None  # division, pow and libm functions are left to the target's arithmetic
    if op in ("floordiv", "mod"):
        if b == 0:
            return 0
        return wrap(a // b if op == "floordiv" else a % b, t)
    if op in ("shl", "shr"):
        b &= t.bits - 1
        if op == "shr" and t.kind == "uint":
            return wrap((a & ((1 << t.bits) - 1)) >> b, t)
        return wrap(a << b if op == "shl" else a >> b, t)
    f = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "min": lambda: min(a, b),
         "max": lambda: max(a, b), "bit_and": lambda: a & b, "bit_or": lambda: a | b,
         "bit_xor": lambda: a ^ b}.get(op)
    return None if f is None else wrap(f(), t)


def _is_const(s, value) -> bool:
    if not isinstance(s, ir.Const) or s.value != value:
        return False
    return not isinstance(value, float) or math.copysign(1.0, s.value) > 0  # -0.0 is no identity


def _identity(s):
    """The operand `s` always equals, bit for bit, or None."""
    if isinstance(s, ir.Select):
        if isinstance(s.cond, ir.Const):
            return s.a if s.cond.value else s.b
        return s.a if s.a is s.b else None
    if isinstance(s, ir.Cast) and s.type is s.x.type:
        return s.x
    if not isinstance(s, ir.Binary) or s.op in ir.COMPARISONS:
        return None
    a, b, op = s.a, s.b, s.op
    if op in ("min", "max") and a is b:
        return a
    if not isinstance(a, ir.Const) and not isinstance(b, ir.Const):  # what follows needs a constant
        return None
    integral = s.type.is_integral
    if op == "sub" and _is_const(b, 0.0 if not integral else 0):
        return a
    if op == "mul" and _is_const(b, 1.0 if not integral else 1):
        return a
    if op == "mul" and _is_const(a, 1.0 if not integral else 1):
        return b
    if op == "truediv" and _is_const(b, 1.0):
        return a
    if integral and s.type is not T.u1:
        if op in ("add", "bit_or", "bit_xor", "shl", "shr") and _is_const(b, 0):
            return a
        if op in ("add", "bit_or", "bit_xor") and _is_const(a, 0):
            return b
        if op == "floordiv" and _is_const(b, 1):
            return a
    return None
