"""Cache keys: what a compiled kernel depends on, found without running the front end.

The key hashes the kernel's source and, through every name its source (and the source of
each `@qd.func` it reaches) resolves in its closure or globals: captured constants, field
declarations (name, dtype, shape, needs_grad), called funcs, plus the parameter
annotations, the artifact format version, a fingerprint of the compiler itself, the target
and every code-affecting option. Resolution over-approximates (a local that shadows a global
still pulls the global in), which can only cost an unneeded rebuild, never a stale hit.

The same walk gives the deterministic list of fields a kernel can reach; an entry records,
for each field of its metadata, an index into that list (`field_refs`), which is how a
direct-mode cache hit binds the right Field objects without compiling.
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect
import os
import textwrap
import types
import weakref

import msgpack
import numpy as np

from qdc.runtime import types as T
from qdc.runtime.artifact import FORMAT_VERSION
from qdc.runtime.fields import Field

from . import lang

_MAX_SEQ, _MAX_DEPTH = 256, 4


class UncacheableKernel(Exception):
    """The kernel's dependencies cannot be determined (e.g. its source is unavailable)."""


class KernelDeps:
    """A kernel's cache key and the fields it can reach, in walk order."""

    def __init__(self, key: str, fields: list, needs_grad: bool):
        self.key, self.fields, self.needs_grad = key, fields, needs_grad

    def refs_for(self, field_objects) -> list | None:
        """`field_refs` for the front end's field table, or None if a field was reached by a
        route the walk did not follow (then the kernel is compiled but not cached)."""
        index = {id(f): [i, False] for i, f in enumerate(self.fields)}
        for i, f in enumerate(self.fields):
            if f.grad is not None:
                index.setdefault(id(f.grad), [i, True])
        refs = [index.get(id(f)) for f in field_objects]
        return None if any(r is None for r in refs) else refs

    def bind(self, field_refs) -> list:
        out = []
        for i, is_grad in field_refs:
            if i >= len(self.fields):
                raise IndexError("field_refs index out of range")
            f = self.fields[i]
            out.append(f.grad if is_grad else f)
        return out


def kernel_key(fn, params, opts, arch: str, variant: str = "forward") -> KernelDeps:
    walk = _Walk(debug=bool(opts.debug))
    walk.function(fn, fn.__name__)
    decls = [[f.name, f.dtype.name, list(f.shape), bool(f.needs_grad), bool(f.is_grad)] for f in walk.fields]
    material = ["qdc-kernel-key", FORMAT_VERSION, compiler_fingerprint(), arch, target_description(arch),
                sorted(opts.key().items()), variant, fn.__name__,
                [[p.name, p.kind, p.dtype.name, p.ndim or 0, bool(p.needs_grad)] for p in params],
                walk.material, decls]
    key = hashlib.sha256(msgpack.packb(material, use_bin_type=True)).hexdigest()
    needs_grad = any(f.needs_grad or f.is_grad for f in walk.fields) or any(p.needs_grad for p in params)
    return KernelDeps(key, walk.fields, needs_grad)


# ---- the dependency walk -----------------------------------------------------------------

_SOURCES = weakref.WeakKeyDictionary()  # a redefined kernel (notebooks) frees its entry


def _source(fn) -> tuple[str, ast.AST]:
    got = _SOURCES.get(fn)
    if got is None:
        try:
            lines, _ = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise UncacheableKernel(f"source of {getattr(fn, '__name__', fn)!r} unavailable: {e}") from None
        text = textwrap.dedent("".join(lines))
        got = _SOURCES[fn] = (text, ast.parse(text))
    return got


def _name_chains(tree) -> list[tuple[str, ...]]:
    """Every `a`, `a.b`, `a.b.c` read in the tree, first occurrence first."""
    seen, out = set(), []
    for node in ast.walk(tree):
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and (attrs or isinstance(node.ctx, ast.Load)):
            chain = (node.id, *reversed(attrs))
            if chain not in seen:
                seen.add(chain)
                out.append(chain)
    return out


def _is_qdc_module(m) -> bool:
    return isinstance(m, types.ModuleType) and (m.__name__ == "qdc" or m.__name__.startswith("qdc."))


