"""`qd.aot`: declarations for ahead-of-time builds (docs/api.md, Running kernels).

`name = qd.aot.instantiate(kernel, **template_args)` at module level of a kernel module
declares one instantiation of a kernel with qd.template() parameters: `qdc build` compiles it
(and its reverse-mode variant when it touches needs_grad data) and the loaded module exposes
`mod.name`, taking only the other parameters. In direct mode the instantiation is the kernel
with those template arguments bound: `name(*other_args)`, `name.grad(*other_args)`, recorded
by a Tape like any kernel call.
"""
from __future__ import annotations

from . import ad, forward
from .kernel import kernel_of


class Instantiation:
    """A kernel with its template arguments bound (`templates`, a TemplateArgs)."""

    def __init__(self, kernel, templates, examples: dict | None = None):
        self.kernel, self.templates = kernel, templates
        # dataclass parameter -> the instance whose structure an ahead-of-time build compiles for
        # (the call still passes one: its members are read at every launch)
        self.examples = examples or {}
        self.fn = kernel.fn
        self.__name__ = kernel.__name__
        self.__doc__ = kernel.__doc__
        self.grad = _InstantiationGrad(self)

    @property
    def params(self):
        """The parameters the instantiation takes: the kernel's other than its template ones."""
        return self.kernel.params

    def params_for(self, opts):
        """`params` under `opts` (an ahead-of-time build's)."""
        return self.kernel.params_for(opts)

    def __call__(self, *args, **kwargs):
        if ad.recording is not None:  # inside `with qd.ad.Tape(...)`
            ad.recording.record(self, args, kwargs)
        if forward.is_active():  # inside `with qd.ad.FwdMode(...)`: the kernel's Jacobian-vector product
            return forward.launch(self.kernel, (), self.all_arguments(args, kwargs))
        return self.launch_unrecorded(args, kwargs)

    def all_arguments(self, args, kwargs=None) -> dict:
        """Every argument of the kernel by name: these and the bound template arguments."""
        bound = self.templates.values if self.templates is not None else {}
        return {**dict(zip(self.kernel.runtime_names, args)), **(kwargs or {}), **bound}

    def build_templates(self):
        """What an ahead-of-time build compiles for: the template arguments and the example
        instances of the dataclass parameters (compiler/language/dataclass_args.py)."""
        if not self.examples:
            return self.templates
        self.kernel._dataclass_arguments((), self.examples)  # checks them, naming kernel and parameter
        return self.kernel.with_dataclass_roots(self.kernel.params, self.templates, self.examples)[1]

    def launch_unrecorded(self, args, kwargs=None):
        launch = self.kernel._launcher(args, kwargs=kwargs, templates=self.templates)[0]
        return launch.__qdc_launcher__.launch(*args, **(kwargs or {}))

    def compile(self, args=(), variant: str = "forward", kwargs=None):
        return self.kernel._launcher(args, variant, kwargs, templates=self.templates)[1]

    def __repr__(self):
        bound = ", ".join(f"{k}={v!r}" for k, v in self.templates.values.items())
        return f"<qdc instantiation {self.__name__}({bound})>"


class _InstantiationGrad:
    """`instantiation.grad(*args)`: the adjoint of the kernel with the same template arguments."""

    def __init__(self, inst: Instantiation):
        self.inst = inst
        self.__name__ = inst.__name__ + ".grad"

    def __call__(self, *args, **kwargs):
        inst = self.inst
        return inst.kernel._launcher(args, "grad", kwargs, templates=inst.templates)[0](*args, **kwargs)

    def compile(self, args=()):
        return self.inst.compile(args, variant="grad")


def instantiate(kernel, **template_args) -> Instantiation:
    """Bind every qd.template() parameter of `kernel` (a `@qd.kernel`) by keyword, and give
    each dataclass parameter an example instance: the build compiles for its structure (which
    members are fields, the types of its arrays), and the built kernel takes an instance of
    that structure at every call."""
    k = kernel_of(kernel)
    if k is None:
        raise TypeError(f"qd.aot.instantiate() needs a @qd.kernel, got {type(kernel).__name__}")
    dataclasses = set(k.dataclass_names)
    examples = {n: v for n, v in template_args.items() if n in dataclasses}
    if k.template_params is None and not dataclasses:
        raise TypeError(f"kernel '{k.__name__}' has no qd.template() parameters to instantiate; "
                        f"`qdc build` builds it as it is")
    missing = sorted(dataclasses - set(examples))
    if missing:
        raise TypeError(f"kernel '{k.__name__}': dataclass parameter '{missing[0]}' needs an example instance "
                        f"(qd.aot.instantiate({k.__name__}, {missing[0]}=...)) to be built ahead of time")
    rest = {n: v for n, v in template_args.items() if n not in dataclasses}
    if k.template_params is None:
        if rest:
            raise TypeError(f"kernel '{k.__name__}' has no template parameter '{sorted(rest)[0]}'")
        return Instantiation(k, None, examples)
    return Instantiation(k, k.template_params.bind(rest), examples)
