"""`@qd.kernel` objects: compiled on first call (per runtime and argument specialisation)
through the offline cache, then launched.

A first call computes the kernel's cache key (cache_key.py, no front end), and on a hit
loads the verified artifacts; on a miss it compiles and stores them. Either way the result
is memoised per runtime generation, so later calls go straight to the launcher.
"""
from __future__ import annotations

import inspect
import keyword
import os
import sys
import time
import types
import warnings
import weakref

import numpy as np

from qdc.runtime import context
from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.contract import types as T
from qdc.runtime.contract.artifact import MAX_ELEMENT_AXIS, FieldMeta, KernelMeta, ParamMeta, TaskMeta
from qdc.runtime.cache import Cache, check_cache_folder, writable_problem
from qdc.runtime.contract.errors import CacheError, QdcCompileError
from qdc.runtime.fields import Ndarray
from qdc.runtime.launcher import make_launcher, stub_function

from ..autodiff.sizeexpr_builder import SizeExprBuilder
from ..language import ad, forward, lang, matrix as M
from ..passes import bounds_checks
from . import cache_key, options as options_mod
from .templates import TemplateArgs, TemplateDispatch, TemplateParams
from .. import ir, targets

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


def parse_params(fn, templates: list | None = None) -> list[ir.Param]:
    """Kernel parameters from annotations; an ndarray whose dtype/ndim is omitted is templated.
    `qd.template()` parameters are not among them: their names go to `templates`. A vector or
    matrix type (`v: qd.math.vec3`) is a parameter of kind "vector" with its element shape:
    passed by value, its elements become scalar parameters in the IR (frontend/vectors.py,
    element_params) and in the metadata."""
    sig = inspect.signature(fn)
    params = []
    for name, p in sig.parameters.items():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise _param_error(fn, name, _UNSUPPORTED_KINDS[p.kind])
        ann = p.annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, fn.__globals__)  # noqa: S307  (the user's own annotation, as typing does)
            except Exception as e:  # noqa: BLE001  (reported at the parameter)
                raise _param_error(fn, name, f"has an annotation that cannot be evaluated: "
                                             f"{type(e).__name__}: {e}") from None
        if ann is inspect.Parameter.empty:
            raise _param_error(fn, name, "needs a type annotation (a qd scalar type, a vector/matrix type, "
                                         "qd.types.ndarray(...) or qd.template())")
        if ann is int:
            ann = options_mod.current.default_ip
        elif ann is float:
            ann = options_mod.current.default_fp
        if lang.is_template_annotation(ann):
            if templates is not None:
                templates.append(name)
        elif isinstance(ann, T.DataType):
            params.append(ir.Param(name, "scalar", ann))
        elif isinstance(ann, M.MatrixType):  # passed by value: the front end makes a scalar of each element
            dtype = ann.element_dtype(options_mod.current.default_ip, options_mod.current.default_fp)
            if any(n > MAX_ELEMENT_AXIS for n in ann.shape):
                raise _param_error(fn, name, f"is a {ann!r}: a vector or matrix parameter has at most "
                                             f"{MAX_ELEMENT_AXIS} rows and columns; pass an ndarray")
            params.append(ir.Param(name, "vector", dtype, 0, False, ann.shape))
        elif isinstance(ann, lang.NdarrayType):
            es = ann.element_shape  # an ndarray of vectors: its components are trailing axes
            ndim = None if ann.ndim is None else ann.ndim + len(es)
            params.append(ir.Param(name, "ndarray", ann.dtype, ndim, ann.needs_grad, es))
        else:
            raise _param_error(fn, name, f"has unsupported annotation {ann!r}")
    return params


_UNSUPPORTED_KINDS = {
    inspect.Parameter.VAR_POSITIONAL: "is a *args parameter; kernels take a fixed list of annotated parameters",
    inspect.Parameter.VAR_KEYWORD: "is a **kwargs parameter; kernels take a fixed list of annotated parameters",
    inspect.Parameter.KEYWORD_ONLY: "is keyword-only; kernel parameters must be positional",
}


