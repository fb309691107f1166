"""Cache keys: what a compiled kernel depends on, found without running the front end.

The key hashes the kernel's source and, through every name its source (and the source of
each `@qd.func` it reaches) resolves in its closure or globals: captured constants, field
declarations (name, dtype, shape, needs_grad), called funcs, plus the parameter
annotations, the artifact format version, a fingerprint of the compiler itself, the target
and every code-affecting option. Resolution over-approximates (a local that shadows a global
still pulls the global in), which can only cost an unneeded rebuild, never a stale hit.

Every object reached enters the key by what it is (`_Walk.value`), never by its type alone:
numbers and strings by value; sequences, dicts and numpy arrays by content; fields by
declaration; a `@qd.func` or plain Python function by its source, defaults and its own
captures (a lambda also by its code: two can share a line); modules by name; intrinsics,
math functions, classes and other named objects by a qualified name that leads back to
the object itself (`qdc.compiler.language.lang.cos`, `math.sin`, `numpy.float32`); a qdc language
object by its `__qdc_key__()` or the qdc module attribute holding it. Anything else raises
UncacheableKernel: the kernel is compiled but not stored (`QDC_LOG=cache` says why), since
two kernels differing only in it would otherwise share an entry.

The same walk gives the deterministic list of fields a kernel can reach; an entry records,
for each field of its metadata, an index into that list (`field_refs`), which is how a
direct-mode cache hit binds the right Field objects without compiling.
"""
from __future__ import annotations

import enum
import hashlib
import inspect
import os
import sys
import types

import msgpack
import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.contract.artifact import FORMAT_VERSION
from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker as StructField

from .. import targets
from ..language import lang
from ..language.dataclass_args import (DataclassArgument, array_type, is_array_argument, is_dataclass_instance,
                                       members as dataclass_members, scalar_annotation)
from . import sources, template_values

# Past these a captured value is not keyed (the kernel is compiled without the cache).
_MAX_VALUES, _MAX_DEPTH = 1 << 16, 16


class UncacheableKernel(Exception):
    """The kernel's dependencies cannot be determined (e.g. its source is unavailable)."""


class UndescribableTemplate(UncacheableKernel):
    """A template argument has no description by value (template_values.py): the message
    names the kernel, the parameter and the route to what cannot be described."""


class KernelDeps:
    """A kernel's cache key and the fields it can reach, in walk order."""

    def __init__(self, key: str, fields: list, needs_grad: bool, dual: bool = False, module_reads=()):
        self.key, self.fields, self.needs_grad = key, fields, needs_grad
        self.module_reads = list(module_reads)  # (module, attribute, value) the kernel's source reads
        # forward_ad entries: a field table's secondary buffers are duals, not gradients
        self.dual = dual
        self.needs_dual = any(getattr(f, "dual", None) is not None for f in fields)

    def _secondary(self, f):
        return getattr(f, "dual", None) if self.dual else f.grad

    def refs_for(self, field_objects) -> list | None:
        """`field_refs` for the front end's field table, or None if a field was reached by a
        route the walk did not follow (then the kernel is compiled but not cached)."""
        index = {id(f): [i, False] for i, f in enumerate(self.fields)}
        for i, f in enumerate(self.fields):
            if self._secondary(f) is not None:
                index.setdefault(id(self._secondary(f)), [i, True])
        refs = [index.get(id(f)) for f in field_objects]
        return None if any(r is None for r in refs) else refs

    def bind(self, field_refs) -> list:
        out = []
        for i, is_grad in field_refs:
            if i >= len(self.fields):
                raise IndexError("field_refs index out of range")
            f = self.fields[i]
            out.append(self._secondary(f) if is_grad else f)
        return out


def kernel_key(fn, params, opts, arch: str, variant: str = "forward", templates=None) -> KernelDeps:
    """`templates`: the TemplateArgs of a kernel with qd.template() parameters, each keyed by
    its description by value (template_values.py: a field by its declaration, a config object
    by its class and attributes), so that another process passing an equal argument hits."""
    with sources.collection_paused():
        return _kernel_key(fn, params, opts, arch, variant, templates)


