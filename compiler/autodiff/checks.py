"""What a gradient kernel refuses to compile: anything whose gradient would be silently wrong.

Quadrants' global data access rules, checked statically instead of trusted:
- no `while`/`break`/`continue` (the reverse sweep replays loops by their trip count);
- the old value of an atomic operation is not used (the grad kernel does not repeat it);
- no access to `x.grad[...]` of an ndarray parameter `x` that gets a gradient (as Quadrants:
  the gradient of the gradient buffer is not defined; passing `a.grad` itself is fine);
- no `qd.atomic_mul` on a float global or kernel-scope local that needs a gradient (its
  adjoint needs the product of the other factors, which no thread has);
- in a parallel loop, a differentiable global is not read at an element other iterations
  may write (cross-iteration read-after-write: `out[i] = out[i-1] + ...`; `x[k, i + 1] =
  f(x[k, i])` in a serial loop inside iteration k is fine: dependence.py proves it);
- a value the gradient needs is not overwritten later by the same kernel (a non-linear use
  of an overwritten value): reads that may be overwritten are marked here, and the driver
  rejects those the finished gradient kernel still reads.
Overwriting itself is fine: a store consumes the adjoint of the value it overwrote
(task_adjoint.py), so stores in both branches of an `if`, repeated stores, in-place updates
and serial dependencies through globals all differentiate exactly.
- a value crossing tasks (a kernel temporary) is written by one task only, which does not
  read it back, so the grad kernel can replay it; a kernel-scope local reduced in parallel
  loops (`s += v`, atomic on its temporary) may be set once before them and is read only
  after the last of them.
Each error points at the offending line.
"""
from __future__ import annotations

import linecache

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir
from . import dependence
from .dependence import IndexKeys, buffer_key
from .positions import Positions

_UNSUPPORTED_LOOPS = (ir.While, ir.Break, ir.Continue)


def refuse_graph_loops(k: ir.KernelIR, what: str) -> None:
    """A qd.graph.do_while loop is replayed from the host, which a derivative does not follow."""
    if k.graph_loops:
        raise error(k.loc, f"qd.graph.do_while cannot be used in kernel '{k.name}', which needs {what}: its "
                           f"loop is replayed from the host, which the derivative does not follow")
    for s in ir.walk(k.body):
        if isinstance(s, ir.GraphDoWhile):
            raise error(s.loc, f"qd.graph.do_while cannot be used in kernel '{k.name}', which needs {what}: its "
                               f"loop is replayed from the host, which the derivative does not follow")


def error(loc: ir.SourceLoc | None, message: str) -> QdcCompileError:
    if loc is None:
        return QdcCompileError(message)
    line = linecache.getline(loc.filename, loc.line) or None
    return QdcCompileError(message, loc.filename, loc.line, loc.col, line)


def check_kernel(k: ir.KernelIR, differentiable) -> None:
    refuse_graph_loops(k, "a gradient")
    for t in k.tasks:
        for s in ir.walk(t.body):
            if isinstance(s, _UNSUPPORTED_LOOPS):
                what = "while loops" if isinstance(s, ir.While) else f"'{type(s).__name__.lower()}'"
                raise error(s.loc, f"{what} cannot be used in kernel '{k.name}', which needs a gradient: the "
                                   f"reverse sweep replays loops by their trip count; use a range-for "
                                   f"(with an if around its body) instead")
    _check_grad_buffer_accesses(k, differentiable)
    _check_atomic_results(k, differentiable)
    _check_temporaries(k)
    accesses = _global_accesses(k)
    _check_parallel_races(k, accesses, differentiable)
    _mark_clobbered_reads(accesses)


def _check_grad_buffer_accesses(k, differentiable):
    for s in ir.walk(k.body):
        if not isinstance(s, (ir.GlobalLoad, ir.GlobalStore, ir.AtomicRMW)):
            continue
        target = s.ptr.target
        if isinstance(target, ir.NdarrayRef) and target.is_grad and target.dtype.is_float \
                and differentiable(ir.NdarrayRef(target.arg_index, target.name, target.dtype, target.ndim, False)):
            name = k.params[target.arg_index].name
            raise error(s.loc, f"kernel '{k.name}', parameter '{name}': cannot automatically differentiate through a "
                               f"grad tensor ('{name}.grad[...]' in a kernel that needs a gradient); if you really "
                               f"want to do that, pass the grad tensor into the kernel directly")


def _atomic_target(s) -> str:
    return f"'{s.ptr.target.name}'" if isinstance(s, ir.AtomicRMW) else "a kernel-scope local"


