"""One kernel variant, from its Python function, parameters and options to artifacts
(`compile_kernel`: front end, passes, codegen), and the parameters from the annotations.

Nothing here touches a cache or a device: the offline cache's lookups and stores are the
floor above (compiler/jit/offline_cache.py), as are the kernel objects that memoise the
result per runtime and launch it (compiler/jit/kernel.py).
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import os
import sys
import warnings

from qdc.runtime.contract import sizeexpr as se
from qdc.runtime.contract import types as T
from qdc.runtime.contract import log
from qdc.runtime.contract.artifact import FieldMeta, KernelMeta, ParamMeta, TaskMeta
from qdc.runtime.contract.artifact_schema import MAX_ELEMENT_AXIS, VARIANT_SUFFIXES
from qdc.runtime.contract.errors import QdcCompileError
from qdc.runtime.contract.objects import NdarrayMarker as Ndarray
from qdc.runtime.contract.tensor_api import Tensor

from ..autodiff.sizeexpr_builder import SizeExprBuilder
from ..frontend.structs import struct_layouts, struct_param, struct_param_problem
from ..language import lang, matrix as M
from ..language.dataclass_args import is_dataclass_type
from ..language.structs import StructType
from ..passes import bounds_checks
from .. import ir, targets, timings


class CompiledKernel:
    """One kernel variant ready to load: metadata, artifacts and the Field objects it binds.
    `ir` is the optimised IR when it was compiled here, None when it came from the cache."""

    def __init__(self, kir, meta, artifacts, field_objects, deps, from_cache=False):
        self.ir, self.meta, self.artifacts = kir, meta, artifacts
        self.field_objects, self.deps, self.from_cache = field_objects, deps, from_cache
        self.warnings: list = []  # [category name, message, filename, line] issued while compiling
        self.timings = None  # compiler/timings.KernelTimings of the compile, None from the cache


def parse_params(fn, opts, templates: list | None = None) -> list[ir.Param]:
    """Kernel parameters from annotations; an ndarray whose dtype/ndim is omitted is templated.
    `int`, `float` and a vector type without its own dtype take the default types of `opts`.
    `qd.template()` parameters are not among them: their names go to `templates`. A vector or
    matrix type (`v: qd.math.vec3`) is a parameter of kind "vector" with its element shape:
    passed by value, its elements become scalar parameters in the IR (frontend/vectors.py,
    element_params) and in the metadata. A `dataclasses.dataclass` type is a parameter of kind
    "dataclass" whose dtype is that class: the members its argument holds become parameters
    when the kernel is compiled for it (language/dataclass_args.py)."""
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
        if _is_method_self(fn, name, ann):
            ann = lang.Template()  # a kernel method's `self` (a @qd.data_oriented instance) is a template
        if ann is inspect.Parameter.empty:
            raise _param_error(fn, name, "needs a type annotation (a qd scalar type, a vector/matrix type, "
                                         "qd.types.ndarray(...) or qd.template())")
        if ann is bool:
            ann = T.u1
        elif ann is int:
            ann = opts.default_ip
        elif ann is float:
            ann = opts.default_fp
        elif isinstance(ann, type) and issubclass(ann, Tensor):
            ann = lang.NdarrayType()  # qd.Tensor: an ndarray or a field, dtype and ndim the argument's
        if lang.is_template_annotation(ann):
            if templates is not None:
                templates.append(name)
        elif isinstance(ann, T.DataType):
            params.append(ir.Param(name, "scalar", ann))
        elif isinstance(ann, M.MatrixType):  # passed by value: the front end makes a scalar of each element
            dtype = ann.element_dtype(opts.default_ip, opts.default_fp)
            if any(n > MAX_ELEMENT_AXIS for n in ann.shape):
                raise _param_error(fn, name, f"is a {ann!r}: a vector or matrix parameter has at most "
                                             f"{MAX_ELEMENT_AXIS} rows and columns; pass an ndarray")
            params.append(ir.Param(name, "vector", dtype, 0, False, ann.shape))
        elif isinstance(ann, StructType):  # passed by value: the front end makes a scalar of each member element
            problem = struct_param_problem(ann, opts.default_ip, opts.default_fp)
            if problem:
                raise _param_error(fn, name, problem)
            params.append(struct_param(name, ann, opts.default_ip, opts.default_fp))
        elif is_dataclass_type(ann):  # its members are parameters: which ones, the argument says
            params.append(ir.Param(name, "dataclass", ann))
        elif isinstance(ann, lang.NdarrayType):
            es = ann.element_shape  # an ndarray of vectors: its components are trailing axes
            ndim = None if ann.ndim is None else ann.ndim + len(es)
            params.append(ir.Param(name, "ndarray", ann.dtype, ndim, ann.needs_grad, es))
        else:
            raise _param_error(fn, name, f"has unsupported annotation {ann!r}")
    return params


def _is_method_self(fn, name: str, ann) -> bool:
    """The unannotated first parameter `self` of a kernel defined in a class."""
    return (ann is inspect.Parameter.empty and name == "self" and "." in fn.__qualname__
            and next(iter(inspect.signature(fn).parameters)) == "self")


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
                   i in written, p.element_shape,  # an element of a vector parameter: named as the parameter
                   layout=getattr(p, "layout", None) if p.kind == "ndarray" else None)  # a struct leaf's is its struct's
         for i, p in enumerate(kir.params)],
        [FieldMeta(f.name, f.dtype.name, f.shape, f.is_grad) for f in kir.fields],
        task_records(kir, entry, adstack, launch_policy),
        kir.num_temps, is_grad, adstack, bounds_checks.records(kir) if debug else None,
        returns=kir.returns, random=any(isinstance(s, ir.RandomState) for s in ir.walk(kir.body)),
        messages=kir.messages, structs=struct_layouts(kir.params), members=kir.members,
        signature=kir.signature if kir.members else None,
        graph_loops=_graph_loop_records(kir))


def _graph_loop_records(kir: ir.KernelIR) -> list:
    """[first task, end task, flag parameter] of each qd.graph.do_while loop that kept a task."""
    records = []
    for loop, flag in enumerate(kir.graph_loops):
        inside = [i for i, t in enumerate(kir.tasks) if loop in t.graph_loops]
        if inside:
            records.append([inside[0], inside[-1] + 1, flag])
    return records


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
    `templates`: the TemplateArgs of a kernel with qd.template() parameters. The phases' times
    are in `.timings` (compiler/timings.py; also recorded into an enclosing `recording()`),
    and printed to stderr with QDC_LOG=timings."""
    recorder = timings.KernelTimings()
    with timings.recording(recorder), _collecting_new_objects_only():
        compiled = _compile(fn, params, opts, arch, dump, variant, templates)
    compiled.timings = recorder
    if log.enabled("timings"):
        name = fn.__name__ + VARIANT_SUFFIXES.get(variant, "")
        log.log("timings", timings.describe(name, arch, recorder))
    return compiled


