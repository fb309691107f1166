"""Local arrays (ir/local_arrays.py) in SPIR-V (a mixin of lowering.TaskLowering): a
Function-storage variable of an array type, zeroed where the IR declares it (a store of
OpConstantNull), and an OpAccessChain by the (already clamped) index for each access: one load
or store where the front end's form was N compares and selects. Metal's MSL, made from this
module by spirv-cross, gets a thread-local array."""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .spec import Op, StorageClass


class LocalArrayLowering:
    def array_type(self, s) -> int:
        element = self.ty(s.type)
        return self.m._type(("array", element, s.length), Op.TypeArray, element, self.c(T.u32, s.length))

    def s_LocalArray(self, s):
        typ = self.array_type(s)
        var = self.fb.local_variable(typ)
        self.fb.emit_void(Op.Store, var, self.m._const(("null", typ), Op.ConstantNull, typ))
        return var

    def array_element(self, s) -> int:
        pointer = self.m.pointer(StorageClass.Function, self.ty(s.array.type))
        return self.fb.emit(Op.AccessChain, pointer, self.v(s.array), self.v(s.index))

    def s_ArrayLoad(self, s):
        return self.fb.emit(Op.Load, self.ty(s.type), self.array_element(s))

    def s_ArrayStore(self, s):
        self.fb.emit_void(Op.Store, self.array_element(s), self.v(s.value))
