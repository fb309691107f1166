"""Adjoints of block-level code (qd.simt): subgroup exchanges and block-shared arrays.

Both are linear. `y = shuffle(x, src)` moves lane src's x to the calling lane, so its adjoint
moves the calling lane's adjoint of y back to lane src and adds it there: every lane runs the
reverse exchange together, at the shuffle's place in the reverse sweep (the reverse sweep of a
block's threads runs in lock-step just as its forward sweep does, so the lanes that exchanged
values exchange adjoints). By the form of the source lane:

- `lane ^ m`, m uniform (the butterflies of reductions and scans): the same shuffle, since xor
  with m is its own inverse;
- uniform (`broadcast`, `shuffle(v, k)` with k a constant, an argument or the index of a loop
  with uniform bounds): every lane read lane k, so lane k gets the subgroup's sum of the
  adjoints (a butterfly of xor shuffles), the others nothing;
- `shuffle_up(x, d)` / `shuffle_down(x, d)`, d uniform: the opposite shift, where the lane it
  reads from took part; a lane that kept its own value (its source lane outside the subgroup)
  keeps its own adjoint;
- anything else: a loop over the subgroup's lanes k, each lane adding lane k's adjoint where
  lane k's source lane is itself (2 shuffles per lane of the subgroup).

A SharedArray with a gradient gets an adjoint SharedArray of its shape (the same float type),
zeroed by the block's threads at the start of every iteration between two barriers. A store's
reverse takes the element's adjoint and zeroes it, a load's reverse adds to it atomically
(several threads may have read the element), and every barrier and fence of the forward sweep
is mirrored at its place in the reverse sweep, so the adjoints written between two barriers
are read only after the barrier that separated the writes from the reads.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir

_UNIFORM_LEAVES = (ir.Const, ir.ArgLoad, ir.NdarrayShape)


def is_uniform(x: ir.Stmt) -> bool:
    """Does `x` certainly have one value on every lane of a subgroup?"""
    if isinstance(x, _UNIFORM_LEAVES):
        return True
    if isinstance(x, ir.LoopIndex):
        loop = x.loop
        return isinstance(loop, ir.RangeFor) and is_uniform(loop.begin) and is_uniform(loop.end)
    if isinstance(x, (ir.Unary, ir.Binary, ir.Cast)):
        return all(is_uniform(o) for o in x.operands())
    return False


def _xor_mask(lane: ir.Stmt):
    """m where `lane` is `invocation_id() ^ m` (through casts) with m uniform, else None."""
    if not (isinstance(lane, ir.Binary) and lane.op == "bit_xor"):
        return None
    for mine, other in ((lane.a, lane.b), (lane.b, lane.a)):
        while isinstance(mine, ir.Cast) and mine.x.type.is_integral:
            mine = mine.x
        if isinstance(mine, ir.SimtIndex) and mine.what == "lane" and is_uniform(other):
            return other
    return None


def subgroup_op(ad, s: ir.SubgroupOp, g) -> None:
    """Add the adjoint `g` of exchange `s` to the adjoint of its value, at its source lanes."""
    if not ad.is_active(s.value):
        return
    op, size = s.op, ad.subgroup_size
    if op == "shuffle_xor" or (op == "shuffle" and _xor_mask(s.lane) is not None):
        return ad.acc(s.value, ad.emit(ir.SubgroupOp(op, g, ad.primal(s.lane), g.type, s.loc)))
    if op == "broadcast" or (op == "shuffle" and is_uniform(s.lane)):
        total = subgroup_sum(ad, g, size, s.loc)
        mine = ad.op("eq", _my_lane(ad), ad.primal(s.lane))
        return ad.acc(s.value, ad.select(mine, total, ad.const(0.0, g.type)))
    if op in ("shuffle_up", "shuffle_down") and is_uniform(s.lane):
        return ad.acc(s.value, _shift_adjoint(ad, s, g, size))
    ad.acc(s.value, _gather_adjoint(ad, s, g, size))


def subgroup_sum(ad, value, size: int, loc):
    """Every lane gets the sum of `value` over the subgroup (a butterfly)."""
    step = 1
    while step < size:
        partner = ad.emit(ir.SubgroupOp("shuffle_xor", value, ad.const(step, T.u32), value.type, loc))
        value = ad.op("add", value, partner)
        step *= 2
    return value


def _my_lane(ad):
    return ad.cast(ad.emit(ir.SimtIndex("lane", T.i32)), T.u32)


def _shift_adjoint(ad, s: ir.SubgroupOp, g, size: int):
    """shuffle_up(x, d): lane l+d read lane l (where l+d is in the subgroup), and lanes below d
    kept their own value; shuffle_down(x, d): lane l-d read lane l (where l >= d), and lanes
    from size-d on kept their own."""
    d, lane, zero = ad.primal(s.lane), _my_lane(ad), ad.const(0.0, g.type)
    reversed_op = "shuffle_down" if s.op == "shuffle_up" else "shuffle_up"
    moved = ad.emit(ir.SubgroupOp(reversed_op, g, d, g.type, s.loc))
    end = ad.const(size, T.u32)
    if s.op == "shuffle_up":
        read_by_other = ad.op("lt", ad.op("add", lane, d), end)
        kept_own = ad.op("lt", lane, d)
    else:
        read_by_other = ad.op("ge", lane, d)
        kept_own = ad.op("ge", ad.op("add", lane, d), end)
    return ad.op("add", ad.select(read_by_other, moved, zero), ad.select(kept_own, g, zero))


def _source_lane(ad, s: ir.SubgroupOp, size: int):
    """The lane whose value `s` gave the calling lane (a u32)."""
    if s.op == "shuffle":
        return ad.primal(s.lane)
    d, lane = ad.primal(s.lane), _my_lane(ad)
    if s.op == "shuffle_up":
        return ad.select(ad.op("ge", lane, d), ad.op("sub", lane, d), lane)
    up = ad.op("add", lane, d)
    return ad.select(ad.op("lt", up, ad.const(size, T.u32)), up, lane)


def _gather_adjoint(ad, s: ir.SubgroupOp, g, size: int):
    """For each lane k: lane k's adjoint, where lane k read from the calling lane."""
    source, lane = _source_lane(ad, s, size), _my_lane(ad)
    total = ad.emit(ir.Alloca(g.type, "shuffle_adj", s.loc))
    loop = ad.emit(ir.RangeFor(ad.const(0, T.i32), ad.const(size, T.i32), T.i32, serial=True, loc=s.loc))
    outer, ad.cur = ad.cur, loop.body
    try:
        k = ad.cast(loop.index, T.u32)
        theirs = ad.emit(ir.SubgroupOp("shuffle", g, k, g.type, s.loc))
        their_source = ad.emit(ir.SubgroupOp("shuffle", source, k, T.u32, s.loc))
        mine = ad.op("eq", their_source, lane)
        before = ad.emit(ir.LocalLoad(total))
        ad.emit(ir.LocalStore(total, ad.select(mine, ad.op("add", before, theirs), before)))
    finally:
        ad.cur = outer
    return ad.emit(ir.LocalLoad(total))


