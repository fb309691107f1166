"""Source of kernels and funcs: parsed AST, file positions, and early-return normalisation."""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import weakref
from typing import NamedTuple

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir


class ValueNames(NamedTuple):
    once: frozenset  # the names assigned by one statement
    parameters: frozenset  # the parameters assigned by none
    passed_to: dict  # name -> the callee expressions of the calls it is passed to by name
    assigned: frozenset  # every name assigned somewhere


class SourceInfo:
    """Where a Python function's source lives, so AST positions map to file positions."""

    def __init__(self, fn):
        self.filename = inspect.getsourcefile(fn) or "<unknown>"
        found = _definition(fn, self.filename)
        if found is None:
            lines, start = inspect.getsourcelines(fn)
            found = lines, start, ast.parse(textwrap.dedent("".join(lines)))
        lines, self.first_line, self.tree = found
        self.file_lines = lines
        self.indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
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

    @functools.cached_property
    def value_names(self) -> "ValueNames":
        """The names of the body the front end lowers that it may bind to their values instead of
        local variables (see ValueNames). Left out: names stored through (`v[0] = x`, `s.a = x`, `v.fill(x)`) or indexed other than by
        a constant or a qd.static loop's variable (a run-time index into a vector local reads it
        as a local array). A `for` target, an augmented assignment or a second assignment each
        count as a statement that assigns; whether a callee may write what it is passed (a
        qd.template() parameter, an atomic operation), or a qd.static loop unrolls an assignment,
        is the front end's to tell (FrontEnd.binds_once)."""
        counts: dict = {}
        excluded, passed, static_names, subscripts = set(), {}, set(), []
        stack = list(self.func_body)
        while stack:  # every node once, as ast.walk but without its generators (a cold build's every func)
            n = stack.pop()
            cls = n.__class__
            if cls is ast.Name:
                if n.ctx.__class__ is not ast.Load:
                    counts[n.id] = counts.get(n.id, 0) + 1
                continue
            if cls is ast.Subscript or cls is ast.Attribute:
                if n.ctx.__class__ is not ast.Load:
                    excluded.add(_root_name(n))
                if cls is ast.Subscript:
                    subscripts.append(n)
            elif cls is ast.Call:
                for a in [*n.args, *(k.value for k in n.keywords)]:
                    if a.__class__ is ast.Name:
                        passed.setdefault(a.id, []).append(n.func)
                if n.func.__class__ is ast.Attribute and n.func.attr == "fill":
                    excluded.add(_root_name(n.func.value))
            elif cls is ast.For and _is_static_call(n.iter):
                static_names.update(t.id for t in ast.walk(n.target) if isinstance(t, ast.Name))
            for field in getattr(n, "_fields", ()):  # a list may hold names (strings)
                v = getattr(n, field, None)
                if v.__class__ is list:
                    stack.extend(v)
                elif isinstance(v, ast.AST):
                    stack.append(v)
        excluded.update(_root_name(n) for n in subscripts if not _is_fixed_index(n.slice, static_names))
        once = frozenset(name for name, count in counts.items() if count == 1 and name not in excluded)
        a = self.fn_def.args
        params = frozenset(p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]
                           if p.arg not in counts and p.arg not in excluded)
        return ValueNames(once, params, passed, frozenset(counts))

    @property
    def func_body(self) -> list[ast.stmt]:
        """The body of a qd.func with early returns rewritten into tail returns (computed once)."""
        if self._func_body is None:
            self._func_body = fold_early_returns(self.fn_def.body)
        return self._func_body


def _definition(fn, filename: str) -> tuple[list, int, ast.Module] | None:
    """(lines, first line number, syntax tree) of `fn`'s definition, decorators included, the
    lines as `inspect.getsourcelines` gives them, found from its code object and the indentation
    of its file's lines; None where they are not exactly one definition of its name (then
    inspect, which tokenizes the file from the definition on: a quarter of Genesis's cold
    front end)."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn.__name__ == "<lambda>":
        return None
    linecache.checkcache(filename)
    lines = linecache.getlines(filename, getattr(fn, "__globals__", None))
    first = code.co_firstlineno - 1
    if not 0 <= first < len(lines) or not lines[first].lstrip().startswith(("@", "def ", "async ")):
        return None
    end = block_end(lines, first, last_line(code))
    while end > first + 1 and lines[end - 1].strip()[:1] in ("", "#"):
        end -= 1  # trailing blank and comment lines: inspect ends the block at its last statement
    block = lines[first:end]
    try:
        tree = ast.parse(textwrap.dedent("".join(block)))
    except (SyntaxError, ValueError):
        return None
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) or \
            body[0].name != fn.__name__:
        return None
    return block, first + 1, tree


def last_line(code) -> int:
    """The last source line any instruction of `code` (or of a function or comprehension
    inside it) spans: the block reaches at least there, whatever its indentation."""
    last = code.co_firstlineno
    positions = getattr(code, "co_positions", None)
    if positions is not None:  # Python 3.11: where each instruction ends
        for _, end, _, _ in positions():
            if end is not None and end > last:
                last = end
    else:
        for _, _, line in code.co_lines():
            if line is not None and line > last:
                last = line
    for const in code.co_consts:
        if isinstance(const, type(code)):
            last = max(last, last_line(const))
    return last


def indentation(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def block_end(lines: list, start: int, at_least: int) -> int:
    """Where the indented block of the definition whose first line (a decorator, else its own)
    is `lines[start]` ends, going on at least to line `at_least`: the first line after it
    indented no deeper than the definition that is not blank, a comment or a closing bracket
    (of a signature written over several lines)."""
    head = start
    while head < len(lines) and not lines[head].lstrip().startswith(("def ", "async ", "class ")):
        head += 1  # past the decorators: the definition's own line sets the body's indentation
    if head >= len(lines):
        return len(lines)
    margin = indentation(lines[head])
    end = max(head + 1, at_least)
    while end < len(lines):
        stripped = lines[end].strip()
        if stripped and stripped[0] not in "#)]}" and indentation(lines[end]) <= margin:
            break
        end += 1
    return end


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


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_static_call(node) -> bool:
    """`qd.static(...)` (any module's `static`, or a bare `static`)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "static") or (isinstance(f, ast.Name) and f.id == "static")


def _is_fixed_index(node, static_names: set) -> bool:
    """An index known when the front end lowers it: constants and qd.static loop variables."""
    if isinstance(node, ast.Tuple):
        return all(_is_fixed_index(e, static_names) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_fixed_index(node.operand, static_names)
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id in static_names)


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