class _Walk:
    def __init__(self, debug: bool):
        self.debug = debug
        self.material: list = []
        self.fields: list[Field] = []
        self._field_index: dict = {}
        self._fns: set = set()

    def function(self, fn, label: str) -> None:
        if fn in self._fns:
            return
        self._fns.add(fn)
        text, tree = _source(fn)
        where = [fn.__code__.co_filename, fn.__code__.co_firstlineno] if self.debug else []
        self.material.append(["source", label, text, *where])
        for i, d in enumerate(fn.__defaults__ or ()):
            self.value(f"{label}.__defaults__[{i}]", d)
        closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                closure[name] = cell.cell_contents
            except ValueError:  # an unassigned cell: the front end will report it
                pass
        for chain in _name_chains(tree):
            self.chain(fn, closure, chain)

    def chain(self, fn, closure: dict, chain: tuple) -> None:
        root = chain[0]
        if root in closure:
            value = closure[root]
        elif root in fn.__globals__:
            value = fn.__globals__[root]
        else:
            return  # a local, a parameter or a builtin: covered by the source text
        for i, attr in enumerate(chain[1:], 1):
            if _is_qdc_module(value) or isinstance(value, (Field, lang.Func, T.DataType)) \
                    or isinstance(value, types.FunctionType) and "_primal" in value.__dict__:  # a @qd.kernel
                return  # the prefix is recorded on its own; what hangs off it is the language's
            try:
                value = getattr(value, attr)
            except Exception:  # noqa: BLE001  (a missing attribute is reported by the front end)
                self.material.append(["missing", ".".join(chain[:i + 1])])
                return
        self.value(".".join(chain), value)

    def value(self, label: str, v, depth: int = 0) -> None:
        m = self.material
        if isinstance(v, Field):
            m.append(["field", label, self.add_field(v, label)])
        elif isinstance(v, lang.Func):
            m.append(["func", label, v.fn.__qualname__])
            self.function(v.fn, label)
        elif isinstance(v, (bool, int, float, str, type(None), np.generic)):
            m.append(["const", label, type(v).__name__, repr(v)])
        elif isinstance(v, T.DataType):
            m.append(["dtype", label, v.name])
        elif isinstance(v, types.ModuleType):
            if not _is_qdc_module(v):
                m.append(["module", label, v.__name__])
        elif isinstance(v, (tuple, list)) and depth < _MAX_DEPTH and len(v) <= _MAX_SEQ:
            m.append(["seq", label, type(v).__name__, len(v)])
            for i, item in enumerate(v):
                self.value(f"{label}[{i}]", item, depth + 1)
        elif isinstance(v, lang.NdarrayType):
            m.append(["ndarray_type", label, repr(v), bool(v.needs_grad)])
        elif getattr(builtins, getattr(v, "__name__", ""), None) is v:
            m.append(["builtin", label, v.__name__])
        else:
            m.append(["object", label, type(v).__module__, type(v).__qualname__])

    def add_field(self, f: Field, label: str) -> int:
        i = self._field_index.get(id(f))
        if i is None:
            if f.name == f"field{f.id}" and label.replace(".", "_").isidentifier():
                f.set_name(label.rsplit(".", 1)[-1])  # stable across processes, unlike the creation count
            i = self._field_index[id(f)] = len(self.fields)
            self.fields.append(f)
        return i


# ---- what else goes into every key ----------------------------------------------------------

_FINGERPRINT: list = []


def compiler_fingerprint() -> str:
    """A hash of the compiler's own sources and the code generator it drives, so an edited or
    upgraded compiler never reuses artifacts an older one produced."""
    if not _FINGERPRINT:
        import llvmlite
        import qdc
        h = hashlib.sha256(f"qdc {qdc.__version__} llvmlite {llvmlite.__version__}".encode())
        compiler_dir = os.path.dirname(os.path.abspath(__file__))
        runtime_dir = os.path.join(os.path.dirname(compiler_dir), "runtime")
        # Runtime modules whose formats or constants generated code and stored entries depend on.
        paths = [os.path.join(runtime_dir, n) for n in ("artifact.py", "types.py", "bounds.py", "sizeexpr.py")]
        for dirpath, dirs, files in os.walk(compiler_dir):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py")]
        for p in paths:
            with open(p, "rb") as f:
                h.update(os.path.relpath(p, os.path.dirname(compiler_dir)).encode() + b"\0" + f.read() + b"\0")
        _FINGERPRINT.append(h.hexdigest())
    return _FINGERPRINT[0]


def compiler_version() -> str:
    import qdc
    return f"{qdc.__version__}+{compiler_fingerprint()[:12]}"


@functools.lru_cache(maxsize=None)
def target_description(arch: str) -> str:
    if arch == "cpu":
        from .codegen.cpu import target_description as cpu_target
        return cpu_target()
    return arch
