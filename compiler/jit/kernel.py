"""The user-facing kernel objects: `@qd.kernel` and `@qd.func`.

`@qd.kernel` returns a plain Python function backed by a Kernel: compiled on first call (per
runtime and argument specialisation) through the offline cache (compiler/driver/kernel.py),
then launched by the function itself. This is the top floor of the compiler: the language,
front end and driver below never import it; they recognise a kernel function by its marker
attribute (language/lang.py, KERNEL_ATTRIBUTE).
"""
from __future__ import annotations

import functools
import inspect
import keyword
import types

import numpy as np

from qdc.runtime import context
from qdc.runtime.contract import foreign_arrays, types as T
from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray
from qdc.runtime.fields import Ndarray as DeviceNdarray
from qdc.runtime.kernel_function import KernelFunction
from qdc.runtime.launcher import make_launcher

from .. import ir
from ..driver import cache_key
from ..driver.kernel import CompiledKernel, dual_params, parse_params
from ..driver.sources import collection_paused
from ..driver.templates import TemplateArgs, TemplateParams
from ..language import lang
from ..language.dataclass_args import DataclassArgument, argument_key, is_dataclass_instance
from ..driver.templates import specialisation_key
from qdc.runtime.member_arguments import member_launcher
from . import ad, forward
from .api import direct_options
from .variant_dispatch import VariantDispatch
from .offline_cache import obtain


