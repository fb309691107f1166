"""The pass pipeline, top to bottom. `run_pipeline(k, verify_each=True)` checks the IR after
every pass (tests do); `dump` receives the IR text after each pass (for `--ir` dumps)."""
from __future__ import annotations

from .. import ir
from .constant_fold import constant_fold
from .dce import eliminate_dead_code
from .offload import offload

PIPELINE = [
    ("constant_fold", constant_fold),
    ("dce", eliminate_dead_code),
    ("offload", offload),
]


def run_pipeline(k: ir.KernelIR, verify_each: bool = False, dump=None) -> ir.KernelIR:
    if verify_each:
        ir.verify(k)
    offloaded = False
    for name, pass_fn in PIPELINE:
        pass_fn(k)
        offloaded = offloaded or name == "offload"
        if verify_each:
            ir.verify(k, offloaded=offloaded)
        if dump is not None:
            dump(name, ir.print_kernel(k))
    return k
