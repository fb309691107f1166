"""`@qd.kernel` objects: compile on first call (per runtime and argument specialisation), then launch."""
from __future__ import annotations

import inspect

import numpy as np

from qdc.runtime import context
from qdc.runtime import types as T
from qdc.runtime.artifact import FieldMeta, KernelMeta, ParamMeta, TaskMeta
from qdc.runtime.errors import QdcCompileError
from qdc.runtime.fields import Ndarray
from qdc.runtime.launcher import make_launcher

from . import ir, lang, options as options_mod


class CompiledKernel:
    """The result of compiling one kernel: IR, metadata, artifacts and the objects it binds."""

    def __init__(self, kir, meta, artifacts, field_objects, deps):
        self.ir, self.meta, self.artifacts = kir, meta, artifacts
        self.field_objects, self.deps = field_objects, deps


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


def build_meta(kir: ir.KernelIR, entry: str, is_grad: bool = False) -> KernelMeta:
    return KernelMeta(
        kir.name, entry,
        [ParamMeta(p.name, p.kind, p.dtype.name, p.ndim or 0, bool(p.needs_grad)) for p in kir.params],
        [FieldMeta(f.name, f.dtype.name, f.shape, f.is_grad) for f in kir.fields],
        [TaskMeta(t.task_name, t.kind, t.serial, t.source_kind) for t in kir.tasks],
        kir.num_temps, is_grad)


def compile_kernel(fn, params, opts, arch="cpu", dump=None) -> CompiledKernel:
    """Front end → passes → codegen for one (specialised) kernel."""
    from .frontend.ast_to_ir import FrontEnd
    from .passes.pipeline import run_pipeline
    fe = FrontEnd(fn, params, opts)
    kir = fe.build()
    run_pipeline(kir, dump=dump)
    meta = build_meta(kir, f"qdc_{kir.name}")
    if arch != "cpu":
        raise NotImplementedError(f"arch {arch} has no code generator yet")
    from .codegen import cpu
    artifacts = cpu.compile_kernel(kir, meta, int(opts.opt_level), bool(opts.fast_math))
    return CompiledKernel(kir, meta, artifacts, fe.field_objects, (fe.constants_used, fe.funcs_used))


class Kernel:
    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._params = None
        self._templated = None
        self._launchers: dict = {}  # specialisation key -> (generation, launch, compiled)
        self._fast = (None, None)   # (generation, launch) when nothing is templated

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

    def compile(self, args=()) -> CompiledKernel:
        return self._launcher(args)[1]

    def _launcher(self, args):
        rt = context.current()
        key, params = self.specialise(args)
        entry = self._launchers.get(key)
        if entry is None or entry[0] != rt.generation:
            compiled = compile_kernel(self.fn, params, options_mod.current, rt.arch)
            loaded = rt.device.load_kernel(compiled.artifacts, compiled.meta)
            launch = make_launcher(compiled.meta, rt.device, loaded, compiled.field_objects)
            entry = (rt.generation, launch, compiled)
            self._launchers[key] = entry
        if not self._templated:
            self._fast = (rt.generation, entry[1])
        return entry[1], entry[2]

    def __call__(self, *args, **kwargs):
        gen, launch = self._fast
        if gen is not None and gen == context._current.generation:
            return launch(*args, **kwargs)
        return self._launcher(args)[0](*args, **kwargs)

    def __repr__(self):
        return f"<qdc kernel {self.__name__}>"
