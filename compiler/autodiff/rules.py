"""Adjoint rules of the pure operations: given the adjoint `g` of a result, what flows back
into each operand. `ad` is the reverse-sweep builder (task_adjoint.TaskAdjoint): it emits
statements (`ad.op`), recovers primal values at the current point (`ad.primal`) and
accumulates into operand adjoints (`ad.acc`, which ignores operands without a gradient).
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir


def unary(ad, s: ir.Unary, g) -> None:
    x, op = s.x, s.op
    if op == "neg":
        return ad.acc(x, ad.op("neg", g))
    if op in ("floor", "ceil", "round"):
        return None
    a = ad.primal(x)
    if op == "abs":  # the derivative's sign; 0 at 0, as Taichi's sgn
        zero = ad.const(0.0, s.type)
        sign = ad.select(ad.op("gt", a, zero), ad.const(1.0, s.type),
                         ad.select(ad.op("lt", a, zero), ad.const(-1.0, s.type), zero))
        return ad.acc(x, ad.op("mul", g, sign))
    ad.acc(x, ad.op("mul", g, _unary_derivative(ad, s, a)))


def _unary_derivative(ad, s: ir.Unary, a):
    op, t = s.op, s.type
    one = ad.const(1.0, t)
    if op == "sin":
        return ad.op("cos", a)
    if op == "cos":
        return ad.op("neg", ad.op("sin", a))
    if op == "tan":
        y = ad.op("tan", a)
        return ad.op("add", one, ad.op("mul", y, y))
    if op == "asin":
        return ad.op("rsqrt", ad.op("sub", one, ad.op("mul", a, a)))
    if op == "acos":
        return ad.op("neg", ad.op("rsqrt", ad.op("sub", one, ad.op("mul", a, a))))
    if op == "atan":
        return ad.op("truediv", one, ad.op("add", one, ad.op("mul", a, a)))
    if op == "tanh":
        y = ad.op("tanh", a)
        return ad.op("sub", one, ad.op("mul", y, y))
    if op == "exp":
        return ad.op("exp", a)
    if op == "log":
        return ad.op("truediv", one, a)
    if op == "sqrt":
        return ad.op("truediv", ad.const(0.5, t), ad.op("sqrt", a))
    if op == "rsqrt":  # d(a^-1/2) = -1/2 a^-3/2 = -1/2 y^3
        y = ad.op("rsqrt", a)
        return ad.op("mul", ad.const(-0.5, t), ad.op("mul", y, ad.op("mul", y, y)))
    raise NotImplementedError(f"no adjoint rule for {op}")


def binary(ad, s: ir.Binary, g) -> None:
    x, y, op, t = s.a, s.b, s.op, s.type
    if op == "add":
        ad.acc(x, g)
        ad.acc(y, g)
    elif op == "sub":
        ad.acc(x, g)
        ad.acc(y, ad.op("neg", g))
    elif op == "mul":
        if ad.is_active(x):
            ad.acc(x, ad.op("mul", g, ad.primal(y)))
        if ad.is_active(y):
            ad.acc(y, ad.op("mul", g, ad.primal(x)))
    elif op == "truediv":
        b = ad.primal(y)
        ad.acc(x, ad.op("truediv", g, b))
        if ad.is_active(y):
            quotient = ad.op("truediv", ad.primal(x), b)
            ad.acc(y, ad.op("neg", ad.op("truediv", ad.op("mul", g, quotient), b)))
    elif op == "mod":  # a % b = a - b * (a // b)
        ad.acc(x, g)
        if ad.is_active(y):
            ad.acc(y, ad.op("neg", ad.op("mul", g, ad.op("floordiv", ad.primal(x), ad.primal(y)))))
    elif op in ("min", "max"):  # the gradient goes to the operand that won (the first on a tie)
        a, b = ad.primal(x), ad.primal(y)
        first = ad.op("le" if op == "min" else "ge", a, b)
        zero = ad.const(0.0, t)
        ad.acc(x, ad.select(first, g, zero))
        ad.acc(y, ad.select(first, zero, g))
    elif op == "pow":
        _pow(ad, s, g)
    elif op == "atan2":  # atan2(a, b): d/da = b / (a²+b²), d/db = -a / (a²+b²)
        a, b = ad.primal(x), ad.primal(y)
        scale = ad.op("truediv", g, ad.op("add", ad.op("mul", a, a), ad.op("mul", b, b)))
        ad.acc(x, ad.op("mul", scale, b))
        ad.acc(y, ad.op("neg", ad.op("mul", scale, a)))
    else:
        raise NotImplementedError(f"no adjoint rule for {op}")


def _pow(ad, s, g):
    x, y, t = s.a, s.b, s.type
    a, b = ad.primal(x), ad.primal(y)
    if ad.is_active(x):  # b * a^(b-1)
        ad.acc(x, ad.op("mul", g, ad.op("mul", b, ad.op("pow", a, ad.op("sub", b, ad.const(1.0, t))))))
    if ad.is_active(y):  # a^b * log(a), taken as 0 where a <= 0 (no real logarithm)
        zero = ad.const(0.0, t)
        positive = ad.op("gt", a, zero)
        safe = ad.select(positive, a, ad.const(1.0, t))
        d = ad.op("mul", ad.op("pow", safe, b), ad.op("log", safe))
        ad.acc(y, ad.op("mul", g, ad.select(positive, d, zero)))


def cast(ad, s: ir.Cast, g) -> None:
    """A float-to-float conversion passes the adjoint through; int<->float stops it."""
    if s.x.type.is_float and s.type.is_float:
        ad.acc(s.x, g if s.x.type is s.type else ad.cast(g, s.x.type))


def select(ad, s: ir.Select, g) -> None:
    cond = ad.primal(s.cond)
    zero = ad.const(0.0, s.type)
    if ad.is_active(s.a):
        ad.acc(s.a, ad.select(cond, g, zero))
    if ad.is_active(s.b):
        ad.acc(s.b, ad.select(cond, zero, g))


def result_type(op: str, a: ir.Stmt) -> T.DataType:
    return T.u1 if op in ir.COMPARISONS else a.type
