"""The syntax of `qd.simt.Tile16x16` / `Tile32x32` (compiler/language/simt_tiles.py) in kernels,
as Quadrants' tile_slicing gives it: a mixin of FrontEnd (see ast_to_ir.py).

- `TileNxN.zeros(dtype=...)` / `.eye(dtype=...)`: a tile value (dtype: default_fp without one);
- `arr[r0:r1, c0:c1]` / `arr[b, r0:r1, c0:c1]` on a field or ndarray: a `TileSlice`, and
  `arr[r0:r1, c]` / `arr[b, r0:r1, c]` a `ColumnSlice`: compile-time objects that only tile
  loads, stores and outer products take;
- `tile[:] = slice` loads the tile in place, `arr[...] = tile` stores it;
- `tile -= qd.outer(a, b)` is the tile's rank-1 update, a column slice giving each lane its
  element (the same slice twice, `qd.outer(v, v)`, is read once).

Each becomes a call of the tile's own qd.func method, the tile local being `self` in place;
the method's arguments are values already computed, reached through names no user can write.
"""
from __future__ import annotations

import ast

from ..language import lang
from ..language.simt_tiles import TileConstructor, is_tile
from .objects import GLOBAL_ARRAYS
from .structs import StructValue, StructVar


class TileSlice:
    """`arr[r0:r1, c0:c1]`; `batch` holds the indices before the rows: (b,) for a 3-D array's
    arr[b, r0:r1, c0:c1], () for a 2-D one."""

    def __init__(self, arr, batch, rows: tuple, cols: tuple):
        self.arr, self.batch, self.rows, self.cols = arr, batch, rows, cols


class ColumnSlice:
    """`arr[r0:r1, c]`: lane k's element is arr[r0 + k, c] (0 past r1 or the array's end);
    `batch` as for TileSlice."""

    def __init__(self, arr, batch, rows: tuple, col):
        self.arr, self.batch, self.rows, self.col = arr, batch, rows, col


class TileSyntax:
    _tile_arguments = 0  # names bound so far for the values handed to tile methods

    def call_tile_constructor(self, callee: TileConstructor, node: ast.Call):
        if node.args or any(k.arg != "dtype" for k in node.keywords):
            self.error(f"{callee.proxy!r}.{callee.kind}() takes only dtype=", node)
        if self.target_arch == "cpu":
            self.error(f"{callee.proxy!r} needs a GPU arch (cuda, amdgpu, vulkan, metal): target 'cpu' runs no "
                       f"subgroups", node)
        dtype = self.visit(node.keywords[0].value) if node.keywords else None
        if dtype is None or dtype is float:
            dtype = self.values.default_fp
        stype = callee.proxy.tile_type(dtype)
        tile = self.construct_struct(stype, ast.copy_location(ast.Call(node.func, [], []), node))
        if callee.kind == "zeros":
            return tile
        var = self.new_struct_var(tile, "tile")
        self.call_tile_method(var, "eye_", [], node)
        return self.load_struct_var(var)

    def tile_slice(self, base, node: ast.Subscript):
        """`base[...]` with a tile's slices: a TileSlice or ColumnSlice, else None."""
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        pattern = [isinstance(p, ast.Slice) for p in parts]
        if pattern not in ([True, True], [False, True, True], [True, False], [False, True, False]):
            return None  # not a tile's slice: the subscript's own errors apply
        values = []
        for p in parts:
            if isinstance(p, ast.Slice):
                if p.lower is None or p.upper is None or p.step is not None:
                    self.error("a tile slice needs a start and a stop, and no step (arr[r0:r1, c0:c1])", p)
                values.append((self.visit(p.lower), self.visit(p.upper)))
            else:
                values.append(self.visit(p))
        if pattern == [True, True]:
            return TileSlice(base, (), values[0], values[1])
        if pattern == [False, True, True]:
            return TileSlice(base, (values[0],), values[1], values[2])
        if pattern == [True, False]:
            return ColumnSlice(base, (), values[0], values[1])
        return ColumnSlice(base, (values[0],), values[1], values[2])

    def tile_assign(self, target: ast.Subscript, value, value_node) -> bool:
        """`tile[:] = slice` or `arr[...] = tile`; False for any other subscript assignment."""
        var = self._tile_var(target.value)
        if var is not None and isinstance(target.slice, ast.Slice) and target.slice.lower is None \
                and target.slice.upper is None and target.slice.step is None:
            if not isinstance(value, TileSlice):
                self.error(f"{var.stype.name}[:] can only be assigned an array slice (arr[r0:r1, c0:c1])",
                           value_node or target)
            self._tile_transfer(var, value, target, store=False)
            return True
        if not (isinstance(value, StructValue) and is_tile(value.stype)):
            return False
        base = self.visit(target.value)
        where = self.tile_slice(base, target) if isinstance(base, GLOBAL_ARRAYS) else None
        if not isinstance(where, TileSlice):
            self.error(f"a {value.stype.name} can only be stored into an array slice (arr[r0:r1, c0:c1])", target)
        self._tile_transfer(value, where, target, store=True)
        return True

    def tile_aug_assign(self, node: ast.AugAssign) -> bool:
        """`tile -= qd.outer(a, b)`; False where the target is not a tile local."""
        var = self._tile_var(node.target)
        if var is None:
            return False
        call = node.value
        if not (isinstance(node.op, ast.Sub) and isinstance(call, ast.Call) and self.visit(call.func) is lang.outer
                and len(call.args) == 2 and not call.keywords):
            self.error(f"a {var.stype.name} takes only `-= qd.outer(a, b)` as an augmented assignment", node)
        a, b = (self.visit(arg) for arg in call.args)
        same = b is a
        a = self._lane_value(var, a, call.args[0])
        b = a if same else self._lane_value(var, b, call.args[1])
        self.call_tile_method(var, "_ger_sub", [a, b], node)
        return True

    # ---- helpers ---------------------------------------------------------------------------
    def _tile_var(self, node):
        if isinstance(node, ast.Name):
            var = self.caller_variable(node.id)
            if isinstance(var, StructVar) and is_tile(var.stype):
                return var
        return None

    def _tile_transfer(self, tile, where: TileSlice, node, store: bool) -> None:
        self.call_tile_method(tile, "_transfer", [where.arr, where.batch, *where.rows, *where.cols, store], node)

    def _lane_value(self, var: StructVar, value, node):
        if isinstance(value, ColumnSlice):
            return self.call_tile_method(var, "_column", [value.arr, value.batch, *value.rows, value.col], node)
        if isinstance(value, TileSlice):
            self.error("qd.outer of a tile takes a lane's value or a column slice arr[r0:r1, c]", node)
        return value

    def call_tile_method(self, tile, method: str, args: list, node):
        """`tile.method(*args)` with values already computed (`tile` a struct local: in place)."""
        scope = self.frame.scopes[-1]
        names = []
        for value in args:
            name = f"tile argument {self._tile_arguments}"  # a space: never a user's name
            self._tile_arguments += 1
            scope[name] = value
            names.append(name)
        callee = ast.Name(f"{tile.stype.name}.{method}", ast.Load())  # how errors name the call
        call = ast.Call(callee, [ast.Name(n, ast.Load()) for n in names], [])
        for n in ast.walk(call):
            ast.copy_location(n, node)
        try:
            return self.inline_library_func(tile.stype.methods[method], call, receiver=tile)
        finally:
            for name in names:
                scope.pop(name, None)
