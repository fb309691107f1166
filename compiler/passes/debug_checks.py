"""Debug-mode arithmetic checks (`debug=True`), inserted into the front end's output.

After every integer `+ - * <<` the result is checked for overflow (wrapped two's-complement
arithmetic, as every backend computes it); an overflow appends an "overflow" message
("Addition overflow detected", ...) to the print buffer and execution goes on, as Quadrants
does. Before every integer `**` a negative exponent appends an "assert" message, which
raises at sync. Without debug this pass never runs, so the code is exactly as before.
"""
from __future__ import annotations

import linecache

from qdc.runtime.contract import types as T

from .. import ir

OVERFLOW_MESSAGES = {
    "add": "Addition overflow detected",
    "sub": "Subtraction overflow detected",
    "mul": "Multiplication overflow detected",
    "shl": "Shift left overflow detected",
}
NEGATIVE_POWER = "Negative exponent in pow(int, int) is not allowed."


def insert_debug_checks(k: ir.KernelIR) -> None:
    """Add the checks to every integer add, sub, mul, shl and pow of `k`."""
    for s in list(ir.walk(k.body)):
        if not isinstance(s, ir.Binary) or not s.a.type.is_integral or s.a.type is T.u1:
            continue
        if s.op in OVERFLOW_MESSAGES:
            _Check(k, s, after=True).report_if(_overflowed, "overflow", OVERFLOW_MESSAGES[s.op])
        elif s.op == "pow":
            _Check(k, s, after=False).report_if(_negative_exponent, "assert", NEGATIVE_POWER)


class _Check:
    """Emits statements next to `anchor` (after it, or before it), located at its source."""

    def __init__(self, k: ir.KernelIR, anchor: ir.Binary, after: bool):
        self.k, self.anchor, self.after = k, anchor, after
        self.t = anchor.a.type
        self.block, self.position = anchor.block, anchor.block.stmts.index(anchor) + (1 if after else 0)

    def emit(self, s: ir.Stmt) -> ir.Stmt:
        s.loc = self.anchor.loc
        s.block = self.block
        self.block.stmts.insert(self.position, s)
        self.position += 1
        return s

    def const(self, value, t: T.DataType | None = None) -> ir.Stmt:
        return self.emit(ir.Const(value, t or self.t))

    def binary(self, op: str, a: ir.Stmt, b: ir.Stmt) -> ir.Stmt:
        return self.emit(ir.Binary(op, a, b, T.u1 if op in ir.COMPARISONS else a.type))

    def select(self, cond: ir.Stmt, a: ir.Stmt, b: ir.Stmt) -> ir.Stmt:
        return self.emit(ir.Select(cond, a, b))

    def report_if(self, condition, kind: str, text: str) -> None:
        failed = self.emit(ir.If(condition(self)))
        loc = self.anchor.loc
        where, source = (str(loc), linecache.getline(loc.filename, loc.line).rstrip("\n")) if loc else ("", "")
        self.k.messages.append([kind, [text], [], [], where, source])
        message = ir.DebugMessage(len(self.k.messages) - 1, [], loc)
        failed.then_block.append(message)


def _overflowed(c: _Check) -> ir.Stmt:
    """Whether the anchor's wrapped result differs from the exact one (u1)."""
    s, t = c.anchor, c.t
    a, b, r = s.a, s.b, s
    signed = t.kind == "int"
    zero = c.const(0)
    if s.op == "add":  # signed: the result's sign differs from both operands'; unsigned: it wrapped below a
        if signed:
            return c.binary("lt", c.binary("bit_and", c.binary("bit_xor", a, r), c.binary("bit_xor", b, r)), zero)
        return c.binary("lt", r, a)
    if s.op == "sub":  # signed: operands of different signs and the result's sign not a's; unsigned: a < b
        if signed:
            return c.binary("lt", c.binary("bit_and", c.binary("bit_xor", a, b), c.binary("bit_xor", a, r)), zero)
        return c.binary("lt", a, b)
    if s.op == "shl":  # shifting back loses bits that were shifted out (or flips the sign)
        return c.binary("ne", c.binary("shr", r, b), a)
    # mul: r / a == b unless it wrapped; a divisor of 0 (never overflows) or -1 (MIN / -1 traps) is replaced
    a_is_zero = c.binary("eq", a, zero)
    special = a_is_zero
    if signed:
        a_is_minus_one = c.binary("eq", a, c.const(-1))
        special = c.binary("bit_or", a_is_zero, a_is_minus_one)
    wrapped = c.binary("ne", c.binary("floordiv", r, c.select(special, c.const(1), a)), b)
    wrapped = c.select(a_is_zero, c.const(False, T.u1), wrapped)
    if not signed:
        return wrapped
    return c.select(a_is_minus_one, c.binary("eq", b, c.const(-(1 << (t.bits - 1)))), wrapped)


def _negative_exponent(c: _Check) -> ir.Stmt:
    return c.binary("lt", c.anchor.b, c.const(0))
