"""Forward-mode autodiff: the Jacobian-vector-product ("forward_ad") variant of a kernel.

Runs on the kernel body before offloading (pass "forward_mode" of passes/pipeline.py), so
that the tangent of a kernel-scope local becomes a kernel temporary, and its `+=` in a
parallel loop a reduction, exactly as the local itself does. Every float value that depends
on a global with a dual gets a tangent computed right after it, in the same block:

- a load of a global with a dual also loads its `.dual` element;
- a store to such a global also stores the tangent of the value (0 when it has none) into the
  dual; `+=`/`-=` add the tangent atomically;
- a local carrying a tangent gets a tangent local beside it, stored and loaded with it, so
  loops (static, dynamic, `while`) and branches carry tangents with no adstack;
- block-level code (qd.simt): a subgroup exchange exchanges the tangent alike, right after it
  (the same lanes run both), and a SharedArray that a value with a tangent is stored into gets
  a tangent SharedArray, stored and loaded beside it.

The derivative of each operation comes from the reverse-mode rules (rules.py), which are
linear in the adjoint they are given: applied to one operand's tangent, with only that
operand's contribution kept, a rule yields that operand's share of the result's tangent.

In the compiled kernel a dual is addressed like a gradient buffer (`is_grad` references): a
field's dual is one more entry of the field table (named `<field>.dual`) and an ndarray's
dual takes the gradient word of its parameter; `Param.needs_grad` of the forward_ad variant
says whether the argument has a dual. The runtime binds the duals (runtime/forward_mode.py).
"""
from __future__ import annotations

from .. import ir
from ..passes.local_arrays import expand_component_accesses
from . import rules
from .activity import gradient_operands
from .checks import error, refuse_graph_loops
from .companions import CompanionBuffers

DUAL_SUFFIX = ".dual"
_LINEAR_ATOMICS = ("add", "sub")


class ForwardModePass:
    """The pass: `field_objects` are the runtime Fields of the kernel's field table (the front
    end's list); the duals the kernel touches are appended to both."""

    def __init__(self, field_objects: list):
        self.field_objects = field_objects

    def __call__(self, k: ir.KernelIR) -> bool:
        _reject_gradient_buffers(k)
        refuse_graph_loops(k, "forward-mode derivatives")
        expand_component_accesses(k)  # tangents of scalars only
        duals = _DualBuffers(k, self.field_objects)
        varied, varied_vars = _varied(k, duals)
        _Tangents(duals, varied, varied_vars, ir.users_count(k.body)).block(k.body)
        return True


class _DualBuffers(CompanionBuffers):
    """Which globals have a dual (float ones only), and the references that address it."""

    def __init__(self, k: ir.KernelIR, field_objects: list):
        super().__init__(k, field_objects, "dual")
        self.shared: dict = {}  # SharedRef with a tangent -> the tangent SharedRef (`varied` adds them)
        self.next_shared = 1 + max((s.target.uid for s in ir.walk(k.body)
                                    if isinstance(s, ir.GlobalPtr) and isinstance(s.target, ir.SharedRef)), default=-1)

    def has(self, target) -> bool:
        if isinstance(target, ir.SharedRef):
            return target in self.shared
        return target.dtype.is_float and super().has(target)

    def of(self, target):
        if isinstance(target, ir.SharedRef):
            return self.shared[target]
        return super().of(target)

    def add_shared(self, ref: ir.SharedRef) -> None:
        self.shared[ref] = ir.SharedRef(self.next_shared, f"{ref.name}{DUAL_SUFFIX}", ref.dtype, ref.shape)
        self.next_shared += 1


def _reject_gradient_buffers(k: ir.KernelIR) -> None:
    """An ndarray's gradient word carries its dual in this variant: a kernel that reads `.grad`
    of an ndarray has no forward-mode variant."""
    for s in ir.walk(k.body):
        if isinstance(s, ir.GlobalPtr) and isinstance(s.target, ir.NdarrayRef) and s.target.is_grad:
            raise error(s.loc, f"kernel '{k.name}' uses the gradient of ndarray '{s.target.name}', so it cannot "
                               f"run in forward mode (qd.ad.FwdMode)")


