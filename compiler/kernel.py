"""`@qd.kernel` objects: compiled on first call (per runtime and argument specialisation)
through the offline cache, then launched.

A first call computes the kernel's cache key (cache_key.py, no front end), and on a hit
loads the verified artifacts; on a miss it compiles and stores them. Either way the result
is memoised per runtime generation, so later calls go straight to the launcher.
"""
from __future__ import annotations

import inspect
import keyword
import sys
import time
import types
import warnings
import weakref

import numpy as np

from qdc.runtime import context
from qdc.runtime import types as T
from qdc.runtime.artifact import FieldMeta, KernelMeta, ParamMeta, TaskMeta
from qdc.runtime.cache import Cache
from qdc.runtime.errors import CacheError, QdcCompileError
from qdc.runtime.fields import Ndarray
from qdc.runtime.launcher import make_launcher, stub_function

from . import ad, bounds_checks, cache_key, ir, lang, options as options_mod

# Artifacts kept in memory but not written to the cache (textual LLVM IR: `qdc inspect --llvm`
# disassembles the stored bitcode instead).
_NOT_STORED = frozenset({"ll"})


class CompiledKernel:
    """One kernel variant ready to load: metadata, artifacts and the Field objects it binds.
    `ir` is the optimised IR when it was compiled here, None when it came from the cache."""

    def __init__(self, kir, meta, artifacts, field_objects, deps, from_cache=False):
        self.ir, self.meta, self.artifacts = kir, meta, artifacts
        self.field_objects, self.deps, self.from_cache = field_objects, deps, from_cache
        self.warnings: list = []  # [category name, message, filename, line] issued while compiling


def parse_params(fn) -> list[ir.Param]:
    """Kernel parameters from annotations; an ndarray whose dtype/ndim is omitted is templated."""
    sig = inspect.signature(fn)
    params = []
    for name, p in sig.parameters.items():
        ann = p.annotation
        if isinstance(ann, str):
            ann = eval(ann, fn.__globals__)  # noqa: S307  (the user's own annotation, as typing does)
        if ann is inspect.Parameter.empty:
            raise _param_error(fn, name, "needs a type annotation (a qd scalar type or qd.types.ndarray(...))")
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise _param_error(fn, name, "*args/**kwargs parameters are not supported")
        if ann is int:
            ann = options_mod.current.default_ip
        elif ann is float:
            ann = options_mod.current.default_fp
        if isinstance(ann, T.DataType):
            params.append(ir.Param(name, "scalar", ann))
        elif isinstance(ann, lang.NdarrayType):
            params.append(ir.Param(name, "ndarray", ann.dtype, ann.ndim, ann.needs_grad))
        else:
            raise _param_error(fn, name, f"has unsupported annotation {ann!r}")
    return params


def _param_error(fn, name, msg):
    code = fn.__code__
    return QdcCompileError(f"parameter '{name}' of kernel '{fn.__name__}' {msg}", code.co_filename,
                           code.co_firstlineno, 1)


def build_meta(kir: ir.KernelIR, entry: str, is_grad: bool = False, adstack: dict | None = None,
               debug: bool = False) -> KernelMeta:
    return KernelMeta(
        kir.name, entry,
        [ParamMeta(p.name, p.kind, p.dtype.name, p.ndim or 0, bool(p.needs_grad)) for p in kir.params],
        [FieldMeta(f.name, f.dtype.name, f.shape, f.is_grad) for f in kir.fields],
        [TaskMeta(t.task_name, t.kind, t.serial, t.source_kind, _task_range(t)) for t in kir.tasks],
        kir.num_temps, is_grad, adstack, bounds_checks.records(kir) if debug else None)


def _task_range(t: ir.Task):
    """How a range-for task's bounds are obtained at launch (artifact.TaskMeta.range)."""
    if t.kind != "range_for" or t.begin is None:
        return None
    return {"begin": _range_expr(t.begin), "end": _range_expr(t.end)}


