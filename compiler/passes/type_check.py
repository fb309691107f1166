"""Type check: the verifier's type rules over the front end's output, before any pass relies
on them. A violation is a compiler bug; it is reported at the user's line it came from."""
from __future__ import annotations

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir


def type_check(k: ir.KernelIR) -> bool:
    try:
        ir.check_types(k)
    except ir.IRVerifyError as e:
        loc = e.stmt.loc if e.stmt is not None else None
        loc = loc or k.loc
        raise QdcCompileError(f"internal compiler error (IR type check): {e.message}",
                              loc.filename if loc else "<unknown>", loc.line if loc else 0,
                              loc.col if loc else 0) from None
    return False
