"""Typed value construction for the front end: weak literals, promotion, casts, operators.

Front-end values are either IR statements (run-time values, typed) or plain Python numbers
(compile-time values: ints, floats and bools stay weakly typed until they meet a typed value,
as in Quadrants/Taichi). Operations on two compile-time numbers are folded in Python.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from qdc.runtime.contract import types as T

from .. import ir
from ..language import lang
from ..passes.constant_fold import convert
from .objects import RangeSpec

_PY_NUMBER = (bool, int, float)
_MATH_FOLD = {
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos,
    "atan": math.atan, "tanh": math.tanh, "exp": math.exp, "log": math.log, "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x), "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)), "round": lambda x: float(round(x)),  # round: half to even
}
_PY_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "pow": lambda a, b: a ** b, "min": min, "max": max,
    "bit_and": lambda a, b: a & b, "bit_or": lambda a, b: a | b, "bit_xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b, "atan2": math.atan2,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
}
_BITWISE = ("bit_and", "bit_or", "bit_xor", "shl", "shr")
_ARITHMETIC = ("add", "sub", "mul", "floordiv", "mod", "pow", "min", "max")
_LARGEST_CONST_POWER = 8  # `x ** k` for |k| <= this is exact repeated multiplication


def is_number(v) -> bool:
    """A compile-time scalar: a Python number or a numpy scalar."""
    return isinstance(v, (*_PY_NUMBER, np.generic)) and not isinstance(v, (np.str_, np.bytes_))


def is_runtime(v) -> bool:
    return isinstance(v, ir.Stmt)


def holds_runtime(v) -> bool:
    """A run-time value, or a tuple or list holding one (at any depth)."""
    if isinstance(v, (tuple, list)):
        return any(holds_runtime(e) for e in v)
    return is_runtime(v)


def _range_hint(t: T.DataType) -> str:
    lo, hi = (0, (1 << t.bits) - 1) if t.kind == "uint" else (-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1)
    return f" (its range is {lo} to {hi})"


def not_a_value_message(v) -> str:
    """Why the compile-time object `v` cannot be used where a number or run-time value is needed."""
    if isinstance(v, (str, bytes)):
        return "a string is not a kernel value (strings exist only at compile time, e.g. in qd.static(...))"
    if isinstance(v, (RangeSpec, lang.ndrange)):
        return "range() and qd.ndrange() can only be the iterable of a for loop"
    return f"{type(v).__name__} value cannot be used as a kernel value"


def short_number(v) -> str:
    """`v` for an error message: a huge integer is abbreviated to its first digits and length."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text.lstrip('-'))} digits)"


def fits(value: int, t: T.DataType) -> bool:
    if t is T.u1:
        return value in (0, 1)
    if t.kind == "uint":
        return 0 <= value < 1 << t.bits
    return -(1 << (t.bits - 1)) <= value < 1 << (t.bits - 1)


