"""The IR of a kernel as text, for tests and debugging (no code generation, nothing launched)."""
from __future__ import annotations


def kernel_ir(kernel, *args, after: str | None = None):
    """The KernelIR of `kernel` (a `@qd.kernel`) specialised for `args` (needed only for
    templated ndarray parameters) under direct mode's options, run through the pass pipeline
    up to and including pass `after` (the whole pipeline by default)."""
    from ..frontend.ast_to_ir import FrontEnd
    from ..jit.api import direct_options
    from ..jit.kernel import kernel_of
    from ..passes.pipeline import run_pipeline

    kernel = kernel_of(kernel)
    _, params = kernel.specialise(args)
    kir = FrontEnd(kernel.fn, params, direct_options()).build()
    return run_pipeline(kir, stop_after=after)


def inspect_ir(kernel, *args, after: str | None = None) -> str:
    """The printed IR of `kernel` after the pass pipeline (or after pass `after`)."""
    from ..ir import print_kernel
    return print_kernel(kernel_ir(kernel, *args, after=after))
