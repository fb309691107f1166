"""`qd.algorithms`: device-wide algorithms built on qd.simt, with Quadrants' names: `sort` (an
LSB radix sort of 32- or 64-bit integer keys, optionally carrying values) and
`sort_scratch_slots`.

`sort` is a `qd.func` called at a kernel's top level (or in a qd.graph.do_while body): each
of its phases is a top-level parallel loop, so a task of its own, and tasks run one after the
other. Per 8-bit digit, low digits first:
1. every tile of TILE keys counts its digits in shared memory into the digit-major histogram
   `scratch[digit * tiles + tile]`;
2. an exclusive scan of the histogram, a staircase of block scans over SCAN_BLOCK elements
   (each level's block totals are the next level's input; then each level adds the prefix of
   its block from the level above), gives every (digit, tile) its first output position;
3. every tile scatters its keys stably: a key's rank among the equal digits of its subgroup
   comes from ballots (one lane mask per digit bit), and the subgroups' counts per digit are
   combined in shared memory, starting from the digit's first position for the tile (one
   coalesced read of the scan per digit, not one per key).
The passes alternate between `keys` and `tmp_keys` (after an odd count the keys are copied
back). `n` is a 0-d i32 ndarray holding the count, read on the device; `scratch` is an i32 or
u32 ndarray of at least `sort_scratch_slots(n, log256_max_n)` slots; keys are i32, u32, i64
or u64 (signed keys order as numbers). GPU archs only; the ballots are u64, so not on Metal.
"""
from __future__ import annotations

from qdc.runtime.contract.types import i32, u64

from .lang import atomic_add, func, loop_config, static, template
from .simt import SharedArray, ballot, block, block_sync, group_size, invocation_id, thread_idx

TILE = 256          # keys per tile: threads per block of the histogram and scatter phases
SCAN_BLOCK = 256    # elements per block of the scan staircase
RADIX = 256         # values of an 8-bit digit