def _check_atomic_results(k, differentiable):
    uses = ir.users_count(k.body)
    for s in ir.walk(k.body):
        if isinstance(s, (ir.AtomicRMW, ir.TempAtomic)) and s.op == "mul" and s.type.is_float:
            what = (f"'{s.ptr.target.name}'" if isinstance(s, ir.AtomicRMW) else "a kernel-scope local")
            if isinstance(s, ir.TempAtomic) or differentiable(s.ptr.target):
                raise error(s.loc, f"qd.atomic_mul on {what} cannot be differentiated (kernel '{k.name}' needs a "
                                   f"gradient): accumulate log-values with atomic_add, or multiply into a local "
                                   f"in a serial loop")
        if isinstance(s, (ir.AtomicRMW, ir.TempAtomic)) and s.op == "xchg" and s.type.is_float \
                and (isinstance(s, ir.TempAtomic) or differentiable(s.ptr.target)):
            raise error(s.loc, f"qd.atomic_exchange on {_atomic_target(s)} cannot be differentiated (kernel "
                               f"'{k.name}' needs a gradient): which thread's value remains is not determined")
        if isinstance(s, (ir.AtomicRMW, ir.TempAtomic)) and uses.get(s):
            raise error(s.loc, "the old value returned by an atomic operation cannot be used in a kernel that "
                               "needs a gradient (the gradient kernel does not repeat the atomic)")


def _check_temporaries(k):
    last_update = _check_reduced_temporaries(k)
    writers: dict = {}
    for ti, t in enumerate(k.tasks):
        stores = [s for s in ir.walk(t.body) if isinstance(s, ir.TempStore)]
        loaded = {s.slot for b in t.blocks() for s in ir.walk(b) if isinstance(s, ir.TempLoad)}
        for s in stores:
            if t.kind == "range_for" and not t.serial:
                raise error(s.loc, "this variable is assigned inside a parallel loop and used after it; which "
                                   "iteration's value it keeps is unspecified, and so would be its gradient. "
                                   "Store per-iteration results in a field")
            if s.slot in loaded or writers.setdefault(s.slot, ti) != ti:
                raise error(s.loc, "this variable is assigned in more than one part of the kernel (it is "
                                   "shared between a top-level loop and code outside it); the gradient kernel "
                                   "cannot replay it. Keep it local to one loop, or use a field")
            if s.slot in last_update and last_update[s.slot][0] <= ti:
                raise error(s.loc, "this variable is assigned after a parallel loop accumulated into it; the "
                                   "gradient kernel cannot replay that. Use a new variable")


def _check_reduced_temporaries(k) -> dict:
    """Temporaries updated by `TempAtomic`s are read only after their last updating task (the
    grad kernel replays the updates and then sees only the final value). Returns slot ->
    (index of the last updating task, one of its updates)."""
    last: dict = {}
    for ti, t in enumerate(k.tasks):
        for s in ir.walk(t.body):
            if isinstance(s, ir.TempAtomic):
                last[s.slot] = (ti, s)
    for ti, t in enumerate(k.tasks):
        for s in (s for b in t.blocks() for s in ir.walk(b)):
            if isinstance(s, ir.TempLoad) and s.slot in last and ti <= last[s.slot][0]:
                raise error(s.loc, "this variable is read before or while a parallel loop accumulates into it "
                                   f"(line {last[s.slot][1].loc.line if last[s.slot][1].loc else '?'}); the "
                                   "gradient kernel would see only its final value. Read it after the loop")
    return last


# ---- global accesses --------------------------------------------------------------------

class _Access:
    __slots__ = ("stmt", "task", "task_stmt", "buffer", "key", "write", "positions", "bounds")

    def __init__(self, stmt, task, task_stmt, buffer, key, write, positions, bounds):
        self.stmt, self.task, self.task_stmt, self.buffer, self.key = stmt, task, task_stmt, buffer, key
        self.write, self.positions = write, positions
        self.bounds = bounds  # the keys of the task's begin and end (a range-for task), else None


def _written_buffers(k) -> set:
    return {buffer_key(s.ptr.target) for s in ir.walk(k.body) if isinstance(s, (ir.GlobalStore, ir.AtomicRMW))}


def _global_accesses(k) -> list:
    written = _written_buffers(k)
    out = []
    for ti, t in enumerate(k.tasks):
        positions = Positions(t.body)
        keys = IndexKeys(written)
        bounds = (keys.of(t.begin), keys.of(t.end)) if t.kind == "range_for" else None
        for s in ir.walk(t.body):
            # A block's threads share a SharedArray on purpose, ordered by barriers; the
            # gradient kernel's forward sweep recomputes it (simt_adjoints.py)
            if isinstance(s, (ir.GlobalLoad, ir.GlobalStore, ir.AtomicRMW)) and not isinstance(s.ptr.target,
                                                                                              ir.SharedRef):
                out.append(_Access(s, ti, t, buffer_key(s.ptr.target), keys.of_ptr(s.ptr),
                                   not isinstance(s, ir.GlobalLoad), positions, bounds))
    return out


def _name(target) -> str:
    return target.name if isinstance(target, ir.FieldRef) else f"ndarray '{target.name}'"


