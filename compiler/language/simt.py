"""`qd.simt`: block-level GPU programming, with Quadrants' names and semantics.

A top-level parallel `for` runs as blocks of `qd.loop_config(block_dim=B)` threads (the
target's default without it); with a range whose length is a multiple of B and starts at 0,
thread `thread_idx()` of block b runs iterations b*B + thread_idx(), then one grid stride
further on, and every thread of a block runs the same number of iterations, so the threads of
a block can meet at barriers. Inside such a loop:

- `block`: `sync()` (a barrier of the block's threads), `mem_fence()`, `thread_idx()`,
  `global_thread_idx()`, `block_idx()` and `block_dim()` (qdc's own), `SharedArray(shape,
  dtype)` (static shape, scalar or vector/matrix dtype, one copy per block), the reductions and
  scans over the block and `sync_{all,any,count}_nonzero(p)`;
- `subgroup` (a warp on CUDA, a wavefront on AMDGPU, a SIMD-group on Metal): `sync()`,
  `mem_fence()`, `invocation_id()`, `group_size()` / `log2_group_size()` (compile-time ints),
  `shuffle`, `shuffle_up`, `shuffle_down`, `shuffle_xor`, `broadcast`, `broadcast_first`,
  `ballot`, `ballot_first_n`, `elect`, `all_true` / `any_true` / `all_equal`, the lane masks,
  reductions, scans and segmented reductions, each also `_tiled(..., log2_size)` over
  independent tiles of 2**log2_size lanes;
- `grid`: `mem_fence()` (device scope);
- `warp.sync(mask)`.

The primitives are recognised by the front end (compiler/frontend/simt_calls.py) and become
the IR's SimtSync / SimtIndex / SubgroupOp statements and shared-array addresses; everything
else here is `qd.func`s written with them, inlined like a user's. CPU kernels refuse them at
compile time (TargetCannotExpress at the line using one): a CPU runs no blocks of threads.
"""
from __future__ import annotations

import types as _types

from qdc.runtime.contract.types import i32, u32, u64

from . import lang
from .lang import func, static, template
from .simt_tiles import TileProxy


class SharedArray:
    """`qd.simt.block.SharedArray(shape, dtype)` inside a kernel: an array of compile-time
    `shape` (an int or a tuple of ints) shared by the threads of a block. `dtype` is a scalar
    type or a vector/matrix type (its components are trailing axes)."""

    def __init__(self, shape, dtype):
        raise RuntimeError("qd.simt.block.SharedArray can only be made inside a kernel or qd.func")


# The front end's primitives: function -> name (compiler/frontend/simt_calls.py lowers each).
PRIMITIVES: dict = {SharedArray: "block.SharedArray"}


def _primitive(name: str, doc: str):
    def primitive(*args, **kwargs):
        raise RuntimeError(f"qd.simt.{name}() can only be called inside a kernel or qd.func")
    primitive.__name__ = primitive.__qualname__ = name.rsplit(".", 1)[-1]
    primitive.__doc__ = doc
    PRIMITIVES[primitive] = name
    return primitive


block_sync = _primitive("block.sync", "Barrier: every thread of the block waits here for the others.")
block_mem_fence = _primitive("block.mem_fence", "The calling thread's memory accesses ordered for its block.")
thread_idx = _primitive("block.thread_idx", "The thread's index in its block (i32).")
global_thread_idx = _primitive("block.global_thread_idx", "The thread's index in the launch's grid (i32).")
block_idx = _primitive("block.block_idx", "The block's index in the grid (i32).")
block_dim = _primitive("block.block_dim", "Threads per block (i32).")
subgroup_sync = _primitive("subgroup.sync", "Barrier of the subgroup's lanes.")
subgroup_mem_fence = _primitive("subgroup.mem_fence", "The calling lane's memory accesses ordered for its subgroup.")
invocation_id = _primitive("subgroup.invocation_id", "The lane's index in its subgroup (i32).")
group_size = _primitive("subgroup.group_size", "Lanes per subgroup: a compile-time int (32 on CUDA and Metal, "
                                               "64 on AMDGPU, the device's on Vulkan).")
