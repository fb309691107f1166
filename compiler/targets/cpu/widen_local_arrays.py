"""Local arrays (ir/local_arrays.py) at W lanes (a mixin of widen.WideChunkEnv, which provides b,
W, exec, plan, splat, vv, is_vec, lane_numbers, intrinsic, vector_suffix, vt and store_lanes).

An array that only uniform values at uniform indices write, outside narrow code, is one scalar
array for all lanes (widen_plan.py). A varying one is a per-lane array, `alloca [N x <W x T>]`:
element k of lane l at position k*W + l, so element k of every lane is one vector. An access at
a uniform index is one vector load or store (a store keeps the lanes that are off, as a local's
does); at a varying index each lane's element is gathered or scattered under the lane mask. The
index is within the array already (the IR clamps it), in every lane, running or not.
"""
from __future__ import annotations

from llvmlite import ir as ll

from ..llvm.inline_math_vector import splat
from ..llvm.llvm_types import I32, I64, PTR


class LaneLocalArrays:
    def s_LocalArray(self, s):
        if not self.wide or s not in self.plan.varying:  # uniform: one array for every lane
            return super().s_LocalArray(s)
        typ = ll.ArrayType(self.vt(s.type), s.length)
        slot = self.entry_alloca(typ, s.var_name)
        self.b.store(ll.Constant(typ, None), slot)
        return slot

    def lane_elements(self, s):
        """The `<W x ptr>` addresses of each lane's element `s.index` (a varying index)."""
        b, w = self.b, self.W
        t = s.array.type
        position = self.v(s.index)
        if s.array in self.plan.varying:  # lane l's element k at k*W + l
            position = b.add(b.mul(position, splat(I32, w, w)), self.lane_numbers(I32))
        offsets = b.mul(b.sext(position, ll.VectorType(I64, w)), splat(I64, t.nbytes, w))
        base = b.ptrtoint(self.v(s.array), I64)
        return b.inttoptr(b.add(self.splat(base), offsets), ll.VectorType(PTR, w))

    def lane_vector(self, s):
        """The pointer to element `s.index` (uniform) of every lane of a varying array."""
        return self.b.gep(self.v(s.array), [ll.Constant(I32, 0), self.v(s.index)], inbounds=True)

    def s_ArrayLoad(self, s):
        varying_array, varying_index = s.array in self.plan.varying, self.is_vec(self.v(s.index))
        if not self.wide or not (varying_array or varying_index):
            return super().s_ArrayLoad(s)
        if not varying_index:
            return self.b.load(self.lane_vector(s), typ=self.vt(s.type))
        vt = self.vt(s.type)
        addresses = self.lane_elements(s)
        return self.intrinsic(f"llvm.masked.gather.{self.vector_suffix(vt)}.{self.vector_suffix(addresses.type)}",
                              vt, [addresses.type, I32, self.exec.type, vt],
                              [addresses, ll.Constant(I32, s.type.nbytes), self.exec, ll.Constant(vt, None)])

    def s_ArrayStore(self, s):
        if not self.wide or s.array not in self.plan.varying:  # uniform: uniform values at uniform indices
            return super().s_ArrayStore(s)
        value = self.vv(s.value)
        if not self.is_vec(self.v(s.index)):
            return self.store_lanes(self.lane_vector(s), value, s.array.type)
        addresses = self.lane_elements(s)
        self.intrinsic(f"llvm.masked.scatter.{self.vector_suffix(value.type)}.{self.vector_suffix(addresses.type)}",
                       ll.VoidType(), [value.type, addresses.type, I32, self.exec.type],
                       [value, addresses, ll.Constant(I32, s.array.type.nbytes), self.exec])