def _varied(k: ir.KernelIR, duals: _DualBuffers) -> tuple[set, set]:
    """Float values, and locals, that depend on a global with a dual: a fixed point, since
    locals carry values around loops."""
    stmts = list(ir.walk(k.body))
    varied, varied_vars = set(), set()
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if s.type is not None and s.type.is_float and s not in varied and _varies(s, duals, varied, varied_vars):
                varied.add(s)
                changed = True
            if isinstance(s, (ir.LocalStore, ir.LocalAtomic)) and s.value in varied and s.var not in varied_vars:
                varied_vars.add(s.var)
                changed = True
            if isinstance(s, (ir.GlobalStore, ir.AtomicRMW)) and isinstance(s.ptr.target, ir.SharedRef) \
                    and s.value in varied and not duals.has(s.ptr.target):
                duals.add_shared(s.ptr.target)
                changed = True
    return varied, varied_vars


def _varies(s: ir.Stmt, duals: _DualBuffers, varied: set, varied_vars: set) -> bool:
    if isinstance(s, ir.GlobalLoad):
        return duals.has(s.ptr.target)
    if isinstance(s, (ir.LocalLoad, ir.LocalAtomic)):
        return s.var in varied_vars
    return any(o in varied for o in gradient_operands(s))


class _Tangents:
    """Rewrites blocks in place, inserting each statement's tangent work right after it. Also
    the builder the rules call (`op`, `const`, `select`, `cast`, `primal`, `is_active`, `acc`),
    focused on one operand at a time."""

    def __init__(self, duals: _DualBuffers, varied: set, varied_vars: set, uses: dict):
        self.duals, self.varied, self.varied_vars, self.uses = duals, varied, varied_vars, uses
        self.tangent: dict = {}      # value -> its tangent
        self.tangent_var: dict = {}  # local -> the local holding its tangent
        self.cur: ir.Block | None = None  # the block being rebuilt
        self.loc = None
        self.focus = None            # the operand whose contribution a rule is asked for
        self.contribution = None

    # ---- the rewrite ------------------------------------------------------------------------

    def block(self, block: ir.Block) -> None:
        old, saved = block.stmts, self.cur
        block.stmts = []
        for s in old:
            block.append(s)
            for b in s.blocks():
                self.block(b)
            self.cur, self.loc = block, s.loc
            self.visit(s)
        self.cur = saved

    def visit(self, s: ir.Stmt) -> None:
        method = getattr(self, "visit_" + type(s).__name__, None)
        if method is not None:
            method(s)
        elif s in self.varied:
            self.pure(s)

    def visit_Alloca(self, s: ir.Alloca) -> None:
        if s in self.varied_vars:
            self.tangent_var[s] = self.emit(ir.Alloca(s.type, s.var_name + DUAL_SUFFIX, s.loc))

    def visit_LocalLoad(self, s: ir.LocalLoad) -> None:
        if s.var in self.tangent_var:
            self.tangent[s] = self.emit(ir.LocalLoad(self.tangent_var[s.var], s.loc))

    def visit_LocalStore(self, s: ir.LocalStore) -> None:
        if s.var in self.tangent_var:
            self.emit(ir.LocalStore(self.tangent_var[s.var], self.tangent_or_zero(s.value), s.loc))

    def visit_LocalAtomic(self, s: ir.LocalAtomic) -> None:
        var = self.tangent_var.get(s.var)
        if var is None:
            return
        if s.op not in _LINEAR_ATOMICS:
            raise error(s.loc, f"an atomic {s.op} on a value with a tangent has no forward-mode derivative "
                               f"(qd.ad.FwdMode supports += and -= there)")
        if self.uses.get(s):
            raise error(s.loc, "forward mode cannot use the old value an atomic update returns")
        if s.value in self.tangent:
            self.emit(ir.LocalAtomic(s.op, var, self.tangent[s.value], s.loc))

    def visit_GlobalLoad(self, s: ir.GlobalLoad) -> None:
        if s in self.varied:
            self.tangent[s] = self.emit(ir.GlobalLoad(self.dual_ptr(s.ptr), s.loc))

    def visit_GlobalStore(self, s: ir.GlobalStore) -> None:
        if self.duals.has(s.ptr.target):
            self.emit(ir.GlobalStore(self.dual_ptr(s.ptr), self.tangent_or_zero(s.value), s.loc))

    def visit_AtomicRMW(self, s: ir.AtomicRMW) -> None:
        if not self.duals.has(s.ptr.target):
            return
        if s.op not in _LINEAR_ATOMICS:
            raise error(s.loc, f"an atomic {s.op} on '{s.ptr.target.name}', which has a dual, has no forward-mode "
                               f"derivative (qd.ad.FwdMode supports += and -= there)")
        if self.uses.get(s):
            raise error(s.loc, "forward mode cannot use the old value an atomic update returns")
        if s.value in self.tangent:
            self.emit(ir.AtomicRMW(s.op, self.dual_ptr(s.ptr), self.tangent[s.value], s.loc))

    def visit_SubgroupOp(self, s: ir.SubgroupOp) -> None:
        if s in self.varied:  # linear: the tangent travels as the value did
            self.tangent[s] = self.emit(ir.SubgroupOp(s.op, self.tangent[s.value], s.lane, s.type, s.loc))

    def visit_Cast(self, s: ir.Cast) -> None:
        if s in self.varied:  # a float-to-float conversion converts the tangent too
            t = self.tangent[s.x]
            self.tangent[s] = t if t.type is s.type else self.emit(ir.Cast(t, s.type, s.loc))

    def pure(self, s: ir.Stmt) -> None:
        """Unary, Binary, Select: the sum of each varied operand's contribution."""
        rule = rules.unary if isinstance(s, ir.Unary) else rules.binary if isinstance(s, ir.Binary) else rules.select
        total = None
        for operand in dict.fromkeys(gradient_operands(s)):  # `x * x`: each distinct operand once
            if operand not in self.tangent:
                continue
            self.focus, self.contribution = operand, None
            rule(self, s, self.tangent[operand])
            if self.contribution is not None:
                total = self.contribution if total is None else self.op("add", total, self.contribution)
        self.focus = None
        if total is not None:
            self.tangent[s] = total

    # ---- helpers ----------------------------------------------------------------------------

    def emit(self, s: ir.Stmt) -> ir.Stmt:
        if s.loc is None:
            s.loc = self.loc
        return self.cur.append(s)

    def dual_ptr(self, ptr: ir.GlobalPtr) -> ir.GlobalPtr:
        return self.emit(ir.GlobalPtr(self.duals.of(ptr.target), ptr.indices, ptr.loc))

    def tangent_or_zero(self, value: ir.Stmt) -> ir.Stmt:
        t = self.tangent.get(value)
        return t if t is not None else self.const(0.0, value.type)

    # ---- what the rules call ------------------------------------------------------------------

    def is_active(self, x) -> bool:
        return x is self.focus

    def acc(self, x, value) -> None:
        if x is self.focus:
            self.contribution = value if self.contribution is None else self.op("add", self.contribution, value)

    def primal(self, x):
        return x

    def op(self, name: str, *args):
        if len(args) == 1:
            return self.emit(ir.Unary(name, args[0], args[0].type))
        a, b = args
        return self.emit(ir.Binary(name, a, b, rules.result_type(name, a)))

    def const(self, value, dtype):
        return self.emit(ir.Const(float(value) if dtype.is_float else int(value), dtype))

    def select(self, cond, a, b):
        return self.emit(ir.Select(cond, a, b))

    def cast(self, value, dtype):
        return self.emit(ir.Cast(value, dtype))