log2_group_size = _primitive("subgroup.log2_group_size", "log2 of group_size(), a compile-time int.")
shuffle = _primitive("subgroup.shuffle", "`value` of lane `index`.")
shuffle_up = _primitive("subgroup.shuffle_up", "`value` of lane (self - offset); the own value below `offset`.")
shuffle_down = _primitive("subgroup.shuffle_down", "`value` of lane (self + offset); the own value past the end.")
broadcast = _primitive("subgroup.broadcast", "`value` of lane `index`, which every lane must pass alike.")
ballot = _primitive("subgroup.ballot", "A u64 with bit k set where lane k's predicate is nonzero.")
_vote_all = _primitive("subgroup.vote_all", "Whether the predicate holds on every lane (i32 0 or 1).")
_vote_any = _primitive("subgroup.vote_any", "Whether the predicate holds on some lane (i32 0 or 1).")
_type_max = _primitive("subgroup.type_max", "The largest value of `value`'s type (+inf for floats).")
_type_min = _primitive("subgroup.type_min", "The smallest value of `value`'s type (-inf for floats).")
_static_error = _primitive("static_error", "A compile error at the user's call with the given message.")
grid_mem_fence = _primitive("grid.mem_fence", "The calling thread's memory accesses ordered for the whole device.")
_warp_sync = _primitive("warp.sync", "Barrier of the warp's lanes (the mask is CUDA's: all lanes).")


# ---- the subgroup's library (qd.funcs over the primitives) --------------------------------

@func
def _bin_add(a, b):
    return a + b


@func
def _bin_mul(a, b):
    return a * b


@func
def _bin_min(a, b):
    return min(a, b)


@func
def _bin_max(a, b):
    return max(a, b)


@func
def _bin_and(a, b):
    return a & b


@func
def _bin_or(a, b):
    return a | b


@func
def _bin_xor(a, b):
    return a ^ b


@func
def shuffle_xor(value, mask):
    return shuffle(value, u32(invocation_id()) ^ u32(mask))


@func
def broadcast_first(value):
    return broadcast(value, u32(0))


@func
def elect():
    return i32(invocation_id() == 0)


@func
def ballot_first_n(predicate, n: template()):
    if static(n > 32):
        _static_error("subgroup.ballot_first_n: n must be at most 32")
    return u32(ballot(predicate) & u64(static((1 << n) - 1)))


@func
def lanemask_lt(lane_id):
    return (u32(1) << u32(lane_id)) - u32(1)


@func
def lanemask_le(lane_id):
    one_at_lane = u32(1) << u32(lane_id)
    return one_at_lane | (one_at_lane - u32(1))


@func
def lanemask_eq(lane_id):
    return u32(1) << u32(lane_id)


@func
def lanemask_gt(lane_id):
    one_at_lane = u32(1) << u32(lane_id)
    return ~(one_at_lane | (one_at_lane - u32(1)))


@func
def lanemask_ge(lane_id):
    return ~((u32(1) << u32(lane_id)) - u32(1))


@func
def _check_tile(log2_size: template()):
    """A compile error unless tiles of 2**log2_size lanes fit in a subgroup: shuffles across a
    larger tile would read lanes that do not exist (undefined values, no error, on a device)."""
    if static(log2_size < 0 or log2_size > log2_group_size()):
        _static_error("a _tiled operation's tiles of 2**log2_size lanes must fit in a subgroup "
                      "(log2_size at most qd.simt.subgroup.log2_group_size())")


@func
def _reduce_tiled(value, op: template(), log2_size: template()):
    """Lane 0 of each tile of 2**log2_size lanes gets the tile's reduction under `op`."""
    _check_tile(log2_size)
    for i in static(range(log2_size)):
        value = op(value, shuffle_down(value, u32(static(1 << (log2_size - 1 - i)))))
    return value


@func
def _reduce_all_tiled(value, op: template(), log2_size: template()):
    """Every lane of each tile gets the tile's reduction (a butterfly)."""
    _check_tile(log2_size)
    lane = u32(invocation_id())
    for i in static(range(log2_size)):
        value = op(value, shuffle(value, lane ^ u32(static(1 << i))))
    return value


