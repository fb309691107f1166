"""Thread-local reductions: one atomic per chunk instead of one per iteration.

In a parallel range-for task, `y[None] += v` (or `qd.atomic_add/sub/mul/min/max/and/or/xor(t, v)`
whose old value is unused) at an address that does not change across iterations makes every
iteration contend for one cache line. The order in which the atomics land is unspecified,
so each chunk of the range may instead combine its values into a local accumulator and apply
a single atomic at the end:

    chunk_init  { %p = global_ptr @y[] ; %acc = alloca }        once per chunk
    body        { ... accumulate_add %acc %v reassoc ... }      every iteration
    chunk_final { %s = local_load %acc ; atomic_add %p %s }     once per (non-empty) chunk

`LocalAccumulate` tells the backend the updates may be reordered, so a float sum vectorises.
A product starts from 1 and multiplies (atomic_mul is a compare-and-swap loop on every
backend, so one per chunk instead of one per iteration matters most there).
The transform is refused for an address whose buffer the task also reads or writes in any
other way (a read would observe the partial sum), or that mixes kinds of update (add and max).

`s += v` on a kernel-scope local `s` (a `TempAtomic` on its temporary) is the same shape and
gets the same treatment, the temporary playing the part of the buffer.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir
from .dce import eliminate_dead_code

# Kind of update -> (accumulation, final atomic); a subtraction accumulates the negated value.
COMBINE = {"add": "add", "sub": "add", "mul": "mul", "min": "min", "max": "max", "and": "and", "or": "or", "xor": "xor"}
# Leaves an address may be computed from: they do not change while a task runs (TempLoad
# only if the task does not write that temporary, checked separately).
_INVARIANT_LEAVES = (ir.Const, ir.ArgLoad, ir.NdarrayShape)


def thread_local_reductions(k: ir.KernelIR) -> bool:
    changed = False
    for t in k.tasks:
        # block-level code keeps its atomics: a shared array is per block, and a per-thread
        # partial flushed after the loop would move updates past the loop's barriers
        if t.kind == "range_for" and not t.serial and ir.uses_simt(t) is None:
            changed |= _reduce_task(t)
    if changed:  # the atomics' address computations in the body may now be unused
        eliminate_dead_code(k)
    return changed


def _reduce_task(t: ir.Task) -> bool:
    accesses = [s for b in (t.chunk_init, t.body, t.chunk_final) for s in ir.walk(b)
                if isinstance(s, (ir.GlobalLoad, ir.GlobalStore, ir.AtomicRMW))]
    uses = ir.users_count(t.body)
    written_temps = {s.slot for s in ir.walk(t.body) if isinstance(s, (ir.TempStore, ir.TempAtomic))}
    groups: dict = {}  # address key -> candidate atomics
    blocked: set = set()  # buffers touched in a way a local accumulator would change
    for s in accesses:
        buffer = _buffer_key(s.ptr.target)
        if _is_candidate(s, uses, written_temps):
            groups.setdefault((buffer, _address_key(s.ptr)), []).append(s)
        else:
            blocked.add(buffer)
    changed = False
    for (buffer, _), atomics in groups.items():
        if buffer in blocked or len({COMBINE[a.op] for a in atomics}) != 1:
            continue
        _accumulate_locally(t, atomics)
        changed = True
    return _reduce_temporaries(t, uses) or changed


def _reduce_temporaries(t: ir.Task, uses: dict) -> bool:
    """The per-chunk accumulator for `TempAtomic`s: a temporary the task touches only through
    atomics of one kind whose old values are unused."""
    by_slot: dict = {}
    blocked: set = set()
    for s in (s for b in (t.chunk_init, t.body, t.chunk_final) for s in ir.walk(b)):
        if isinstance(s, ir.TempAtomic) and _is_temp_candidate(s, uses):
            by_slot.setdefault(s.slot, []).append(s)
        elif isinstance(s, (ir.TempLoad, ir.TempStore, ir.TempAtomic)):
            blocked.add(s.slot)
    changed = False
    for slot, atomics in by_slot.items():
        if slot in blocked or len({COMBINE[a.op] for a in atomics}) != 1:
            continue
        acc = _chunk_accumulator(t, atomics[0], f"t{slot}_partial")
        for a in atomics:
            _replace_with_accumulate(a, COMBINE[a.op], acc)
        total = t.chunk_final.append(ir.LocalLoad(acc, atomics[0].loc))
        t.chunk_final.append(ir.TempAtomic(COMBINE[atomics[0].op], slot, total, atomics[0].loc))
        changed = True
    return changed


def _is_temp_candidate(s: ir.TempAtomic, uses) -> bool:
    return (not uses.get(s) and s.op in COMBINE and s.type not in (T.u1, T.f16)
            and s.block is not None)


def _is_candidate(s, uses, written_temps) -> bool:
    return (isinstance(s, ir.AtomicRMW) and not uses.get(s) and s.op in COMBINE
            and s.type not in (T.u1, T.f16) and s.block is not None
            and is_invariant(s.ptr, written_temps))


def is_invariant(v: ir.Stmt, written_temps: set) -> bool:
    if isinstance(v, _INVARIANT_LEAVES):
        return True
    if isinstance(v, ir.TempLoad):
        return v.slot not in written_temps
    if not v.PURE or isinstance(v, ir.LoopIndex):
        return False
    return all(is_invariant(o, written_temps) for o in v.operands())


def _buffer_key(target) -> tuple:
    if isinstance(target, ir.FieldRef):
        return ("field", target.slot, target.is_grad)
    return ("ndarray", target.arg_index, target.is_grad)


def _address_key(v: ir.Stmt) -> tuple:
    """Structural identity of an invariant expression (equal keys, equal values)."""
    if isinstance(v, ir.GlobalPtr):
        return ("ptr", _buffer_key(v.target), tuple(_address_key(i) for i in v.indices))
    if isinstance(v, ir.Const):
        return ("const", v.type, repr(v.value))
    return (type(v).__name__, v.type, v.attrs(), tuple(_address_key(o) for o in v.operands()))


def _accumulate_locally(t: ir.Task, atomics: list[ir.AtomicRMW]) -> None:
    first = atomics[0]
    combine = COMBINE[first.op]
    ptr = hoist(first.ptr, t.chunk_init, {})
    acc = _chunk_accumulator(t, first, f"{first.ptr.target.name}_partial")
    for a in atomics:
        _replace_with_accumulate(a, combine, acc)
    total = t.chunk_final.append(ir.LocalLoad(acc, first.loc))
    t.chunk_final.append(ir.AtomicRMW(combine, ptr, total, first.loc))


def _chunk_accumulator(t: ir.Task, first, name: str) -> ir.Alloca:
    """A local of `first`'s type in `t.chunk_init`, holding the identity of its combination."""
    combine, dtype = COMBINE[first.op], first.type
    acc = t.chunk_init.append(ir.Alloca(dtype, name, first.loc))
    identity = _identity(combine, dtype)
    if identity != 0:  # an Alloca starts at zero
        t.chunk_init.append(ir.LocalStore(acc, t.chunk_init.append(ir.Const(identity, dtype, first.loc)), first.loc))
    return acc


