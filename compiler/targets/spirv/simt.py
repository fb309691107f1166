"""Block-level statements in SPIR-V (a mixin of lowering.TaskLowering): barriers and fences,
thread/block/lane indices, subgroup operations and block-shared arrays.

- `block.sync()`: OpControlBarrier at Workgroup scope; it also orders storage-buffer and
  workgroup memory (AcquireRelease | UniformMemory | WorkgroupMemory), as CUDA's
  __syncthreads() orders global and shared memory. Subgroup barriers at Subgroup scope,
  fences as OpMemoryBarrier at their scope (the grid's: Device).
- Indices: LocalInvocationId.x, the flat workgroup id of the ABI's 2-D grid (WorkgroupId.x +
  WorkgroupId.y * NumWorkgroups.x), the WorkgroupSize's x (spec constant 0), the workgroups
  dispatched, SubgroupLocalInvocationId.
- Subgroup operations are GroupNonUniform instructions, each requiring its own capability
  (Shuffle, ShuffleRelative, Ballot, Vote), which the device checks at load. A 64-bit value
  travels as a two-word u32 vector (no shaderSubgroupExtendedTypes needed). shuffle_up and
  shuffle_down return the lane's own value where the source lane is outside the subgroup, as
  CUDA's shfl.sync.up/down do (SPIR-V leaves it undefined).
- A SharedArray is a Workgroup variable holding an array of its elements (a u1 as a byte).
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T

from ... import ir
from ..base import Unsupported
from .spec import (SCOPE_DEVICE, SCOPE_SUBGROUP, SCOPE_WORKGROUP, SEMANTICS_ACQ_REL_MEMORY, BuiltIn, Capability,
                   Decoration, Op, StorageClass)

_SYNC = {"block_barrier": (Op.ControlBarrier, SCOPE_WORKGROUP), "subgroup_barrier": (Op.ControlBarrier, SCOPE_SUBGROUP),
         "block_fence": (Op.MemoryBarrier, SCOPE_WORKGROUP), "subgroup_fence": (Op.MemoryBarrier, SCOPE_SUBGROUP),
         "grid_fence": (Op.MemoryBarrier, SCOPE_DEVICE)}
_EXCHANGE = {"shuffle": (Op.GroupNonUniformShuffle, Capability.GroupNonUniformShuffle),
             "shuffle_xor": (Op.GroupNonUniformShuffleXor, Capability.GroupNonUniformShuffle),
             "shuffle_up": (Op.GroupNonUniformShuffleUp, Capability.GroupNonUniformShuffleRelative),
             "shuffle_down": (Op.GroupNonUniformShuffleDown, Capability.GroupNonUniformShuffleRelative),
             "broadcast": (Op.GroupNonUniformBroadcast, Capability.GroupNonUniformBallot)}
_VOTE = {"all": Op.GroupNonUniformAll, "any": Op.GroupNonUniformAny}


class SimtLowering:
    # ---- barriers and fences ------------------------------------------------------------------
    def s_SimtSync(self, s):
        opcode, scope = _SYNC[s.kind]
        semantics = self.c(T.u32, SEMANTICS_ACQ_REL_MEMORY)
        if opcode == Op.ControlBarrier:
            self.fb.emit_void(opcode, self.c(T.u32, scope), self.c(T.u32, scope), semantics)
        else:
            self.fb.emit_void(opcode, self.c(T.u32, scope), semantics)

    # ---- indices --------------------------------------------------------------------------------
    def input_builtin(self, builtin: int, vector: bool) -> int:
        """The value of an Input built-in (u32, or its u32x3), loaded where it is used."""
        u32 = self.ty(T.u32)
        pointee = self.m.vector(u32, 3) if vector else u32
        key = ("builtin", builtin)
        var = self.views.get(key)
        if var is None:
            var = self.views[key] = self.m.global_variable(pointee, StorageClass.Input)
            self.m.decorate(var, Decoration.BuiltIn, builtin)
        return self.fb.emit(Op.Load, pointee, var)

    def s_SimtIndex(self, s):
        u32 = self.ty(T.u32)
        if s.what == "thread_idx":
            index = self.fb.emit(Op.CompositeExtract, u32, self.input_builtin(BuiltIn.LocalInvocationId, True), 0)
        elif s.what == "block_idx":
            group = self.input_builtin(BuiltIn.WorkgroupId, True)
            gx, gy = (self.fb.emit(Op.CompositeExtract, u32, group, i) for i in (0, 1))
            index = self.op(Op.IAdd, T.u32, gx, self.op(Op.IMul, T.u32, gy, self.groups[0]))
        elif s.what == "block_dim":
            index = self.block_size
        elif s.what == "grid_dim":
            index = self.op(Op.IMul, T.u32, *self.groups)
        else:
            self.m.require(Capability.GroupNonUniform)
            index = self.input_builtin(BuiltIn.SubgroupLocalInvocationId, False)
        return self.op(Op.Bitcast, T.i32, index)

    # ---- subgroup operations -------------------------------------------------------------------
    def s_SubgroupOp(self, s):
        self.m.require(Capability.GroupNonUniform)
        subgroup = self.c(T.u32, SCOPE_SUBGROUP)
        if s.op in _VOTE:
            self.m.require(Capability.GroupNonUniformVote)
            return self.fb.emit(_VOTE[s.op], self.m.bool(), subgroup, self.v(s.value))
        if s.op == "ballot":
            self.m.require(Capability.GroupNonUniformBallot)
            u32 = self.ty(T.u32)
            bits = self.fb.emit(Op.GroupNonUniformBallot, self.m.vector(u32, 4), subgroup, self.v(s.value))
            low, high = (self.fb.emit(Op.CompositeExtract, u32, bits, i) for i in (0, 1))
            if s.type is T.u32:
                return low
            return self.op(Op.BitwiseOr, T.u64, self.op(Op.UConvert, T.u64, low),
                           self.op(Op.ShiftLeftLogical, T.u64, self.op(Op.UConvert, T.u64, high), self.c(T.u64, 32)))
        opcode, capability = _EXCHANGE[s.op]
        self.m.require(capability)
        value, lane, t = self.v(s.value), self.v(s.lane), s.type
        if t.bits == 64:  # as two u32 words
            pair = self.m.vector(self.ty(T.u32), 2)
            words = self.fb.emit(Op.Bitcast, pair, value)
            moved = self.fb.emit(Op.Bitcast, self.ty(t), self.fb.emit(opcode, pair, subgroup, words, lane))
        else:
            moved = self.fb.emit(opcode, self.ty(t), subgroup, value, lane)
        if s.op not in ("shuffle_up", "shuffle_down"):
            return moved
        me = self.subgroup_lane()
        if s.op == "shuffle_up":
            inside = self.boolean(Op.UGreaterThanEqual, me, lane)
        else:
            size = self.input_builtin(BuiltIn.SubgroupSize, False)
            inside = self.boolean(Op.ULessThan, self.op(Op.IAdd, T.u32, me, lane), size)
        return self.select(t, inside, moved, value)

    def subgroup_lane(self) -> int:
        return self.input_builtin(BuiltIn.SubgroupLocalInvocationId, False)

    # ---- block-shared arrays -----------------------------------------------------------------
    def shared_variable(self, ref: ir.SharedRef) -> int:
        key = ("shared", ref.uid)
        var = self.views.get(key)
        if var is None:
            element = self.ty(self.mem_type(ref.dtype))
            count = math.prod(ref.shape)
            length = self.c(T.u32, count)
            array = self.m._type(("array", element, count), Op.TypeArray, element, length)
            var = self.views[key] = self.m.global_variable(array, StorageClass.Workgroup, f"shared{ref.uid}")
        return var

    def s_GlobalPtr(self, s):
        if not isinstance(s.target, ir.SharedRef):
            return super().s_GlobalPtr(s)
        ref = s.target
        linear = self.c(T.i32, 0)
        for n, (idx, dim) in enumerate(zip(s.indices, ref.shape)):
            i = self.convert(self.v(idx), idx.type, T.i32)
            linear = i if n == 0 else self.op(Op.IAdd, T.i32, self.op(Op.IMul, T.i32, linear, self.c(T.i32, dim)), i)
        self.pointers[s] = (("shared", ref), linear)
        self.index_types[s] = T.i32
        return self.element("shared", ref, self.mem_type(s.type), linear)

    def element(self, resource, index, t: T.DataType, position: int) -> int:
        if resource != "shared":
            return super().element(resource, index, t, position)
        if self.mem_type(index.dtype) is not t:
            raise Unsupported(f"a {t.name} view of a {index.dtype.name} SharedArray (a float atomic other than "
                              f"an f32 add on a SharedArray) is not available on target '{self.arch}'")
        pointer = self.m.pointer(StorageClass.Workgroup, self.ty(t))
        return self.fb.emit(Op.AccessChain, pointer, self.shared_variable(index), position)
