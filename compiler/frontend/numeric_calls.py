"""Kernel-scope `qd.random`, `qd.stop_grad`, `qd.raw_div`, `qd.raw_mod`, `qd.bit_shr` and the
type predicates of `qd.types` (compiler/language/numeric.py). Each handler takes the front
end (`fe`, calls.py's CallLowering), the call's node and the name it was called by.

C-style division and remainder are built from Python-style `//` and `%`, which every target
has: truncation differs from flooring only when the remainder is nonzero and the operands'
signs differ. A float remainder is fmod(a, b) = sign(a) * (|a| % |b|), exact because both
operands of that `%` are non-negative.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir
from ..language import numeric
from .bit_calls import BIT_CALLS
from .values import is_runtime


def call_random(fe, node, name):
    if len(node.args) + len(node.keywords) > 1 or any(k.arg != "dtype" for k in node.keywords):
        fe.error(f"{name}() takes one argument, the type of the value (dtype=qd.f32 by default)")
    dtype = fe.visit(node.args[0] if node.args else node.keywords[0].value) if node.args or node.keywords else float
    if dtype is float or dtype is int:
        dtype = fe.values.default_fp if dtype is float else fe.values.default_ip
    if not isinstance(dtype, T.DataType) or dtype is T.u1:
        fe.error(f"{name}() needs a float or integer qd type (qd.f32, qd.i32, ...), got {dtype!r}")
    return fe.emit(ir.Random(dtype))


def call_stop_grad(fe, node, name):
    def stop(v):
        if is_runtime(v) and not v.type.is_float:  # a mistake: nothing to stop (only floats have gradients)
            fe.error(f"qd.stop_grad() of a non-float value ({v.type}): only float values carry a gradient, "
                     f"so this stops nothing; apply it to the float value whose gradient should not flow",
                     node.args[0])
        return fe.emit(ir.StopGrad(v)) if is_runtime(v) else v
    return fe.elementwise(stop, fe.call_args(node, 1, 1, name), node.args)


def call_raw_div(fe, node, name):
    return fe.elementwise(lambda a, b: _raw_div(fe, a, b), fe.call_args(node, 2, 2, name), node.args)


def call_raw_mod(fe, node, name):
    return fe.elementwise(lambda a, b: _raw_mod(fe, a, b), fe.call_args(node, 2, 2, name), node.args)


def call_bit_shr(fe, node, name):
    return fe.elementwise(lambda x, n: _bit_shr(fe, x, n), fe.call_args(node, 2, 2, name), node.args)


def call_compile_time(fe, node, name):
    """A type predicate: a compile-time bool of compile-time arguments."""
    fe.reject_unpacking(node)
    args = [fe.visit(a) for a in node.args]
    kwargs = {k.arg: fe.visit(k.value) for k in node.keywords}
    if any(is_runtime(v) for v in [*args, *kwargs.values()]):
        fe.error(f"{name}() needs compile-time arguments (a qd type)")
    try:
        return fe.visit(node.func)(*args, **kwargs)
    except TypeError as e:
        fe.error(f"{name}(): {e}")


def call_static_assert(fe, node, name):
    """`qd.static_assert(cond, msg=None)`: a compile error at the call when `cond` is false."""
    fe.reject_unpacking(node)
    if not 1 <= len(node.args) + len(node.keywords) <= 2 or any(k.arg != "msg" for k in node.keywords):
        fe.error(f"{name}() takes a condition and an optional message")
    cond = fe.visit(node.args[0])
    msg_node = node.args[1] if len(node.args) > 1 else (node.keywords[0].value if node.keywords else None)
    msg = fe.visit(msg_node) if msg_node is not None else None
    if is_runtime(cond) or is_runtime(msg):
        fe.error(f"{name}() needs a condition known at compile time (a run-time value cannot be checked now)",
                 node.args[0])
    if not cond:
        fe.error(f"static assertion failed{': ' + str(msg) if msg is not None else ''}", node)


def call_outer(fe, node, name):
    """`qd.outer(a, b)`: the matrix of a[i] * b[j]."""
    return fe.outer_product(*fe.call_args(node, 2, 2, name))


NUMERIC_CALLS = {"static_assert": call_static_assert, "outer": call_outer, "random": call_random, "stop_grad": call_stop_grad, "raw_div": call_raw_div,
                 "raw_mod": call_raw_mod, "bit_shr": call_bit_shr, "compile_time": call_compile_time, **BIT_CALLS}


def _integer_operands(fe, a, b):
    """(type, a, b) converted to the type they meet at."""
    t = fe.values.common_type(a, b)
    return t, fe.values.cast(a, t), fe.values.cast(b, t)


def _raw_div(fe, a, b):
    if not is_runtime(a) and not is_runtime(b) and b != 0:
        return numeric.raw_div(a, b)
    if fe.values.common_type(a, b).is_float:
        return fe.values.binary("truediv", a, b)
    t, a, b = _integer_operands(fe, a, b)
    floor = fe.values.binary("floordiv", a, b)
    if t.kind != "int":
        return floor
    inexact = _nonzero_and_signs_differ(fe, fe.values.binary("mod", a, b), a, b)
    return fe.values.select(inexact, fe.values.binary("add", floor, fe.values.const(1, t)), floor)


def _raw_mod(fe, a, b):
    if not is_runtime(a) and not is_runtime(b) and b != 0:
        return numeric.raw_mod(a, b)
    t, a, b = _integer_operands(fe, a, b)
    if t.is_float:
        zero = fe.values.const(0.0, t)
        magnitude = fe.values.binary("mod", fe.values.unary("abs", a), fe.values.unary("abs", b))
        signed = fe.values.select(fe.values.binary("lt", a, zero), fe.values.unary("neg", magnitude), magnitude)
        # a zero dividend keeps its own sign (fmod(-0.0, b) is -0.0), unless b is 0 (NaN)
        zero_dividend = fe.values.binary("bit_and", fe.values.binary("eq", a, zero), fe.values.binary("ne", b, zero))
        return fe.values.select(zero_dividend, a, signed)
    remainder = fe.values.binary("mod", a, b)
    if t.kind != "int":
        return remainder
    floored = _nonzero_and_signs_differ(fe, remainder, remainder, a)
    return fe.values.select(floored, fe.values.binary("sub", remainder, b), remainder)


def _nonzero_and_signs_differ(fe, remainder, x, y):
    """u1: `remainder` is nonzero and exactly one of `x`, `y` is negative: where flooring and
    truncating division part."""
    zero = fe.values.const(0, remainder.type)
    differ = fe.values.binary("ne", fe.values.binary("lt", x, zero), fe.values.binary("lt", y, zero))
    return fe.values.binary("bit_and", fe.values.binary("ne", remainder, zero), differ)


def _bit_shr(fe, x, n):
    if not is_runtime(x) and not is_runtime(n):
        return numeric.bit_shr(x, n)
    x = fe.values.materialize(x)
    t = x.type
    if t.is_float or t is T.u1 or (is_runtime(n) and n.type.is_float) or isinstance(n, float):
        fe.error(f"qd.bit_shr() needs integer operands, got {t}")
    if t.kind == "uint":
        return fe.values.shift("shr", x, n)
    unsigned = T.by_name("u" + t.name[1:])
    shifted = fe.values.shift("shr", fe.values.cast(x, unsigned), n)
    return fe.values.cast(shifted, t)
