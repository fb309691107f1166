"""`qd.ad.FwdMode`: forward-mode autodiff in direct mode (docs/api.md, Autodiff).

The context manager itself is the runtime's (runtime/forward_mode.py), shared with prebuilt
modules. What direct mode adds: while a FwdMode is active a kernel call (which then takes the
kernel's slow path, kernel.py) launches the kernel's forward_ad variant, compiled on demand
like the grad variant and specialised on which ndarray arguments carry a dual
(compiler/driver/kernel.py, dual_params), as `needs_grad=None` follows an argument's gradient.
"""
from __future__ import annotations

from qdc.runtime import forward_mode
from qdc.runtime.forward_mode import FwdMode  # noqa: F401  (qd.ad.FwdMode)


def is_active() -> bool:
    return forward_mode.active is not None


def launch(kernel, args: tuple, kwargs: dict | None):
    """Run `kernel`'s forward_ad variant on these arguments (a call inside a FwdMode)."""
    launcher, compiled = kernel._launcher(args, "forward_ad", kwargs)
    args, kwargs = kernel.runtime_arguments(args, kwargs)
    args, kwargs = forward_mode.dual_arguments(compiled.meta, args, kwargs)
    return launcher.__qdc_launcher__.launch(*args, **(kwargs or {}))
