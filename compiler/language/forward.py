"""`qd.ad.FwdMode`: forward-mode autodiff in direct mode (API.md §3, "Forward mode").

The context manager itself is the runtime's (runtime/forward_mode.py), shared with prebuilt
modules. What direct mode adds: while a FwdMode is active a kernel call (which then takes the
kernel's slow path, compiler/driver/kernel.py) launches the kernel's forward_ad variant,
compiled on demand like the grad variant and specialised on which ndarray arguments carry a
dual, as `needs_grad=None` follows an argument's gradient.
"""
from __future__ import annotations

from qdc.runtime import forward_mode
from qdc.runtime.fields import Ndarray
from qdc.runtime.forward_mode import FwdMode  # noqa: F401  (qd.ad.FwdMode)

from .. import ir


def _suspend_fast_launches() -> None:
    from ..driver.kernel import suspend_fast_launches
    suspend_fast_launches()


forward_mode.on_enter(_suspend_fast_launches)


def is_active() -> bool:
    return forward_mode.active is not None


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
        out[i] = ir.Param(p.name, p.kind, p.dtype, p.ndim, has_dual, p.element_shape)
        duals.append(has_dual)
    return (key, tuple(duals)), out


_ABSENT = object()


def launch(kernel, args: tuple, kwargs: dict | None):
    """Run `kernel`'s forward_ad variant on these arguments (a call inside a FwdMode)."""
    launcher, compiled = kernel._launcher(args, "forward_ad", kwargs)
    args, kwargs = kernel.runtime_arguments(args, kwargs)
    args, kwargs = forward_mode.dual_arguments(compiled.meta, args, kwargs)
    return launcher.__qdc_launcher__.launch(*args, **(kwargs or {}))
