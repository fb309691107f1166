"""IR statements of block-level GPU programming (qd.simt): barriers and memory fences, where the
calling thread is, and values exchanged or voted across a subgroup; `uses_simt` and
`simt_construct` find them and name them as the user wrote them, for a target that cannot run
them. A statement family of its own, as adstack.py and local_arrays.py are; the block-shared
arrays (`SharedRef`) are GlobalPtr targets, beside FieldRef and NdarrayRef in stmts.py.
"""
from __future__ import annotations

from qdc.runtime.contract.types import DataType

from .stmts import GlobalPtr, SharedRef, Stmt, walk_nested

__all__ = ["SIMT_SYNCS", "SimtSync", "SIMT_INDICES", "SimtIndex", "SUBGROUP_OPS", "SubgroupOp", "uses_simt",
           "simt_construct"]

# What SimtSync does: a barrier converges the threads of its scope (and orders their memory
# accesses); a fence only orders the calling thread's accesses as seen from its scope.
SIMT_SYNCS = ("block_barrier", "subgroup_barrier", "block_fence", "subgroup_fence", "grid_fence")


class SimtSync(Stmt):
    """`qd.simt.block.sync()` and the other barriers and memory fences (`kind`, SIMT_SYNCS).
    Never moved, merged or removed; memory passes forget what they knew across it."""
    ATTRS = ("kind",)

    def __init__(self, kind: str, loc=None):
        assert kind in SIMT_SYNCS, kind
        super().__init__(None, loc)
        self.kind = kind


# thread_idx: in the block; block_idx: of the block in the grid; block_dim: threads per block;
# grid_dim: blocks in the grid; lane: in the subgroup (warp, wavefront).
SIMT_INDICES = ("thread_idx", "block_idx", "block_dim", "grid_dim", "lane")


class SimtIndex(Stmt):
    """Where the calling GPU thread is (`what`, SIMT_INDICES), an i32."""
    ATTRS = ("what",)
    PURE = True

    def __init__(self, what: str, type: DataType, loc=None):
        assert what in SIMT_INDICES, what
        super().__init__(type, loc)
        self.what = what


# shuffle: `value` of lane `lane`; shuffle_up / shuffle_down: of lane (self - lane) / (self +
# lane), the caller's own value where that lane is outside the subgroup; shuffle_xor: of lane
# (self ^ lane); broadcast: of lane `lane`, the same for every lane; ballot: a bit per lane whose
# `value` (u1) holds, lane 0 the lowest (u32 or u64); all / any: whether `value` (u1) holds on
# every / some lane (u1).
SUBGROUP_OPS = ("shuffle", "shuffle_up", "shuffle_down", "shuffle_xor", "broadcast", "ballot", "all", "any")


class SubgroupOp(Stmt):
    """A value exchanged or voted across the lanes of a subgroup (`op`, SUBGROUP_OPS); `lane`
    (a u32, or None for ballot/all/any) as the op says. Every lane of the subgroup must execute
    it together, so it is never moved, merged or removed."""
    OPERANDS = ("value", "lane")
    ATTRS = ("op",)

    def __init__(self, op: str, value: Stmt, lane: Stmt | None, type: DataType, loc=None):
        assert op in SUBGROUP_OPS, op
        super().__init__(type, loc)
        self.op, self.value, self.lane = op, value, lane


def uses_simt(stmt: Stmt) -> Stmt | None:
    """The first block-level statement inside `stmt` (a barrier, an index, a subgroup op, or
    an address in a shared array), else None."""
    return next((s for s in walk_nested(stmt) if simt_construct(s) is not None), None)


_SIMT_NAMES = {"block_barrier": "block.sync", "subgroup_barrier": "subgroup.sync", "block_fence": "block.mem_fence",
               "subgroup_fence": "subgroup.mem_fence", "grid_fence": "grid.mem_fence",
               "thread_idx": "block.thread_idx", "block_idx": "block.block_idx", "block_dim": "block.block_dim",
               "grid_dim": "block.grid_dim", "lane": "subgroup.invocation_id", "all": "subgroup.all_true",
               "any": "subgroup.any_true"}


def simt_construct(s: Stmt) -> str | None:
    """How the user wrote block-level statement `s` (`qd.simt.block.sync()`; for one inside a
    qd.simt library function, its `via`: the user's call, `qd.simt.block.reduce_add()`), else None."""
    if getattr(s, "via", None) is not None and isinstance(s, (SimtSync, SimtIndex, SubgroupOp)):
        return f"{s.via}()"
    if isinstance(s, GlobalPtr) and isinstance(s.target, SharedRef):
        return "qd.simt.block.SharedArray"
    if isinstance(s, SimtSync):
        return f"qd.simt.{_SIMT_NAMES[s.kind]}()"
    if isinstance(s, SimtIndex):
        return f"qd.simt.{_SIMT_NAMES[s.what]}()"
    if isinstance(s, SubgroupOp):
        return f"qd.simt.{_SIMT_NAMES.get(s.op, 'subgroup.' + s.op)}()"
    return None
