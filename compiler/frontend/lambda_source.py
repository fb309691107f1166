"""The source of a lambda called in a kernel, so that it is inlined like a `@qd.func`.

`inspect.getsource` gives a lambda's whole first line, which need not parse on its own
(`grad_test(lambda x: qd.sin(x),` continued below). So the lambda is found in its file's
syntax tree instead: on its first line, with its parameters, and (for several lambdas on one
line) the one whose body holds the positions its bytecode records. It becomes the function
`def <lambda>(params): return body`, located at the lambda's own lines and columns.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import weakref

from qdc.runtime.contract.errors import QdcCompileError

from .source import SourceInfo, source_info

_LAMBDA_SOURCES = weakref.WeakKeyDictionary()


def callable_source(fn) -> SourceInfo:
    """The SourceInfo of a function or lambda."""
    if fn.__name__ != "<lambda>":
        return source_info(fn)
    info = _LAMBDA_SOURCES.get(fn)
    if info is None:
        info = _LAMBDA_SOURCES[fn] = LambdaSource(fn)
    return info


class LambdaSource(SourceInfo):
    def __init__(self, fn):  # noqa: super().__init__ reads the lambda's lines alone, which may not parse
        code = fn.__code__
        self.filename = inspect.getsourcefile(fn) or code.co_filename
        self.file_lines = linecache.getlines(self.filename, fn.__globals__)
        self.indent, self.first_line = 0, 1
        self._locs = {}
        try:
            self.tree = _parse("".join(self.file_lines))
        except SyntaxError as e:
            raise QdcCompileError(f"cannot read the source of a lambda: {e}", self.filename,
                                  code.co_firstlineno, 1) from None
        lam = _find_lambda(self.tree, code)
        if lam is None:
            raise QdcCompileError("cannot find the source of this lambda (was its file changed after it was "
                                  "loaded?)", self.filename, code.co_firstlineno, 1)
        body = ast.copy_location(ast.Return(value=lam.body), lam.body)
        self.fn_def = ast.copy_location(ast.FunctionDef(name="<lambda>", args=lam.args, body=[body],
                                                        decorator_list=[], returns=None, type_params=[]), lam)
        self._func_body = None


@functools.lru_cache(maxsize=16)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def _find_lambda(tree, code) -> ast.Lambda | None:
    params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    candidates = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == code.co_firstlineno
                  and tuple(a.arg for a in (*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs)) == params]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    # the body's instructions; the zero-width ones (the frame's RESUME) sit at column 0
    positions = [(line, col) for line, _, col, end_col in code.co_positions()
                 if line is not None and col is not None and end_col != col]
    for lam in candidates:
        b = lam.body
        if all((b.lineno, b.col_offset) <= p <= (b.end_lineno, b.end_col_offset) for p in positions):
            return lam
    return None