class ValueBuilder:
    """Appends typed statements through `emit` (supplied by the AST visitor)."""

    def __init__(self, emit, default_ip: T.DataType, default_fp: T.DataType, error):
        self.emit = emit
        self.default_ip, self.default_fp = default_ip, default_fp
        self.error = error  # error(message) -> raises at the node being visited
        self.describe = lambda v: f"literal {short_number(v)}"  # names a number in errors (the front end sets it)

    # -- literals ----------------------------------------------------------------------
    def literal_type(self, v) -> T.DataType:
        """The type a weak literal takes on its own: default_ip / default_fp / u1."""
        if isinstance(v, (bool, np.bool_)):
            return T.u1
        if isinstance(v, np.generic):
            return T.from_numpy(v.dtype) or self.error(f"numpy scalar of dtype {v.dtype} is not supported")
        if isinstance(v, int):
            if fits(v, self.default_ip):
                return self.default_ip
            if fits(v, T.i64):
                return T.i64
            if fits(v, T.u64):
                return T.u64
            self.error(f"integer literal {short_number(v)} does not fit in 64 bits (neither i64 nor u64)")
        if isinstance(v, float):
            return self.default_fp
        self.error(not_a_value_message(v))

    def const(self, v, dtype: T.DataType) -> ir.Stmt:
        """A Const of `dtype` holding the typed constant `v` converted as the target converts it
        at run time (integers wrap, floats saturate into integers)."""
        value = convert(v, dtype)
        if value is None:
            self.error(f"cannot convert {v} to {dtype}")
        return self.emit(ir.Const(value, dtype))

    def literal(self, v, dtype: T.DataType) -> ir.Stmt:
        """A Const of `dtype` holding the compile-time number `v` (a literal, a captured constant
        or a folded constant expression), which must fit `dtype`: never a silent wrap-around."""
        if dtype is T.u1:
            return self.emit(ir.Const(bool(v), dtype))
        v = int(v) if isinstance(v, bool) else v
        if dtype.is_float:
            return self.emit(ir.Const(self.float_literal(v, dtype), dtype))
        if isinstance(v, float):
            if not math.isfinite(v) or not fits(math.trunc(v), dtype):
                self.error(f"float {self.describe(v)} does not fit in {dtype}{_range_hint(dtype)}")
            v = math.trunc(v)
        if not fits(v, dtype):
            self.error(f"integer {self.describe(v)} does not fit in {dtype}{_range_hint(dtype)}")
        return self.emit(ir.Const(int(v), dtype))

    def float_literal(self, v, dtype: T.DataType) -> float:
        """`v` rounded to `dtype`'s precision, as at run time; a finite `v` beyond its range is an error."""
        try:
            with np.errstate(over="ignore"):
                rounded = float(dtype.np_dtype.type(v))
        except OverflowError:
            rounded = math.inf
        if math.isinf(rounded) and not (isinstance(v, float) and math.isinf(v)):
            self.error(f"{self.describe(v)} is too large for {dtype}")
        return rounded

    def materialize(self, v, dtype: T.DataType | None = None) -> ir.Stmt:
        """A compile-time number becomes a Const (of `dtype` or its own type); a Stmt is cast to `dtype`."""
        if is_runtime(v):
            return v if dtype is None else self.cast(v, dtype)
        if not is_number(v):
            self.error(not_a_value_message(v))
        if (dtype is None and isinstance(v, int) and not isinstance(v, bool) and not fits(v, self.default_ip)
                and (fits(v, T.i64) or fits(v, T.u64))):
            # On its own a literal is default_ip (docs/api.md): widening it silently would make
            # `v = 3000000000; a_i32[0] = v` wrap at the store.
            self.error(f"integer {self.describe(v)} does not fit in {self.default_ip} (default_ip), the type "
                       f"a literal takes on its own{_range_hint(self.default_ip)}; write "
                       f"qd.i64({short_number(v)}) or qd.init(default_ip=qd.i64)")
        dtype = dtype or self.literal_type(v)
        return self.literal(v.item() if isinstance(v, np.generic) else v, dtype)

    def cast(self, v, dtype: T.DataType) -> ir.Stmt:
        if not is_runtime(v):
            return self.materialize(v, dtype)
        if v.type is dtype:
            return v
        if isinstance(v, ir.Const) and convert(v.value, dtype) is not None:  # NaN -> int: left to the target
            return self.const(v.value, dtype)
        return self.emit(ir.Cast(v, dtype))

    def to_bool(self, v) -> ir.Stmt:
        return self.cast(v, T.u1)

    # -- typing of operands --------------------------------------------------------------
    def common_type(self, a, b) -> T.DataType:
        return self.common_type_of([a, b])

    def common_type_of(self, values) -> T.DataType:
        """The type operands meet at. A weak literal takes the typed operands' type, except that
        a float literal next to integers gives default_fp, an int literal next to bools gives
        default_ip, and an int literal too large for the typed integer type widens it."""
        typed = [v.type for v in values if is_runtime(v)]
        weak = [v for v in values if not is_runtime(v)]
        if not typed:
            return functools.reduce(T.promote, [self.literal_type(v) for v in weak])
        t = functools.reduce(T.promote, typed)
        for w in weak:
            t = self.meet_literal(t, w)
        return t

    def meet_literal(self, t: T.DataType, weak) -> T.DataType:
        if isinstance(weak, np.generic):  # a numpy scalar carries its type
            return T.promote(t, self.literal_type(weak))
        if isinstance(weak, float) and not t.is_float:
            return self.default_fp
        if isinstance(weak, bool):
            return t
        if t is T.u1:
            t = self.default_ip
        if not t.is_float and not fits(weak, t):
            t = T.promote(t, self.literal_type(weak))
            if not fits(weak, t) and weak < 0 and t.bits < 64:  # `u32 + -1`: a wider signed type holds both
                t = T.i64
        return t

    def unify(self, a, b) -> tuple[ir.Stmt, ir.Stmt]:
        t = self.common_type(a, b)
        return self.cast(a, t), self.cast(b, t)

    def float_type_of(self, v) -> T.DataType:
        t = v.type if is_runtime(v) else self.literal_type(v)
        return t if t.is_float else self.default_fp

    # -- operators -------------------------------------------------------------------------
    def binary(self, op: str, a, b):
        if not is_runtime(a) and not is_runtime(b):
            return self.fold_python(op, a, b)
        if op == "pow" and isinstance(b, int) and not isinstance(b, bool) and abs(b) <= _LARGEST_CONST_POWER:
            return self.const_power(a, b)
        if op in ("truediv", "atan2"):  # always floating point, default_fp for integers
            t = T.promote(self.float_type_of(a), self.float_type_of(b))
            a, b = self.cast(a, t), self.cast(b, t)
        if op in ("shl", "shr") and is_runtime(a):
            return self.shift(op, a, b)
        a, b = self.unify(a, b)
        t = a.type
        if op in _BITWISE and t.is_float:
            self.error(f"bitwise operator needs integer operands, got {t}")
        if t is T.u1 and op in _ARITHMETIC:  # bools do arithmetic as integers, as in Python
            a, b = self.cast(a, self.default_ip), self.cast(b, self.default_ip)
            t = self.default_ip
        rtype = T.u1 if op in ir.COMPARISONS else t
        return self.emit(ir.Binary(op, a, b, rtype))

    def shift(self, op: str, a: ir.Stmt, b):
        """`a << b` / `a >> b` keep the type of `a` (the amount is converted to it), as in Quadrants."""
        t = a.type if a.type is not T.u1 else self.default_ip
        if t.is_float or (is_runtime(b) and b.type.is_float) or isinstance(b, float):
            self.error("shift operators need integer operands")
        a, b = self.cast(a, t), self.cast(b, t)
        return self.emit(ir.Binary(op, a, b, t))

    def const_power(self, a: ir.Stmt, n: int):
        """`x ** k` for a small constant integer k: exact repeated multiplication (x ** -k = 1 / x ** k)."""
        if n < 0:
            a = self.cast(a, self.float_type_of(a))
            return self.binary("truediv", 1.0, self.const_power(a, -n))
        if a.type is T.u1:
            a = self.cast(a, self.default_ip)
        if n == 0:
            return self.const(1, a.type)
        result, base = None, a
        while n:
            if n & 1:
                result = base if result is None else self.emit(ir.Binary("mul", result, base, a.type))
            n >>= 1
            if n:
                base = self.emit(ir.Binary("mul", base, base, a.type))
        return result

    def fold_python(self, op, a, b):
        a = a.item() if isinstance(a, np.generic) else a
        b = b.item() if isinstance(b, np.generic) else b
        try:
            return _PY_BINARY[op](a, b)
        except (ZeroDivisionError, TypeError, ValueError, OverflowError) as e:
            self.error(f"constant expression failed: {e}")

    def unary(self, op: str, x):
        if not is_runtime(x):
            return self.fold_unary(op, x)
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
        x = self.cast(x, self.float_type_of(x))  # math functions compute in floating point
        return self.emit(ir.Unary(op, x, x.type))

    def fold_unary(self, op: str, x):
        x = x.item() if isinstance(x, np.generic) else x
        try:
            if op == "neg":
                return -x
            if op == "not":
                return not x
            if op == "bit_not":
                if isinstance(x, float):
                    self.error("~ needs an integer operand")
                return ~x
            if op == "abs":
                return abs(x)
            return _MATH_FOLD[op](x)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
            self.error(f"constant expression failed: {op}({x!r}): {e}")

    def select(self, cond, a, b):
        cond = self.to_bool(cond)
        a, b = self.unify(a, b)
        return self.emit(ir.Select(cond, a, b))
