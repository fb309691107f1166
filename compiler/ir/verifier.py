"""Structural and type checks of the IR.

`verify` checks everything: block/parent links, that every statement sits in exactly one
place, scoping (an operand is defined earlier in the same block or in an enclosing one, a
loop index is used only inside its loop, a task body sees none of another task's values),
the type rules of every statement class, the shape of offloaded tasks, temporaries, and
that `break`/`continue` sit inside a loop. `check_types` applies only the type rules (the
pipeline's type-check pass). Tests run `verify` after every pass (QDC_VERIFY_IR=1).
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from . import stmts as ir
from .local_arrays import COMPONENT_ACCESSES, LocalArray


class IRVerifyError(AssertionError):
    """Malformed IR: always a compiler bug. `stmt` is the offending statement (its `loc` the
    user's line it came from)."""

    def __init__(self, message: str, stmt: ir.Stmt | None = None):
        where = f" (at {type(stmt).__name__} {stmt.loc})" if stmt is not None else ""
        super().__init__(message + where)
        self.stmt = stmt
        self.message = message


def verify(k: ir.KernelIR, offloaded: bool = False) -> None:
    """Raise IRVerifyError if `k` is malformed. `offloaded`: the top level must hold only
    tasks (it must anyway as soon as it holds one)."""
    _Verifier(k).run(offloaded)


def check_types(k: ir.KernelIR) -> None:
    """Raise IRVerifyError on the first statement that breaks its class's type rules (in program
    order: each block's list looped over, nested blocks by recursion, cheaper than `ir.walk`)."""
    check = _TypeRules(k).check

    def checked(stmts: list) -> None:
        for s in stmts:
            check(s)
            if s.BLOCKS:
                for b in s.blocks():
                    checked(b.stmts)

    checked(k.body.stmts)


# ---- structure and scoping ------------------------------------------------------------

class _Verifier:
    def __init__(self, k: ir.KernelIR):
        self.k = k
        self.types = _TypeRules(k)
        self.seen: set = set()

    def run(self, offloaded: bool):
        body = self.k.body
        if body.parent is not None:
            raise IRVerifyError("the kernel body must not have a parent statement")
        has_tasks = any(isinstance(s, ir.Task) for s in body.stmts)
        if offloaded or has_tasks:
            for s in body.stmts:
                if not isinstance(s, ir.Task):
                    raise IRVerifyError("the top level of an offloaded kernel must hold only tasks", s)
        if len(self.k.temp_types) != self.k.num_temps:
            raise IRVerifyError(f"kernel declares {self.k.num_temps} temporaries but types {len(self.k.temp_types)}")
        self.block(body, set(), loop_depth=0)

    def block(self, b: ir.Block, visible: set, loop_depth: int):
        visible = set(visible)
        for s in b.stmts:
            self.structure(s, b)
            for o in s.operands():
                if o not in visible:
                    what = "a loop index outside its loop" if isinstance(o, ir.LoopIndex) else \
                        f"{type(o).__name__} that is not defined before this use (or not in scope)"
                    raise IRVerifyError(f"operand is {what}", s)
            self.types.check(s)
            if isinstance(s, (ir.Break, ir.Continue)) and loop_depth == 0:
                raise IRVerifyError(f"{type(s).__name__.lower()} outside a loop", s)
            if isinstance(s, ir.Task):
                if b is not self.k.body:
                    raise IRVerifyError("a task must sit at the top level of the kernel", s)
                self.task(s)
            elif isinstance(s, ir.If):
                self.block(s.then_block, visible, loop_depth)
                self.block(s.else_block, visible, loop_depth)
            elif isinstance(s, ir.RangeFor):
                if s.index.loop is not s:
                    raise IRVerifyError("the loop's index refers to another loop", s)
                self.block(s.body, visible | {s.index}, loop_depth + 1)
            elif isinstance(s, ir.While):
                self.block(s.body, visible, loop_depth + 1)
            else:
                for child in s.blocks():  # statement classes added later: scoped like an If
                    self.block(child, visible, loop_depth)
            visible.add(s)

    def structure(self, s: ir.Stmt, b: ir.Block):
        if s in self.seen:
            raise IRVerifyError("statement appears twice in the IR", s)
        self.seen.add(s)
        if s.block is not b:
            raise IRVerifyError("statement's block link is wrong", s)
        if isinstance(s, ir.LoopIndex):
            raise IRVerifyError("a loop index is defined by its loop and cannot be a statement of a block", s)
        for name in s.BLOCKS:
            if getattr(s, name).parent is not s:
                raise IRVerifyError(f"block '{name}' has the wrong parent", s)

    def task(self, t: ir.Task):
        if t.kind not in ("serial", "range_for"):
            raise IRVerifyError(f"unknown task kind '{t.kind}'", t)
        self.block(t.prologue, set(), 0)
        if t.kind == "serial":
            if t.index is not None or t.begin is not None or t.end is not None:
                raise IRVerifyError("a serial task has no index or range", t)
            if t.prologue.stmts or t.chunk_init.stmts or t.chunk_final.stmts:
                raise IRVerifyError("a serial task has only a body", t)
            self.block(t.body, set(), 0)
            return
        if t.index is None or t.index.loop is not t:
            raise IRVerifyError("a range-for task needs its own loop index", t)
        for bound in (t.begin, t.end):
            if bound is None or bound.block is not t.prologue:
                raise IRVerifyError("task bounds must be computed in its prologue", t)
            if bound.type is not t.index.type:
                raise IRVerifyError(f"task bound has type {bound.type}, its index {t.index.type}", t)
        if not t.index.type.is_integral or t.index.type is T.u1:
            raise IRVerifyError(f"task index must be an integer, got {t.index.type}", t)
        self.block(t.chunk_init, set(), 0)
        chunk_values = set(t.chunk_init.stmts)
        self.axes(t, chunk_values)
        self.block(t.body, chunk_values | {t.index, *t.axis_index}, 1)  # `continue` ends an iteration
        self.block(t.chunk_final, chunk_values, 0)

    @staticmethod
    def axes(t: ir.Task, chunk_values: set):
        if t.axis_index and len(t.axis_index) != len(t.axes) + 1:
            raise IRVerifyError(f"a task with {len(t.axes)} row extents needs {len(t.axes) + 1} coordinates", t)
        if t.axes and not t.axis_index:
            raise IRVerifyError("a task with row extents needs its coordinates", t)
        for a in t.axes:
            if a not in chunk_values:
                raise IRVerifyError("row extents must be computed in the task's chunk_init", t)
            if a.type is not t.index.type:
                raise IRVerifyError(f"row extent has type {a.type}, the index {t.index.type}", t)
        for c in t.axis_index:
            if c.loop is not t or c.type is not t.index.type:
                raise IRVerifyError("a row coordinate must belong to its task and have the index's type", t)


# ---- type rules -------------------------------------------------------------------------

_FLOAT_ONLY_UNARY = {"sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "sqrt",
                     "rsqrt", "floor", "ceil", "round"}
_INT_ONLY_BINARY = {"bit_and", "bit_or", "bit_xor", "shl", "shr"}
_NOT_BOOL_BINARY = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "shl", "shr"}
_FLOAT_ONLY_BINARY = {"truediv", "atan2"}
_INT_ONLY_ATOMIC = {"and", "or", "xor"}