def _param_error(fn, name, msg):
    """A QdcCompileError at the parameter in the kernel's source, with its source line (at the
    def line when the source cannot be read)."""
    from ..frontend.source import source_info
    message = f"parameter '{name}' of kernel '{fn.__name__}' {msg}"
    try:
        src = source_info(fn)
        args = src.fn_def.args
        node = next(a for a in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg)
                    if a is not None and a.arg == name)
    except (QdcCompileError, AttributeError, StopIteration):
        code = fn.__code__
        return QdcCompileError(message, code.co_filename, code.co_firstlineno, 1)
    loc = src.loc(node)
    return QdcCompileError(message, loc.filename, loc.line, loc.col, src.source_line(node))


def build_meta(kir: ir.KernelIR, entry: str, is_grad: bool = False, adstack: dict | None = None,
               debug: bool = False, launch_policy=None) -> KernelMeta:
    """The kernel's metadata (artifact format v4). `launch_policy(task)` is the target's
    (compiler/targets/base.py); without one every task gets the CPU's serial policy."""
    written = _written_ndarrays(kir)
    grads = None if is_grad else _grad_buffers_used(kir)
    return KernelMeta(
        kir.name, entry,
        [ParamMeta(getattr(p, "argument", p.name), p.kind, p.dtype.name, p.ndim or 0, _needs_grad_meta(p, i, grads),
                   i in written, p.element_shape)  # an element of a vector parameter: named as the parameter
         for i, p in enumerate(kir.params)],
        [FieldMeta(f.name, f.dtype.name, f.shape, f.is_grad) for f in kir.fields],
        task_records(kir, entry, adstack, launch_policy),
        kir.num_temps, is_grad, adstack, bounds_checks.records(kir) if debug else None,
        returns=kir.returns)


def _needs_grad_meta(p: ir.Param, index: int, grads: set | None):
    """A forward kernel's ndarray has a gradient word only if its code uses the gradient: the
    launcher then insists on an argument with one (a null gradient pointer would crash), and
    accepts any array otherwise. None stays None: an annotation that follows the argument,
    built with none to follow (AOT)."""
    if p.needs_grad is None:
        return None
    return bool(p.needs_grad) and (grads is None or index in grads)


def _grad_buffers_used(kir: ir.KernelIR) -> set:
    """Argument indices of the ndarrays whose gradient buffer the kernel reads or writes."""
    return {s.target.arg_index for s in ir.walk(kir.body)
            if isinstance(s, ir.GlobalPtr) and isinstance(s.target, ir.NdarrayRef) and s.target.is_grad}


def _written_ndarrays(kir: ir.KernelIR) -> set:
    """Argument indices of the ndarrays whose own elements the kernel stores into (a grad
    kernel writes only .grad buffers): a read-only array is refused for exactly these."""
    written = set()
    for s in ir.walk(kir.body):
        if isinstance(s, (ir.GlobalStore, ir.AtomicRMW)):
            target = s.ptr.target if isinstance(s.ptr, ir.GlobalPtr) else None
            if target is None:  # an address we cannot trace: assume every ndarray is written
                return set(range(len(kir.params)))
            if isinstance(target, ir.NdarrayRef) and not target.is_grad:
                written.add(target.arg_index)
    return written


def task_records(kir: ir.KernelIR, entry: str, adstack: dict | None, launch_policy=None) -> list:
    """One TaskMeta per task: its entry symbol (`<entry>_t<i>`), trip count, launch policy and
    the ids of its adstacks."""
    stacks = (adstack or {}).get("stacks") or []
    builder = SizeExprBuilder(kir, temp_reads=True)  # one per kernel: it memoises shared values
    records = []
    for i, t in enumerate(kir.tasks):
        launch = launch_policy(t) if launch_policy is not None else {"policy": "cpu_chunks", "parallel_from": 0}
        records.append(TaskMeta(t.task_name, t.kind, t.serial, t.source_kind, task_entry(entry, i),
                                se.to_nodes(_iterations(builder, t)), launch,
                                [s for s, r in enumerate(stacks) if r["task"] == i]))
    return records


def task_entry(entry: str, index: int) -> str:
    return f"{entry}_t{index}"


