"""What a gradient kernel refuses to compile: anything whose gradient would be silently wrong.

Quadrants' global data access rules, checked statically instead of trusted:
- no `while`/`break`/`continue` (the reverse sweep replays loops by their trip count);
- the old value of an atomic operation is not used (the grad kernel does not repeat it);
- in a parallel loop, a differentiable global is not read at an element other iterations
  write (cross-iteration read-after-write: `out[i] = out[i-1] + ...`);
- a differentiable global element is not overwritten after being read, nor stored to twice
  (its adjoint would be counted for two values);
- a value crossing tasks (a kernel temporary) is written by one task only, which does not
  read it back, so the grad kernel can replay it.
Each error points at the offending line.
"""
from __future__ import annotations

import linecache

from qdc.runtime.errors import QdcCompileError

from .. import ir
from .positions import Positions

_UNSUPPORTED_LOOPS = (ir.While, ir.Break, ir.Continue)


def error(loc: ir.SourceLoc | None, message: str) -> QdcCompileError:
    if loc is None:
        return QdcCompileError(message)
    line = linecache.getline(loc.filename, loc.line) or None
    return QdcCompileError(message, loc.filename, loc.line, loc.col, line)


def check_kernel(k: ir.KernelIR, differentiable) -> None:
    for t in k.tasks:
        for s in ir.walk(t.body):
            if isinstance(s, _UNSUPPORTED_LOOPS):
                what = "while loops" if isinstance(s, ir.While) else f"'{type(s).__name__.lower()}'"
                raise error(s.loc, f"{what} cannot be used in kernel '{k.name}', which needs a gradient: the "
                                   f"reverse sweep replays loops by their trip count; use a range-for "
                                   f"(with an if around its body) instead")
    _check_atomic_results(k)
    _check_temporaries(k)
    accesses = _global_accesses(k)
    _check_parallel_races(k, accesses, differentiable)
    _check_overwrites(accesses, differentiable)
    _mark_clobbered_loads(accesses)


def _check_atomic_results(k):
    uses = ir.users_count(k.body)
    for s in ir.walk(k.body):
        if isinstance(s, ir.AtomicRMW) and uses.get(s):
            raise error(s.loc, "the old value returned by an atomic operation cannot be used in a kernel that "
                               "needs a gradient (the gradient kernel does not repeat the atomic)")


def _check_temporaries(k):
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


# ---- global accesses --------------------------------------------------------------------

class _Access:
    __slots__ = ("stmt", "task", "buffer", "key", "write", "positions")

    def __init__(self, stmt, task, buffer, key, write, positions):
        self.stmt, self.task, self.buffer, self.key, self.write = stmt, task, buffer, key, write
        self.positions = positions


def buffer_key(target) -> tuple:
    if isinstance(target, ir.FieldRef):
        return ("field", target.name)
    return ("ndarray", target.arg_index, target.is_grad)


def _global_accesses(k) -> list:
    written = {buffer_key(s.ptr.target) for s in ir.walk(k.body) if isinstance(s, (ir.GlobalStore, ir.AtomicRMW))}
    out = []
    for ti, t in enumerate(k.tasks):
        positions = Positions(t.body)
        keys = _IndexKeys(written)
        for s in ir.walk(t.body):
            if isinstance(s, (ir.GlobalLoad, ir.GlobalStore, ir.AtomicRMW)):
                out.append(_Access(s, ti, buffer_key(s.ptr.target), keys.of_ptr(s.ptr),
                                   not isinstance(s, ir.GlobalLoad), positions))
    return out


class _IndexKeys:
    """Structural keys of index expressions: equal keys mean the same element in one iteration
    of the task (the task's own index is one symbol, whichever task)."""

    def __init__(self, written: set):
        self.written, self.memo = written, {}

    def of_ptr(self, ptr: ir.GlobalPtr) -> tuple:
        return tuple(self.of(i) for i in ptr.indices)

    def of(self, s) -> tuple:
        key = self.memo.get(s)
        if key is None:
            key = self.memo[s] = self._compute(s)
        return key

    def _compute(self, s) -> tuple:
        if isinstance(s, ir.LoopIndex):
            return ("task_index",) if isinstance(s.loop, ir.Task) else ("loop", id(s.loop))
        if isinstance(s, ir.Const):
            return ("const", s.type.name, s.value)
        if isinstance(s, ir.GlobalLoad) and buffer_key(s.ptr.target) not in self.written:
            return ("load", buffer_key(s.ptr.target), self.of_ptr(s.ptr))
        if isinstance(s, (ir.ArgLoad, ir.NdarrayShape, ir.TempLoad)) or s.PURE:
            return (type(s).__name__, s.type.name, tuple(repr(a) for a in s.attrs()),
                    tuple(self.of(o) for o in s.operands()))
        return ("value", id(s))

    @staticmethod
    def uses_task_index(key) -> bool:
        return _mentions(key, ("task_index",))


