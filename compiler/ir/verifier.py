"""Structural and type checks of the IR; tests run it between every pass."""
from __future__ import annotations

from qdc.runtime import types as T

from . import stmts as ir


class IRVerifyError(AssertionError):
    pass


def verify(k: ir.KernelIR, offloaded: bool = False) -> None:
    """Raise IRVerifyError if the IR is malformed: an operand used before (or outside the
    scope of) its definition, a block whose parent link is wrong, a type mismatch, a
    break/continue outside a loop, or (`offloaded`) a non-task at the top level."""
    _Verifier(k).run(offloaded)


class _Verifier:
    def __init__(self, k: ir.KernelIR):
        self.k = k

    def fail(self, s, msg):
        raise IRVerifyError(f"{msg} (at {type(s).__name__} {s.loc})")

    def run(self, offloaded: bool):
        if offloaded:
            for s in self.k.body:
                if not isinstance(s, ir.Task):
                    self.fail(s, "top level of an offloaded kernel must hold only tasks")
        self.block(self.k.body, set(), loop_depth=0)

    def block(self, b: ir.Block, visible: set, loop_depth: int):
        visible = set(visible)
        for s in b.stmts:
            if s.block is not b:
                self.fail(s, "statement's block link is wrong")
            for o in s.operands():
                if o not in visible:
                    self.fail(s, f"operand {type(o).__name__} is not defined before its use")
            self.check_types(s)
            if isinstance(s, (ir.Break, ir.Continue)) and loop_depth == 0:
                self.fail(s, "break/continue outside a loop")
            for bname in s.BLOCKS:
                child = getattr(s, bname)
                if child.parent is not s:
                    self.fail(s, f"block {bname} has the wrong parent")
            if isinstance(s, ir.If):
                self.block(s.then_block, visible, loop_depth)
                self.block(s.else_block, visible, loop_depth)
            elif isinstance(s, ir.RangeFor):
                self.block(s.body, visible | {s.index}, loop_depth + 1)
            elif isinstance(s, ir.While):
                self.block(s.body, visible, loop_depth + 1)
            elif isinstance(s, ir.Task):
                self.task(s, visible)
            visible.add(s)

    def task(self, t: ir.Task, visible: set):
        pro = set(visible)
        self.block(t.prologue, set(), 0)
        pro = set(t.prologue.stmts)
        if t.kind == "range_for":
            for b in (t.begin, t.end):
                if b not in pro:
                    self.fail(t, "task bounds must be computed in its prologue")
            self.block(t.body, {t.index}, 0)
        else:
            self.block(t.body, set(), 0)

    def check_types(self, s):
        if isinstance(s, ir.Binary):
            if s.a.type is not s.b.type:
                self.fail(s, f"{s.op} operands differ in type: {s.a.type} vs {s.b.type}")
            want = T.u1 if s.op in ir.COMPARISONS else s.a.type
            if s.type is not want:
                self.fail(s, f"{s.op} result type {s.type}, expected {want}")
        elif isinstance(s, ir.Unary):
            if s.op != "not" and s.type is not s.x.type:
                self.fail(s, f"{s.op} result type {s.type} differs from operand {s.x.type}")
        elif isinstance(s, ir.Select):
            if s.cond.type is not T.u1 or s.a.type is not s.b.type:
                self.fail(s, "select needs a u1 condition and equal branch types")
        elif isinstance(s, ir.If):
            if s.cond.type is not T.u1:
                self.fail(s, f"if condition has type {s.cond.type}, expected u1")
        elif isinstance(s, ir.LocalStore):
            if not isinstance(s.var, ir.Alloca) or s.value.type is not s.var.type:
                self.fail(s, "local store type mismatch")
        elif isinstance(s, (ir.GlobalStore, ir.AtomicRMW)):
            if s.value.type is not s.ptr.type:
                self.fail(s, "global store/atomic type mismatch")
        elif isinstance(s, ir.GlobalPtr):
            for i in s.indices:
                if not i.type.is_integral:
                    self.fail(s, "global index is not an integer")
        elif isinstance(s, ir.RangeFor):
            if s.begin.type is not s.index.type or s.end.type is not s.index.type:
                self.fail(s, "range bounds must have the loop index's type")
