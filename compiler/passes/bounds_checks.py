"""Debug-mode bounds checks (`debug=True`): which global accesses of a kernel are checked.

Every indexed `GlobalPtr` of the offloaded kernel, but those into block-shared arrays (whose
static shape a GPU's shared memory holds), gets one check; its id is its position in
`checked_accesses`, which the metadata table (`records`, runtime/contract/artifact.py) and the code
generator both derive from the same final IR, so they always agree.
"""
from __future__ import annotations

from .. import ir


def checked_accesses(kir: ir.KernelIR) -> list:
    """The indexed global accesses of `kir`, in program order (a check id is the position)."""
    return [s for task in kir.tasks for s in ir.walk_nested(task)
            if isinstance(s, ir.GlobalPtr) and s.indices and not isinstance(s.target, ir.SharedRef)]


def records(kir: ir.KernelIR) -> list:
    """The metadata table of checks: [kind, name, is_grad, extent, where] per access, where
    extent is the field's shape or the ndarray's argument index (its shape is known at launch)."""
    out = []
    for s in checked_accesses(kir):
        t = s.target
        where = str(s.loc) if s.loc is not None else ""  # accesses made up by autodiff have no source
        if isinstance(t, ir.FieldRef):
            out.append(["field", t.name, bool(t.is_grad), [int(d) for d in t.shape], where])
        else:
            out.append(["ndarray", t.name, bool(t.is_grad), int(t.arg_index), where])
    return out
