"""The adjoint of one offloaded task: per iteration of its index, a forward sweep then a
reverse sweep.

Forward sweep: the task body again, minus its side effects on globals and temporaries (the
forward kernel already made them; `y[None] += v` must not count twice). Locals whose values
the reverse sweep needs but could not otherwise recover get adstacks: each store also pushes
the value (the forward sweep itself keeps reading the local, a register); the reverse sweep
reads them back from the stack.

Reverse sweep: the body's statements in reverse order, each emitting its adjoint. Adjoints of
values live in zero-initialised locals (registers after mem2reg); a stacked local's adjoint
lives in its stack entries. A reverse `for` runs the same range backwards, and so do the
iterations of a serialized task; a reverse `if` takes the same branch. A global store takes
the adjoint of the element it wrote and zeroes it (the overwritten value's adjoint then
collects only from the reads before the store), so overwriting differentiates exactly.

Primal values the adjoints need (the `cos(a)` of `sin(a)`, an index, a condition, a loop
bound) are recomputed where they are needed: at the adjoint of a statement, every stack is
in the state it had right after that statement in the forward sweep, so a pure chain of
constants, arguments, loop indices, global loads and stack tops recomputes to the same
value, provided no push to a stack it reads happened in between. Where that fails, the value
is snapshotted: pushed on a stack of its own right after its definition, read from it in
reverse, popped at the definition's reverse. Values at the top level of the task body need
neither: the forward sweep's own results are still in scope there.

Block-level code (qd.simt) differentiates in place (simt_adjoints.py): the forward sweep keeps
its barriers, exchanges and shared-array stores (a SharedArray lives only as long as the
launch, so the sweep rebuilds it), the reverse sweep mirrors the barriers and runs the reverse
exchanges; values read from shared arrays are snapshotted where the reverse sweep needs them.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir
from ..ir.adstack import AdStackAccAdjoint, AdStackAlloca, AdStackLoadTop, AdStackLoadTopAdj, AdStackPop, AdStackPush, TempAtomicAdd
from . import rules, simt_adjoints
from .checks import error
from .positions import Positions

_RECOMPUTABLE = (ir.Const, ir.ArgLoad, ir.NdarrayShape, ir.TempLoad, ir.GlobalPtr, ir.Unary, ir.Binary,
                 ir.Cast, ir.Select, ir.StopGrad, ir.SimtIndex)
_DROPPED_IN_FORWARD = (ir.GlobalStore, ir.AtomicRMW, ir.TempStore, ir.TempAtomic)


class NeedStack(Exception):
    """The reverse sweep needs a value of local `var` that a plain local cannot give back."""

    def __init__(self, var: ir.Alloca):
        super().__init__(var.var_name)
        self.var = var


class TaskAdjoint:
    """Builds the adjoint task of `task`, with the locals in `stacked` kept on adstacks.
    Raises NeedStack when another local must be stacked (the caller retries with it)."""

    def __init__(self, kctx, task: ir.Task, stacked: set):
        self.k, self.task, self.stacked = kctx, task, stacked
        self.positions = Positions(task.body)
        self.writes: dict = {}  # local -> its Alloca and stores (every point that sets it)
        self.stored_values: dict = {}  # value -> the stores that store it
        for s in ir.walk(task.body):
            if isinstance(s, ir.Alloca):
                self.writes.setdefault(s, []).append(s)
            elif isinstance(s, ir.LocalStore):
                self.writes.setdefault(s.var, []).append(s)
                self.stored_values.setdefault(s.value, []).append(s)
        self.stacks: list = []       # AdStackAlloca of this task, with what each holds
        self.stack_of: dict = {}     # stacked local -> its AdStackAlloca
        self.zero_pushed: set = set()  # stacked locals whose initial zero has an entry
        self.snapshot: dict = {}     # forward value -> AdStackAlloca holding its snapshots
        self.fmap: dict = {}         # statement of the task -> its forward-sweep copy
        self.adj: dict = {}          # value or local -> Alloca holding its adjoint
        self.known_zero: set = set()  # adjoint locals certainly still 0 at the current point
        self.rev_block_of: dict = {}  # block of the task -> the block of its reverse
        self.front: dict = {}        # reverse block -> where its adjoint locals go
        self.rev_index: dict = {}    # LoopIndex -> its value in the reverse loop
        self.memo: list = []         # per open reverse block: value -> recomputed primal
        self.cur: ir.Block | None = None
        self.at: ir.Stmt | None = None  # the statement whose adjoint is being emitted
        self.new = None
        self.subgroup_size = kctx.k.subgroup_size

    # ---- the task ------------------------------------------------------------------------
    def build(self, name: str) -> ir.Task:
        t = self.task
        new = self.new = ir.Task(t.kind, t.loc)
        new.serial, new.source_kind, new.task_name, new.block_dim = t.serial, t.source_kind, name, t.block_dim
        if t.kind == "range_for":
            mapping: dict = {}
            ir.clone_block(t.prologue, new.prologue, mapping)
            new.begin, new.end = mapping[t.begin], mapping[t.end]
            new.index = ir.LoopIndex(new, t.index.type)
            self.fmap[t.index] = self.reversed_index(new) if t.serial else new.index
        self.forward_block(t.body, new.body)
        reverse = ir.Block()
        self.reverse_block(t.body, reverse)
        for s in list(reverse.stmts):
            new.body.append(s)
        self.k.shared_adjoints.zero_at_iteration_start(new, new.body)
        for st in reversed(self.stacks):
            st.block = new.body
            new.body.stmts.insert(0, st)
        return new

    def reversed_index(self, new: ir.Task) -> ir.Stmt:
        """A serialized task's iterations run backwards: iteration j of the adjoint stands for
        forward index begin+end-1-j, so what one iteration leaves in a global for the next is
        differentiated after the next. The body cannot see the prologue: it recomputes the range."""
        t, it = self.task, self.task.index.type
        mapping: dict = {}
        ir.clone_block(t.prologue, new.body, mapping)
        total = new.body.append(ir.Binary("add", mapping[t.begin], mapping[t.end], it))
        last = new.body.append(ir.Binary("sub", total, new.body.append(ir.Const(1, it)), it))
        return new.body.append(ir.Binary("sub", last, new.index, it))

    def new_stack(self, dtype: T.DataType, name: str, loc, adjoint: bool | None = None) -> AdStackAlloca:
        st = AdStackAlloca(dtype, -1, name, loc, adjoint)
        self.stacks.append(st)
        return st

    # ---- forward sweep -------------------------------------------------------------------
    def forward_block(self, src: ir.Block, dst: ir.Block) -> None:
        for s in src.stmts:
            self.forward_stmt(s, dst)

    def forward_stmt(self, s: ir.Stmt, dst: ir.Block) -> None:
        m = self.fmap
        if isinstance(s, _DROPPED_IN_FORWARD) and not _writes_shared(s):
            return
        if isinstance(s, ir.Alloca) and s in self.stacked:
            # The forward sweep keeps reading the local itself (a register); the stack records
            # its values for the reverse sweep.
            dst.append(ir.clone_stmt(s, m))
            st = self.stack_of[s] = self.new_stack(s.type, s.var_name, s.loc, adjoint=self.is_active(s))
            if not _stored_before_read(s):  # its zero is observable: it gets an entry of its own
                zero = dst.append(ir.Const(0.0 if s.type.is_float else (False if s.type is T.u1 else 0), s.type))
                dst.append(AdStackPush(st, zero, s.loc))
                self.zero_pushed.add(s)
        elif isinstance(s, ir.LocalStore) and s.var in self.stacked:
            dst.append(ir.clone_stmt(s, m))
            dst.append(AdStackPush(self.stack_of[s.var], m[s.value], s.loc))
        elif isinstance(s, ir.If):
            new = m[s] = dst.append(ir.If(m[s.cond], s.loc))
            self.forward_block(s.then_block, new.then_block)
            self.forward_block(s.else_block, new.else_block)
        elif isinstance(s, ir.RangeFor):
            new = m[s] = dst.append(ir.RangeFor(m[s.begin], m[s.end], s.index.type, serial=True, kind=s.kind,
                                                loc=s.loc))
            m[s.index] = new.index
            self.forward_block(s.body, new.body)
        elif s.BLOCKS or isinstance(s, ir.LocalAccumulate):
            raise error(s.loc, f"reverse-mode autodiff does not support {type(s).__name__} statements")
        else:
            dst.append(ir.clone_stmt(s, m))

    # ---- reverse sweep -------------------------------------------------------------------
    def reverse_block(self, src: ir.Block, dst: ir.Block) -> None:
        self.rev_block_of[src] = dst
        self.front[dst] = len(dst.stmts)
        self.memo.append({})
        outer, self.cur = self.cur, dst
        for s in reversed(src.stmts):
            self.at = s
            self.reverse_stmt(s)
            st = self.snapshot.get(s)
            if st is not None:
                self.emit(AdStackPop(st))
        self.cur = outer
        self.memo.pop()

    def reverse_stmt(self, s: ir.Stmt) -> None:
        if isinstance(s, ir.If):
            new = self.emit(ir.If(self.primal_whole(s.cond), s.loc))
            self.reverse_block(s.then_block, new.then_block)
            self.reverse_block(s.else_block, new.else_block)
        elif isinstance(s, ir.RangeFor):
            self.reverse_loop(s)
        elif isinstance(s, ir.Alloca):
            if s in self.zero_pushed:
                self.emit(AdStackPop(self.stack_of[s]))
        elif isinstance(s, ir.LocalStore):
            self.reverse_local_store(s)
        elif isinstance(s, (ir.GlobalStore, ir.AtomicRMW)):
            self.reverse_global_write(s)
        elif isinstance(s, ir.TempStore):
            slot = self.k.adjoint_temps.get(s.slot)
            if slot is not None and self.is_active(s.value):
                self.acc(s.value, self.emit(ir.TempLoad(slot, s.value.type)))
        elif isinstance(s, ir.TempAtomic):
            self.reverse_temp_atomic(s)
        elif isinstance(s, ir.SimtSync):  # the adjoints written before it are read after it
            self.emit(ir.SimtSync(s.kind, s.loc))
        elif s in self.adj:
            self.reverse_value(s, self.emit(ir.LocalLoad(self.adj[s])))

    def reverse_loop(self, s: ir.RangeFor) -> None:
        """The same range backwards: reverse iteration j stands for forward index begin+end-1-j."""
        begin, end = self.primal_whole(s.begin), self.primal_whole(s.end)
        it = s.index.type
        last = self.op("sub", self.op("add", begin, end), self.const(1, it))
        loop = self.emit(ir.RangeFor(begin, end, it, serial=True, kind=s.kind, loc=s.loc))
        self.rev_index[s.index] = loop.body.append(ir.Binary("sub", last, loop.index, it))
        self.reverse_block(s.body, loop.body)

    def reverse_value(self, s: ir.Stmt, g) -> None:
        """Propagate `g`, the adjoint of value `s`, to what `s` was computed from."""
        if isinstance(s, ir.LocalLoad):
            if s.var in self.stack_of:
                self.emit(AdStackAccAdjoint(self.stack_of[s.var], g))
            else:
                self.acc_into(s.var, g)
        elif isinstance(s, ir.GlobalLoad):
            if self.differentiable(s.ptr.target):
                self.emit(ir.AtomicRMW("add", self.grad_ptr(s.ptr), g, s.loc))
        elif isinstance(s, ir.TempLoad):
            self.emit(TempAtomicAdd(self.k.adjoint_temps[s.slot], g, s.loc))
        elif isinstance(s, ir.Unary):
            rules.unary(self, s, g)
        elif isinstance(s, ir.Binary):
            rules.binary(self, s, g)
        elif isinstance(s, ir.Cast):
            rules.cast(self, s, g)
        elif isinstance(s, ir.Select):
            rules.select(self, s, g)
        elif isinstance(s, ir.SubgroupOp):
            simt_adjoints.subgroup_op(self, s, g)
        else:
            raise NotImplementedError(f"no adjoint rule for {type(s).__name__}")

    def reverse_local_store(self, s: ir.LocalStore) -> None:
        var = s.var
        flows = self.is_active(var) and self.is_active(s.value)
        if var in self.stack_of:
            st = self.stack_of[var]
            if flows and st.has_adjoint:
                self.acc(s.value, self.emit(AdStackLoadTopAdj(st)))
            self.emit(AdStackPop(st))
        elif self.is_active(var):  # the stored value takes the local's adjoint, which restarts at 0
            adj = self.adjoint_local(var)
            if flows:
                self.acc(s.value, self.emit(ir.LocalLoad(adj)))
            self.reset_adjoint(adj)

    def reverse_global_write(self, s) -> None:
        """`x[i] = v` consumes x.grad[i]: v takes it and x.grad[i] restarts at 0, since the value
        it overwrote reaches the result only through reads before the store, whose reverses
        (later in the reverse sweep) add to it. `y[i] += v`: v gets y.grad[i], which stays (the
        old value passes through); `-=` its negation; atomic min/max: v gets it where v won."""
        if not self.differentiable(s.ptr.target):
            return
        if isinstance(s, ir.GlobalStore):
            return self.reverse_store(s)
        op = s.op
        if isinstance(s.ptr.target, ir.SharedRef) and op not in ("add", "sub") and self.is_active(s.value):
            raise error(s.loc, f"atomic {op} on a SharedArray has no exact gradient here (its reverse needs the "
                               f"element's final value, which later iterations overwrite); reduce with "
                               f"qd.simt.block.reduce_{op} or into a field instead")
        if op not in ("add", "sub", "min", "max") or not self.is_active(s.value):
            return
        g = self.emit(ir.GlobalLoad(self.grad_ptr(s.ptr)))
        if op == "sub":
            g = self.op("neg", g)
        elif op in ("min", "max"):
            final = self.emit(ir.GlobalLoad(self.primal(s.ptr), s.loc))
            final.clobbered_by = s.clobbered_by  # a later write changes the final value
            g = self.select(self.op("eq", self.primal(s.value), final), g, self.const(0.0, s.value.type))
        self.acc(s.value, g)

    def reverse_temp_atomic(self, s: ir.TempAtomic) -> None:
        """`s += v` on a kernel-scope local: v takes the local's adjoint, which stays (the old
        value passes through); `-=` its negation. Integer updates carry no gradient."""
        slot = self.k.adjoint_temps.get(s.slot)
        if slot is None or not self.is_active(s.value):
            return
        if s.op not in ("add", "sub"):
            raise error(s.loc, f"atomic {s.op} on a float variable shared by the iterations of a parallel "
                               f"loop has no exact gradient; reduce into a field with qd.atomic_{s.op} instead")
        g = self.emit(ir.TempLoad(slot, s.value.type))
        self.acc(s.value, self.op("neg", g) if s.op == "sub" else g)

    def reverse_store(self, s: ir.GlobalStore) -> None:
        if not s.ptr.type.is_float:
            return
        ptr = self.grad_ptr(s.ptr)
        if self.is_active(s.value):
            self.acc(s.value, self.emit(ir.GlobalLoad(ptr)))
        self.emit(ir.GlobalStore(ptr, self.const(0.0, ptr.type), s.loc))

    def grad_ptr(self, ptr: ir.GlobalPtr) -> ir.GlobalPtr:
        # The primal access's location, so a debug-mode bounds error on the .grad points at user code.
        target = ptr.target
        adjoint = self.k.shared_adjoints.of(target) if isinstance(target, ir.SharedRef) else self.k.grad_target(target)
        return self.emit(ir.GlobalPtr(adjoint, [self.primal(i) for i in ptr.indices], loc=ptr.loc))

    def differentiable(self, target) -> bool:
        """Has global or shared array `target` an adjoint?"""
        if isinstance(target, ir.SharedRef):
            return self.k.shared_adjoints.has(target)
        return self.k.differentiable(target)

    # ---- adjoints ------------------------------------------------------------------------
    def is_active(self, x) -> bool:
        return x in self.k.activity

    def acc(self, x: ir.Stmt, value) -> None:
        """Add `value` to the adjoint of `x` (nothing if `x` carries no gradient)."""
        if x in self.k.activity.values:
            self.acc_into(x, value)

    def acc_into(self, key, value) -> None:
        adj = self.adjoint_local(key)
        if adj in self.known_zero and adj.block is self.cur:
            self.emit(ir.LocalStore(adj, value))  # the first contribution: no `0.0 + value`
        else:
            self.emit(ir.LocalStore(adj, self.op("add", self.emit(ir.LocalLoad(adj)), value)))
        self.known_zero.discard(adj)

    def reset_adjoint(self, adj: ir.Alloca) -> None:
        self.emit(ir.LocalStore(adj, self.const(0.0, adj.type)))
        if adj.block is self.cur:
            self.known_zero.add(adj)
        else:
            self.known_zero.discard(adj)

    def adjoint_local(self, key) -> ir.Alloca:
        """The adjoint of a value or local: zeroed where the reverse of its block begins, so
        each reverse iteration of a loop that defines it starts afresh."""
        adj = self.adj.get(key)
        if adj is None:
            block = self.rev_block_of[key.block]
            adj = self.adj[key] = ir.Alloca(key.type, "adj", key.loc)
            adj.block = block
            block.stmts.insert(self.front[block], adj)
            self.front[block] += 1
            self.known_zero.add(adj)
        return adj

    # ---- primal values in the reverse sweep ------------------------------------------------
    def primal(self, x: ir.Stmt):
        """`x`'s forward value, usable at the current point of the reverse sweep."""
        if x is self.task.index:
            return self.fmap[x]
        if x.block is self.task.body:
            return self.fmap[x]
        if isinstance(x, ir.LoopIndex):
            return self.rev_index[x]
        for scope in reversed(self.memo):
            if x in scope:
                return scope[x]
        value = self.memo[-1][x] = self.recompute(x)
        return value

    def primal_whole(self, x: ir.Stmt):
        """`primal(x)`, but when `x` cannot be recomputed it is snapshotted whole (an `if`
        condition costs a u1 entry, where snapshotting the float it compares would cost more)."""
        if not self.recoverable(x) and x not in self.snapshot:
            self.snapshot_stack(x)
        return self.primal(x)

    def recoverable(self, x: ir.Stmt) -> bool:
        """Would `primal(x)` succeed without taking a new snapshot?"""
        if x is self.task.index or x.block is self.task.body or isinstance(x, ir.LoopIndex):
            return True
        if any(x in scope for scope in self.memo):
            return True
        how, _ = self.how_to_recover(x)
        if how != "clone":
            return how == "stack top"
        return isinstance(x, ir.LocalLoad) or all(self.recoverable(o) for o in x.operands())

    def recompute(self, x: ir.Stmt):
        how, stack = self.how_to_recover(x)
        if how == "snapshot":
            how, stack = "stack top", self.snapshot_stack(x)
        if how == "stack top":
            return self.emit(AdStackLoadTop(stack))
        if isinstance(x, ir.LocalLoad):
            mapping = {x.var: self.fmap[x.var]}
        else:
            mapping = {o: self.primal(o) for o in x.operands()}
        return self.emit(ir.clone_stmt(x, mapping))

    def how_to_recover(self, x: ir.Stmt) -> tuple:
        """("stack top", stack) | ("clone", None) | ("snapshot", None) for `x` at the current point."""
        if x in self.snapshot:
            return "stack top", self.snapshot[x]
        pushed = self.stack_topped_by(x)
        if pushed is not None:
            return "stack top", pushed
        if isinstance(x, _RECOMPUTABLE):
            return "clone", None
        if isinstance(x, ir.GlobalLoad):  # a gradient buffer changes during the reverse sweep, a SharedArray
            return ("snapshot" if x.ptr.target.is_grad or isinstance(x.ptr.target, ir.SharedRef)  # after it
                    else "clone"), None
        if isinstance(x, ir.LocalLoad):
            var = x.var
            if var in self.stacked:
                pushed = any(self.positions.runs_between(w, x, self.at) for w in self.writes[var])
                return ("snapshot", None) if pushed else ("stack top", self.stack_of[var])
            # A plain local holds its last forward value: right only if nothing stores to it
            # after this load, and in scope only if it is declared at the task's top level.
            if var.block is not self.task.body or any(self.positions.may_run_after(w, x) for w in self.writes[var]):
                raise NeedStack(var)
            return "clone", None
        return "snapshot", None

    def stack_topped_by(self, x: ir.Stmt):
        """A stack whose top at the current point is `x` itself: `x` was stored to a stacked
        local by a store that dominates this point, with no other write to it in between."""
        if isinstance(x, (ir.Const, ir.ArgLoad, ir.NdarrayShape)):
            return None  # cheaper to recompute than to load
        for store in self.stored_values.get(x, ()):
            stack = self.stack_of.get(store.var)
            if stack is None or not self.positions.dominates(store, self.at):
                continue
            if not any(w is not store and self.positions.runs_between(w, store, self.at)
                       for w in self.writes[store.var]):
                return stack
        return None

    def snapshot_stack(self, x: ir.Stmt) -> AdStackAlloca:
        st = self.snapshot.get(x)
        if st is None:
            st = self.snapshot[x] = self.new_stack(x.type, f"snapshot@{x.loc.line if x.loc else '?'}", x.loc,
                                                   adjoint=False)
            value = self.fmap[x]
            block = value.block
            push = AdStackPush(st, value, x.loc)
            push.block = block
            block.stmts.insert(block.stmts.index(value) + 1, push)
        return st

    # ---- emission helpers (also used by rules.py) -----------------------------------------
    def emit(self, s: ir.Stmt):
        return self.cur.append(s)

    def op(self, name: str, *args):
        if len(args) == 1:
            return self.emit(ir.Unary(name, args[0], args[0].type))
        a, b = args
        return self.emit(ir.Binary(name, a, b, rules.result_type(name, a)))

    def const(self, value, dtype: T.DataType):
        return self.emit(ir.Const(float(value) if dtype.is_float else int(value), dtype))

    def select(self, cond, a, b):
        return self.emit(ir.Select(cond, a, b))

    def cast(self, value, dtype: T.DataType):
        return self.emit(ir.Cast(value, dtype))


def _writes_shared(s: ir.Stmt) -> bool:
    return isinstance(s, (ir.GlobalStore, ir.AtomicRMW)) and isinstance(s.ptr.target, ir.SharedRef)


def _stored_before_read(var: ir.Alloca) -> bool:
    """Is the local's first access after its declaration a store in the same block? Then its
    initial zero is never read and needs no stack entry."""
    block = var.block.stmts
    for s in block[block.index(var) + 1:]:
        if isinstance(s, ir.LocalStore) and s.var is var:
            return True
        if any(getattr(d, "var", None) is var for d in [s, *ir.walk_nested(s)]):
            return False
    return False
