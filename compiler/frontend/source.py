"""Source of kernels and funcs: parsed AST, file positions, and early-return normalisation."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import weakref

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir


class SourceInfo:
    """Where a Python function's source lives, so AST positions map to file positions."""

    def __init__(self, fn):
        self.filename = inspect.getsourcefile(fn) or "<unknown>"
        lines, start = inspect.getsourcelines(fn)
        self.file_lines = lines
        self.indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        self.first_line = start
        self.tree = ast.parse(textwrap.dedent("".join(lines)))
        self.fn_def = self.tree.body[0]
        self._func_body = None
        self._locs: dict = {}

    def loc(self, node) -> ir.SourceLoc:
        """Made once per position: the front end asks for the location of every statement it
        emits (a vector expression emits dozens at one node), and a SourceLoc is immutable."""
        key = (getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        got = self._locs.get(key)
        if got is None:
            line, col = key
            got = self._locs[key] = ir.SourceLoc(self.filename, self.first_line + line - 1, col + self.indent + 1)
        return got

    def source_line(self, node) -> str | None:
        idx = getattr(node, "lineno", 1) - 1
        return self.file_lines[idx] if 0 <= idx < len(self.file_lines) else None

    @functools.cached_property
    def assigned_names(self) -> frozenset:
        """Every name the function assigns somewhere (for the hint of a "not defined" error)."""
        return frozenset(n.id for n in ast.walk(self.fn_def)
                         if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))

    @property
    def func_body(self) -> list[ast.stmt]:
        """The body of a qd.func with early returns rewritten into tail returns (computed once)."""
        if self._func_body is None:
            self._func_body = fold_early_returns(self.fn_def.body)
        return self._func_body


_SOURCE_CACHE = weakref.WeakKeyDictionary()  # a redefined kernel (notebooks) frees its entry


def source_info(fn) -> SourceInfo:
    info = _SOURCE_CACHE.get(fn)
    if info is None:
        try:
            info = SourceInfo(fn)
        except (OSError, TypeError, SyntaxError) as e:
            raise QdcCompileError(f"cannot read the source of {getattr(fn, '__name__', fn)}: {e}") from None
        _SOURCE_CACHE[fn] = info
    return info


# ---- early returns ----------------------------------------------------------------------
#
# A qd.func is inlined, so a `return` must end every path it is on. The usual early-return
# pattern
#     if c:
#         return a
#     rest
#     return b
# is rewritten into `if c: return a  else: rest; return b`: the statements after an `if`
# that contains a return move into each of its branches that does not already end in one.
# Returns that still are not the last statement of their block (inside a loop, or followed
# by code) are rejected by the front end; `is_tail_return` tells them apart.

_TAIL_MARK = "_qdc_tail_return"


def is_tail_return(node: ast.Return) -> bool:
    return getattr(node, _TAIL_MARK, False)


def fold_early_returns(stmts: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for i, s in enumerate(stmts):
        rest = stmts[i + 1:]
        if isinstance(s, ast.If) and rest and _contains_return(s):
            body = s.body if _ends_in_return(s.body) else s.body + rest
            orelse = s.orelse if _ends_in_return(s.orelse) else s.orelse + rest
            s = ast.copy_location(ast.If(test=s.test, body=body, orelse=orelse), s)
            out.append(_fold_branches(s))
            return out
        out.append(_fold_branches(s) if isinstance(s, ast.If) else s)
    if out and isinstance(out[-1], ast.Return):
        setattr(out[-1], _TAIL_MARK, True)
    return out


def _fold_branches(s: ast.If) -> ast.If:
    new = ast.copy_location(ast.If(test=s.test, body=fold_early_returns(s.body),
                                   orelse=fold_early_returns(s.orelse)), s)
    return new


def _ends_in_return(stmts) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return True
    return isinstance(last, ast.If) and _ends_in_return(last.body) and _ends_in_return(last.orelse)


def _contains_return(node) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))
