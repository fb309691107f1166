"""Activity analysis: which values, locals and temporaries carry a gradient.

A value is *active* when it is a float that depends on a differentiable input (a load of a
field or ndarray that has a gradient buffer) and also flows into a differentiable output (a
store or atomic update of such a global). Only active values get adjoints: integers, values
of constants and scalar arguments, and computations whose results never reach a gradient
cost nothing in the reverse sweep. Both directions are fixed points over the whole kernel,
because locals and temporaries carry values around loops and across tasks.

A block-shared array (qd.simt) carries a gradient like a local does: when a value with one is
stored into it (or added to it) and a load of it flows into an output (`shared`). Subgroup
exchanges pass their value's gradient through; ballots and votes carry none.
"""
from __future__ import annotations

from .. import ir

# Operations whose derivative is zero almost everywhere: no gradient flows through them.
ZERO_DERIVATIVE_UNARY = frozenset({"floor", "ceil", "round", "not", "bit_not"})
ZERO_DERIVATIVE_BINARY = frozenset(ir.COMPARISONS) | {"floordiv", "bit_and", "bit_or", "bit_xor", "shl", "shr"}
GRADIENT_ATOMICS = frozenset({"add", "sub", "min", "max"})


def gradient_operands(s: ir.Stmt) -> list:
    """The operands of `s` a gradient of `s` flows back into."""
    if s.type is None or not s.type.is_float:
        return []
    if isinstance(s, ir.Unary):
        return [] if s.op in ZERO_DERIVATIVE_UNARY else [s.x]
    if isinstance(s, ir.Binary):
        return [] if s.op in ZERO_DERIVATIVE_BINARY else [s.a, s.b]
    if isinstance(s, ir.Cast):
        return [s.x] if s.x.type.is_float else []
    if isinstance(s, ir.Select):
        return [s.a, s.b]
    if isinstance(s, ir.SubgroupOp):
        return [s.value]
    return []


def _shared(s):
    """The SharedRef that load, store or atomic `s` accesses, else None."""
    ptr = getattr(s, "ptr", None)
    if isinstance(ptr, ir.GlobalPtr) and isinstance(ptr.target, ir.SharedRef):
        return ptr.target
    return None


def _updates_with_gradient(s) -> bool:
    return isinstance(s, ir.GlobalStore) or (isinstance(s, ir.AtomicRMW) and s.op in GRADIENT_ATOMICS)


class Activity:
    def __init__(self, kernel: ir.KernelIR, differentiable):
        """`differentiable(target)`: whether a FieldRef/NdarrayRef has a gradient buffer."""
        self.differentiable = differentiable
        stmts = list(ir.walk(kernel.body))
        self._varied_shared, self._useful_shared = set(), set()
        varied, varied_vars, varied_temps = self._forward(stmts)
        useful, useful_vars, useful_temps = self._backward(stmts)
        self.varied, self.useful = varied, useful
        self.values = varied & useful
        self.locals = varied_vars & useful_vars
        self.temps = varied_temps & useful_temps
        self.shared = self._varied_shared & self._useful_shared

    def __contains__(self, s) -> bool:
        return s in self.values or s in self.locals

    def _forward(self, stmts):
        varied, var_set, temp_set = set(), set(), set()
        changed = True
        while changed:
            changed = False
            for s in stmts:
                if s.type is not None and s.type.is_float and s not in varied and self._varies(s, varied, var_set, temp_set):
                    varied.add(s)
                    changed = True
                if isinstance(s, ir.LocalStore) and s.value in varied and s.var not in var_set:
                    var_set.add(s.var)
                    changed = True
                elif isinstance(s, (ir.TempStore, ir.TempAtomic)) and s.value in varied and s.slot not in temp_set:
                    temp_set.add(s.slot)
                    changed = True
                elif _updates_with_gradient(s) and s.value in varied and _shared(s) is not None \
                        and _shared(s) not in self._varied_shared:
                    self._varied_shared.add(_shared(s))
                    changed = True
        return varied, var_set, temp_set

    def _varies(self, s, varied, var_set, temp_set) -> bool:
        if isinstance(s, ir.GlobalLoad) and _shared(s) is not None:
            return _shared(s) in self._varied_shared
        if isinstance(s, ir.GlobalLoad):
            return self.differentiable(s.ptr.target)
        if isinstance(s, ir.LocalLoad):
            return s.var in var_set
        if isinstance(s, ir.TempLoad):
            return s.slot in temp_set
        return any(o in varied for o in gradient_operands(s))

    def _backward(self, stmts):
        useful, var_set, temp_set = set(), set(), set()
        changed = True
        while changed:
            changed = False
            for s in reversed(stmts):
                for o in self._useful_operands(s, useful, var_set, temp_set):
                    if o not in useful:
                        useful.add(o)
                        changed = True
                if s in useful:
                    if isinstance(s, ir.LocalLoad) and s.var not in var_set:
                        var_set.add(s.var)
                        changed = True
                    elif isinstance(s, ir.TempLoad) and s.slot not in temp_set:
                        temp_set.add(s.slot)
                        changed = True
                    elif isinstance(s, ir.GlobalLoad) and _shared(s) is not None \
                            and _shared(s) not in self._useful_shared:
                        self._useful_shared.add(_shared(s))
                        changed = True
        return useful, var_set, temp_set

    def _useful_operands(self, s, useful, var_set, temp_set) -> list:
        if _shared(s) is not None and not isinstance(s, ir.GlobalLoad):
            return [s.value] if _updates_with_gradient(s) and _shared(s) in self._useful_shared else []
        if isinstance(s, ir.GlobalStore):
            return [s.value] if self.differentiable(s.ptr.target) else []
        if isinstance(s, ir.AtomicRMW):
            return [s.value] if s.op in GRADIENT_ATOMICS and self.differentiable(s.ptr.target) else []
        if isinstance(s, ir.LocalStore):
            return [s.value] if s.var in var_set else []
        if isinstance(s, ir.TempStore):
            return [s.value] if s.slot in temp_set else []
        if isinstance(s, ir.TempAtomic):  # `s += v` on a kernel-scope local: v gets the local's adjoint
            return [s.value] if s.op in GRADIENT_ATOMICS and s.slot in temp_set else []
        return gradient_operands(s) if s in useful else []