class Kernel(KernelFunction):
    """What stands behind the function `@qd.kernel` returns (`kernel_of(function)`): the
    parameters, the compiled variants per runtime and specialisation, and the namespace of
    that function.

    The function is what `k(...)` calls, so that a launch is one Python call with nothing in
    front of it (the runtime's KernelFunction, shared with prebuilt kernels). It is generated
    at decoration with exactly the kernel's parameters (Python itself then reports a missing,
    extra or unknown argument, naming the kernel) and its code is at first a stub that hands
    the arguments to `_slow_call`. Once the forward variant of a kernel with only one (no
    qd.template() or dataclass parameters, no templated ndarray parameters: an ndarray's
    omitted dtype/ndim, or a needs_grad=None whose `.grad` the kernel uses, see `params`) is
    compiled for the current runtime, the function becomes that variant's launch function
    (qdc.runtime.launcher, "Owners"): its `__code__` is the launch code, which runs in the
    function's own globals. `qd.init`, FwdModes and Tapes put a stub back, sending calls to
    `_slow_call` again (recompile, launch forward_ad, record). The function of a kernel with
    variants becomes a dispatch instead (variant_dispatch.py): one dict lookup on what picks
    the variant, then that variant's launch function."""

    def __init__(self, fn, graph: bool = False):
        self.fn = fn
        self.graph = bool(graph)  # launch (and .grad) as one replayed graph where the device has graphs
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._params = None
        self._params_types = None  # the (default_ip, default_fp) `_params` were parsed under
        self._templated = self._forward_templated = self._annotated = None  # set with `params`
        self._template_params = None  # TemplateParams when some parameter is a qd.template(); set with `params`
        self._dataclass_at: list = []  # indices of the dataclass parameters (among `params`); set with `params`
        self._runtime_names: list = []  # the parameters other than template ones; set with `params`
        self._member_launches: dict = {}  # see _member_launch
        self._dispatch = None  # VariantDispatch: the launch code of a kernel with variants, made at its first launch
        self._launchers: dict = {}  # (variant, specialisation key) -> (generation, launch, compiled)
        self.grad = ad.GradKernel(self)  # `kernel.grad(*args)`: the reverse-mode variant
        names = _plain_parameters(fn)
        self._plain = names is not None  # else a signature no launcher takes: the first call reports why
        code_name = self.__name__
        if not code_name.isidentifier() or keyword.iskeyword(code_name):
            code_name = "kernel"  # only the code's own name: the function is renamed below
        super().__init__(code_name, names, {"grad": self.grad})
        function = self.function
        function.__name__, function.__qualname__ = fn.__name__, fn.__qualname__
        function.__module__, function.__doc__ = fn.__module__, fn.__doc__
        function.__wrapped__ = function.fn = fn
        function.compile = self.compile
        setattr(function, lang.KERNEL_ATTRIBUTE, self)  # what kernel_of and the front end look for

    @property
    def params(self) -> list[ir.Param]:
        """The parameters under direct mode's options (`params_for`)."""
        return self.params_for(direct_options())

    def params_for(self, opts) -> list[ir.Param]:
        """The parameters under `opts` (whose default types `int`, `float` and vector annotations
        without an element type take), with what follows the argument resolved as without one
        (an AOT build, `compile()` without arguments): a float ndarray's `needs_grad=None` stays
        None (built without a gradient) unless the kernel uses its `.grad`, then True; an integer
        one's is False. `specialise` resolves them from the arguments."""
        types = (opts.default_ip, opts.default_fp)
        if self._params is None or self._params_types != types:
            template_names: list = []
            annotated = [_no_integer_gradient(p) for p in parse_params(self.fn, opts, template_names)]
            if template_names:
                self._template_params = TemplateParams(self.fn, template_names)
            shaped = [i for i, p in enumerate(annotated)
                      if p.kind == "ndarray" and (p.dtype is None or p.ndim is None or None in p.element_shape)]
            follow = [i for i, p in enumerate(annotated) if p.kind == "ndarray" and p.needs_grad is None]
            read = cache_key.grad_read_params(self.fn, {annotated[i].name for i in follow}) if follow else set()
            self._annotated = annotated
            self._dataclass_at = [i for i, p in enumerate(annotated) if p.kind == "dataclass"]
            self._runtime_names = [p.name for p in annotated]  # the launch function's arguments
            # The forward variant depends on the argument's gradient only where it uses `.grad`;
            # the grad variant always does. `_templated`: what some variant specialises on.
            self._forward_templated = sorted({*shaped, *(i for i in follow if annotated[i].name in read)})
            self._templated = sorted({*shaped, *follow})
            self._params = [ir.Param(p.name, p.kind, p.dtype, p.ndim, True, p.element_shape) if p.name in read else p
                            for p in annotated]
            self._params_types = types
        return self._params

    def specialise(self, args, variant: str = "forward", kwargs=None) -> tuple[tuple, list[ir.Param]]:
        """(specialisation key, parameters) of `variant` for these arguments: an ndarray's
        omitted dtype/ndim is the argument's, and `needs_grad=None` is whether the argument is a
        float qd.ndarray with a gradient (for the grad variant; for the forward one only where
        the kernel uses `.grad`, see `params`). Without the argument (`k.grad.compile()`), a
        needs_grad=None is resolved as `params` does."""
        if variant == "forward_ad":  # duals follow the arguments
            return dual_params(args, kwargs, *self.specialise(args, "forward", kwargs))
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
            part, out[i] = self.specialised_argument(i, a)
            key.append(part)
        return tuple(key), out

    def specialised_argument(self, i: int, a) -> tuple[tuple, ir.Param]:
        """(part of the specialisation key, parameter) of templated ndarray parameter `i` (see
        `specialise`) for argument `a`; TypeError naming the kernel and parameter for an
        argument no variant can take. The variant dispatch keys arrays with it too."""
        p = self._annotated[i]
        external = None if isinstance(a, (np.ndarray, Ndarray, Field)) else foreign_arrays.signature(a)
        if isinstance(a, (np.ndarray, Ndarray, Field)):  # a field passed as a qd.Tensor: its buffer
            dt = T.from_numpy(a.dtype if isinstance(a, np.ndarray) else a.dtype.np_dtype)
            if dt is None:
                raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': unsupported dtype {a.dtype}")
            ndim = len(a.shape) if isinstance(a, np.ndarray) else len(a.storage_shape)
        elif external is not None:  # a torch tensor, a DLPack array
            dt, ndim = T.by_name(external[0]) if external[0] else None, external[1]
            if dt is None:
                raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': unsupported dtype "
                                f"{getattr(a, 'dtype', '?')}")
        else:
            raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': expected an ndarray, "
                            f"got {type(a).__name__}")
        element_shape = p.element_shape
        if p.dtype is None and isinstance(a, (Ndarray, Field)) and a.element_shape:  # a qd.ndarray of vectors
            element_shape = a.element_shape
        if None in element_shape:  # an element_dim without its shape: the argument's element or last axes
            element_shape = _element_axes_of(a, len(element_shape))
        dt = p.dtype or dt
        ndim = p.ndim + len(element_shape) - len(p.element_shape) if p.ndim is not None else ndim
        needs_grad = p.needs_grad
        if needs_grad is None:
            if external is not None:  # a tensor's requires_grad
                needs_grad = dt.is_float and external[2]
            else:
                needs_grad = dt.is_float and not isinstance(a, np.ndarray) and a.grad is not None
        layout = getattr(a, "layout", None) if isinstance(a, (Ndarray, Field)) else None
        return (dt.name, ndim, needs_grad, element_shape, layout), \
            ir.Param(p.name, "ndarray", dt, ndim, needs_grad, element_shape, layout)

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

    @property
    def dataclass_names(self) -> list[str]:
        """The names of the dataclass parameters."""
        self.params  # noqa: B018  (parses the annotations)
        return [self._annotated[i].name for i in self._dataclass_at]

    @property
    def runtime_names(self) -> list[str]:
        """The names of the parameters a launch takes: all but the qd.template() ones."""
        self.params  # noqa: B018  (parses the annotations)
        return list(self._runtime_names)

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
        array_key, params = self.specialise(args, variant, kwargs)
        key = array_key
        instances = {}
        if self._dataclass_at:  # their arguments' members become parameters, as templates' arrays do
            instances, dataclass_key = self._dataclass_arguments(args, kwargs)
            key = (key, dataclass_key)
        if templates is not None:
            key = (templates.key, key)
        own = variant == "forward" and not self._forward_templated and self._plain and templates is None \
            and not self._dataclass_at
        entry = self._launchers.get((variant, key))
        if entry is None or entry[0] != rt.generation:
            roots = templates
            if self._dataclass_at:
                params, roots = self.with_dataclass_roots(params, templates, instances)
            compiled = obtain(self.fn, params, direct_options(), rt.arch, variant, roots)
            with collection_paused():  # see obtain
                loaded = rt.device.load_kernel(compiled.artifacts, compiled.meta)
                launch = make_launcher(compiled.meta, rt.device, loaded, compiled.field_objects,
                                       function=self.function if own else None, graph=self.graph)
            entry = self._launchers[(variant, key)] = (rt.generation, launch, compiled)
        launch = entry[1]
        if entry[2].meta.members or self._dataclass_at:
            launch = self._member_launch(entry, templates)
        if own:  # bound to this runtime: the function launches on its own unless calls are observed
            self.launch_directly(launch.__qdc_launcher__.fast_code)
        elif variant == "forward" and self._plain:
            self._dispatch_to(instances, templates, array_key, launch)
        return launch, entry[2]

    def _dispatch_to(self, instances: dict, templates, array_key: tuple, launch) -> None:
        """Let the kernel function find this variant's launch itself (VariantDispatch), unless a
        Tape or FwdMode must see the calls: `instances` are the dataclass arguments, `array_key`
        the specialisation key of the templated ndarray arguments."""
        if self._dispatch is None:
            names = self._template_params.names if self._template_params is not None else []
            arrays = {self._annotated[i].name: self._array_key_function(i) for i in self._forward_templated}
            self._dispatch = VariantDispatch(self.function, self.dataclass_names, names, arrays,
                                             self._runtime_names)
            context.on_reset(self._dispatch)
        parts = {self._annotated[i].name: part for i, part in zip(self._forward_templated, array_key)}
        if self._dispatch.add(instances, templates, parts, launch):
            self.launch_directly(self._dispatch.code)

    def _array_key_function(self, i: int):
        """Templated ndarray parameter `i`'s part of the specialisation key, as a function of its
        argument. For an exact numpy array or qd.ndarray the part follows from a few attributes
        (dtype and rank; a qd.ndarray's element shape, gradient and layout too), so it is looked
        up by them once computed; anything else (a tensor) is keyed in full at every launch."""
        specialised = self.specialised_argument
        if None in self._annotated[i].element_shape:  # the part reads the argument's trailing axes
            return lambda a: specialised(i, a)[0]
        known: dict = {}

        def key(a):
            cls = a.__class__
            if cls is np.ndarray:
                facts = (cls, a.dtype, a.ndim)
            elif cls is DeviceNdarray:
                facts = (cls, a.dtype, a.ndim, a.element_shape, a.grad is not None, a.layout)
            else:
                return specialised(i, a)[0]
            part = known.get(facts)
            if part is None:
                part = known[facts] = specialised(i, a)[0]
            return part
        return key

    def _member_launch(self, entry, templates):
        """The launch function of variant `entry` that takes the kernel's arguments (its
        dataclass ones included) and reads the members it was compiled to take off them, and off
        these template arguments: one per variant and distinct template objects holding members
        (a variant keyed by an array's type serves every array of that type)."""
        meta = entry[2].meta
        values = templates.values if templates is not None else {}
        roots = {path[0]: values[path[0]] for path in meta.members.values() if path[0] in values} if values else {}
        key = (id(entry[1]), tuple((name, id(v)) for name, v in sorted(roots.items()))) if roots else id(entry[1])
        got = self._member_launches.get(key)
        if got is None:
            wrapped = member_launcher(meta, entry[1], self._runtime_names, roots)  # its fast code
            wrapped.__qdc_launcher__ = _MemberLaunch(wrapped)
            got = self._member_launches[key] = (entry[1], roots, wrapped)  # keeps the ids' objects alive
        return got[2]

    def _dataclass_arguments(self, args, kwargs) -> tuple[dict, tuple]:
        """({parameter: instance}, key) of the dataclass arguments of a call, keyed by their
        structure (dataclass_args.argument_key); TypeError naming the kernel and parameter for
        a missing or wrong one."""
        instances, keys = {}, []
        for i in self._dataclass_at:
            p = self._annotated[i]
            a = self._argument(i, args, kwargs)
            if a is _MISSING:
                raise TypeError(f"kernel '{self.__name__}': missing argument '{p.name}'")
            if not (is_dataclass_instance(a) and isinstance(a, p.dtype)):
                raise TypeError(f"kernel '{self.__name__}', argument '{p.name}': expected a {p.dtype.__qualname__} "
                                f"instance, got {type(a).__name__}")
            keys.append(argument_key(a, specialisation_key, f"argument '{p.name}' of kernel '{self.__name__}'"))
            instances[p.name] = a
        return instances, tuple(keys)

    def with_dataclass_roots(self, params, templates, instances: dict):
        """(parameters, template arguments) to compile for these dataclass arguments: they leave
        the parameter list and reach the front end as compile-time roots, alongside the template
        arguments (their members become parameters there: frontend/host_objects.py)."""
        merged = TemplateArgs.__new__(TemplateArgs)
        merged.values = {**(templates.values if templates is not None else {}),
                         **{name: DataclassArgument(a) for name, a in instances.items()}}
        merged.key = (templates.key if templates is not None else (),
                      tuple(argument_key(a, specialisation_key, name) for name, a in instances.items()))
        return [p for p in params if p.kind != "dataclass"], merged

    def _slow_call(self, *args, **kwargs):
        """A launch the kernel function does not make on its own: the first one (compiling),
        the first after `qd.init`, every one under a Tape, and those whose arguments the
        kernel's dispatch cannot key (see VariantDispatch: a mutable dataclass, a tuple as a
        template argument)."""
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
        kernel with variants: through its dispatch, see VariantDispatch)."""
        if self._dispatch is not None:
            return self.launches_directly(self._dispatch.code) and bool(self._dispatch.variants)
        entry = self._launchers.get(("forward", ()))
        return entry is not None and self.launches_directly(entry[1].__qdc_launcher__.fast_code)

    def __repr__(self):
        return f"<qdc kernel {self.__name__}>"


_MISSING = object()


def _no_integer_gradient(p: ir.Param) -> ir.Param:
    """An integer ndarray has no gradient to follow: its needs_grad=None is False."""
    if p.kind == "ndarray" and p.needs_grad is None and p.dtype is not None and not p.dtype.is_float:
        return ir.Param(p.name, p.kind, p.dtype, p.ndim, False, p.element_shape)
    return p


class _MemberLaunch:
    """What `launch.__qdc_launcher__` offers for a launch function that reads members (see
    runtime/member_arguments.py): its generic launch is the function itself."""
    __slots__ = ("launch",)
    fast_code = None

    def __init__(self, launch):
        self.launch = launch


def _element_axes_of(a, count: int) -> tuple:
    """The element shape of ndarray argument `a` for an annotation's `element_dim=count`: a
    qd.ndarray's own element shape when it has that many axes, else its last `count` axes."""
    own = getattr(a, "element_shape", ())
    if len(own) == count:
        return tuple(own)
    shape = a.storage_shape if isinstance(a, Ndarray) else a.shape
    return tuple(shape[len(shape) - count:]) if len(shape) >= count else tuple(shape)