def _range_expr(s, depth=0) -> list:
    if depth > 16:
        return ["opaque"]
    if isinstance(s, ir.Const):
        return ["const", s.value.item() if hasattr(s.value, "item") else s.value]
    if isinstance(s, ir.ArgLoad):
        return ["arg", s.arg_index]
    if isinstance(s, ir.NdarrayShape):
        return ["shape", s.arg_index, s.dim]
    if isinstance(s, ir.TempLoad):
        return ["temp", s.slot]
    if isinstance(s, ir.GlobalLoad) and isinstance(s.ptr.target, ir.FieldRef):
        target = s.ptr.target
        return ["field", target.name, target.is_grad, [_range_expr(i, depth + 1) for i in s.ptr.indices]]
    if isinstance(s, ir.Cast):
        return ["cast", s.type.name, _range_expr(s.x, depth + 1)]
    if isinstance(s, (ir.Unary, ir.Binary)):
        return [s.op] + [_range_expr(o, depth + 1) for o in s.operands()]
    return ["opaque"]


def compile_kernel(fn, params, opts, arch="cpu", dump=None, variant="forward") -> CompiledKernel:
    """Front end → passes → codegen for one (specialised) kernel variant. No cache involved."""
    from .frontend.ast_to_ir import FrontEnd
    from .passes.pipeline import run_pipeline
    fe = FrontEnd(fn, params, opts)
    kir = fe.build()
    if variant == "grad":  # the adjoint of the offloaded kernel (compiler/autodiff)
        from .autodiff import PIPELINE_STOP, make_grad_kernel
        run_pipeline(kir, dump=dump, stop_after=PIPELINE_STOP)
        grad = make_grad_kernel(kir, fe.field_objects, opts)
        kir, field_objects, adstack = grad.kernel, grad.field_objects, {"stacks": grad.stacks}
    else:
        run_pipeline(kir, dump=dump)
        field_objects, adstack = fe.field_objects, None
    meta = build_meta(kir, f"qdc_{kir.name}" + ("_grad" if variant == "grad" else ""), variant == "grad", adstack,
                      bool(opts.debug))
    artifacts = _generate_code(arch, kir, meta, opts)
    artifacts["ir"] = ir.print_kernel(kir).encode()
    return CompiledKernel(kir, meta, artifacts, field_objects, None)


# Arches with a code generator; `qdc build --arch all` builds for these.
CODEGEN_ARCHES = ("cpu",)


def _generate_code(arch: str, kir, meta, opts) -> dict:
    if arch not in CODEGEN_ARCHES:
        raise NotImplementedError(f"arch '{arch}' has no code generator in this build of qdc "
                                  f"(available: {', '.join(CODEGEN_ARCHES)})")
    from .codegen import cpu
    return cpu.compile_kernel(kir, meta, int(opts.opt_level), bool(opts.fast_math))


# ---- through the offline cache --------------------------------------------------------------

_CACHES: dict = {}      # cache folder -> Cache
_UNWRITABLE: set = set()  # cache folders we failed to write (warned once)


def cache_for(opts) -> Cache:
    root = opts.resolved_cache_dir
    cache = _CACHES.get(root)
    if cache is None:
        cache = _CACHES[root] = Cache(root)
    return cache


def obtain(fn, params, opts, arch: str, variant: str = "forward") -> CompiledKernel:
    """The kernel variant from the cache when its key hits, else compiled and stored."""
    cache = cache_for(opts)
    try:
        deps = cache_key.kernel_key(fn, params, opts, arch, variant)
    except cache_key.UncacheableKernel:
        return compile_kernel(fn, params, opts, arch, variant=variant)  # the front end explains why
    hit = load_cached(cache, deps)
    if hit is not None:
        replay_warnings(hit.warnings)
        return hit
    compiled = compile_recording_warnings(fn, params, opts, arch, variant)
    compiled.deps = deps
    store(cache, deps, compiled, fn, arch, variant, opts)
    return compiled