def _check_parallel_races(k, accesses, differentiable):
    """A read of a differentiable global at an element another iteration of the same parallel
    loop may write: which value it sees depends on timing, and its gradient on the same race."""
    for ti, t in enumerate(k.tasks):
        if t.kind != "range_for" or t.serial or _single_iteration(t):
            continue
        mine = [a for a in accesses if a.task == ti and differentiable(a.stmt.ptr.target)]
        writes = {}
        for a in mine:
            if a.write:
                writes.setdefault(a.buffer, []).append(a)
        for a in mine:
            if a.write:
                continue
            for w in writes.get(a.buffer, ()):
                if dependence.may_meet_in_other_iteration(w.key, a.key, w.bounds):
                    raise error(a.stmt.loc, f"'{_name(a.stmt.ptr.target)}' is read here at an element that other "
                                            f"iterations of this parallel loop write (line {w.stmt.loc.line}): a "
                                            f"cross-iteration read-after-write, whose gradient would be wrong. "
                                            f"Write the results to a separate field, or serialize the loop with "
                                            f"qd.loop_config(serialize=True)")


def check_shared_parallel_stores(k, differentiable, active) -> None:
    """A value with a gradient stored by every iteration of a parallel loop into one element of
    a differentiable global: which store lands last is unspecified, so the gradient cannot say
    which value the element kept. (A store under an `if` is taken to come from one iteration.)"""
    for t in k.tasks:
        if t.kind != "range_for" or t.serial or _single_iteration(t):
            continue
        keys = IndexKeys(_written_buffers(k))
        for s in _unconditional_stores(t.body):
            if differentiable(s.ptr.target) and s.value in active \
                    and all(dependence.same_in_every_iteration(key) for key in keys.of_ptr(s.ptr)):
                raise error(s.loc, f"every iteration of this parallel loop stores into the same element of "
                                   f"'{_name(s.ptr.target)}'; which value it keeps is unspecified, and so "
                                   f"would be its gradient. Accumulate with +=, store from one iteration "
                                   f"(under an if), or serialize the loop with qd.loop_config(serialize=True)")


def _single_iteration(t: ir.Task) -> bool:
    b, e = t.begin, t.end
    return isinstance(b, ir.Const) and isinstance(e, ir.Const) and e.value - b.value <= 1


def _unconditional_stores(block: ir.Block):
    """The GlobalStores of `block` and of the loop bodies in it, not entering an `if`."""
    for s in block.stmts:
        if isinstance(s, ir.GlobalStore):
            yield s
        elif isinstance(s, ir.RangeFor):
            yield from _unconditional_stores(s.body)


def _mark_clobbered_reads(accesses) -> None:
    """Mark the reads whose value the kernel may overwrite afterwards: the gradient kernel runs
    after the forward kernel and would read the new contents. A load is marked when a later
    write may hit its element; an atomic min/max (whose reverse reads the final value to find
    the winner) when a later write of another kind may. Copies of a load keep the mark
    (clone_stmt copies attributes); check_unstable_loads rejects any marked load the gradient
    still needs after dead code is removed, so a value used only linearly (`out[i] * 2.0`)
    may be overwritten freely: its gradient does not need it."""
    writes: dict = {}
    for a in accesses:
        if a.write:
            writes.setdefault(a.buffer, []).append(a)
    for a in accesses:
        atomic_op = getattr(a.stmt, "op", None) if a.write else None
        if a.write and atomic_op not in ("min", "max"):
            continue
        for w in writes.get(a.buffer, ()):
            if w is a or (atomic_op and getattr(w.stmt, "op", None) == atomic_op):
                continue
            if _clobbers(w, a):
                a.stmt.clobbered_by = w.stmt.loc
                break


def _clobbers(w: _Access, read: _Access) -> bool:
    if w.task != read.task:
        return w.task > read.task
    return dependence.may_follow_on_same_element(w, read, w.task_stmt)


# ---- checks of the forward kernel's activity and of the finished gradient kernel -----------

def check_gradient_through_plain_globals(k: ir.KernelIR, activity, differentiable) -> None:
    """A value with a gradient stored into a field or ndarray without one, and read back into
    the result: the gradient would silently stop there."""
    read_back = {buffer_key(s.ptr.target) for s in ir.walk(k.body) if isinstance(s, ir.GlobalLoad)
                 and s in activity.useful and s.type.is_float and not isinstance(s.ptr.target, ir.SharedRef)}
    for s in ir.walk(k.body):
        if isinstance(s, (ir.GlobalStore, ir.AtomicRMW)) and s.value in activity.varied \
                and not isinstance(s.ptr.target, ir.SharedRef) \
                and not differentiable(s.ptr.target) and buffer_key(s.ptr.target) in read_back:
            target = s.ptr.target
            raise error(s.loc, f"a value with a gradient is stored into '{target.name}', which has none, and read "
                               f"back into the result: the gradient would stop here. Create it with "
                               f"needs_grad=True")


def check_unstable_loads(g: ir.KernelIR) -> None:
    """Reject a load marked by _mark_clobbered_reads that the gradient kernel `g` still needs."""
    for s in ir.walk(g.body):
        if isinstance(s, ir.GlobalLoad) and s.clobbered_by is not None:
            raise error(s.loc, f"the gradient needs the value read here (its use is not linear), but kernel "
                               f"'{g.name}' overwrites '{s.ptr.target.name}' afterwards (line "
                               f"{s.clobbered_by.line}), and its gradient kernel runs after it "
                               f"and would read the new value. Keep the update linear in the old value "
                               f"(`x[i] = x[i] * c + v` with c free of gradients), or write the new values to "
                               f"a separate field")
