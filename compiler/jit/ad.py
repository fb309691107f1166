"""`qd.ad`: reverse-mode entry points. `kernel.grad(*args)` (a GradKernel) and `qd.ad.Tape`.

`kernel.grad` is the kernel's "grad" variant: an ordinary compiled kernel (KernelMeta with
is_grad=True) built by compiler/autodiff and cached, loaded and launched like any other.
"""
from __future__ import annotations

import functools

from qdc.runtime import context, random_stream
from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray
from qdc.runtime.kernel_function import observe_calls, stop_observing_calls

from . import grad_check as grad_check_mod
from .forward import FwdMode  # noqa: F401  (qd.ad.FwdMode: forward mode, forward.py)
from .grad_check import GradCheckError  # noqa: F401  (qd.ad.GradCheckError)

recording = None  # the Tape whose `with` body is running, if any


def no_grad(func=None):
    """`@qd.ad.no_grad` on a Python function, or `with qd.ad.no_grad():` around code: the kernels
    launched there run as usual, but a Tape does not record them, so their gradients are not
    taken (Quadrants' no_grad: the function's gradient is empty)."""
    if func is None:
        return _NoGradScope()

    @functools.wraps(func)
    def without_gradient(*args, **kwargs):
        with _NoGradScope():
            return func(*args, **kwargs)
    return without_gradient


class _NoGradScope:
    open = 0  # how many no_grad scopes are running (they nest)

    def __enter__(self):
        _NoGradScope.open += 1
        return self

    def __exit__(self, *exc):
        _NoGradScope.open -= 1


class GradKernel:
    """`kernel.grad`: calling it runs the adjoint of `kernel` with the same arguments."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.__name__ = kernel.__name__ + ".grad"
        self._fast = (None, None)  # (runtime generation, launch) when nothing is templated

    def compile(self, args=()):
        return self.kernel.compile(args, variant="grad")

    def __call__(self, *args, **kwargs):
        gen, launch = self._fast
        if gen is None or gen != context.current().generation:
            if self.kernel.template_params is not None:  # compiled per template argument
                templates, args = self.kernel.template_params.split(args, kwargs)
                return self.kernel._launcher(args, "grad", templates=templates)[0](*args)
            launch = self.kernel._launcher(args, "grad")[0]
            if not self.kernel._templated:
                self._fast = (context.current().generation, launch)
        return launch(*args, **kwargs)

    def __repr__(self):
        return f"<qdc grad kernel {self.__name__}>"


class Tape:
    """`with qd.ad.Tape(loss=y): compute(...)` records the kernel launches in its body; on exit
    it seeds `loss.grad` with 1 and runs their gradient kernels in reverse order.

    As in Quadrants: `loss` is a 0-d field (or one-element ndarray) with a gradient, zeroed on
    entry; with `clear_gradients` (the default) the gradients the recorded kernels write are
    zeroed before the replay, so the result is the gradient of this tape alone.

    `grad_check=[fields]` checks the gradients of those fields against central finite
    differences after the backward pass (grad_check.py). `validation` is accepted as
    in Quadrants, where it turns on checks of the global data access rules in debug mode: qdc
    applies those rules to every kernel it compiles, so there is nothing more to turn on."""

    def __init__(self, loss=None, clear_gradients: bool = True, validation: bool = False, grad_check=None):
        if loss is not None:
            if not isinstance(loss, (Field, Ndarray)):
                raise TypeError(f"Tape(loss=...) needs a qd field or ndarray, got {type(loss).__name__}")
            if loss.size != 1:
                raise ValueError(f"the loss of a Tape must be a 0-d field or hold one element; it has shape "
                                 f"{loss.shape}")
            if loss.grad is None:
                raise ValueError("the loss of a Tape needs a gradient: create it with needs_grad=True")
        self.loss, self.clear_gradients, self.validation = loss, clear_gradients, bool(validation)
        self.calls: list = []
        self.random_counters: list = []  # per call: the qd.random() launch counter it drew with
        self.entered = self.evaluated = False
        self.grad_check = grad_check_mod.check_fields(grad_check, loss) if grad_check else None
        self.initial_state = grad_check_mod.StateSnapshot() if self.grad_check else None

    def __enter__(self):
        global recording
        if self.entered:
            raise RuntimeError("a Tape can be entered only once")
        if recording is not None:
            raise RuntimeError("Tapes cannot be nested")
        self.entered = True
        if self.loss is not None:
            self.loss.fill(0)
            if self.initial_state is not None:
                self.initial_state.save(self.loss)
        observe_calls()  # every kernel call in the body must reach the recording slow path
        recording = self
        return self

    def __exit__(self, exc_type, exc, tb):
        global recording
        recording = None
        stop_observing_calls()
        if exc_type is None and self.loss is not None:
            self.grad()

    def record(self, kernel, args, kwargs) -> None:
        if _NoGradScope.open:  # launched under qd.ad.no_grad: its gradient is not taken
            return
        if self.initial_state is not None:  # what the finite differences start from
            self.initial_state.save_launch(kernel, args, kwargs)
        self.calls.append((kernel, args, kwargs))
        self.random_counters.append(random_stream.STREAM.launches)  # the one this launch draws with, if it draws

    def grad(self) -> None:
        """Seed the loss gradient and run the recorded kernels' gradients, last first."""
        if self.evaluated:
            raise RuntimeError("a Tape's gradients can be evaluated only once")
        self.evaluated = True
        if self.clear_gradients:
            self._clear_gradients()
        if self.loss is not None:
            self.loss.grad.fill(1)
        for (kernel, args, kwargs), counter in reversed(list(zip(self.calls, self.random_counters))):
            with random_stream.STREAM.replaying(counter):  # qd.random() draws what the launch drew
                kernel.grad(*args, **kwargs)
        if self.grad_check:
            grad_check_mod.run_check(self.grad_check, self.loss, self.calls, self.initial_state)

    def _clear_gradients(self) -> None:
        for kernel, args, kwargs in self.calls:
            for f in kernel.compile(args, variant="grad", kwargs=kwargs).field_objects:
                if getattr(f, "is_grad", False):
                    f.fill(0)
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, Ndarray) and a.grad is not None:
                    a.grad.fill(0)
