"""`qdc.torch`: a qdc kernel as a differentiable PyTorch op (this module is importable as
`qdc.torch`; its file is not named torch.py, which would shadow the real torch for scripts run
beside it).

    import qdc.torch
    step = qdc.torch.function(advance, inputs=("x",), outputs=("y",))
    y = step(x, torch.zeros_like(x), 64)   # the kernel's arguments, in its order
    y.sum().backward()                     # runs advance.grad: x.grad

The kernel is a `@qd.kernel` function or one of a module from `qdc.runtime.load` (a deployment
can train with prebuilt kernels; the gradient kernel must be built, so its differentiated
ndarray parameters are annotated `needs_grad=True`). Forward: the outputs are new tensors that
start as copies of the tensors given for them (their shape, dtype, device and initial value;
the given tensors are not modified), the kernel runs on them in place with the inputs, and they
are returned (one tensor for one output). Backward: the kernel's gradient kernel runs with the
same arguments, each input's gradient buffer zeroed and each output's seeded with the incoming
gradient (runtime/external_arrays.py binds a tensor's `.grad` as the gradient buffer); what it
accumulates for the inputs is their gradient, and what remains on an output is the gradient of
its initial value. Tensors that are neither (integer index arrays, constants) and numbers are
passed as they are, without gradients.
"""
from __future__ import annotations

import inspect

import torch
from torch.autograd.function import once_differentiable

__all__ = ["function"]


def function(kernel, inputs=(), outputs=()):
    """A callable taking `kernel`'s arguments (tensors for its ndarray parameters, numbers for
    scalars; positionally or by name) that runs it and returns its `outputs` as new tensors
    (one tensor for one output), differentiable with respect to the `inputs` (and the outputs'
    initial values) through the kernel's gradient kernel."""
    inputs, outputs = _names(inputs, "inputs"), _names(outputs, "outputs")
    name = getattr(kernel, "__name__", type(kernel).__name__)
    try:
        signature = inspect.signature(kernel)
    except (TypeError, ValueError):
        raise TypeError(f"qdc.torch.function: {kernel!r} is not a kernel (a @qd.kernel function or a kernel of a "
                        f"loaded module)") from None
    params = list(signature.parameters)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()) \
            or getattr(kernel, "grad", None) is None:
        raise TypeError(f"qdc.torch.function: {kernel!r} is not a kernel with a gradient (a @qd.kernel function or "
                        f"a kernel of a loaded module)")
    if not outputs:
        raise ValueError(f"qdc.torch.function: kernel '{name}': outputs=() names no parameter to return")
    for group, names in (("inputs", inputs), ("outputs", outputs)):
        unknown = [n for n in names if n not in params]
        if unknown:
            raise ValueError(f"qdc.torch.function: kernel '{name}' has no parameter {', '.join(map(repr, unknown))} "
                             f"(named in {group}); its parameters: {', '.join(params)}")
    both = set(inputs) & set(outputs)
    if both:
        raise ValueError(f"qdc.torch.function: kernel '{name}': {', '.join(map(repr, sorted(both)))} is both an "
                         f"input and an output; an output's initial value is differentiated already")
    op = _Op(kernel, name, signature, [params.index(n) for n in inputs], [params.index(n) for n in outputs])

    def call(*args, **kwargs):
        return _KernelFunction.apply(op, *op.arguments(args, kwargs))
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"qdc kernel '{name}' as a differentiable PyTorch op: inputs {inputs}, outputs {outputs}"
    return call


def _names(names, what: str) -> tuple:
    if isinstance(names, str):
        return (names,)
    try:
        out = tuple(names)
    except TypeError:
        raise TypeError(f"qdc.torch.function: {what} must be parameter names, got {names!r}") from None
    if not all(isinstance(n, str) for n in out):
        raise TypeError(f"qdc.torch.function: {what} must be parameter names, got {names!r}")
    return out


class _Op:
    """What one `function(...)` made: the kernel and where its inputs and outputs are."""

    def __init__(self, kernel, name: str, signature, inputs: list, outputs: list):
        self.kernel, self.name, self.signature = kernel, name, signature
        self.inputs, self.outputs = inputs, outputs
        self.names = list(signature.parameters)

    def arguments(self, args, kwargs) -> list:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel '{self.name}': {e}") from None
        bound.apply_defaults()
        values = list(bound.arguments.values())
        for i in self.inputs + self.outputs:
            if not isinstance(values[i], torch.Tensor):
                raise TypeError(f"kernel '{self.name}', argument '{self.names[i]}': an "
                                f"{'input' if i in self.inputs else 'output'} of the op takes a torch.Tensor, got "
                                f"{type(values[i]).__name__}")
        return values


class _KernelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: _Op, *args):
        args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        for i in op.outputs:  # new tensors from the given ones' values; those stay as they are
            args[i] = args[i].clone(memory_format=torch.contiguous_format)
        op.kernel(*args)
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.op, ctx.args, ctx.tensors = op, [None if i in tensors else a for i, a in enumerate(args)], tensors
        ctx.save_for_backward(*(args[i] for i in tensors))
        outs = tuple(args[i] for i in op.outputs)
        return outs[0] if len(outs) == 1 else outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        op = ctx.op
        args = list(ctx.args)
        for i, t in zip(ctx.tensors, ctx.saved_tensors):
            args[i] = t
        wanted = ctx.needs_input_grad[1:]
        if not any(wanted[i] for i in op.inputs + op.outputs):
            return (None,) * (1 + len(args))
        differentiable = [i for i in op.inputs + op.outputs if args[i].is_floating_point()]
        for i in op.inputs:  # a leaf of its own whose .grad is the kernel's gradient buffer
            if i in differentiable:
                args[i] = args[i].detach().requires_grad_()
                args[i].grad = torch.zeros_like(args[i], memory_format=torch.contiguous_format)
        for i, g in zip(op.outputs, grad_outputs):  # a copy: the gradient kernel consumes the seed
            args[i] = args[i].clone()
            if i in differentiable:
                args[i].requires_grad_()
                args[i].grad = g.clone(memory_format=torch.contiguous_format)
        op.kernel.grad(*args)
        grads = [None] * len(args)
        for i in differentiable:
            if wanted[i]:
                grads[i] = args[i].grad
        return (None, *grads)