@func
def _inclusive_scan_tiled(value, op: template(), log2_size: template()):
    """Lane k of each tile gets op(a[tile start], ..., a[k]), folded left in lane order."""
    _check_tile(log2_size)
    lane_in_group = invocation_id() & static((1 << log2_size) - 1)
    for i in static(range(log2_size)):
        partner = shuffle_up(value, u32(static(1 << i)))
        if lane_in_group >= static(1 << i):
            value = op(partner, value)
    return value


@func
def _exclusive_scan_tiled(value, op: template(), identity, log2_size: template()):
    """The inclusive scan of the input shifted up one lane, `identity` in each tile's lane 0."""
    lane_in_group = invocation_id() & static((1 << log2_size) - 1)
    prev = shuffle_up(value, u32(1))
    if lane_in_group == 0:
        prev = identity
    return _inclusive_scan_tiled(prev, op, log2_size)


@func
def _segment_distance_tiled(head_flag, log2_size: template()):
    """How many lanes past its segment's head each lane is: a head is a lane whose flag is
    nonzero, or the tile's first lane (a max-scan of the heads' lane numbers)."""
    lane_in_group = invocation_id() & static((1 << log2_size) - 1)
    head = 0
    if head_flag != 0:
        head = lane_in_group
    head = _inclusive_scan_tiled(head, _bin_max, log2_size)
    return lane_in_group - head


@func
def _segmented_reduce_tiled(value, head_flag, op: template(), log2_size: template()):
    distance = _segment_distance_tiled(head_flag, log2_size)
    for i in static(range(log2_size)):
        partner = shuffle_up(value, u32(static(1 << i)))
        if distance >= static(1 << i):
            value = op(partner, value)
    return value


@func
def all_true_tiled(predicate, log2_size: template()):
    if static(log2_size == log2_group_size()):
        return _vote_all(predicate)
    return _reduce_all_tiled(i32(predicate != 0), _bin_min, log2_size)


@func
def any_true_tiled(predicate, log2_size: template()):
    if static(log2_size == log2_group_size()):
        return _vote_any(predicate)
    return _reduce_all_tiled(i32(predicate != 0), _bin_max, log2_size)


@func
def all_equal_tiled(value, log2_size: template()):
    base = shuffle(value, u32(invocation_id() & static(~((1 << log2_size) - 1))))
    return all_true_tiled(i32(value == base), log2_size)


@func
def reduce_add_tiled(value, log2_size: template()):
    return _reduce_tiled(value, _bin_add, log2_size)


@func
def reduce_min_tiled(value, log2_size: template()):
    return _reduce_tiled(value, _bin_min, log2_size)


@func
def reduce_max_tiled(value, log2_size: template()):
    return _reduce_tiled(value, _bin_max, log2_size)


@func
def reduce_all_add_tiled(value, log2_size: template()):
    return _reduce_all_tiled(value, _bin_add, log2_size)


@func
def reduce_all_min_tiled(value, log2_size: template()):
    return _reduce_all_tiled(value, _bin_min, log2_size)


@func
def reduce_all_max_tiled(value, log2_size: template()):
    return _reduce_all_tiled(value, _bin_max, log2_size)


@func
def segmented_reduce_add_tiled(value, head_flag, log2_size: template()):
    return _segmented_reduce_tiled(value, head_flag, _bin_add, log2_size)


@func
def segmented_reduce_min_tiled(value, head_flag, log2_size: template()):
    return _segmented_reduce_tiled(value, head_flag, _bin_min, log2_size)


@func
def segmented_reduce_max_tiled(value, head_flag, log2_size: template()):
    return _segmented_reduce_tiled(value, head_flag, _bin_max, log2_size)


def _scans(op, identity):
    """The inclusive and exclusive `op` scans over tiles, and over the whole subgroup."""
    @func
    def inclusive_tiled(value, log2_size: template()):
        return _inclusive_scan_tiled(value, op, log2_size)

    @func
    def exclusive_tiled(value, log2_size: template()):
        return _exclusive_scan_tiled(value, op, identity(value), log2_size)

    @func
    def inclusive(value):
        return inclusive_tiled(value, static(log2_group_size()))

    @func
    def exclusive(value):
        return exclusive_tiled(value, static(log2_group_size()))
    return inclusive_tiled, exclusive_tiled, inclusive, exclusive


