"""Typed value construction for the front end: weak literals, promotion, casts, operators.

Front-end values are either IR statements (run-time values, typed) or plain Python objects
(compile-time values: ints, floats and bools stay weakly typed until they meet a typed value).
"""
from __future__ import annotations

import math

from qdc.runtime import types as T

from .. import ir

_PY_NUMBER = (bool, int, float)


def is_number(v) -> bool:
    return isinstance(v, _PY_NUMBER) or (hasattr(v, "dtype") and getattr(v, "shape", None) == ()
                                         and not isinstance(v, ir.Stmt))


class ValueBuilder:
    """Appends typed statements through `emit` (supplied by the AST visitor)."""

    def __init__(self, emit, default_ip: T.DataType, default_fp: T.DataType, error):
        self.emit = emit
        self.default_ip, self.default_fp = default_ip, default_fp
        self.error = error  # error(message) -> raises at the node being visited

    # -- literals ----------------------------------------------------------------------
    def literal_type(self, v) -> T.DataType:
        if isinstance(v, bool):
            return T.u1
        if isinstance(v, int):
            if -2**31 <= v < 2**31 or self.default_ip.bits == 64:
                return self.default_ip
            if -2**63 <= v < 2**64:
                return T.i64 if v < 2**63 else T.u64
            self.error(f"integer literal {v} does not fit in 64 bits")
        if isinstance(v, float):
            return self.default_fp
        self.error(f"{type(v).__name__} value cannot be used in a kernel expression")

    def const(self, v, dtype: T.DataType) -> ir.Stmt:
        if dtype.is_float:
            v = float(v)
        elif dtype is T.u1:
            v = bool(v)
        else:
            if isinstance(v, float):
                if not math.isfinite(v):
                    self.error(f"cannot convert {v} to {dtype}")
                v = int(v)
            v = int(v)
            bits = dtype.bits
            v &= (1 << bits) - 1
            if dtype.kind == "int" and v >= 1 << (bits - 1):
                v -= 1 << bits
        return self.emit(ir.Const(v, dtype))

    def materialize(self, v, dtype: T.DataType | None = None) -> ir.Stmt:
        """A Python number becomes a Const (of `dtype` or its default type); a Stmt is cast to `dtype`."""
        if isinstance(v, ir.Stmt):
            return v if dtype is None else self.cast(v, dtype)
        if hasattr(v, "item") and not isinstance(v, _PY_NUMBER):
            v = v.item()
        if not isinstance(v, _PY_NUMBER):
            self.error(f"{type(v).__name__} value cannot be used as a kernel value")
        return self.const(v, dtype or self.literal_type(v))

    def cast(self, v, dtype: T.DataType) -> ir.Stmt:
        if not isinstance(v, ir.Stmt):
            return self.materialize(v, dtype)
        if v.type is dtype:
            return v
        if isinstance(v, ir.Const):
            return self.const(v.value, dtype)
        if dtype is T.u1:  # truthiness, as C and Python do
            return self.emit(ir.Binary("ne", v, self.const(0, v.type), T.u1))
        return self.emit(ir.Cast(v, dtype))

    def to_bool(self, v) -> ir.Stmt:
        return self.cast(v, T.u1)

    # -- typing of operands --------------------------------------------------------------
    def unify(self, a, b) -> tuple[ir.Stmt, ir.Stmt]:
        """Bring two operands to their common type; weak literals take the other side's type
        (a float literal next to an integer value promotes to default_fp)."""
        a_weak, b_weak = not isinstance(a, ir.Stmt), not isinstance(b, ir.Stmt)
        if a_weak and b_weak:
            ta, tb = self.literal_type(a), self.literal_type(b)
            t = T.promote(ta, tb)
            return self.materialize(a, t), self.materialize(b, t)
        if a_weak or b_weak:
            typed, weak = (b, a) if a_weak else (a, b)
            t = typed.type
            if isinstance(weak, float) and not t.is_float:
                t = self.default_fp
            if t is T.u1 and not isinstance(weak, bool):
                t = self.default_ip
            typed, weak = self.cast(typed, t), self.materialize(weak, t)
            return (weak, typed) if a_weak else (typed, weak)
        t = T.promote(a.type, b.type)
        return self.cast(a, t), self.cast(b, t)

    def float_type_of(self, v) -> T.DataType:
        t = v.type if isinstance(v, ir.Stmt) else self.literal_type(v)
        return t if t.is_float else self.default_fp

    # -- operators -------------------------------------------------------------------------
    def binary(self, op: str, a, b):
        if not isinstance(a, ir.Stmt) and not isinstance(b, ir.Stmt):
            return self.fold_python(op, a, b)
        if op == "truediv":
            t = T.promote(self.float_type_of(a), self.float_type_of(b))
            a, b = self.cast(a, t) if isinstance(a, ir.Stmt) else a, self.cast(b, t) if isinstance(b, ir.Stmt) else b
        if op == "pow" and not isinstance(b, ir.Stmt) and isinstance(b, int) and not isinstance(b, bool) and abs(b) <= 8:
            return self.int_power(a, b)
        if op == "atan2":
            t = T.promote(self.float_type_of(a), self.float_type_of(b))
            a, b = self.cast(a, t) if isinstance(a, ir.Stmt) else a, self.cast(b, t) if isinstance(b, ir.Stmt) else b
        a, b = self.unify(a, b)
        t = a.type
        if op in ("bit_and", "bit_or", "bit_xor", "shl", "shr") and t.is_float:
            self.error(f"bitwise operator needs integer operands, got {t}")
        if op in ("shl", "shr") and t is T.u1:
            a, b = self.cast(a, self.default_ip), self.cast(b, self.default_ip)
            t = self.default_ip
        if t is T.u1 and op in ("add", "sub", "mul", "floordiv", "mod", "pow", "neg"):
            a, b = self.cast(a, self.default_ip), self.cast(b, self.default_ip)
            t = self.default_ip
        rtype = T.u1 if op in ir.COMPARISONS else t
        return self.emit(ir.Binary(op, a, b, rtype))

    def int_power(self, a, n: int):
        """`x ** k` for a small constant integer k: exact repeated multiplication."""
        if isinstance(a, ir.Stmt) and a.type is T.u1:
            a = self.cast(a, self.default_ip)
        if n == 0:
            return self.materialize(1, a.type)
        if n < 0:
            if not a.type.is_float:
                a = self.cast(a, self.default_fp)
            return self.binary("truediv", 1.0, self.int_power(a, -n))
        result, base, k = None, a, n
        while k:
            if k & 1:
                result = base if result is None else self.emit(ir.Binary("mul", result, base, a.type))
            k >>= 1
            if k:
                base = self.emit(ir.Binary("mul", base, base, a.type))
        return result

    def fold_python(self, op, a, b):
        try:
            if op == "truediv":
                return a / b
            if op == "floordiv":
                return a // b
            if op == "mod":
                return a % b
            return {
                "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                "pow": lambda: a ** b, "min": lambda: min(a, b), "max": lambda: max(a, b),
                "bit_and": lambda: a & b, "bit_or": lambda: a | b, "bit_xor": lambda: a ^ b,
                "shl": lambda: a << b, "shr": lambda: a >> b, "atan2": lambda: math.atan2(a, b),
                "lt": lambda: a < b, "le": lambda: a <= b, "gt": lambda: a > b,
                "ge": lambda: a >= b, "eq": lambda: a == b, "ne": lambda: a != b,
            }[op]()
        except (ZeroDivisionError, TypeError, ValueError, OverflowError) as e:
            self.error(f"constant expression failed: {e}")

    def unary(self, op: str, x):
        if not isinstance(x, ir.Stmt):
            try:
                return {"neg": lambda: -x, "not": lambda: not x, "bit_not": lambda: ~x,
                        "abs": lambda: abs(x)}[op]()
            except KeyError:
                x = self.materialize(x, self.float_type_of(x))
            except TypeError as e:
                self.error(str(e))
        if op == "not":
            return self.emit(ir.Unary("not", self.to_bool(x), T.u1))
        if op == "bit_not":
            if x.type.is_float:
                self.error("~ needs an integer operand")
            return self.emit(ir.Unary(op, x, x.type))
        if op in ("neg", "abs"):
            if x.type is T.u1:
                x = self.cast(x, self.default_ip)
            return self.emit(ir.Unary(op, x, x.type))
        if op in ("floor", "ceil", "round") and not x.type.is_float:
            x = self.cast(x, self.default_fp)
        if not x.type.is_float:
            x = self.cast(x, self.default_fp)
        return self.emit(ir.Unary(op, x, x.type))

    def select(self, cond, a, b):
        cond = self.to_bool(cond)
        a, b = self.unify(a, b)
        return self.emit(ir.Select(cond, a, b))
