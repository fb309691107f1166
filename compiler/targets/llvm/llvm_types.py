"""The LLVM types of the IR's scalar types, shared by the lowering (llvm_ir.py) and its parts."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

PTR = ll.PointerType()
I1, I8, I16, I32, I64 = ll.IntType(1), ll.IntType(8), ll.IntType(16), ll.IntType(32), ll.IntType(64)
VOID = ll.VoidType()


def lltype(t: T.DataType):
    if t is T.u1:
        return I1
    if t.is_float:
        return {16: ll.HalfType(), 32: ll.FloatType(), 64: ll.DoubleType()}[t.bits]
    return ll.IntType(t.bits)


def memtype(t: T.DataType):
    """In memory a u1 is a byte."""
    return I8 if t is T.u1 else lltype(t)


FLOAT_BITS = {"half": 16, "float": 32, "double": 64}  # by the LLVM type's name


def float_suffix(t) -> str:
    """The suffix of LLVM's intrinsics on the float type `t` (llvm.maxnum.f32)."""
    return {"half": "f16", "float": "f32", "double": "f64"}[str(t)]