@func
def _zero(value):
    return value - value


@func
def _one(value):
    return value - value + 1


@func
def _all_bits(value):
    return ~(value ^ value)


inclusive_add_tiled, exclusive_add_tiled, inclusive_add, exclusive_add = _scans(_bin_add, _zero)
inclusive_mul_tiled, exclusive_mul_tiled, inclusive_mul, exclusive_mul = _scans(_bin_mul, _one)
inclusive_min_tiled, exclusive_min_tiled, inclusive_min, exclusive_min = _scans(_bin_min, _type_max)
inclusive_max_tiled, exclusive_max_tiled, inclusive_max, exclusive_max = _scans(_bin_max, _type_min)
inclusive_and_tiled, exclusive_and_tiled, inclusive_and, exclusive_and = _scans(_bin_and, _all_bits)
inclusive_or_tiled, exclusive_or_tiled, inclusive_or, exclusive_or = _scans(_bin_or, _zero)
inclusive_xor_tiled, exclusive_xor_tiled, inclusive_xor, exclusive_xor = _scans(_bin_xor, _zero)


def _whole_subgroup(tiled):
    @func
    def whole(value):
        return tiled(value, static(log2_group_size()))
    return whole


def _whole_subgroup_segmented(tiled):
    @func
    def whole(value, head_flag):
        return tiled(value, head_flag, static(log2_group_size()))
    return whole


all_true, any_true, all_equal = map(_whole_subgroup, (all_true_tiled, any_true_tiled, all_equal_tiled))
reduce_add, reduce_min, reduce_max = map(_whole_subgroup, (reduce_add_tiled, reduce_min_tiled, reduce_max_tiled))
reduce_all_add, reduce_all_min, reduce_all_max = map(_whole_subgroup, (reduce_all_add_tiled, reduce_all_min_tiled,
                                                                       reduce_all_max_tiled))
segmented_reduce_add, segmented_reduce_min, segmented_reduce_max = map(
    _whole_subgroup_segmented, (segmented_reduce_add_tiled, segmented_reduce_min_tiled, segmented_reduce_max_tiled))


# ---- the block's library -------------------------------------------------------------------
# Each operation that reads a SharedArray after its barrier ends with another barrier: a
# thread's next grid-stride iteration writes the array again, which must wait for every read.

@func
def _check_block_dim(block_dim: template()):
    """A compile error unless `block_dim` is a positive multiple of the subgroup size."""
    if static(block_dim % group_size() != 0 or block_dim < group_size()):
        _static_error("block_dim must be a positive multiple of the subgroup size "
                      "(qd.simt.subgroup.group_size())")


