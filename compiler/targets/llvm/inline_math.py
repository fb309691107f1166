"""Transcendental functions as LLVM IR the loop vectoriser can widen, for the CPU (a call to
the C math library's scalar functions keeps a loop scalar, and llvmlite gives no way to point
LLVM at a vector math library).

Each function is defined in the kernel's module on first use, `internal` and `alwaysinline`:
inlined into the loop body, it is plain arithmetic, integer bit operations and selects (every
case computed, the right one selected), which LLVM widens to `<8 x float>` and the like. The
exceptions are branches around costly work in f64 sin, cos and tan (the long reduction only
for huge arguments; `LlvmOps.branch`): their sides are plain arithmetic, which the vectoriser
if-converts into selects, while scalar code (a loop-carried chain, which no vectoriser
widens) takes the short side only.

- f64: fdlibm's algorithms as compiler/targets/fdlibm.py writes them against a small set
  of operations (`Float64Math`); `LlvmOps` implements those operations as LLVM IR. Within an
  ulp of the correctly rounded result, as there; sin, cos and tan give NaN from |x| >= 2^53
  (where Payne-Hanek reduction would be needed).
- f32: sin, cos, tan, exp, log, tanh and pow are computed in float (inline_math_f32.py:
  twice the vector width, within 2 ulp, tan, tanh and pow 3); atan, atan2, asin and acos are
  the f64 functions of the widened arguments, rounded once.

No floating-point operation here carries fast-math flags (the error-free transformations need
IEEE rounding and no contraction); a fast_math kernel gets the same functions.
"""
from __future__ import annotations

from llvmlite import ir as ll

from ..fdlibm import Float64Math
from .inline_math_f32 import FLOAT_OPS, FloatMath
from .llvm_ops import F32, F64, LlvmOps
from .target import INLINE_MATH_OPS as OPS
ARITY = {"pow": 2, "atan2": 2}


def function_name(op: str, bits: int) -> str:
    return f"__qdc_vm_{op}_f{bits}"


def math_function(module: ll.Module, name: str, t, op: str):
    """(function, builder at its entry) of a new internal, always inlined `t name(t, ...)` taking
    `op`'s arguments; (the function, None) where `module` defines `name` already."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing, None
    fn = ll.Function(module, ll.FunctionType(t, [t] * ARITY.get(op, 1)), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    return fn, ll.IRBuilder(fn.append_basic_block("entry"))


def define(module: ll.Module, op: str, bits: int) -> ll.Function:
    """The function computing `op` on `bits`-wide floats in `module`, defined on first use."""
    fn, b = math_function(module, function_name(op, bits), F64 if bits == 64 else F32, op)
    if b is None:
        return fn
    if bits == 32 and op in FLOAT_OPS:
        b.ret(getattr(FloatMath(b), op)(*fn.args))
        return fn
    value = Float64Math(LlvmOps(b))(op, *(a if bits == 64 else b.fpext(a, F64) for a in fn.args))
    b.ret(value if bits == 64 else b.fptrunc(value, F32))
    return fn
