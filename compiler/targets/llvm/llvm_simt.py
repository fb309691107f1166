"""Block-level statements (qd.simt) in the shared LLVM lowering, for the targets that run
tasks as blocks of threads (a mixin of llvm_ir._Env). What the statements need of the GPU
(its barrier, its lane index, its shuffles) comes from the target's `simt_instructions()`
(cuda/simt.py, amdgpu/simt.py); what every target shares is here:

- a SharedArray is a module global in address space 3 (shared / LDS memory: one copy per
  block), an array of its elements (a u1 as a byte), reached through a generic pointer so that
  the shared element accesses of llvm_ir apply unchanged (the optimiser infers the space back);
- a subgroup exchange moves 32-bit words: a 64-bit value as two, a float by its bits;
- shuffle_up / shuffle_down return the lane's own value where the source lane is outside the
  subgroup (CUDA's rule; the targets' instructions follow it).
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from ..base import Unsupported
from .llvm_types import I1, I32, I64, PTR, lltype, memtype

SHARED_ADDRSPACE = 3


class SimtLowering:
    def simt(self):
        instructions = getattr(self.cg.target, "simt_instructions", None)
        if instructions is None:
            raise Unsupported(f"target '{self.cg.target.arch}' runs no blocks of threads")
        return instructions()

    def s_SimtSync(self, s):
        self.simt().sync(self, s.kind)

    def s_SimtIndex(self, s):
        return self.simt().index(self, s.what)

    def s_SubgroupOp(self, s):
        gpu, b = self.simt(), self.b
        if s.op in ("ballot", "all", "any"):
            bits = gpu.ballot(self, self.v(s.value))  # an i64, a bit per lane
            if s.op == "ballot":
                return bits if s.type is T.u64 else b.trunc(bits, I32)
            everyone = gpu.ballot(self, ll.Constant(I1, 1))
            return b.icmp_unsigned("==", bits, everyone) if s.op == "all" else \
                b.icmp_unsigned("!=", bits, ll.Constant(I64, 0))
        lane = self.v(s.lane)
        words = self.to_words(self.v(s.value), s.type)
        moved = [gpu.exchange(self, s.op, w, lane) for w in words]
        return self.from_words(moved, s.type)

    def to_words(self, v, t: T.DataType) -> list:
        b = self.b
        if t.bits == 64:
            pair = b.bitcast(v, ll.VectorType(I32, 2))
            return [b.extract_element(pair, ll.Constant(I32, k)) for k in (0, 1)]
        return [b.bitcast(v, I32) if t.is_float else v]

    def from_words(self, words: list, t: T.DataType):
        b = self.b
        if t.bits == 64:
            pair = ll.Constant(ll.VectorType(I32, 2), ll.Undefined)
            for k, w in enumerate(words):
                pair = b.insert_element(pair, w, ll.Constant(I32, k))
            return b.bitcast(pair, lltype(t))
        return b.bitcast(words[0], lltype(t)) if t.is_float else words[0]

    def shared_base(self, ref: ir.SharedRef):
        """(generic pointer to the array, [each axis's extent as i64])."""
        module = self.mb.module
        name = f"{self.b.function.name}.shared{ref.uid}"
        array = module.globals.get(name)
        if array is None:
            count = 1
            for d in ref.shape:
                count *= d
            array = ll.GlobalVariable(module, ll.ArrayType(memtype(ref.dtype), count), name, addrspace=SHARED_ADDRSPACE)
            array.initializer = ll.Constant(array.value_type, ll.Undefined)
            array.linkage = "internal"
            array.align = 16
        return self.b.addrspacecast(array, PTR), [ll.Constant(I64, d) for d in ref.shape]