def _iterations(builder: SizeExprBuilder, t: ir.Task):
    """The task's trip count as a SizeExpr (an upper bound, exact for ranges bounded by
    constants, arguments, shapes, and field, ndarray or temporary elements), None when not
    expressible. A serial task runs once."""
    if t.kind == "serial" or t.begin is None:
        return se.Const(1)
    return builder.trip_count(t)


def compile_kernel(fn, params, opts, arch="cpu", dump=None, variant="forward", templates=None) -> CompiledKernel:
    """Front end → passes → codegen for one (specialised) kernel variant. No cache involved.
    `templates`: the TemplateArgs of a kernel with qd.template() parameters."""
    from ..frontend.ast_to_ir import FrontEnd
    from ..passes.pipeline import run_pipeline
    target = targets.get(arch)
    # The grad kernel returns nothing: its forward sweep need not compute the return value.
    fe = FrontEnd(fn, params, opts, templates.values if templates else None, returns=variant != "grad", arch=arch)
    kir = fe.build()
    if variant == "grad":  # the adjoint of the offloaded kernel (compiler/autodiff)
        from ..autodiff import PIPELINE_STOP, make_grad_kernel
        run_pipeline(kir, dump=dump, stop_after=PIPELINE_STOP)
        grad = make_grad_kernel(kir, fe.field_objects, opts)
        kir, field_objects, adstack = grad.kernel, grad.field_objects, {"stacks": grad.stacks}
    else:  # forward_ad: the pipeline's forward_mode pass adds tangents (autodiff/forward_mode.py)
        field_objects, adstack = fe.field_objects, None
        run_pipeline(kir, dump=dump, variant_passes=_variant_passes(variant, field_objects))
    meta = build_meta(kir, f"qdc_{kir.name}" + _ENTRY_SUFFIX.get(variant, ""), variant == "grad", adstack,
                      bool(opts.debug), target.launch_policy)
    artifacts = target.compile(kir, meta, opts)
    artifacts["ir"] = ir.print_kernel(kir).encode()
    return CompiledKernel(kir, meta, artifacts, field_objects, None)


_ENTRY_SUFFIX = {"grad": "_grad", "forward_ad": "_fwd"}


def _variant_passes(variant: str, field_objects: list) -> dict:
    if variant != "forward_ad":
        return {}
    from ..autodiff.forward_mode import ForwardModePass
    return {"forward_mode": ForwardModePass(field_objects)}


# ---- through the offline cache --------------------------------------------------------------

_CACHES: dict = {}      # cache folder -> Cache
_UNWRITABLE: set = set()  # cache folders we failed to write (warned once)


def cache_for(opts) -> Cache:
    root = opts.resolved_cache_dir
    cache = _CACHES.get(root)
    if cache is None:
        cache = _CACHES[root] = Cache(root)
    return cache


def check_cache_dir(opts) -> None:
    """At `qd.init`: ValueError if cache_dir is a file; if it is not writable (a read-only
    deployment, say), one warning now, and kernels are compiled without being stored (its
    entries are still used)."""
    root = check_cache_folder(opts.resolved_cache_dir, "cache_dir")
    problem = writable_problem(root)
    if problem is None:
        _UNWRITABLE.discard(cache_for(opts).root)
        return
    _UNWRITABLE.add(cache_for(opts).root)
    warnings.warn(f"qdc: cache_dir {root} is not writable ({problem}): kernels it does not hold yet will be "
                  f"compiled on every run. Set qd.init(cache_dir=...) to a writable folder.", stacklevel=3)


def obtain(fn, params, opts, arch: str, variant: str = "forward", templates=None) -> CompiledKernel:
    """The kernel variant from the cache when its key hits, else compiled and stored."""
    cache = cache_for(opts)
    try:
        deps = cache_key.kernel_key(fn, params, opts, arch, variant, templates)
    except cache_key.UncacheableKernel as e:  # compiled, never stored: better than a shared entry
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: {e}")
        # the front end explains why
        return compile_kernel(fn, params, opts, arch, variant=variant, templates=templates)
    hit = load_cached(cache, deps)
    if hit is not None:
        replay_warnings(hit.warnings, fn)
        return hit
    compiled = compile_recording_warnings(fn, params, opts, arch, variant, templates)
    compiled.deps = deps
    store(cache, deps, compiled, fn, arch, variant, opts)
    return compiled