def _plain_parameters(fn) -> list[str] | None:
    """The parameter names, if the generated function can take them as its own."""
    names = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or name.startswith("_q_"):
            return None
        names.append(name)
    return names


def kernel(fn=None, *, pure: bool | None = None, fastcache: bool = False, graph: bool = False,
           checkpoints: bool = False):
    """`@qd.kernel`: the kernel as a plain Python function that compiles on first call, then
    launches (see Kernel). `@qd.kernel(graph=True)`: on CUDA the kernel's tasks (and its
    `.grad`'s) are replayed as one graph per launch; on every other arch it changes nothing.
    `fastcache=True` (Quadrants': cache the kernel across processes; `pure` is its deprecated
    name there) is what qdc does for every kernel, so it changes nothing. `checkpoints=True`
    opts into Quadrants' experimental `qd.checkpoint` pause/resume, which qdc does not have:
    an error."""
    if checkpoints:
        raise NotImplementedError("@qd.kernel(checkpoints=True): qdc has no qd.checkpoint pause/resume model")
    if fn is None:
        return lambda f: kernel(f, graph=graph)
    if not callable(fn):
        raise TypeError(f"@qd.kernel decorates a function, got {type(fn).__name__}; its options are keywords "
                        f"(@qd.kernel(graph=True))")
    function = Kernel(fn, graph).function
    return KernelMethod(function) if _defined_in_class(fn) else function