def _name(target) -> str:
    return target.name if isinstance(target, ir.FieldRef) else f"ndarray '{target.name}'"


def _check_parallel_races(k, accesses, differentiable):
    for ti, t in enumerate(k.tasks):
        if t.kind != "range_for" or t.serial:
            continue
        mine = [a for a in accesses if a.task == ti and differentiable(a.stmt.ptr.target)]
        writes = {}
        for a in mine:
            if a.write:
                writes.setdefault(a.buffer, []).append(a)
        for a in mine:
            if a.write or a.buffer not in writes:
                continue
            w = writes[a.buffer][0]
            same = all(x.key == a.key for x in writes[a.buffer])
            if not same or not _IndexKeys.uses_task_index(a.key):
                raise error(a.stmt.loc, f"'{_name(a.stmt.ptr.target)}' is read here at an element that other "
                                        f"iterations of this parallel loop write (line {w.stmt.loc.line}): a "
                                        f"cross-iteration read-after-write, whose gradient would be wrong. Write "
                                        f"the results to a separate field, or serialize the loop with "
                                        f"qd.loop_config(serialize=True)")


def _check_overwrites(accesses, differentiable):
    by_buffer: dict = {}
    for a in accesses:
        if differentiable(a.stmt.ptr.target):
            by_buffer.setdefault(a.buffer, []).append(a)
    for group in by_buffer.values():
        for w in group:
            if not w.write:
                continue
            is_store = isinstance(w.stmt, ir.GlobalStore)
            for other in group:
                if other is w or other.key != w.key or not _may_follow(w, other):
                    continue
                if other.write and not is_store:
                    continue  # accumulating after a write or another accumulation is fine
                _overwrite_error(w, "read" if not other.write else "written", other.stmt.loc.line)
            if is_store and _repeats(w):
                _overwrite_error(w, "written", w.stmt.loc.line, " in an earlier iteration of its loop")


def _overwrite_error(w: _Access, what: str, line: int, when: str = ""):
    verb = "overwritten" if isinstance(w.stmt, ir.GlobalStore) else "accumulated into"
    raise error(w.stmt.loc, f"'{_name(w.stmt.ptr.target)}' is {verb} here after being {what} (line {line}"
                            f"{when}); its gradient would be wrong. Quadrants' rule: write each element of a "
                            f"differentiable global once, then only accumulate into it with +=, and read it "
                            f"only after all accumulation; keep time steps in separate elements")


def _repeats(w: _Access) -> bool:
    """Does the store hit the same element in several iterations of an enclosing loop?"""
    return any(not _mentions(w.key, ("loop", id(loop))) for loop in w.positions.loops[w.stmt])


def _mentions(key, symbol) -> bool:
    return key == symbol or any(isinstance(part, tuple) and _mentions(part, symbol) for part in key)


def _may_follow(later: _Access, earlier: _Access) -> bool:
    """Can `later` touch the element `earlier` touched, after it? (Equal keys only.) Within a
    task: later in the iteration, or in a later iteration of a loop around both whose index
    the key does not involve (one that does makes it another element)."""
    if later.task != earlier.task:
        return later.task > earlier.task
    p = later.positions
    if p.pos[later.stmt] > p.pos[earlier.stmt]:
        return True
    shared = set(p.loops[later.stmt]) & set(p.loops[earlier.stmt])
    return any(not _mentions(later.key, ("loop", id(loop))) for loop in shared)


def _mark_clobbered_loads(accesses) -> None:
    """Mark loads of a buffer the kernel may write afterwards: the gradient kernel runs after the
    forward kernel and would read the new contents. Copies of a load keep the mark (clone_stmt
    copies attributes); the autodiff driver rejects any marked load the gradient still needs.
    A write to the same buffer at another index counts too, unless it is provably the same
    element's own earlier value (equal keys) or another element (a loop index in the key)."""
    writes: dict = {}
    for a in accesses:
        if a.write:
            writes.setdefault(a.buffer, []).append(a)
    for a in accesses:
        if a.write:
            continue
        for w in writes.get(a.buffer, ()):
            if _clobbers(w, a):
                a.stmt._ad_clobbered_by = w.stmt.loc
                break


def _clobbers(w: _Access, load: _Access) -> bool:
    if w.task != load.task:
        return w.task > load.task
    p = w.positions
    if p.pos[w.stmt] > p.pos[load.stmt]:
        return True
    shared = set(p.loops[w.stmt]) & set(p.loops[load.stmt])
    if w.key != load.key:
        return bool(shared)
    return any(not _mentions(w.key, ("loop", id(loop))) for loop in shared)