def compile_recording_warnings(fn, params, opts, arch: str, variant: str, templates=None) -> CompiledKernel:
    """compile_kernel, keeping the warnings it issues so a cache hit can issue them again
    (a kernel warns the same whether it was compiled now or fetched)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_kernel(fn, params, opts, arch, variant=variant, templates=templates)
    compiled.warnings = [[f"{w.category.__module__}.{w.category.__qualname__}", str(w.message),
                          *_user_location(w.filename, w.lineno, fn)] for w in caught]
    replay_warnings(compiled.warnings)
    return compiled


_QDC_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the qdc package
_QDC_CODE = tuple(os.path.join(_QDC_ROOT, d) + os.sep for d in ("compiler", "runtime", "cli"))


def _user_location(filename: str, line: int, fn) -> tuple[str, int]:
    """Where a warning about kernel `fn` points: its own location when that is in the user's
    code (a warning that names a source line), else the kernel's def line: never qdc's files,
    nor code qdc generates ("<string>")."""
    code = getattr(fn, "__code__", None)
    if code is None or filename == code.co_filename:
        return filename, line
    path = os.path.abspath(filename or "<>")
    in_qdc = path.startswith(_QDC_CODE) or os.path.dirname(path) == _QDC_ROOT
    if filename and not filename.startswith("<") and not in_qdc:
        return filename, line
    return code.co_filename, code.co_firstlineno


def replay_warnings(recorded: list, fn=None) -> None:
    """Issue recorded warnings again, at the user's source (kernel `fn`'s def line for one
    recorded inside qdc). A category is looked up only among modules already imported (never
    imported because a cache entry names it); unknown ones become UserWarning."""
    for category, message, filename, line in recorded:
        module, _, name = category.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, Warning)):
            cls = UserWarning
        if fn is not None:
            filename, line = _user_location(filename, line, fn)
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
        stale = any(f.dtype.name != fm.dtype or tuple(f.storage_shape) != tuple(fm.shape)
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
          replace: bool = False, raise_errors: bool = False) -> bool:
    """Write the entry (False if the kernel cannot be cached or the cache is not writable).
    `raise_errors` (`qdc build`): a failed write raises its OSError instead of warning."""
    refs = deps.refs_for(compiled.field_objects)
    if refs is None:
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: it reaches a field "
                      f"through an expression the cache key does not follow")
    if refs is None or (cache.root in _UNWRITABLE and not raise_errors):
        return False
    code = fn.__code__
    body = {"kernel": fn.__name__, "variant": variant, "arch": arch, "compiler": cache_key.compiler_version(arch),
            "created": time.time(), "source": f"{code.co_filename}:{code.co_firstlineno}",
            "options": opts.key(), "meta": compiled.meta.to_dict(), "field_refs": refs,
            "warnings": compiled.warnings}
    artifacts = {k: v for k, v in compiled.artifacts.items() if isinstance(v, bytes) and k not in _NOT_STORED}
    try:
        cache.write_entry(deps.key, body, artifacts, replace=replace)
    except OSError as e:
        if raise_errors:
            raise
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
    a kernel without templated parameters (an ndarray's omitted dtype/ndim, or a
    needs_grad=None whose `.grad` the kernel uses: see `params`) is compiled for the current
    runtime, the function
    becomes that variant's launch function (qdc.runtime.launcher, "Owners"): its `__code__`
    is the launch code, which runs in the function's own globals. `qd.init` and Tapes put a
    stub back, sending calls to `_slow_call` again (recompile, record). The function of a
    kernel with qd.template() parameters becomes a dispatch instead (templates.TemplateDispatch):
    one dict lookup on the template arguments, then that variant's launch function."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._params = None
        self._templated = self._forward_templated = self._annotated = None  # set with `params`
        self._template_params = None  # TemplateParams when some parameter is a qd.template(); set with `params`
        self._dispatch = None  # TemplateDispatch: the launch code of a template kernel, made at its first launch
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
        """The parameters, with what follows the argument resolved as without one (an AOT
        build, `compile()` without arguments): a float ndarray's `needs_grad=None` stays None
        (built without a gradient) unless the kernel uses its `.grad`, then True; an integer
        one's is False. `specialise` resolves them from the arguments."""
        if self._params is None:
            template_names: list = []
            annotated = [_no_integer_gradient(p) for p in parse_params(self.fn, template_names)]
            if template_names:
                self._template_params = TemplateParams(self.fn, template_names)
            shaped = [i for i, p in enumerate(annotated)
                      if p.kind == "ndarray" and (p.dtype is None or p.ndim is None)]
            follow = [i for i, p in enumerate(annotated) if p.kind == "ndarray" and p.needs_grad is None]
            read = cache_key.grad_read_params(self.fn, {annotated[i].name for i in follow}) if follow else set()
            self._annotated = annotated
            # The forward variant depends on the argument's gradient only where it uses `.grad`;
            # the grad variant always does. `_templated`: what some variant specialises on.
            self._forward_templated = sorted({*shaped, *(i for i in follow if annotated[i].name in read)})
            self._templated = sorted({*shaped, *follow})
            self._params = [ir.Param(p.name, p.kind, p.dtype, p.ndim, True, p.element_shape) if p.name in read else p
                            for p in annotated]
        return self._params

    def specialise(self, args, variant: str = "forward", kwargs=None) -> tuple[tuple, list[ir.Param]]:
        """(specialisation key, parameters) of `variant` for these arguments: an ndarray's
        omitted dtype/ndim is the argument's, and `needs_grad=None` is whether the argument is a
        float qd.ndarray with a gradient (for the grad variant; for the forward one only where
        the kernel uses `.grad`, see `params`). Without the argument (`k.grad.compile()`), a
        needs_grad=None is resolved as `params` does."""
        if variant == "forward_ad":  # duals follow the arguments (language/forward.py)
            return forward.dual_params(args, kwargs, *self.specialise(args, "forward", kwargs))
        params = self.params
        templated = self._forward_templated if variant == "forward" else self._templated
        if not templated:
            return (), params
        out = list(params)
        key = []
        for i in templated:
            p = self._annotated[i]
            a = self._argument(i, args, kwargs)
            if a is _MISSING and p.dtype is not None and p.ndim is not None:
                key.append(None)  # only its gradient follows the argument: as without one
                continue
            if a is _MISSING:
                raise TypeError(f"kernel '{self.__name__}': missing argument '{p.name}'")
            if isinstance(a, (np.ndarray, Ndarray)):
                dt = T.from_numpy(a.dtype.np_dtype if isinstance(a, Ndarray) else a.dtype)
                if dt is None:
                    raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': unsupported dtype {a.dtype}")
                ndim = len(a.storage_shape) if isinstance(a, Ndarray) else len(a.shape)
            else:
                raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': expected an ndarray, "
                                f"got {type(a).__name__}")
            element_shape = p.element_shape
            if p.dtype is None and isinstance(a, Ndarray) and a.element_shape:  # a qd.ndarray of vectors
                element_shape = a.element_shape
            dt = p.dtype or dt
            ndim = p.ndim + len(element_shape) - len(p.element_shape) if p.ndim is not None else ndim
            needs_grad = p.needs_grad
            if needs_grad is None:
                needs_grad = dt.is_float and isinstance(a, Ndarray) and a.grad is not None
            out[i] = ir.Param(p.name, "ndarray", dt, ndim, needs_grad, element_shape)
            key.append((dt.name, ndim, needs_grad, element_shape))
        return tuple(key), out

    def _argument(self, i: int, args, kwargs):
        """Argument `i` of a call, or _MISSING (`kernel.grad(...)` hands over only positional ones)."""
        if i < len(args):
            return args[i]
        name = self._annotated[i].name
        return kwargs[name] if kwargs and name in kwargs else _MISSING

    @property
    def template_params(self) -> TemplateParams | None:
        """The qd.template() parameters, None when there are none."""
        self.params  # noqa: B018  (parses the annotations)
        return self._template_params

    def runtime_arguments(self, args, kwargs=None) -> tuple[tuple, dict | None]:
        """(args, kwargs) as the launch function takes them: without the template arguments."""
        if self.template_params is None:
            return args, kwargs
        return self._template_params.split(args, kwargs)[1], None

    def compile(self, args=(), variant: str = "forward", kwargs=None) -> CompiledKernel:
        return self._launcher(args, variant, kwargs)[1]

    def _launcher(self, args, variant: str = "forward", kwargs=None, templates: TemplateArgs | None = None):
        """(launch function, CompiledKernel) of `variant` for `args` on the current runtime,
        compiled (through the cache) if needed. The forward variant of a kernel without
        templated parameters launches through the kernel function itself. A kernel with
        qd.template() parameters takes them from `args`/`kwargs` (or bound already, as
        `templates`, with `args` the other arguments); its launch function takes the others."""
        rt = context.current()
        if templates is None and self.template_params is not None:
            templates, args = self._template_params.split(args, kwargs)
            kwargs = None
        key, params = self.specialise(args, variant, kwargs)
        if templates is not None:
            key = (templates.key, key)
        own = variant == "forward" and not self._forward_templated and self._plain and templates is None
        entry = self._launchers.get((variant, key))
        if entry is None or entry[0] != rt.generation:
            compiled = obtain(self.fn, params, options_mod.current, rt.arch, variant, templates)
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
        elif templates is not None and variant == "forward":
            self._dispatch_to(templates, entry[1])
        return entry[1], entry[2]

    def _dispatch_to(self, templates: TemplateArgs, launch) -> None:
        """Let the kernel function find this template variant's launch itself (TemplateDispatch),
        unless a Tape or FwdMode must see the calls."""
        if self._forward_templated or not self._plain:  # the ndarray specialisation needs the slow path
            return
        if self._dispatch is None:
            self._dispatch = TemplateDispatch(self.function, self._template_params)
            context.on_reset(self._dispatch)
        self._dispatch.add(templates, launch)
        if ad.recording is None and not forward.is_active():
            self.function.__code__ = self._dispatch.code
            _FAST.add(self)

    def _slow_call(self, *args, **kwargs):
        """A launch the kernel function does not make on its own: the first one (compiling),
        the first after `qd.init`, every one under a Tape, and those of a template kernel whose
        template arguments its dispatch cannot key (see TemplateDispatch)."""
        if ad.recording is not None:  # inside `with qd.ad.Tape(...)`
            ad.recording.record(self, args, kwargs)
        if forward.is_active():  # inside `with qd.ad.FwdMode(...)`: the Jacobian-vector product
            return forward.launch(self, args, kwargs)
        return self.launch_unrecorded(args, kwargs)

    def launch_unrecorded(self, args, kwargs=None):
        """Launch the forward variant, unseen by a Tape (its grad_check re-runs recorded launches)."""
        if self.template_params is not None:
            templates, args = self._template_params.split(args, kwargs)
            return self._launcher(args, templates=templates)[0].__qdc_launcher__.launch(*args)
        return self._launcher(args, kwargs=kwargs)[0].__qdc_launcher__.launch(*args, **(kwargs or {}))

    def launches_on_its_own(self) -> bool:
        """Whether the kernel function's next call goes straight to the native code (for a
        template kernel: through its dispatch, see TemplateDispatch)."""
        if self._dispatch is not None:
            return self.function.__code__ is self._dispatch.code and bool(self._dispatch.variants)
        entry = self._launchers.get(("forward", ()))
        return entry is not None and self.function.__code__ is entry[1].__qdc_launcher__.fast_code

    def __repr__(self):
        return f"<qdc kernel {self.__name__}>"


_MISSING = object()


def _no_integer_gradient(p: ir.Param) -> ir.Param:
    """An integer ndarray has no gradient to follow: its needs_grad=None is False."""
    if p.kind == "ndarray" and p.needs_grad is None and p.dtype is not None and not p.dtype.is_float:
        return ir.Param(p.name, p.kind, p.dtype, p.ndim, False, p.element_shape)
    return p


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