def sort_scratch_slots(n: int, log256_max_n: int | None = None) -> int:
    """The scratch slots `sort` needs for `n` keys, compiled for `log256_max_n` (default: the
    smallest depth whose 256 ** depth holds n): the histogram and every level of its scan."""
    if log256_max_n is None:
        log256_max_n = 1
        while RADIX ** log256_max_n < n:
            log256_max_n += 1
    size = -(-max(n, 1) // TILE) * RADIX
    total = size
    for _ in range(log256_max_n):  # the scan's levels (`_scan`): each one's block totals
        size = -(-size // SCAN_BLOCK)
        total += size
    return total


@func
def _popcount(x):
    x = x - ((x >> u64(1)) & u64(0x5555555555555555))
    x = (x & u64(0x3333333333333333)) + ((x >> u64(2)) & u64(0x3333333333333333))
    x = (x + (x >> u64(4))) & u64(0x0F0F0F0F0F0F0F0F)
    return i32((x * u64(0x0101010101010101)) >> u64(56))


@func
def _digit(key, digit: template(), key_dtype: template()):
    """8-bit digit number `digit` of `key`; a signed key's top digit has its sign bit flipped,
    so that negative keys sort first."""
    bits = u64(key)
    if static(digit == key_dtype.bits // 8 - 1 and key_dtype.kind == "int"):
        bits = bits ^ u64(static(1 << (key_dtype.bits - 1)))
    return i32((bits >> u64(static(8 * digit))) & u64(RADIX - 1))


@func
def _histogram(src: template(), scratch: template(), n: template(), digit: template(), key_dtype: template()):
    loop_config(block_dim=TILE)
    for i in range((n[()] + TILE - 1) // TILE * TILE):
        tiles = (n[()] + TILE - 1) // TILE
        counts = SharedArray((RADIX,), i32)
        t = thread_idx()
        for d in range(t, RADIX, TILE):
            counts[d] = 0
        block_sync()
        if i < n[()]:
            atomic_add(counts[_digit(src[i], digit, key_dtype)], 1)
        block_sync()
        for d in range(t, RADIX, TILE):
            scratch[d * tiles + i // TILE] = counts[d]


@func
def _level_offset(count, level: template()):
    """Where level `level` of the scan staircase starts in the scratch, for `count` keys: the
    histogram is level 0, each level's block totals the next one."""
    size = (count + TILE - 1) // TILE * RADIX
    offset = 0
    for _ in static(range(level)):
        offset += size
        size = (size + SCAN_BLOCK - 1) // SCAN_BLOCK
    return offset


@func
def _level_size(count, level: template()):
    """The elements of level `level` of the scan staircase, for `count` keys."""
    size = (count + TILE - 1) // TILE * RADIX
    for _ in static(range(level)):
        size = (size + SCAN_BLOCK - 1) // SCAN_BLOCK
    return size


@func
def _scan_level(scratch: template(), n: template(), level: template()):
    """Exclusive scan of the level's elements per block of SCAN_BLOCK; each block's total to the
    next level. Offsets and sizes are computed where they are used (the loop's bounds, its
    body) rather than once at the kernel's top level, where they would be tasks of their own."""
    loop_config(block_dim=SCAN_BLOCK)
    for j in range((_level_size(n[()], level) + SCAN_BLOCK - 1) // SCAN_BLOCK * SCAN_BLOCK):
        size = _level_size(n[()], level)
        offset = _level_offset(n[()], level)
        x = 0
        if j < size:
            x = scratch[offset + j]
        before = block.exclusive_add(x, SCAN_BLOCK, i32)
        if j < size:
            scratch[offset + j] = before
        if thread_idx() == SCAN_BLOCK - 1:
            scratch[offset + size + j // SCAN_BLOCK] = before + x


@func
def _add_block_prefix(scratch: template(), n: template(), level: template()):
    """Every element of the level plus its block's prefix, which the level above holds."""
    for j in range(_level_size(n[()], level)):
        offset = _level_offset(n[()], level)
        scratch[offset + j] += scratch[offset + _level_size(n[()], level) + j // SCAN_BLOCK]


@func
def _scan(scratch: template(), n: template(), levels: template()):
    """The histogram's exclusive scan: up the staircase, then each level's block prefixes
    added back down (the top level is one block: already exact). A histogram of at most
    256 ** D slots (D = log256_max_n) reaches one block after D levels."""
    for level in static(range(levels)):
        _scan_level(scratch, n, level)
    for k in static(range(levels - 1)):
        _add_block_prefix(scratch, n, levels - 2 - k)


@func
def _scatter(src: template(), dst: template(), src_values: template(), dst_values: template(), scratch: template(),
             n: template(), has_values: template(), digit: template(), key_dtype: template()):
    loop_config(block_dim=TILE)
    for i in range((n[()] + TILE - 1) // TILE * TILE):
        tiles = (n[()] + TILE - 1) // TILE
        warps = SharedArray((TILE // group_size(), RADIX), i32)  # per subgroup and digit: keys, then their prefix
        t = thread_idx()
        lane = invocation_id()
        w = t // static(group_size())
        for k in range(t, static(TILE // group_size() * RADIX), TILE):
            warps[k // RADIX, k % RADIX] = 0
        valid = i < n[()]
        key = src[i if valid else 0]
        d = _digit(key, digit, key_dtype)
        same = ballot(valid)  # the lanes holding a key with this lane's digit
        for b in static(range(8)):
            bit = ballot((d >> b) & 1 == 1)
            if (d >> b) & 1 == 1:
                same &= bit
            else:
                same &= ~bit
        below = same & ((u64(1) << u64(lane)) - u64(1))
        rank = _popcount(below)
        block_sync()
        if valid and rank == 0:
            warps[w, d] = _popcount(same)
        block_sync()
        for bucket in range(t, RADIX, TILE):  # each digit value's first position for every subgroup's keys
            run = i32(scratch[bucket * tiles + i // TILE])  # the tile's first, from the scan
            for v in range(static(TILE // group_size())):
                c = warps[v, bucket]
                warps[v, bucket] = run
                run += c
        block_sync()
        if valid:
            position = warps[w, d] + rank
            dst[position] = key
            if static(has_values):
                dst_values[position] = src_values[i]
        block_sync()  # every read of `warps` done before the next grid-stride tile clears it


@func
def _copy(src: template(), dst: template(), n: template()):
    for i in range(n[()]):
        dst[i] = src[i]


@func
def sort(keys: template(), tmp_keys: template(), values: template(), tmp_values: template(), scratch: template(),
         n: template(), key_dtype: template(), has_values: template(), end_bit: template(),
         log256_max_n: template()):
    """Sort keys[0 : n[()]] ascending (stable; values along when `has_values`): see the module
    docstring."""
    for p in static(range((end_bit + 7) // 8)):
        if static(p % 2 == 0):
            _histogram(keys, scratch, n, p, key_dtype)
            _scan(scratch, n, log256_max_n)
            _scatter(keys, tmp_keys, values, tmp_values, scratch, n, has_values, p, key_dtype)
        else:
            _histogram(tmp_keys, scratch, n, p, key_dtype)
            _scan(scratch, n, log256_max_n)
            _scatter(tmp_keys, keys, tmp_values, values, scratch, n, has_values, p, key_dtype)
    if static((end_bit + 7) // 8 % 2 == 1):
        _copy(tmp_keys, keys, n)
        if static(has_values):
            _copy(tmp_values, values, n)