@contextlib.contextmanager
def _collecting_new_objects_only():
    """Keep Python's cycle collector to the objects a compile makes: those alive before it are
    frozen (gc.freeze) until it ends. A large kernel allocates millions of objects, and every
    full collection they trigger would also scan the process's whole heap (in a Genesis process,
    torch's and Genesis's: about a tenth of a build's Python time). Left alone where something
    else froze objects already (gc.unfreeze would release them too). Meanwhile the youngest
    generation is collected every YOUNG_GENERATION allocations instead of Python's 700: most of
    what a compile allocates (its IR, the LLVM IR objects) lives until the compile ends, and each
    young collection only moved it on (Genesis's box scene: the collector's time 0.3 -> 0.1 s
    of its 6 s of Python phases)."""
    if not gc.isenabled():
        yield
        return
    thresholds = gc.get_threshold()
    raised = thresholds[0] < YOUNG_GENERATION  # not by a compile on another thread
    if raised:
        gc.set_threshold(YOUNG_GENERATION, *thresholds[1:])
    frozen = not gc.get_freeze_count()
    if frozen:
        gc.freeze()
    try:
        yield
    finally:
        if frozen:
            gc.unfreeze()
        if raised:
            gc.set_threshold(*thresholds)


YOUNG_GENERATION = 20_000