def _kernel_key(fn, params, opts, arch: str, variant: str, templates) -> KernelDeps:
    walk = _Walk(debug=bool(opts.debug))
    walk.function(fn, fn.__name__)
    walk.arrays_by_type = True  # an array among the template arguments is passed at launch: by its type
    for name, value in (templates.values.items() if templates else ()):
        walk.template(fn.__name__, name, value)
    decls = [[template_values.stable_name(f.name), f.dtype.name, list(f.shape), bool(f.needs_grad), bool(f.is_grad),
              bool(getattr(f, "needs_dual", False))] + ([list(f.element_shape)] if f.element_shape else [])
             + ([["layout", *f.layout]] if getattr(f, "layout", None) else [])
             for f in walk.fields]
    material = ["qdc-kernel-key", FORMAT_VERSION, compiler_fingerprint(arch), arch,
                targets.get(arch).cache_description(opts),
                sorted(opts.key().items()), variant, fn.__name__,
                [[p.name, p.kind, p.dtype.name, p.ndim or 0, p.needs_grad]
                 + ([list(p.element_shape)] if p.element_shape else [])
                 + ([["layout", *p.layout]] if getattr(p, "layout", None) else []) for p in params],  # None: AOT
                walk.material, decls]
    try:
        packed = msgpack.packb(material, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:  # e.g. a __qdc_key__ that is not plain data
        raise UncacheableKernel(f"its key material cannot be serialised ({e})") from None
    key = hashlib.sha256(packed).hexdigest()
    needs_grad = any(f.needs_grad or f.is_grad for f in walk.fields) or any(p.needs_grad for p in params)
    return KernelDeps(key, walk.fields, needs_grad, dual=variant == "forward_ad", module_reads=walk.module_reads)


# ---- the dependency walk -----------------------------------------------------------------

def _source(fn) -> sources.FunctionSource:
    try:
        return sources.function_source(fn)
    except sources.SourceUnavailable as e:
        raise UncacheableKernel(str(e)) from None


def _is_qdc_module(m) -> bool:
    return isinstance(m, types.ModuleType) and (m.__name__ == "qdc" or m.__name__.startswith("qdc."))


def _parameter_names(fn) -> set:
    """A function's own parameters: never resolved in its closure or globals."""
    code = fn.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return set(code.co_varnames[:count])


def qualified_name(v) -> tuple[str, str] | None:
    """(module, qualname) when that name leads back to `v` itself (`math.sin`, `qd.sin`,
    `np.float32`, `builtins.abs`), else None: a name that finds another object proves nothing."""
    module, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if qual is None:
        qual = getattr(v, "__name__", None)
    if not isinstance(module, str) or not isinstance(qual, str) or "<" in qual:
        return None
    obj = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    # the script's own module by its import name: the same key run as a script or imported
    return (template_values.import_name(module), qual) if obj is v else None


def _qdc_attribute_name(v) -> str | None:
    """`module.attr` of a loaded qdc module holding the language object `v` (an instance of a
    qdc class, such as a type constructor), else None. The index of those attributes is made
    again whenever a qdc module was imported since (a kernel's every `qd.template()` annotation
    asks: scanning the modules each time cost milliseconds per parameter, and listing the qdc
    modules among a large program's thousands cost as much: that is done only when a module
    was imported since)."""
    if len(sys.modules) != _QDC_ATTRIBUTES["imported"]:
        _QDC_ATTRIBUTES["imported"] = len(sys.modules)
        modules = [(name, m) for name, m in list(sys.modules.items()) if _is_qdc_module(m)]
        if len(modules) != _QDC_ATTRIBUTES["modules"]:
            index: dict = {}
            for name, module in modules:
                for attr, value in list(vars(module).items()):
                    index.setdefault(id(value), (value, f"{name}.{attr}"))  # the value kept: its id stays its own
            _QDC_ATTRIBUTES.update(modules=len(modules), index=index)
    found = _QDC_ATTRIBUTES["index"].get(id(v))
    return found[1] if found is not None and found[0] is v else None


_QDC_ATTRIBUTES: dict = {"imported": -1, "modules": -1, "index": {}}


def _code_fingerprint(code) -> list:
    """A lambda's code, which its source lines do not identify (two lambdas on one line)."""
    consts = [_code_fingerprint(c) if isinstance(c, types.CodeType) else [type(c).__name__, repr(c)]
              for c in code.co_consts]
    return [code.co_code, list(code.co_names), list(code.co_varnames), list(code.co_freevars), consts]


_CONSTANTS = (bool, int, float, complex, str, bytes, type(None), np.generic, range)


def log_enabled() -> bool:
    return "cache" in os.environ.get("QDC_LOG", "").split(",")


def log(message: str) -> None:
    if log_enabled():
        print(f"[qdc cache] {message}", file=sys.stderr)


class _Walk:
    """Collects the key material of a kernel: every object its source can reach, identified
    by what it is. An object that cannot be identified raises UncacheableKernel: the kernel
    is then compiled without the cache rather than risk sharing another kernel's entry."""

    def __init__(self, debug: bool):
        self.debug = debug
        self.material: list = []
        self.fields: list[Field] = []
        self._field_index: dict = {}
        self._fns: set = set()
        self._budget = _MAX_VALUES
        self.module_reads: list = []
        self.describer = None  # of the template arguments (`template`)
        self.arrays_by_type = False  # arrays are parameters (template arguments), not constants

    def function(self, fn, label: str) -> None:
        if fn in self._fns:
            return
        self._fns.add(fn)
        source = _source(fn)
        where = [fn.__code__.co_filename, fn.__code__.co_firstlineno] if self.debug else []
        self.material.append(["source", label, source.text, *where])
        if fn.__name__ == "<lambda>":
            self.material.append(["code", label, _code_fingerprint(fn.__code__)])
        for i, d in enumerate(fn.__defaults__ or ()):
            self.value(f"{label}.__defaults__[{i}]", d)
        for name, d in sorted((fn.__kwdefaults__ or {}).items()):
            self.value(f"{label}.__kwdefaults__[{name}]", d)
        for name, ann in sorted((getattr(fn, "__annotations__", None) or {}).items()):
            self.annotation(f"{label}.__annotations__[{name}]", ann)
        closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                closure[name] = cell.cell_contents
            except ValueError:  # an unassigned cell: the front end will report it
                pass
        params = _parameter_names(fn)
        for chain in source.chains:
            if chain[0] not in params:
                self.chain(fn, closure, chain)

    def annotation(self, label: str, ann) -> None:
        """Annotations are evaluated where a function is defined, not captured by it: the
        `-> dt` of a kernel or func defined inside a function (dt a local there) reaches the
        key only here. They decide conversions (a return type), so they are keyed by what
        they are, or by their repr where that cannot be identified (`tuple[qd.f32, qd.i32]`)."""
        size = len(self.material)
        try:
            self.value(label, ann)
        except UncacheableKernel:
            del self.material[size:]
            self.material.append(["annotation", label, repr(ann)])

    def module_read(self, module, attr: str, value) -> None:
        """Note a module attribute the kernel reads (`module_reads`: module, attribute, value):
        a manifest records the program's data among them, which may have been set at run time
        (compiler/manifest/recording.py)."""
        if isinstance(module, str) and not _is_qdc_module(sys.modules.get(module)) \
                and not isinstance(value, (types.ModuleType, type, types.FunctionType, types.MethodType, lang.Func,
                                           lang.BoundFunc)):
            self.module_reads.append((module, attr, value))

    def template(self, kernel: str, name: str, value) -> None:
        """A template argument by its description; the fields it holds in walk order (a cache
        hit binds the fields of the argument passed now, through the same routes), and the
        source of the functions and classes it names (their code runs at compile time)."""
        self.described("template", name, value,
                       lambda e: UndescribableTemplate(f"template argument '{name}' of kernel '{kernel}': {e}"))

    def described(self, kind: str, name: str, value, refusal) -> None:
        """`value` by its description (template_values.py), then the functions and classes it names."""
        label = f"<{kind} {name}>"  # not an identifier: never names an unnamed field
        if self.describer is None:  # one for all the arguments: a field held twice is described once
            self.describer = template_values.Describer(lambda f: self.add_field(f, "<template>"))
        try:
            described = self.describer.describe(value, name)
        except template_values.Undescribable as e:
            raise refusal(e) from None
        self.material.append([kind, name, described.data])
        for i, fn in enumerate(described.functions):
            self.value(f"{label}.function[{i}]", fn)
        for cls in described.classes:
            self.material.append(["class", template_values.class_name(cls), sources.class_source(cls)])

    def chain(self, fn, closure: dict, chain: tuple) -> None:
        root = chain[0]
        if root in closure:
            value = closure[root]
        elif root in fn.__globals__:
            value = fn.__globals__[root]
            self.module_read(fn.__globals__.get("__name__"), root, value)
        else:
            return  # a local or a builtin: covered by the source text
        for i, attr in enumerate(chain[1:], 1):
            if isinstance(value, types.ModuleType) and hasattr(value, attr):
                self.module_read(value.__name__, attr, getattr(value, attr))
            if isinstance(value, (Field, StructField, lang.Func, T.DataType)) or lang.is_kernel_function(value):
                # what hangs off these is the language's (x.grad, x.shape): the object decides it
                self.value(".".join(chain[:i]), value)
                return
            try:
                value = getattr(value, attr)
            except Exception:  # noqa: BLE001  (a missing attribute is reported by the front end)
                self.material.append(["missing", ".".join(chain[:i + 1])])
                return
        self.value(".".join(chain), value)

    def value(self, label: str, v, depth: int = 0) -> None:
        self._budget -= 1
        if self._budget < 0 or depth > _MAX_DEPTH:
            raise UncacheableKernel(f"'{label}' holds too large or too deeply nested a value to key")
        m = self.material
        if isinstance(v, Field):
            m.append(["field", label, self.add_field(v, label)])
        elif isinstance(v, StructField):  # one field per member
            m.append(["struct_field", label, list(v.members)])
            for name, member in v.members.items():
                self.value(f"{label}.{name}", member, depth + 1)
        elif isinstance(v, lang.Func):
            m.append(["func", label, v.fn.__qualname__])
            self.function(v.fn, label)
        elif isinstance(v, (lang.BoundFunc, types.MethodType)):
            self.method(label, v)
        elif lang.is_kernel_function(v):
            m.append(["kernel", label, v.__qualname__])
            self.function(v.__wrapped__, label)
        elif isinstance(v, enum.Enum):  # a member by its class and name (its value may be any object)
            m.append(["enum", label, v.name])
            self.identified(f"{label}.__class__", type(v))
        elif isinstance(v, _CONSTANTS):
            m.append(["const", label, type(v).__name__, repr(v)])
        elif isinstance(v, T.DataType):
            m.append(["dtype", label, v.name])
        elif isinstance(v, lang.NdarrayType):
            m.append(["ndarray_type", label, repr(v), v.needs_grad])
        elif isinstance(v, types.ModuleType):
            m.append(["module", label, v.__name__])
        elif isinstance(v, (tuple, list)):
            m.append(["seq", label, type(v).__name__, len(v)])
            for i, item in enumerate(v):
                self.value(f"{label}[{i}]", item, depth + 1)
        elif isinstance(v, dict):
            m.append(["dict", label, len(v)])
            for i, (k, item) in enumerate(v.items()):
                self.value(f"{label}.key[{i}]", k, depth + 1)
                self.value(f"{label}[{k!r}]", item, depth + 1)
        elif isinstance(v, DataclassArgument) or is_dataclass_instance(v):
            self.dataclass(label, v, depth)
        elif self.arrays_by_type and is_array_argument(v):
            m.append(["ndarray_argument", label, *_array_type(v, label)])
        elif isinstance(v, np.ndarray) and not v.dtype.hasobject:
            data = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
            m.append(["array", label, v.dtype.str, list(v.shape), data])
        elif isinstance(v, types.FunctionType) and not _is_qdc_module(sys.modules.get(v.__module__)):
            # inlined like a qd.func
            m.append(["pyfunc", label, template_values.import_name(v.__module__), v.__qualname__])
            self.function(v, label)
        else:
            self.identified(label, v)

    def method(self, label: str, v) -> None:
        """A method bound to an instance that the kernel captured: its function's source and its
        instance, described by value as a template argument is (the method's code reads it)."""
        self.described("method", label, v, lambda e: UncacheableKernel(f"'{label}': {e}"))

    def dataclass(self, label: str, v, depth: int) -> None:
        """A dataclass instance member by member; a dataclass parameter's scalar members (by
        annotation) are arguments, keyed by their annotation only."""
        runtime_scalars = isinstance(v, DataclassArgument)
        inst = v.value if runtime_scalars else v
        self.material.append(["dataclass", label, template_values.import_name(type(inst).__module__),
                              type(inst).__qualname__, runtime_scalars])
        for name, ann in dataclass_members(type(inst)):
            member, sub = getattr(inst, name), f"{label}.{name}"
            if runtime_scalars and scalar_annotation(ann, T.i32, T.f32) is not None and not is_array_argument(member):
                self.material.append(["scalar_member", sub, getattr(ann, "name", getattr(ann, "__name__", ""))])
            elif runtime_scalars and is_dataclass_instance(member):
                self.dataclass(sub, DataclassArgument(member), depth + 1)
            else:
                self.value(sub, member, depth + 1)

    def identified(self, label: str, v) -> None:
        """Intrinsics, math functions, classes, language objects: by their qualified name."""
        key = getattr(type(v), "__qdc_key__", None)
        if key is not None:  # a language object that says what it is
            self.material.append(["qdc_object", label, type(v).__module__, type(v).__qualname__, key(v)])
            return
        try:
            name = qualified_name(v)
        except Exception:  # noqa: BLE001  (an object whose attributes raise: not identifiable)
            name = None
        if name is not None:
            self.material.append(["named", label, *name])
            return
        if type(v).__module__.split(".")[0] == "qdc":
            where = _qdc_attribute_name(v)
            if where is not None:
                self.material.append(["qdc_attribute", label, where])
                return
        raise UncacheableKernel(f"'{label}' is a {type(v).__module__}.{type(v).__qualname__} object, which the "
                                f"cache key cannot identify")

    def add_field(self, f: Field, label: str) -> int:
        i = self._field_index.get(id(f))
        if i is None:
            if f.name == f"field{f.id}" and label.replace(".", "_").isidentifier():
                f.set_name(label.rsplit(".", 1)[-1])  # stable across processes, unlike the creation count
            i = self._field_index[id(f)] = len(self.fields)
            self.fields.append(f)
        return i


def _array_type(a, label: str) -> list:
    try:
        return list(array_type(a))
    except TypeError as e:
        raise UncacheableKernel(f"'{label}': {e}") from None


# ---- which parameters' gradients a kernel's source can reach --------------------------------

def grad_read_params(fn, names: set) -> set:
    """The ndarray parameters among `names` whose `.grad` kernel `fn` may use: those written
    `name.grad` in its source; all of them when a `.grad` hangs off anything else than a
    parameter or a global field (an alias, an expression), when a function it calls mentions
    `.grad` (it may receive the array) or when a source cannot be read. Over-approximate: a
    parameter wrongly included only makes its kernel specialise on the argument's gradient."""
    with sources.collection_paused():
        return _grad_read_params(fn, names)


def _grad_read_params(fn, names: set) -> set:
    try:
        source = _source(fn)
        if _calls_mention_grad(fn, source, set()):
            return set(names)
    except UncacheableKernel:
        return set(names)
    scope = _scope(fn)
    used = set()
    for base in source.grad_bases:
        if base in names:
            used.add(base)
        elif not isinstance(scope.get(base), Field):  # None: `.grad` of an expression
            return set(names)
    return used


def _scope(fn) -> dict:
    """The names `fn` reads (its globals, its closure over them), to look up, never to change."""
    if not fn.__closure__:
        return fn.__globals__  # copying a large module's globals for each function cost more than the rest
    out = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            out[name] = cell.cell_contents
        except ValueError:
            pass
    return out


def _calls_mention_grad(fn, source: sources.FunctionSource, seen: set) -> bool:
    """Whether a qd.func or Python function reachable from `fn`'s source mentions `.grad`."""
    scope = _scope(fn)
    for chain in source.chains:
        value = scope.get(chain[0])
        try:
            for attr in chain[1:]:
                value = getattr(value, attr, None)
        except Exception:  # noqa: BLE001  (the front end reports a broken attribute)
            continue
        callee = value.fn if isinstance(value, lang.Func) else value.__func__.fn if isinstance(value, lang.BoundFunc) \
            else value.__func__ if isinstance(value, types.MethodType) else value
        if not isinstance(callee, types.FunctionType) or lang.is_kernel_function(callee) or callee in seen \
                or _is_qdc_module(sys.modules.get(callee.__module__)):
            continue
        seen.add(callee)
        sub = _source(callee)
        if sub.grad_bases or _calls_mention_grad(callee, sub, seen):
            return True
    return False


# ---- what else goes into every key ----------------------------------------------------------

_FINGERPRINTS: dict = {}
# Backend-neutral stages every target's code depends on (folders under compiler/).
_NEUTRAL = ("language", "frontend", "ir", "passes", "autodiff", "driver", "jit", "commands")


def compiler_fingerprint(arch: str = "cpu") -> str:
    """A hash of the sources that produce `arch`'s artifacts: the backend-neutral stages, the
    target's own folders (and the shared lowering it uses), the runtime contract, and the code
    generator's version. Editing another target's code leaves `arch`'s cache entries valid."""
    if arch not in _FINGERPRINTS:
        import qdc
        target = targets.get(arch)
        compiler_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        targets_dir = os.path.join(compiler_dir, "targets")
        h = hashlib.sha256(f"qdc {qdc.__version__} llvmlite {_llvmlite_version()}".encode())
        tops = [os.path.join(compiler_dir, d) for d in _NEUTRAL]
        tops += [os.path.join(targets_dir, d) for d in target.source_folders]
        tops.append(os.path.join(os.path.dirname(compiler_dir), "runtime", "contract"))
        # the modules at compiler/targets/'s top level (registry, base class, fdlibm.py) serve every target
        paths = [os.path.join(compiler_dir, "__init__.py")]
        paths += [os.path.join(targets_dir, f) for f in sorted(os.listdir(targets_dir)) if f.endswith(".py")]
        for top in tops:
            for dirpath, dirs, files in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                paths += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py")]
        for p in paths:
            with open(p, "rb") as f:
                h.update(os.path.relpath(p, os.path.dirname(compiler_dir)).encode() + b"\0" + f.read() + b"\0")
        _FINGERPRINTS[arch] = h.hexdigest()
    return _FINGERPRINTS[arch]


def _llvmlite_version() -> str:
    """llvmlite's version (it decides the LLVM that generates code), read from its package
    metadata: an offline process computes keys without importing llvmlite."""
    from importlib import metadata
    try:
        return metadata.version("llvmlite")
    except metadata.PackageNotFoundError:
        import llvmlite  # a source tree on sys.path, not installed
        return llvmlite.__version__


def compiler_version(arch: str = "cpu") -> str:
    import qdc
    return f"{qdc.__version__}+{compiler_fingerprint(arch)[:12]}"