def _defined_in_class(fn) -> bool:
    """Whether `fn` is defined in a class body (`Solver.step`, `f.<locals>.Solver.step`)."""
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) > 1 and parts[-2] != "<locals>"


class KernelMethod:
    """What `@qd.kernel` gives a class for a kernel defined in it: read from the class, the kernel
    function itself; read from an instance, a BoundKernel, so that `self.step.grad(f)` passes the
    instance as `self.step(f)` does (a Python method would bind the call but not its `.grad`)."""
    __slots__ = ("function",)

    def __init__(self, function):
        self.function = function

    def __get__(self, instance, owner=None):
        return self.function if instance is None else BoundKernel(self.function, instance)

    def __call__(self, *args, **kwargs):  # reached past __get__ (staticmethod(...), a dict of kernels)
        return self.function(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.function, name)


class BoundKernel(functools.partial):
    """A kernel method bound to an instance: a call (and a call of its `.grad`) passes the instance
    first. A partial, so that the call itself costs what a Python method call does."""
    __slots__ = ()

    @property
    def grad(self):
        return functools.partial(self.func.grad, *self.args)

    @property
    def __func__(self):
        return self.func

    @property
    def __self__(self):
        return self.args[0]

    def __getattr__(self, name):
        return getattr(self.func, name)

    def __repr__(self):
        return f"<bound qdc kernel {self.func.__qualname__} of {self.args[0]!r}>"


func = lang.func  # `@qd.func` (defined with the language, so that kernels can apply it too)


def kernel_of(obj) -> Kernel | None:
    """The Kernel behind a `@qd.kernel` function (or a Kernel itself); None for anything else."""
    if isinstance(obj, KernelMethod):
        obj = obj.function
    elif isinstance(obj, BoundKernel):
        obj = obj.func
    if isinstance(obj, types.FunctionType):
        obj = obj.__dict__.get(lang.KERNEL_ATTRIBUTE)
    return obj if isinstance(obj, Kernel) else None