def _compile(fn, params, opts, arch, dump, variant, templates) -> CompiledKernel:
    from ..frontend.ast_to_ir import FrontEnd
    from ..passes.pipeline import run_pipeline
    target = targets.get(arch)
    with timings.phase("front end"):
        # The grad kernel returns nothing: its forward sweep need not compute the return value.
        fe = FrontEnd(fn, params, opts, templates.values if templates else None, returns=variant != "grad",
                      arch=arch)
        kir = fe.build()
    if variant == "grad":  # the adjoint of the offloaded kernel (compiler/autodiff)
        from ..autodiff.grad_kernel import PIPELINE_STOP, make_grad_kernel
        with timings.phase("passes"):
            run_pipeline(kir, dump=dump, stop_after=PIPELINE_STOP)
        with timings.phase("autodiff"):
            grad = make_grad_kernel(kir, fe.field_objects, opts, dump=dump)
        kir, field_objects, adstack = grad.kernel, grad.field_objects, {"stacks": grad.stacks}
    else:  # forward_ad: the pipeline's forward_mode pass adds tangents (autodiff/forward_mode.py)
        field_objects, adstack = fe.field_objects, None
        with timings.phase("passes"):
            run_pipeline(kir, dump=dump, variant_passes=_variant_passes(variant, field_objects))
    with timings.phase("IR generation"):  # the target's own phases inside are taken out of it
        meta = build_meta(kir, f"qdc_{kir.symbol}" + _ENTRY_SUFFIX.get(variant, ""), variant == "grad", adstack,
                          bool(opts.debug), target.launch_policy)
        artifacts = target.compile(kir, meta, opts)
    with timings.phase("artifacts"):
        artifacts["ir"] = ir.print_kernel(kir).encode()
    return CompiledKernel(kir, meta, artifacts, field_objects, None)


def warm_up(arches) -> None:
    """Import every stage a compile runs and let each arch's target set itself up (imports,
    LLVM's targets): `qdc build` does it once, before it forks its workers and before it times
    any kernel, rather than in the first kernel of every process."""
    from ..autodiff import grad_kernel  # noqa: F401
    from ..frontend import ast_to_ir  # noqa: F401
    from ..passes import pipeline  # noqa: F401
    for arch in arches:
        targets.get(arch).warm_up()


_ENTRY_SUFFIX = {"grad": "_grad", "forward_ad": "_fwd"}


def _variant_passes(variant: str, field_objects: list) -> dict:
    if variant != "forward_ad":
        return {}
    from ..autodiff.forward_mode import ForwardModePass
    return {"forward_mode": ForwardModePass(field_objects)}


# ---- compiling, warnings recorded --------------------------------------------------------

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


def dual_params(args, kwargs, key: tuple, params: list) -> tuple[tuple, list]:
    """The forward_ad variant's (specialisation key, parameters) from the forward variant's:
    an ndarray parameter's `needs_grad` says whether its argument has a dual (whose buffer
    takes the gradient word). Without the argument (an ahead-of-time build) a float one's is
    None: built without a dual."""
    out, duals = list(params), []
    for i, p in enumerate(params):
        if p.kind != "ndarray":
            continue
        a = args[i] if i < len(args) else (kwargs or {}).get(p.name, _ABSENT)
        if a is _ABSENT:
            has_dual = None if p.dtype.is_float else False
        else:
            has_dual = isinstance(a, Ndarray) and a.dual is not None and p.dtype.is_float
        out[i] = ir.Param(p.name, p.kind, p.dtype, p.ndim, has_dual, p.element_shape, p.layout)
        duals.append(has_dual)
    return (key, tuple(duals)), out


_ABSENT = object()