def compile_recording_warnings(fn, params, opts, arch: str, variant: str) -> CompiledKernel:
    """compile_kernel, keeping the warnings it issues so a cache hit can issue them again
    (a kernel warns the same whether it was compiled now or fetched)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_kernel(fn, params, opts, arch, variant=variant)
    compiled.warnings = [[f"{w.category.__module__}.{w.category.__qualname__}", str(w.message), w.filename,
                          w.lineno] for w in caught]
    replay_warnings(compiled.warnings)
    return compiled


def replay_warnings(recorded: list) -> None:
    """Issue recorded warnings again. A category is looked up only among modules already
    imported (never imported because a cache entry names it); unknown ones become UserWarning."""
    for category, message, filename, line in recorded:
        module, _, name = category.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, Warning)):
            cls = UserWarning
        warnings.warn_explicit(message, cls, filename, line)


def load_cached(cache: Cache, deps) -> CompiledKernel | None:
    try:
        entry = cache.lookup(deps.key)
    except CacheError as e:
        warnings.warn(f"qdc: discarding a corrupt cache entry and recompiling: {e}", stacklevel=4)
        cache.evict(deps.key)
        return None
    if entry is None:
        return None
    try:
        fields = deps.bind(entry.field_refs)
        stale = any(f.dtype.name != fm.dtype or tuple(f.shape) != tuple(fm.shape)
                    for f, fm in zip(fields, entry.meta.fields))
    except IndexError:
        stale = True
    if stale:  # the entry does not fit these fields: evict it so the recompiled one takes its place
        cache.evict(deps.key)
        return None
    hit = CompiledKernel(None, entry.meta, entry.artifacts, fields, deps, from_cache=True)
    hit.warnings = entry.record.get("warnings", [])
    return hit


def store(cache: Cache, deps, compiled: CompiledKernel, fn, arch: str, variant: str, opts,
          replace: bool = False) -> bool:
    """Write the entry (False if the kernel cannot be cached or the cache is not writable)."""
    refs = deps.refs_for(compiled.field_objects)
    if refs is None or cache.root in _UNWRITABLE:
        return False
    code = fn.__code__
    body = {"kernel": fn.__name__, "variant": variant, "arch": arch, "compiler": cache_key.compiler_version(),
            "created": time.time(), "source": f"{code.co_filename}:{code.co_firstlineno}",
            "options": opts.key(), "meta": compiled.meta.to_dict(), "field_refs": refs,
            "warnings": compiled.warnings}
    artifacts = {k: v for k, v in compiled.artifacts.items() if isinstance(v, bytes) and k not in _NOT_STORED}
    try:
        cache.write_entry(deps.key, body, artifacts, replace=replace)
    except OSError as e:
        _UNWRITABLE.add(cache.root)
        warnings.warn(f"qdc: cannot write the offline cache at {cache.root} ({e}); kernels will be compiled "
                      f"on every run. Set qd.init(cache_dir=...) to a writable folder.", stacklevel=4)
        return False
    return True


# ---- the kernel function --------------------------------------------------------------------

_FAST: "weakref.WeakSet[Kernel]" = weakref.WeakSet()  # kernels whose function launches on its own now


class Kernel:
    """What stands behind the function `@qd.kernel` returns (`kernel_of(function)`): the
    parameters, the compiled variants per runtime and specialisation, and the namespace of
    that function.

    The function is what `k(...)` calls, so that a launch is one Python call with nothing in
    front of it. It is generated at decoration with exactly the kernel's parameters (Python
    itself then reports a missing, extra or unknown argument, naming the kernel) and its code
    is at first a stub that hands the arguments to `_slow_call`. Once the forward variant of
    a kernel without templated parameters is compiled for the current runtime, the function
    becomes that variant's launch function (qdc.runtime.launcher, "Owners"): its `__code__`
    is the launch code, which runs in the function's own globals. `qd.init` and Tapes put a
    stub back, sending calls to `_slow_call` again (recompile, record)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._params = None
        self._templated = None
        self._launchers: dict = {}  # (variant, specialisation key) -> (generation, launch, compiled)
        self.grad = ad.GradKernel(self)  # `kernel.grad(*args)`: the reverse-mode variant
        names = _plain_parameters(fn)
        self._plain = names is not None  # else a signature no launcher takes: the first call reports why
        self.function = self._make_function(names)
        self._stub = self.function.__code__

    def _make_function(self, names):
        name = self.__name__
        if not name.isidentifier() or keyword.iskeyword(name):
            name = "kernel"  # only the code's own name: the function is renamed below
        function = stub_function(name, names, self._slow_call)
        function.__name__, function.__qualname__ = self.fn.__name__, self.fn.__qualname__
        function.__module__, function.__doc__ = self.fn.__module__, self.fn.__doc__
        function.__wrapped__ = function.fn = self.fn
        function.grad, function.compile = self.grad, self.compile
        function._primal = self  # the name Quadrants gives it
        return function

    @property
    def params(self) -> list[ir.Param]:
        if self._params is None:
            self._params = parse_params(self.fn)
            self._templated = [i for i, p in enumerate(self._params)
                               if p.kind == "ndarray" and (p.dtype is None or p.ndim is None)]
        return self._params

    def specialise(self, args) -> tuple[tuple, list[ir.Param]]:
        params = self.params
        if not self._templated:
            return (), params
        out = list(params)
        key = []
        for i in self._templated:
            p = params[i]
            if i >= len(args):
                raise TypeError(f"kernel '{self.__name__}': missing argument '{p.name}'")
            a = args[i]
            if isinstance(a, (np.ndarray, Ndarray)):
                dt = T.from_numpy(a.dtype.np_dtype if isinstance(a, Ndarray) else a.dtype)
                if dt is None:
                    raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': unsupported dtype {a.dtype}")
                ndim = len(a.shape)
            else:
                raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': expected an ndarray, "
                                f"got {type(a).__name__}")
            dt, ndim = p.dtype or dt, p.ndim if p.ndim is not None else ndim
            out[i] = ir.Param(p.name, "ndarray", dt, ndim, p.needs_grad)
            key.append((dt.name, ndim))
        return tuple(key), out

    def compile(self, args=(), variant: str = "forward") -> CompiledKernel:
        return self._launcher(args, variant)[1]

    def _launcher(self, args, variant: str = "forward"):
        """(launch function, CompiledKernel) of `variant` for `args` on the current runtime,
        compiled (through the cache) if needed. The forward variant of a kernel without
        templated parameters launches through the kernel function itself."""
        rt = context.current()
        key, params = self.specialise(args)
        own = variant == "forward" and not self._templated and self._plain
        entry = self._launchers.get((variant, key))
        if entry is None or entry[0] != rt.generation:
            compiled = obtain(self.fn, params, options_mod.current, rt.arch, variant)
            loaded = rt.device.load_kernel(compiled.artifacts, compiled.meta)
            launch = make_launcher(compiled.meta, rt.device, loaded, compiled.field_objects,
                                   function=self.function if own else None)
            entry = self._launchers[(variant, key)] = (rt.generation, launch, compiled)
        if own:  # bound to this runtime: the function launches on its own, unless a Tape must see calls
            if ad.recording is None:
                self.function.__code__ = entry[1].__qdc_launcher__.fast_code
                _FAST.add(self)
            else:
                self.function.__code__ = self._stub
        return entry[1], entry[2]

    def _slow_call(self, *args, **kwargs):
        """A launch the kernel function does not make on its own: the first one (compiling),
        the first after `qd.init`, every one under a Tape and every one of a templated kernel."""
        if ad.recording is not None:  # inside `with qd.ad.Tape(...)`
            ad.recording.record(self, args, kwargs)
        return self._launcher(args)[0].__qdc_launcher__.launch(*args, **kwargs)

    def launches_on_its_own(self) -> bool:
        """Whether the kernel function's next call goes straight to the native code."""
        entry = self._launchers.get(("forward", ()))
        return entry is not None and self.function.__code__ is entry[1].__qdc_launcher__.fast_code

    def __repr__(self):
        return f"<qdc kernel {self.__name__}>"


def _plain_parameters(fn) -> list[str] | None:
    """The parameter names, if the generated function can take them as its own."""
    names = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or name.startswith("_q_"):
            return None
        names.append(name)
    return names


def kernel_function(fn):
    """`@qd.kernel`: the kernel as a plain Python function (see Kernel)."""
    return Kernel(fn).function


def kernel_of(obj) -> Kernel | None:
    """The Kernel behind a `@qd.kernel` function (or a Kernel itself); None for anything else."""
    if isinstance(obj, types.FunctionType):
        obj = obj.__dict__.get("_primal")
    return obj if isinstance(obj, Kernel) else None


def suspend_fast_launches() -> None:
    """Send every kernel function's next call through `_slow_call` (a Tape records them there);
    each takes its launch code back by itself at its first call outside the Tape."""
    for kernel in list(_FAST):
        kernel.function.__code__ = kernel._stub
    _FAST.clear()
