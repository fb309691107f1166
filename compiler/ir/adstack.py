"""IR statements of reverse-mode autodiff: adstacks and adjoint temporaries.

An adstack is a per-thread stack of values of one scalar type. Float stacks of locals hold, per
entry, the primal value and its adjoint; other stacks hold only the primal. Every grad-kernel
thread pushes during its forward sweep and pops during its reverse sweep, so each stack is
empty again at the end of every task iteration. Where the storage lives (a runtime-owned heap,
sliced per thread) is the backend's business; `stack_id` indexes the kernel's adstack table
(`KernelMeta.adstack["stacks"]`), whose capacities are read at launch time.
"""
from __future__ import annotations

from qdc.runtime.contract.types import DataType

from .stmts import SourceLoc, Stmt

__all__ = ["AdStackAlloca", "AdStackPush", "AdStackPop", "AdStackLoadTop", "AdStackLoadTopAdj",
           "AdStackAccAdjoint", "TempAtomicAdd", "ADSTACK_READS", "ADSTACK_OPS"]


class AdStackAlloca(Stmt):
    """Declares stack `stack_id` (empties it); its value is the stack handle. `adjoint`: whether
    entries carry an adjoint slot (float stacks of locals do; snapshots of values do not)."""
    ATTRS = ("stack_id", "var_name", "adjoint")

    def __init__(self, type: DataType, stack_id: int, var_name: str = "", loc: SourceLoc | None = None,
                 adjoint: bool | None = None):
        super().__init__(type, loc)
        self.stack_id, self.var_name = stack_id, var_name
        self.adjoint = type.is_float if adjoint is None else adjoint
        assert not self.adjoint or type.is_float

    @property
    def has_adjoint(self) -> bool:
        return self.adjoint


class AdStackPush(Stmt):
    """Push `value` (its adjoint slot starts at zero). Past the capacity the write is skipped and
    the overflow flag is raised; the count still advances so pops stay balanced."""
    OPERANDS = ("stack", "value")

    def __init__(self, stack: AdStackAlloca, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.stack, self.value = stack, value


class AdStackPop(Stmt):
    OPERANDS = ("stack",)

    def __init__(self, stack: AdStackAlloca, loc=None):
        super().__init__(None, loc)
        self.stack = stack


class AdStackLoadTop(Stmt):
    """The primal value on top of the stack."""
    OPERANDS = ("stack",)

    def __init__(self, stack: AdStackAlloca, loc=None):
        super().__init__(stack.type, loc)
        self.stack = stack


class AdStackLoadTopAdj(Stmt):
    """The adjoint accumulated on the top entry (float stacks only)."""
    OPERANDS = ("stack",)

    def __init__(self, stack: AdStackAlloca, loc=None):
        assert stack.has_adjoint
        super().__init__(stack.type, loc)
        self.stack = stack


class AdStackAccAdjoint(Stmt):
    """Add `value` to the top entry's adjoint (float stacks only)."""
    OPERANDS = ("stack", "value")

    def __init__(self, stack: AdStackAlloca, value: Stmt, loc=None):
        assert stack.has_adjoint
        super().__init__(None, loc)
        self.stack, self.value = stack, value


class TempAtomicAdd(Stmt):
    """Atomically add `value` to kernel temporary `slot`: the adjoint of a value that crossed
    from one task into a parallel one accumulates here from every iteration."""
    OPERANDS = ("value",)
    ATTRS = ("slot",)

    def __init__(self, slot: int, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.slot, self.value = slot, value


ADSTACK_READS = (AdStackLoadTop, AdStackLoadTopAdj)
ADSTACK_OPS = (AdStackPush, AdStackPop, AdStackLoadTop, AdStackLoadTopAdj, AdStackAccAdjoint)
