"""qd.simt's GPU instructions on NVPTX (llvm/llvm_simt.py lowers the statements with them):
`bar.sync 0` for block barriers, `membar.cta` / `membar.gl` for fences, `bar.warp.sync` for
a warp's barrier, `shfl.sync` (all 32 lanes) for exchanges, `vote.sync.ballot`, and the
special registers tid.x, ctaid.x, ntid.x, nctaid.x, laneid."""
from __future__ import annotations

from llvmlite import ir as ll

from ..llvm.llvm_types import I1, I32, I64, VOID

FULL_MASK = ll.Constant(I32, -1)
# shfl.sync's mode and its `c` operand: 0x1f clamps idx/down/bfly at lane 31; up clamps at 0
_SHUFFLES = {"shuffle": ("idx", 31), "broadcast": ("idx", 31), "shuffle_down": ("down", 31),
             "shuffle_up": ("up", 0), "shuffle_xor": ("bfly", 31)}
_FENCES = {"block_fence": "llvm.nvvm.membar.cta", "subgroup_fence": "llvm.nvvm.membar.cta",
           "grid_fence": "llvm.nvvm.membar.gl"}
_REGISTERS = {"thread_idx": "tid.x", "block_idx": "ctaid.x", "block_dim": "ntid.x", "grid_dim": "nctaid.x",
              "lane": "laneid"}


class NvptxSimt:
    def sync(self, env, kind: str) -> None:
        mb, b = env.mb, env.b
        if kind == "block_barrier":
            b.call(mb.declare("llvm.nvvm.barrier0", VOID, []), [])
        elif kind == "subgroup_barrier":
            b.call(mb.declare("llvm.nvvm.bar.warp.sync", VOID, [I32]), [FULL_MASK])
        else:
            b.call(mb.declare(_FENCES[kind], VOID, []), [])

    def index(self, env, what: str):
        return env.b.call(env.mb.declare(f"llvm.nvvm.read.ptx.sreg.{_REGISTERS[what]}", I32, []), [])

    def exchange(self, env, op: str, word, lane):
        mode, clamp = _SHUFFLES[op]
        fn = env.mb.declare(f"llvm.nvvm.shfl.sync.{mode}.i32", I32, [I32, I32, I32, I32])
        return env.b.call(fn, [FULL_MASK, word, lane, ll.Constant(I32, clamp)])

    def ballot(self, env, predicate):
        fn = env.mb.declare("llvm.nvvm.vote.ballot.sync", I32, [I32, I1])
        return env.b.zext(env.b.call(fn, [FULL_MASK, predicate]), I64)


NVPTX = NvptxSimt()