# Operand class -> whether it is a statement other than a local or a global address (which only
# some statements may use), looked up once per class.
_PLAIN_VALUE: dict = {}


class _TypeRules:
    """One `t_<Class>` method per statement class; classes without one only need their
    operands to be values."""

    def __init__(self, k: ir.KernelIR):
        self.k = k
        self.rules: dict = {}  # statement class -> its t_<Class> method or None, looked up once

    def check(self, s: ir.Stmt):
        for o in s.operands():
            plain = _PLAIN_VALUE.get(o.__class__)
            if plain is None:
                plain = _PLAIN_VALUE[o.__class__] = issubclass(o.__class__, ir.Stmt) and \
                    not issubclass(o.__class__, (ir.Alloca, ir.GlobalPtr, LocalArray))
            if plain and o.type is not None:  # what most operands are: the checks below pass
                continue
            if not isinstance(o, ir.Stmt):
                raise IRVerifyError(f"operand {o!r} is not a statement", s)
            if o.type is None:
                raise IRVerifyError(f"operand {type(o).__name__} produces no value", s)
            if isinstance(o, ir.Alloca) and o is not getattr(s, "var", None) and not isinstance(s, COMPONENT_ACCESSES):
                raise IRVerifyError("a local variable is used as a value without a load", s)
            if isinstance(o, LocalArray) and o is not getattr(s, "array", None):
                raise IRVerifyError("a local array is used as a value without a load", s)
            if isinstance(o, ir.GlobalPtr) and o is not getattr(s, "ptr", None):
                raise IRVerifyError("a global address is used as a value", s)
        cls = type(s)
        method = self.rules.get(cls, self)
        if method is self:
            method = self.rules[cls] = getattr(self, "t_" + cls.__name__, None)
        if method is not None:
            method(s)

    # Each rule tests first and formats its message only when it fails: the rules run for every
    # statement of every kernel (the type-check pass), where formatting the messages of rules that
    # hold was most of their time.
    def fail(self, s, msg):
        raise IRVerifyError(msg, s)

    def no_value(self, s):
        if s.type is not None:
            self.fail(s, f"{type(s).__name__} must not produce a value")

    def loaded(self, s, held, what: str):
        """A load from a `what` holding `held` values has their type."""
        if s.type is not held:
            self.fail(s, f"load of a {held} {what} has type {s.type}")

    def stored(self, s, held, what: str):
        """A store into a `what` holding `held` values gives no value and stores one of their type."""
        self.no_value(s)
        if s.value.type is not held:
            self.fail(s, f"storing {s.value.type} into a {held} {what}")

    # -- values
    def t_Const(self, s):
        t, v = s.type, s.value
        if t is T.u1:
            if not isinstance(v, bool):
                self.fail(s, f"u1 constant must be a bool, got {v!r}")
        elif t.is_float:
            if not isinstance(v, float):
                self.fail(s, f"{t} constant must be a float, got {v!r}")
        else:
            if not (isinstance(v, int) and not isinstance(v, bool)):
                self.fail(s, f"{t} constant must be an int, got {v!r}")
            lo, hi = (-(1 << (t.bits - 1)), 1 << (t.bits - 1)) if t.kind == "int" else (0, 1 << t.bits)
            if not (lo <= v < hi):
                self.fail(s, f"constant {v} does not fit in {t}")

    def t_ArgLoad(self, s):
        p = self.param(s, s.arg_index)
        if p.kind != "scalar":
            self.fail(s, f"argument {s.arg_index} is not a scalar")
        if s.type is not p.dtype:
            self.fail(s, f"argument load has type {s.type}, parameter '{p.name}' is {p.dtype}")

    def t_NdarrayShape(self, s):
        p = self.param(s, s.arg_index)
        if p.kind != "ndarray":
            self.fail(s, f"argument {s.arg_index} is not an ndarray")
        if not (0 <= s.dim < (p.ndim or 0)):
            self.fail(s, f"shape dimension {s.dim} out of range for '{p.name}'")
        if s.type not in (T.i32, T.i64):
            self.fail(s, "ndarray shapes are i32 or i64")

    def t_Unary(self, s):
        t, xt = s.type, s.x.type
        if s.op == "not":
            if not (xt is T.u1 and t is T.u1):
                self.fail(s, "not needs a u1 operand and gives u1")
            return
        if t is not xt:
            self.fail(s, f"{s.op} result type {t} differs from operand {xt}")
        if s.op in _FLOAT_ONLY_UNARY:
            if not t.is_float:
                self.fail(s, f"{s.op} needs a float operand, got {t}")
        elif s.op == "bit_not":
            if not t.is_integral:
                self.fail(s, f"bit_not needs an integer operand, got {t}")
        else:  # neg, abs
            if t is T.u1:
                self.fail(s, f"{s.op} of a u1")

    def t_Binary(self, s):
        at = s.a.type
        if at is not s.b.type:
            self.fail(s, f"{s.op} operands differ in type: {at} vs {s.b.type}")
        want = T.u1 if s.op in ir.COMPARISONS else at
        if s.type is not want:
            self.fail(s, f"{s.op} result type {s.type}, expected {want}")
        if s.op in _INT_ONLY_BINARY:
            if not at.is_integral:
                self.fail(s, f"{s.op} needs integer operands, got {at}")
        if s.op in _FLOAT_ONLY_BINARY:
            if not at.is_float:
                self.fail(s, f"{s.op} needs float operands, got {at}")
        if s.op in _NOT_BOOL_BINARY:
            if at is T.u1:
                self.fail(s, f"{s.op} of u1 operands")

    def t_Cast(self, s):
        if not isinstance(s.type, T.DataType):
            self.fail(s, "cast needs a target type")

    def t_Select(self, s):
        if s.cond.type is not T.u1:
            self.fail(s, f"select condition has type {s.cond.type}, expected u1")
        if not (s.a.type is s.b.type and s.type is s.a.type):
            self.fail(s, "select branches and result must share a type")

    def t_StopGrad(self, s):
        if s.type is not s.x.type:
            self.fail(s, f"stop_grad of a {s.x.type} has type {s.type}")

    def t_Random(self, s):
        if not (isinstance(s.type, T.DataType) and s.type is not T.u1):
            self.fail(s, f"random of type {s.type}")

    def t_RandomState(self, s):
        if s.type is not T.u32:
            self.fail(s, f"random state word of type {s.type}, expected u32")
        if not (0 <= s.word < ir.RANDOM_STATE_WORDS):
            self.fail(s, f"random state word {s.word} out of range")

    def t_DebugMessage(self, s):
        record = self.k.messages[s.message] if 0 <= s.message < len(self.k.messages) else None
        if record is None:
            self.fail(s, f"message {s.message} is not in the kernel's message table")
        if [v.type.name for v in s.values] != record[3]:
            self.fail(s, "message values differ from its record's types")

    # -- locals
    def t_Alloca(self, s):
        if not isinstance(s.type, T.DataType):
            self.fail(s, "a local needs a type")

    def local_var(self, s, var):
        if not isinstance(var, ir.Alloca):
            self.fail(s, f"{type(s).__name__} needs a local variable, got {type(var).__name__}")

    def t_LocalLoad(self, s):
        self.local_var(s, s.var)
        self.loaded(s, s.var.type, "local")

    def t_LocalStore(self, s):
        self.local_var(s, s.var)
        self.stored(s, s.var.type, "local")

    def t_LocalAccumulate(self, s):
        self.t_LocalStore(s)
        if s.op not in ir.LocalAccumulate.OPS:
            self.fail(s, f"unknown accumulation '{s.op}'")
        if s.op in _INT_ONLY_ATOMIC:
            if not s.var.type.is_integral:
                self.fail(s, f"accumulation {s.op} needs an integer")

    def component_access(self, s):
        if not (s.components and all(isinstance(v, ir.Alloca) for v in s.components)):
            self.fail(s, f"{type(s).__name__} needs the locals of a vector's components")
        if not all(v.type is s.components[0].type for v in s.components):
            self.fail(s, "components of different types")
        if not (s.index.type.is_integral and s.index.type is not T.u1):
            self.fail(s, f"a component index must be an integer, got {s.index.type}")

    def t_ComponentLoad(self, s):
        self.component_access(s)
        self.loaded(s, s.components[0].type, "component")

    def t_ComponentStore(self, s):
        self.component_access(s)
        self.stored(s, s.components[0].type, "component")

    def t_LocalArray(self, s):
        if not isinstance(s.type, T.DataType):
            self.fail(s, "a local array needs a type")
        if not (isinstance(s.length, int) and s.length >= 1):
            self.fail(s, f"a local array of {s.length!r} elements")

    def array_access(self, s):
        if not isinstance(s.array, LocalArray):
            self.fail(s, f"{type(s).__name__} needs a local array, got {type(s.array).__name__}")
        if s.index.type is not T.i32:
            self.fail(s, f"a local array's index is i32, got {s.index.type}")
        if isinstance(s.index, ir.Const):
            if not (0 <= s.index.value < s.array.length):
                self.fail(s, f"index {s.index.value} outside a local array of {s.array.length} elements")

    def t_ArrayLoad(self, s):
        self.array_access(s)
        self.loaded(s, s.array.type, "array")

    def t_ArrayStore(self, s):
        self.array_access(s)
        self.stored(s, s.array.type, "array")

    def t_LocalAtomic(self, s):
        self.local_var(s, s.var)
        self.atomic_types(s, s.var.type, "local")

    def atomic_types(self, s, target_type, what: str):
        if s.op not in ir.ATOMIC_OPS:
            self.fail(s, f"unknown atomic '{s.op}'")
        if not (s.value.type is target_type and s.type is target_type):
            self.fail(s, f"atomic_{s.op} of {s.value.type} on a {target_type} {what}")
        if s.op in _INT_ONLY_ATOMIC:
            if not target_type.is_integral:
                self.fail(s, f"atomic_{s.op} needs an integer {what}")

    def t_TempAtomic(self, s):
        self.temp_slot(s, s.type)
        self.atomic_types(s, s.type, "temporary")

    def t_TempLoad(self, s):
        self.temp_slot(s, s.type)

    def t_TempStore(self, s):
        self.no_value(s)
        self.temp_slot(s, s.value.type)

    def temp_slot(self, s, t):
        if not (0 <= s.slot < self.k.num_temps):
            self.fail(s, f"temporary t{s.slot} does not exist")
        declared = self.k.temp_types[s.slot]
        if declared is not t:
            self.fail(s, f"temporary t{s.slot} is {declared}, used as {t}")

    # -- globals
    def t_GlobalPtr(self, s):
        tgt = s.target
        if isinstance(tgt, ir.FieldRef):
            if not (0 <= tgt.slot < len(self.k.fields) and self.k.fields[tgt.slot] is tgt):
                self.fail(s, f"field {tgt!r} is not in the kernel's field table")
            rank = len(tgt.shape)
        elif isinstance(tgt, ir.SharedRef):
            rank = len(tgt.shape)
        else:
            p = self.param(s, tgt.arg_index)
            if not (p.kind == "ndarray" and p.dtype is tgt.dtype and p.ndim == tgt.ndim):
                self.fail(s, f"ndarray reference {tgt!r} does not match parameter '{p.name}'")
            if tgt.is_grad and not p.needs_grad:
                self.fail(s, f"'{p.name}' has no gradient buffer")
            rank = tgt.ndim
        if len(s.indices) != rank:
            self.fail(s, f"{tgt!r} has rank {rank}, indexed with {len(s.indices)}")
        if s.type is not tgt.dtype:
            self.fail(s, f"address type {s.type} differs from {tgt!r}'s {tgt.dtype}")
        for i in s.indices:
            if not i.type.is_integral:
                self.fail(s, f"index of type {i.type} is not an integer")

    def global_ptr(self, s, ptr):
        if not isinstance(ptr, ir.GlobalPtr):
            self.fail(s, f"{type(s).__name__} needs a global address")

    def t_GlobalLoad(self, s):
        self.global_ptr(s, s.ptr)
        self.loaded(s, s.ptr.type, "element")

    def t_GlobalStore(self, s):
        self.global_ptr(s, s.ptr)
        self.stored(s, s.ptr.type, "element")

    def t_AtomicRMW(self, s):
        self.global_ptr(s, s.ptr)
        self.atomic_types(s, s.ptr.type, "element")

    # -- control flow
    def t_If(self, s):
        self.no_value(s)
        if s.cond.type is not T.u1:
            self.fail(s, f"if condition has type {s.cond.type}, expected u1")

    def t_RangeFor(self, s):
        self.no_value(s)
        it = s.index.type
        if not (it.is_integral and it is not T.u1):
            self.fail(s, f"loop index must be an integer, got {it}")
        if not (s.begin.type is it and s.end.type is it):
            self.fail(s, "range bounds must have the loop index's type")

    def t_While(self, s):
        self.no_value(s)

    def t_Break(self, s):
        self.no_value(s)

    t_Continue = t_Break

    def t_Task(self, s):
        self.no_value(s)

    def param(self, s, i):
        if not (0 <= i < len(self.k.params)):
            self.fail(s, f"argument {i} does not exist")
        return self.k.params[i]