@func
def block_reduce(value, block_dim: template(), op: template(), dtype: template()):
    """The block's reduction under `op`, valid in thread 0 (the others hold partials)."""
    _check_block_dim(block_dim)
    partial = _reduce_tiled(value, op, static(log2_group_size()))
    if static(block_dim == group_size()):
        return partial
    tid = thread_idx()
    shared = SharedArray((block_dim // group_size(),), dtype)
    if tid & static(group_size() - 1) == 0:
        shared[tid // static(group_size())] = partial
    block_sync()
    result = partial
    if tid == 0:
        result = shared[0]
        for w in static(range(1, block_dim // group_size())):
            result = op(result, shared[w])
    block_sync()  # the reads done before a next grid-stride iteration writes the array again
    return result


@func
def block_reduce_all(value, block_dim: template(), op: template(), dtype: template()):
    """The block's reduction under `op`, in every thread."""
    result = block_reduce(value, block_dim, op, dtype)
    shared = SharedArray((1,), dtype)
    if thread_idx() == 0:
        shared[0] = result
    block_sync()
    result = shared[0]
    block_sync()
    return result


@func
def block_inclusive_scan(value, block_dim: template(), op: template(), dtype: template()):
    _check_block_dim(block_dim)
    inclusive = _inclusive_scan_tiled(value, op, static(log2_group_size()))
    if static(block_dim == group_size()):
        return inclusive
    tid = thread_idx()
    subgroup_id = tid // static(group_size())  # not `subgroup`: a local shadowing a global is uncacheable
    shared = SharedArray((block_dim // group_size(),), dtype)
    if tid & static(group_size() - 1) == static(group_size() - 1):
        shared[subgroup_id] = inclusive
    block_sync()
    total = shared[0]
    prefix = total
    for w in static(range(1, block_dim // group_size())):
        if subgroup_id == w:
            prefix = total
        total = op(total, shared[w])
    if subgroup_id != 0:
        inclusive = op(prefix, inclusive)
    block_sync()
    return inclusive


@func
def block_exclusive_scan(value, block_dim: template(), op: template(), identity, dtype: template()):
    _check_block_dim(block_dim)
    exclusive = _exclusive_scan_tiled(value, op, identity, static(log2_group_size()))
    if static(block_dim == group_size()):
        return exclusive
    tid = thread_idx()
    subgroup_id = tid // static(group_size())
    shared = SharedArray((block_dim // group_size(),), dtype)
    if tid & static(group_size() - 1) == static(group_size() - 1):
        shared[subgroup_id] = op(exclusive, value)
    block_sync()
    total = shared[0]
    prefix = identity
    for w in static(range(1, block_dim // group_size())):
        if subgroup_id == w:
            prefix = total
        total = op(total, shared[w])
    if subgroup_id != 0:
        exclusive = op(prefix, exclusive)
    block_sync()
    return exclusive


def _block_ops(op, identity):
    @func
    def reduce(value, block_dim: template(), dtype: template()):
        return block_reduce(value, block_dim, op, dtype)

    @func
    def reduce_all(value, block_dim: template(), dtype: template()):
        return block_reduce_all(value, block_dim, op, dtype)

    @func
    def inclusive(value, block_dim: template(), dtype: template()):
        return block_inclusive_scan(value, block_dim, op, dtype)

    @func
    def exclusive(value, block_dim: template(), dtype: template()):
        return block_exclusive_scan(value, block_dim, op, identity(value), dtype)
    return reduce, reduce_all, inclusive, exclusive


@func
def _sync_count(predicate):
    """Barrier that also counts the threads whose predicate is nonzero (in every thread)."""
    count = SharedArray((1,), i32)
    if thread_idx() == 0:
        count[0] = 0
    block_sync()
    if predicate != 0:
        lang.atomic_add(count[0], 1)
    block_sync()
    result = count[0]
    block_sync()
    return result


@func
def sync_count_nonzero(predicate):
    return _sync_count(predicate)


@func
def sync_all_nonzero(predicate):
    return i32(_sync_count(predicate) == block_dim())


@func
def sync_any_nonzero(predicate):
    return i32(_sync_count(predicate) != 0)


def _namespace(name: str, **members):
    space = _types.SimpleNamespace(**members)
    space.__name__ = name
    return space


_add_ops = _block_ops(_bin_add, _zero)
_min_ops = _block_ops(_bin_min, _type_max)
_max_ops = _block_ops(_bin_max, _type_min)

for _name, _value in list(globals().items()):  # the cache key finds a primitive by its module attribute
    if isinstance(_value, _types.FunctionType) and _value in PRIMITIVES:
        _value.__qualname__ = _name

block = _namespace(
    "qd.simt.block", sync=block_sync, mem_fence=block_mem_fence, mem_sync=block_mem_fence, thread_idx=thread_idx,
    global_thread_idx=global_thread_idx, block_idx=block_idx, block_dim=block_dim, SharedArray=SharedArray,
    sync_all_nonzero=sync_all_nonzero, sync_any_nonzero=sync_any_nonzero, sync_count_nonzero=sync_count_nonzero,
    reduce=block_reduce, reduce_all=block_reduce_all, inclusive_scan=block_inclusive_scan,
    exclusive_scan=block_exclusive_scan,
    reduce_add=_add_ops[0], reduce_all_add=_add_ops[1], inclusive_add=_add_ops[2], exclusive_add=_add_ops[3],
    reduce_min=_min_ops[0], reduce_all_min=_min_ops[1], inclusive_min=_min_ops[2], exclusive_min=_min_ops[3],
    reduce_max=_max_ops[0], reduce_all_max=_max_ops[1], inclusive_max=_max_ops[2], exclusive_max=_max_ops[3])

subgroup = _namespace(
    "qd.simt.subgroup", sync=subgroup_sync, barrier=subgroup_sync, mem_fence=subgroup_mem_fence,
    memory_barrier=subgroup_mem_fence, invocation_id=invocation_id, group_size=group_size,
    log2_group_size=log2_group_size, shuffle=shuffle, shuffle_up=shuffle_up, shuffle_down=shuffle_down,
    shuffle_xor=shuffle_xor, broadcast=broadcast, broadcast_first=broadcast_first, ballot=ballot,
    ballot_full_subgroup=ballot, ballot_first_n=ballot_first_n, elect=elect,
    lanemask_lt=lanemask_lt, lanemask_le=lanemask_le, lanemask_eq=lanemask_eq, lanemask_gt=lanemask_gt,
    lanemask_ge=lanemask_ge,
    all_true=all_true, any_true=any_true, all_equal=all_equal, all_true_tiled=all_true_tiled,
    any_true_tiled=any_true_tiled, all_equal_tiled=all_equal_tiled,
    reduce_add=reduce_add, reduce_min=reduce_min, reduce_max=reduce_max, reduce_all_add=reduce_all_add,
    reduce_all_min=reduce_all_min, reduce_all_max=reduce_all_max, reduce_add_tiled=reduce_add_tiled,
    reduce_min_tiled=reduce_min_tiled, reduce_max_tiled=reduce_max_tiled, reduce_all_add_tiled=reduce_all_add_tiled,
    reduce_all_min_tiled=reduce_all_min_tiled, reduce_all_max_tiled=reduce_all_max_tiled,
    segmented_reduce_add=segmented_reduce_add, segmented_reduce_min=segmented_reduce_min,
    segmented_reduce_max=segmented_reduce_max, segmented_reduce_add_tiled=segmented_reduce_add_tiled,
    segmented_reduce_min_tiled=segmented_reduce_min_tiled, segmented_reduce_max_tiled=segmented_reduce_max_tiled,
    inclusive_add=inclusive_add, inclusive_mul=inclusive_mul, inclusive_min=inclusive_min,
    inclusive_max=inclusive_max, inclusive_and=inclusive_and, inclusive_or=inclusive_or, inclusive_xor=inclusive_xor,
    exclusive_add=exclusive_add, exclusive_mul=exclusive_mul, exclusive_min=exclusive_min,
    exclusive_max=exclusive_max, exclusive_and=exclusive_and, exclusive_or=exclusive_or, exclusive_xor=exclusive_xor,
    inclusive_add_tiled=inclusive_add_tiled, inclusive_mul_tiled=inclusive_mul_tiled,
    inclusive_min_tiled=inclusive_min_tiled, inclusive_max_tiled=inclusive_max_tiled,
    inclusive_and_tiled=inclusive_and_tiled, inclusive_or_tiled=inclusive_or_tiled,
    inclusive_xor_tiled=inclusive_xor_tiled, exclusive_add_tiled=exclusive_add_tiled,
    exclusive_mul_tiled=exclusive_mul_tiled, exclusive_min_tiled=exclusive_min_tiled,
    exclusive_max_tiled=exclusive_max_tiled, exclusive_and_tiled=exclusive_and_tiled,
    exclusive_or_tiled=exclusive_or_tiled, exclusive_xor_tiled=exclusive_xor_tiled)

grid = _namespace("qd.simt.grid", mem_fence=grid_mem_fence, memfence=grid_mem_fence)
warp = _namespace("qd.simt.warp", sync=_warp_sync)
# qd.simt.Tile16x16 / Tile32x32 (simt_tiles.py), written with these primitives
_tile_primitives = _types.SimpleNamespace(shuffle=shuffle, invocation_id=invocation_id, group_size=group_size,
                                          static_error=_static_error, __name__=__name__)
Tile16x16, Tile32x32 = TileProxy(16, _tile_primitives), TileProxy(32, _tile_primitives)
