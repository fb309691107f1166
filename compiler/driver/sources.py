"""The source text and syntax tree of the functions and classes a cache key reaches.

A function's source is read out of its file from its code object: the block that starts at
`co_firstlineno` (its first decorator, else its `def`) and ends where the indentation says,
never before the last line its code runs, is parsed alone and accepted only if it is exactly one
definition of that name. A top-level class's block starts at the one `class NAME` line at the
file's left margin. Parsing a program's whole files instead cost most of a warm start: a large
program's kernels reach functions in files of megabytes, most of whose lines no kernel reads.
What the block cannot be found for (two classes of one name, a line continued at the left
margin, a lambda, a file that changed since) is found as before: the whole file parsed, once
per version of it, and the spans of its definitions looked up; a lambda's lines parsed alone.

Both ways give the same text: the definition's lines, decorators included, up to its last
statement, dedented, and the same name chains. What parsing a block found is kept beside the
cache, keyed by the block's exact lines (source_facts.py), so a warm process parses nothing.
"""
from __future__ import annotations

import ast
import gc
import inspect
import linecache
import os
import re
import sys
import textwrap
import weakref
from contextlib import contextmanager

from ..frontend.source import block_end, indentation, last_line
from . import source_facts


class SourceUnavailable(Exception):
    """A function's source cannot be read or isolated (the message says why)."""


