"""`qd.simt.Tile16x16` and `qd.simt.Tile32x32`: an NxN matrix held in registers by the N first
lanes of a subgroup, one row per lane (lane k's `r[j]` is element (k, j)), with Quadrants'
names and semantics. Rows move between lanes by subgroup shuffles only: no shared memory.

In a kernel on a GPU arch (the front end's compiler/frontend/tiles.py gives the syntax):

    L = qd.simt.Tile32x32.eye(dtype=qd.f32)        # or .zeros(dtype=...); dtype: default_fp
    L[:] = a[r0:r1, c0:c1]                          # load (a 3-D array: a[b, r0:r1, c0:c1]);
                                                    # rows/columns past the bounds keep their value
    L -= qd.outer(v, w)                             # rank-1 update; v, w: a lane's scalar, or a
                                                    # column slice a[r0:r1, c] (0 past the bounds)
    L.cholesky_(eps)                                # in place: lower triangle of L with A = L Lᵀ,
                                                    # each pivot sqrt(max(value, eps)) (eps per lane)
    L.solve_triangular_(B)                          # B := B L⁻ᵀ (solves X Lᵀ = B), L lower
    a[r0:r1, c0:c1] = L                             # store, within the array's bounds

A tile is a struct (`qd.dataclass`) of one vector member `r` of N elements; its methods work
on the tile in place, as Quadrants' do. Every lane of the subgroup must take part (the
shuffles), so the subgroup must have at least N lanes: a compile error otherwise.
"""
from qdc.runtime.contract.types import f32, i32, u32

from . import lang
from .lang import func, static, template
from .structs import StructType, dataclass

# (No `from __future__ import annotations` here: the tile class's member annotation is evaluated
# where it is written, from the factory's size and dtype.)


class TileConstructor:
    """`TileNxN.zeros` / `TileNxN.eye`, called in a kernel with an optional `dtype=`."""

    def __init__(self, proxy, kind: str):
        self.proxy, self.kind = proxy, kind

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"qd.simt.Tile{self.proxy.SIZE}x{self.proxy.SIZE}.{self.kind}() can only be called "
                           f"inside a kernel or qd.func")


class TileProxy:
    """`qd.simt.Tile16x16` / `qd.simt.Tile32x32`: the tile class of each dtype, made when a
    kernel first uses it. `simt` holds the qd.simt primitives the tiles are written with
    (compiler/language/simt.py makes the proxies: this module does not import it)."""

    def __init__(self, size: int, simt):
        self.SIZE, self.simt = size, simt
        # a template argument names it (compiler/driver/template_values.py): qd.simt's attribute
        self.__module__, self.__qualname__ = simt.__name__, f"Tile{size}x{size}"
        self.zeros = TileConstructor(self, "zeros")
        self.eye = TileConstructor(self, "eye")

    def tile_type(self, dtype) -> StructType:
        return make_tile(self.SIZE, dtype, self.simt)

    def __repr__(self):
        return f"qd.simt.Tile{self.SIZE}x{self.SIZE}"

    def __qdc_key__(self):  # a kernel's cache key names the proxy by its size
        return repr(self)


_TILES: dict = {}


def make_tile(n: int, dtype, simt) -> StructType:
    dtype = dtype or f32
    tile = _TILES.get((n, dtype))
    if tile is None:
        tile = _TILES[(n, dtype)] = _tile_class(n, dtype, simt)
    return tile


def is_tile(stype) -> bool:
    return any(stype is t for t in _TILES.values())