# ---- block-shared arrays ------------------------------------------------------------------

class SharedAdjoints:
    """The adjoint SharedArrays of a kernel's shared arrays that carry a gradient."""

    def __init__(self, k: ir.KernelIR, active: set):
        self.active = active  # SharedRefs with a gradient (Activity.shared)
        self._next_uid = 1 + max((r.uid for r in _shared_refs(k)), default=-1)
        self._of: dict = {}

    def has(self, ref) -> bool:
        return ref in self.active

    def of(self, ref: ir.SharedRef) -> ir.SharedRef:
        adj = self._of.get(ref)
        if adj is None:
            adj = self._of[ref] = ir.SharedRef(self._next_uid, f"{ref.name}_adj", ref.dtype, ref.shape)
            self._next_uid += 1
        return adj

    def zero_at_iteration_start(self, task: ir.Task, body: ir.Block) -> None:
        """Each iteration's reverse sweep starts from zero adjoints: the block's threads zero
        them between two barriers (the first waits for the previous iteration's reads)."""
        refs = sorted({ref for ref in self._of.values() if _used_in(ref, body)}, key=lambda r: r.uid)
        if not refs:
            return
        zeroing = ir.Block()
        zeroing.append(ir.SimtSync("block_barrier", task.loc))
        thread = zeroing.append(ir.SimtIndex("thread_idx", T.i32, task.loc))
        width = zeroing.append(ir.SimtIndex("block_dim", T.i32, task.loc))
        for ref in refs:
            count = 1
            for d in ref.shape:
                count *= d
            last = zeroing.append(ir.Const(count, T.i32))
            rounds = zeroing.append(ir.Binary("floordiv", zeroing.append(ir.Binary(
                "sub", zeroing.append(ir.Binary("add", last, width, T.i32)), zeroing.append(ir.Const(1, T.i32)),
                T.i32)), width, T.i32))
            loop = zeroing.append(ir.RangeFor(zeroing.append(ir.Const(0, T.i32)), rounds, T.i32, serial=True,
                                              loc=task.loc))
            b = loop.body
            flat = b.append(ir.Binary("add", b.append(ir.Binary("mul", loop.index, width, T.i32)), thread, T.i32))
            inside = b.append(ir.If(b.append(ir.Binary("lt", flat, last, T.u1)), task.loc))
            _store_zero(inside.then_block, ref, flat, task.loc)
        zeroing.append(ir.SimtSync("block_barrier", task.loc))
        for s in reversed(zeroing.stmts):
            s.block = body
            body.stmts.insert(0, s)


def _store_zero(block: ir.Block, ref: ir.SharedRef, flat, loc) -> None:
    """ref[...] = 0 at the row-major position `flat`."""
    indices = []
    rest = flat
    for n, d in enumerate(reversed(ref.shape)):
        if n == len(ref.shape) - 1:
            indices.append(rest)
        else:
            extent = block.append(ir.Const(d, T.i32))
            indices.append(block.append(ir.Binary("mod", rest, extent, T.i32)))
            rest = block.append(ir.Binary("floordiv", rest, extent, T.i32))
    ptr = block.append(ir.GlobalPtr(ref, list(reversed(indices)), loc))
    block.append(ir.GlobalStore(ptr, block.append(ir.Const(0.0, ref.dtype)), loc))


def _shared_refs(k: ir.KernelIR) -> set:
    return {s.target for s in ir.walk(k.body) if isinstance(s, ir.GlobalPtr) and isinstance(s.target, ir.SharedRef)}


def _used_in(ref: ir.SharedRef, body: ir.Block) -> bool:
    return any(isinstance(s, ir.GlobalPtr) and s.target is ref for s in ir.walk(body))