@contextmanager
def collection_paused():
    """The cyclic garbage collector held off while source is parsed and key material built:
    both allocate hundreds of thousands of objects that no cycle holds, and in a program of a
    million live objects (a physics engine and torch) each full collection this triggers walks
    them all, which cost more than the parsing itself. Garbage made meanwhile is collected when
    the collector next runs."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class FunctionSource:
    """What a cache key reads of a function's source: its text (dedented, decorators included),
    every longest name chain it reads (`a`, `a.b`, `a.b.c`, first occurrence first) and the
    base of each `.grad` it reads (the name, or None for any other expression). The syntax tree
    is not kept: a large program's trees are a million objects, which every later full garbage
    collection of the process would walk again."""

    __slots__ = ("text", "chains", "grad_bases")

    def __init__(self, text: str, chains: list, grad_bases: list):
        self.text, self.chains, self.grad_bases = text, chains, grad_bases

    @classmethod
    def of_tree(cls, text: str, tree: ast.AST) -> "FunctionSource":
        return cls(text, *_reads(tree))


def _reads(tree) -> tuple[list, list]:
    """(name chains, `.grad` bases) of a syntax tree. Only the longest chain of an attribute
    access is resolved (`cfg.n` needs the value of `cfg.n`, not of the object `cfg`); a chain
    whose base is no name (`f(x).y`) is searched inside."""
    seen, chains, grad_bases = set(), [], []
    stack = [tree]
    while stack:
        node = stack.pop()
        attrs, base = [], node
        while isinstance(base, ast.Attribute):
            attrs.append(base.attr)
            base = base.value
        for i, attr in enumerate(attrs):
            if attr == "grad":  # attrs[-1] is the attribute taken of the base itself
                grad_bases.append(base.id if i == len(attrs) - 1 and isinstance(base, ast.Name) else None)
        if isinstance(base, ast.Name) and (attrs or isinstance(base.ctx, ast.Load)):
            chain = (base.id, *reversed(attrs))
            if chain not in seen:
                seen.add(chain)
                chains.append(chain)
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(base))))
    return chains, grad_bases


_SOURCES = weakref.WeakKeyDictionary()  # function -> FunctionSource; a redefined kernel (notebooks) frees its entry


def function_source(fn) -> FunctionSource:
    """`fn`'s FunctionSource (a lambda's: of its lines); SourceUnavailable where Python shows
    none."""
    got = _SOURCES.get(fn)
    if got is None:
        with collection_paused():
            got = _SOURCES[fn] = _function_block(fn) or FunctionSource.of_tree(
                *(_function_in_parsed_file(fn) or _parsed_lines(fn)))
    return got


def _function_block(fn) -> FunctionSource | None:
    """`fn`'s source out of its file's lines alone, or None where its block cannot be isolated
    so (then the whole file is parsed)."""
    code = getattr(fn, "__code__", None)
    if code is None or fn.__name__ == "<lambda>":
        return None
    lines = current_lines(code.co_filename, getattr(fn, "__globals__", None))
    first = code.co_firstlineno - 1
    if not 0 <= first < len(lines) or not lines[first].lstrip().startswith(("@", "def ", "async ")):
        return None
    end = block_end(lines, first, first + 1)
    found = _block(lines, first, end, "function", fn.__name__)
    if found is None and last_line(code) > end:  # a line continued at the margin cut the block short
        found = _block(lines, first, block_end(lines, first, last_line(code)), "function", fn.__name__)
    if found is None:
        return None
    stop, _, chains, grad_bases = found
    return FunctionSource(textwrap.dedent("".join(lines[first:stop])), [tuple(c) for c in chains], grad_bases)


_LINE_VERSIONS: dict = {}  # file name -> its version when linecache last read it


def current_lines(filename: str, module_globals) -> list:
    """The lines of a source file as it is now (linecache keeps what it read first: a module
    rewritten and imported again would be keyed by its old text)."""
    version = _file_version(filename)
    if _LINE_VERSIONS.get(filename, version) != version:
        linecache.checkcache(filename)
    _LINE_VERSIONS[filename] = version
    return linecache.getlines(filename, module_globals)


_KINDS = {"function": (ast.FunctionDef, ast.AsyncFunctionDef), "class": (ast.ClassDef,)}


def _block(lines: list, start: int, end: int, kind: str, name: str) -> list | None:
    """[stop, definition line, name chains, `.grad` bases] of the `kind` definition of `name`
    that `lines[start:end]` hold, its last statement ending at `lines[stop - 1]` and its own
    line (after the decorators) `lines[start + definition line - 1]`; None where those lines
    are not exactly one such definition. Kept beside the cache (source_facts.py)."""
    found = source_facts.facts(kind, name, "".join(lines[start:end]), lambda: _parse_block(lines[start:end], kind, name))
    if found is None:
        return None
    return [start + found[0], *found[1:]]


def _parse_block(lines: list, kind: str, name: str) -> list | None:
    indented = indentation(lines[0]) > 0
    try:  # an indented block parses as the body of an `if` (dedenting would change its strings)
        tree = ast.parse(("if 1:\n" if indented else "") + "".join(lines))
    except (SyntaxError, ValueError):
        return None
    body, offset = (tree.body[0].body, 1) if indented else (tree.body, 0)
    if len(body) != 1 or not isinstance(body[0], _KINDS[kind]) or body[0].name != name:
        return None
    node = body[0]
    chains, grad_bases = _reads(node) if kind == "function" else ([], [])
    return [node.end_lineno - offset, node.lineno - offset, [list(c) for c in chains], grad_bases]


def _parsed_lines(fn) -> tuple[str, ast.AST]:
    """The source of a function its file does not show (a lambda's lines), parsed alone."""
    name = getattr(fn, "__name__", fn)
    try:
        lines, _ = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
        raise SourceUnavailable(f"source of {name!r} unavailable: {e}") from None
    text = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a lambda inside a larger expression: its lines alone do not parse
        raise SourceUnavailable(f"source of {name!r} cannot be isolated (a lambda spanning "
                                f"lines of a larger expression?)") from None
    return text, tree


_CLASS_SOURCES = weakref.WeakKeyDictionary()


def class_source(cls) -> str | None:
    """A class's source (its methods and properties run when a kernel reads a template object),
    None where Python has none (a class made at run time keys by its name alone)."""
    try:
        return _CLASS_SOURCES[cls]
    except KeyError:
        pass
    except TypeError:  # not weakly referable
        return None
    with collection_paused():
        text = _CLASS_SOURCES[cls] = _class_text(cls)
    return text


def _class_text(cls) -> str | None:
    try:
        filename = inspect.getsourcefile(cls)
    except TypeError:
        return None
    module = sys.modules.get(cls.__module__)
    if filename is None or module is None or getattr(module, "__file__", None) is None:
        return None
    lines = current_lines(filename, module.__dict__)
    span = _top_level_class_span(lines, cls.__qualname__)
    if span is None:
        _, lines, classes, _ = _parsed_file(filename, module.__dict__)
        span = classes.get(cls.__qualname__)
    return None if span is None else "".join(lines[span[0] - 1:span[1]])


def _top_level_class_span(lines: list, qualname: str) -> tuple[int, int] | None:
    """(first line with its decorators, last line) of the module-level class `qualname`, found
    by its one `class NAME` line at the left margin; None for a nested class, where the name is
    written there twice, or where a decorator spans lines."""
    if not qualname.isidentifier():
        return None
    header = re.compile(rf"class\s+{qualname}\b")
    at = [i for i in _class_lines(lines) if header.match(lines[i])]
    if len(at) != 1:
        return None
    start = at[0]
    while start > 0 and lines[start - 1].startswith("@"):
        start -= 1
    if start > 0 and lines[start - 1][:1] in (" ", "\t", ")", "]", "}"):
        return None  # the end of a decorator spanning lines, or of a statement: the whole file says
    found = _block(lines, start, block_end(lines, start, at[0] + 1), "class", qualname)
    if found is None or found[1] != at[0] - start + 1:
        return None
    return start + 1, found[0]


_CLASS_LINES: dict = {}  # id of a file's lines (linecache's list) -> (those lines, where `class` starts a line)


def _class_lines(lines: list) -> list:
    """The indices of the lines starting with `class`, found once per version of a file's lines
    (a module's classes are looked up one by one, each scan of a long file's lines cost more
    than the rest of the look-up)."""
    found = _CLASS_LINES.get(id(lines))
    if found is None or found[0] is not lines:
        found = _CLASS_LINES[id(lines)] = (lines, [i for i, line in enumerate(lines) if line.startswith("class")])
    return found[1]


# ---- the whole file, where a block cannot be isolated ---------------------------------------

def _file_version(filename: str) -> tuple | None:
    try:
        st = os.stat(filename)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


# file name -> (its version, its lines, its classes (_class_spans), its functions (_function_spans))
_FILES: dict = {}


def _parsed_file(filename: str, module_globals) -> tuple:
    """A source file's lines and the spans of the classes and functions it defines, parsed once
    per version of the file (empty spans where it does not parse). A file rewritten since (a
    rebuilt module) is parsed anew."""
    version = _file_version(filename)
    found = _FILES.get(filename)
    if found is None or found[0] != version:
        linecache.checkcache(filename)
        lines = linecache.getlines(filename, module_globals)
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            tree = None
        found = _FILES[filename] = (version, lines, *(({}, {}) if tree is None else
                                                     (_class_spans(tree), _function_spans(tree))))
    return found


def _function_in_parsed_file(fn) -> tuple[str, ast.AST] | None:
    """A function's source and syntax tree out of its whole file (_parsed_file); None where
    the file does not show it (a lambda, no file)."""
    code = getattr(fn, "__code__", None)
    if code is None or fn.__name__ == "<lambda>":
        return None
    _, lines, _, functions = _parsed_file(code.co_filename, getattr(fn, "__globals__", None))
    span = functions.get(code.co_firstlineno)
    if span is None or span[0].name != fn.__name__:
        return None
    node, first, last = span
    return textwrap.dedent("".join(lines[first - 1:last])), node


def _function_spans(tree) -> dict:
    """first line (with its decorators, and the `def` line) -> (node, first, last) of every
    function definition in a module."""
    spans = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.setdefault(first, (node, first, node.end_lineno))
            spans.setdefault(node.lineno, (node, first, node.end_lineno))
    return spans


def _class_spans(tree) -> dict:
    """qualname -> (first line with its decorators, last line) of every class in a module."""
    spans, stack = {}, [(tree, "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.setdefault(name, (first, child.end_lineno))
                stack.append((child, name + "."))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.append((child, prefix + child.name + ".<locals>."))
    return spans