def _tile_class(n: int, dtype, simt) -> StructType:
    shuffle, invocation_id, group_size, _static_error = simt.shuffle, simt.invocation_id, simt.group_size, \
        simt.static_error

    too_few_lanes = f"Tile{n}x{n} needs subgroups of at least {n} lanes (one row per lane)"
    only_lower = f"Tile{n}x{n}.solve_triangular_: only lower=True is supported"

    @func
    def _check_subgroup():
        if static(group_size() < n):
            _static_error(too_few_lanes)

    @func
    def _clamp(stop, extent):
        return extent if extent < stop else stop

    class Tile:
        r: lang.vector(n, dtype)

        @func
        def _transfer(self, arr: template(), batch, row_start, row_stop, col_start, col_stop, store: template()):
            """Lane k loads row row_start + k, columns [col_start, col_stop), of arr[batch] within
            its bounds (batch: the indices before the rows, () for a 2-D arr); or stores it there
            where `store`."""
            _check_subgroup()
            row = row_start + i32(invocation_id())
            rows = static(len(batch))  # the rows' axis
            if row < _clamp(row_stop, arr.shape[rows]):
                stop = _clamp(col_stop, arr.shape[rows + 1])
                for j in static(range(n)):
                    if col_start + j < stop:
                        if static(store):
                            arr[batch, row, col_start + j] = self.r[j]
                        else:
                            self.r[j] = arr[batch, row, col_start + j]

        @func
        def _column(self, arr: template(), batch, row_start, row_stop, col):
            """Lane k's element of column `col` of arr[batch], rows [row_start, row_stop): 0 past
            them (batch as for _transfer)."""
            value = lang.cast(0.0, dtype)
            row = row_start + i32(invocation_id())
            if row < _clamp(row_stop, arr.shape[static(len(batch))]):
                value = arr[batch, row, col]
            return value

        @func
        def eye_(self):
            lane = i32(invocation_id())
            for j in static(range(n)):
                self.r[j] = lang.cast(1.0, dtype) if lane == j else lang.cast(0.0, dtype)

        @func
        def _ger_sub(self, a, b):
            """self -= a bᵀ: lane k holds a[k] and b[k]; column j takes b[j] from lane j."""
            _check_subgroup()
            for j in static(range(n)):
                self.r[j] = self.r[j] - a * shuffle(b, u32(j))

        @func
        def cholesky_(self, eps):
            """Right-looking in registers: the pivot k on lane k, broadcast by a shuffle; each
            lane keeps the squared norm of its row's finished part."""
            _check_subgroup()
            lane = i32(invocation_id())
            norm = lang.cast(0.0, dtype)
            for k in static(range(n)):
                pivot = lang.cast(0.0, dtype)
                if lane == k:
                    pivot = lang.sqrt(lang.max(self.r[k] - norm, eps))
                    self.r[k] = pivot
                pivot_k = shuffle(pivot, u32(k))
                dot_even = lang.cast(0.0, dtype)  # two partial sums, as Quadrants (the same rounding)
                dot_odd = lang.cast(0.0, dtype)
                for j in static(range(k)):
                    mine = self.r[j]
                    if static(j % 2 == 0):
                        dot_even += shuffle(mine, u32(k)) * mine
                    else:
                        dot_odd += shuffle(mine, u32(k)) * mine
                dot = dot_even + dot_odd
                if lane > k:
                    value = (self.r[k] - dot) / pivot_k
                    self.r[k] = value
                    norm += value * value

        @func
        def _get_col(self, k):
            value = lang.cast(0.0, dtype)
            for j in static(range(n)):
                if k == j:
                    value = self.r[j]
            return value

        @func
        def _set_col(self, k, value):
            for j in static(range(n)):
                if k == j:
                    self.r[j] = value

        @func
        def _trsm(self, lower):
            """self := self lower⁻ᵀ, column by column (forward substitution along each row)."""
            _check_subgroup()
            for c in range(n):
                dot = lang.cast(0.0, dtype)
                for j in range(n):
                    if c > j:
                        dot += self._get_col(j) * shuffle(lower._get_col(j), u32(c))
                diagonal = shuffle(lower._get_col(c), u32(c))
                self._set_col(c, (self._get_col(c) - dot) / diagonal)

        @func
        def solve_triangular_(self, b: template(), lower: template() = True):
            """b := b self⁻ᵀ (X selfᵀ = b), self lower-triangular and non-singular."""
            if static(not lower):
                _static_error(only_lower)
            b._trsm(self)

    Tile.__name__ = Tile.__qualname__ = f"Tile{n}x{n}"
    tile = dataclass(Tile)
    tile.SIZE = n
    return tile