def hoist(v: ir.Stmt, dest: ir.Block, mapping: dict) -> ir.Stmt:
    """A copy of the invariant expression `v` computed in `dest`."""
    if v in mapping:
        return mapping[v]
    for o in v.operands():
        hoist(o, dest, mapping)
    return dest.append(ir.clone_stmt(v, mapping))


def _replace_with_accumulate(a: ir.AtomicRMW, combine: str, acc: ir.Alloca) -> None:
    block = a.block
    at = block.stmts.index(a)
    new = [ir.LocalAccumulate(combine, acc, a.value, a.loc)]
    if a.op == "sub":  # x - v == x + (-v), exactly, for floats and wrapping integers
        neg = ir.Unary("neg", a.value, a.value.type, a.loc)
        new = [neg, ir.LocalAccumulate(combine, acc, neg, a.loc)]
    for s in new:
        s.block = block
    block.stmts[at:at + 1] = new
    a.block = None


def _identity(combine: str, t: T.DataType):
    if combine == "mul":
        return 1.0 if t.is_float else 1
    if combine in ("add", "or", "xor"):
        return 0.0 if t.is_float else 0
    if t.is_float:
        return float("inf") if combine == "min" else float("-inf")
    lo, hi = (-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if t.kind == "int" else (0, (1 << t.bits) - 1)
    if combine == "and":
        return -1 if t.kind == "int" else hi
    return hi if combine == "min" else lo
