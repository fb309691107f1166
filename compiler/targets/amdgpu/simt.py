"""qd.simt's GPU instructions on AMDGPU (llvm/llvm_simt.py lowers the statements with them),
for wavefronts of 64 lanes (codegen.py builds code using them with +wavefrontsize64, as
Quadrants pins every AMDGPU target): `s_barrier` between workgroup-scope release and acquire
fences for block barriers, fences at the wavefront / workgroup / agent scope, `ds_bpermute`
for exchanges (the source lane computed, the own value kept outside the wavefront for
shuffle_up / shuffle_down), `ballot`, mbcnt for the lane, workitem/workgroup ids and the
dispatch packet's sizes."""
from __future__ import annotations

from llvmlite import ir as ll

from ..llvm.llvm_types import I1, I16, I32, I64, VOID
from .codegen import DISPATCH_GRID_SIZE_X, DISPATCH_WORKGROUP_SIZE_X, dispatch_field

WAVEFRONT = 64
_SCOPES = {"block_fence": "workgroup", "subgroup_fence": "wavefront", "grid_fence": "agent"}


class AmdgcnSimt:
    def sync(self, env, kind: str) -> None:
        b = env.b
        if kind == "block_barrier":
            b.fence("release", "workgroup")
            b.call(env.mb.declare("llvm.amdgcn.s.barrier", VOID, []), [])
            b.fence("acquire", "workgroup")
        elif kind == "subgroup_barrier":  # a wavefront runs in lock-step: ordering its memory is enough
            b.fence("acq_rel", "wavefront")
        else:
            b.fence("acq_rel", _SCOPES[kind])

    def index(self, env, what: str):
        mb, b = env.mb, env.b
        if what == "thread_idx":
            return b.call(mb.declare("llvm.amdgcn.workitem.id.x", I32, []), [])
        if what == "block_idx":
            return b.call(mb.declare("llvm.amdgcn.workgroup.id.x", I32, []), [])
        if what == "lane":
            return self.lane(env)
        size = dispatch_field(mb, b, DISPATCH_WORKGROUP_SIZE_X, I16)
        if what == "block_dim":
            return b.trunc(size, I32)
        return b.trunc(b.udiv(dispatch_field(mb, b, DISPATCH_GRID_SIZE_X, I32), size), I32)

    def lane(self, env):
        mb, b = env.mb, env.b
        low = b.call(mb.declare("llvm.amdgcn.mbcnt.lo", I32, [I32, I32]), [ll.Constant(I32, -1), ll.Constant(I32, 0)])
        return b.call(mb.declare("llvm.amdgcn.mbcnt.hi", I32, [I32, I32]), [ll.Constant(I32, -1), low])

    def exchange(self, env, op: str, word, lane):
        b = env.b
        me = self.lane(env)
        inside = None
        if op in ("shuffle", "broadcast"):
            source = lane
        elif op == "shuffle_xor":
            source = b.xor(me, lane)
        elif op == "shuffle_up":
            source, inside = b.sub(me, lane), b.icmp_unsigned(">=", me, lane)
        else:
            source = b.add(me, lane)
            inside = b.icmp_unsigned("<", source, ll.Constant(I32, WAVEFRONT))
        address = b.shl(source, ll.Constant(I32, 2))
        moved = b.call(env.mb.declare("llvm.amdgcn.ds.bpermute", I32, [I32, I32]), [address, word])
        return moved if inside is None else b.select(inside, moved, word)

    def ballot(self, env, predicate):
        return env.b.call(env.mb.declare("llvm.amdgcn.ballot.i64", I64, [I1]), [predicate])


AMDGCN = AmdgcnSimt()
