"""Local arrays (ir/local_arrays.py) in the shared LLVM lowering (a mixin of llvm_ir._Env): an
`alloca [N x T]` in the function's entry block, zeroed where the IR declares it, and a GEP by
the (already clamped) index for each access, so LLVM sees one load or store where the front end's
form was N compares and selects. SROA still splits an array whose every index is a constant."""
from __future__ import annotations

from llvmlite import ir as ll

from .llvm_types import I32, lltype


class LocalArrayLowering:
    def s_LocalArray(self, s):
        typ = ll.ArrayType(lltype(s.type), s.length)
        slot = self.entry_alloca(typ, s.var_name)
        self.b.store(ll.Constant(typ, None), slot)  # zeroinitializer
        return slot

    def array_element(self, s):
        slot, indices = self.v(s.array), [ll.Constant(I32, 0), self.v(s.index)]
        if not slot.type.is_opaque:  # the alloca itself: llvmlite derives the element's pointer type
            return self.b.gep(slot, indices, inbounds=True)
        return self.b.gep(slot, indices, inbounds=True, source_etype=ll.ArrayType(lltype(s.array.type), s.array.length))

    def s_ArrayLoad(self, s):
        return self.b.load(self.array_element(s), typ=lltype(s.type))

    def s_ArrayStore(self, s):
        self.b.store(self.v(s.value), self.array_element(s))
