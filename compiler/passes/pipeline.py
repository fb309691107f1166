"""The pass pipeline, top to bottom.

Two steps of the compiler's design happen before this list, in the front end
(`frontend/ast_to_ir.py`), because they need Python values rather than IR: `@qd.func`
calls are inlined at their call sites, and `qd.static(...)` loops are unrolled (and
`if qd.static(...)` branches chosen) while the AST is walked. What reaches the pipeline is
one flat kernel body.

Each pass is a function `pass(kernel) -> changed` in its own module, mutating the IR in
place. Reverse-mode passes (autodiff, adstacks) belong after `simplify_tasks` and before
`thread_local_reductions`, which rewrites atomics into per-chunk accumulators.

A pass listed with None runs only in the kernel variants that supply it (`variant_passes`):
it needs what the front end resolved for this compilation (the runtime Field objects).
`forward_mode` is the forward-mode variant's tangent transform (autodiff/forward_mode.py).

The gradient kernel has a list of its own (GRAD_PIPELINE in autodiff/grad_kernel.py: the
forward list up to `simplify_tasks`, the reverse-mode transform, then its own passes), run by
the same machinery: `run_passes` verifies the IR after every pass when asked to, or when the
environment variable QDC_VERIFY_IR=1 is set (the test suite sets it, so every kernel it
compiles is checked between passes), naming the pass that broke it; `dump(name, text)`
receives the printed IR after each pass (`--ir` dumps).
"""
from __future__ import annotations

import os

from .. import ir
from .constant_fold import constant_fold
from .intrinsics import lower_intrinsics
from .local_arrays import group_local_arrays
from .offload import offload
from .reductions import thread_local_reductions
from .simplify import simplify
from .task_axes import split_task_index
from .type_check import type_check

PIPELINE = [
    ("type_check", type_check),                # the verifier's type rules on the front end's output
    ("constant_fold", constant_fold),          # `2*3+1` -> const 7
    ("simplify", simplify),                    # store forwarding, folding, CSE, DCE to a fixed point
    ("forward_mode", None),                    # variant forward_ad: a tangent beside every active value
    ("offload", offload),                      # top-level loops -> range-for tasks, the rest -> serial
    ("simplify_tasks", simplify),              # per task: offload recomputes and imports values
    ("lower_intrinsics", lower_intrinsics),    # after autodiff: stop_grad -> its value, random -> Philox
    ("thread_local_reductions", thread_local_reductions),  # one atomic per chunk, not per iteration
    ("split_task_index", split_task_index),    # ndrange coordinates as rows, not k // w and k % w
    ("local_arrays", group_local_arrays),      # vector locals indexed at run time -> arrays, not selects
]


def verify_requested() -> bool:
    return os.environ.get("QDC_VERIFY_IR") == "1"


def run_pipeline(k: ir.KernelIR, verify_each: bool = False, dump=None,
                 stop_after: str | None = None, variant_passes: dict | None = None) -> ir.KernelIR:
    """Run PIPELINE over `k` (up to and including pass `stop_after`, if given); the entries
    listed with None run the function `variant_passes` gives for their name, if any."""
    return run_passes(k, PIPELINE, "the front end", verify_each, dump, stop_after, variant_passes)


def run_passes(k: ir.KernelIR, passes: list, made_by: str, verify_each: bool = False, dump=None,
               stop_after: str | None = None, variant_passes: dict | None = None,
               offloaded: bool = False) -> ir.KernelIR:
    """Run `passes` ((name, pass) pairs, in order) over `k`, which `made_by` produced (checked
    first when verifying) and which is `offloaded` already or not until a pass named "offload"
    has run; see run_pipeline for the other arguments."""
    names = [name for name, _ in passes]
    if stop_after is not None and stop_after not in names:
        raise ValueError(f"unknown pass '{stop_after}' (passes: {', '.join(names)})")
    verify_each = verify_each or verify_requested()
    if verify_each:
        _verify(k, made_by, offloaded)
    for name, pass_fn in passes:
        pass_fn = pass_fn or (variant_passes or {}).get(name)
        if pass_fn is None:
            continue
        pass_fn(k)
        offloaded = offloaded or name == "offload"
        if verify_each:
            _verify(k, f"pass '{name}'", offloaded)
        if dump is not None:
            dump(name, ir.print_kernel(k))
        if name == stop_after:
            break
    return k


def _verify(k: ir.KernelIR, after: str, offloaded: bool) -> None:
    try:
        ir.verify(k, offloaded=offloaded)
    except ir.IRVerifyError as e:
        raise ir.IRVerifyError(f"after {after}: {e.message}\n{ir.print_kernel(k)}", e.stmt) from None
