"""Which parallel tasks the CPU lowers W iterations at a time (widen.py), and what that code
needs to know about each statement: computed here on the IR alone, before any code exists,
so that a task the width-W lowering cannot express keeps today's scalar code, whole.

Terms (as in ISPC):
- *varying*: a value that may differ between the W iterations (lanes) run together: the
  task's index, whatever is computed from it, loads through varying addresses, a loop index
  with varying bounds, a local of the body that narrow code or a varying value writes (kept
  as a vector). Everything else is *uniform*: one scalar value for all lanes (constants,
  arguments, loads of one address, `chunk_init`, locals only ever set to uniform values).
- *masked loop*: a loop inside the body that lanes may leave at different iterations (varying
  bounds, or a break/continue under a varying condition). It runs while any lane is active.
- *narrow* code: code that some lanes of the vector may skip (under a varying `if`, inside a
  masked loop). Adstack operations there make every stack of the task keep a count per lane
  (pushes scatter, reads gather); elsewhere one count serves all lanes (a push is one vector
  store).

Tasks with an inner loop are widened: an inner loop (a dynamic trip count, a loop-carried
chain, reverse mode's adstack loops) is what LLVM's own loop vectoriser cannot widen across the
task's iterations. A body without one is a loop that vectoriser widens already (if-converting its
branches), with less code to optimise and emit, unless it gathers from data-dependent addresses
(`_indirect_accesses`): those are widened too, but not where they also scatter atomics.

`plan(task)` returns a `WidenPlan` or the reason the task stays scalar (shown by `qdc inspect`).
"""
from __future__ import annotations

import os

from qdc.runtime.contract import types as T

from ... import ir
from ...ir import adstack as ad

# "0": the scalar code for every task (tests and benchmarks compare the two); "all": widen the
# tasks without an inner loop too (for measurements); else the default below.
SCALAR_SWITCH = "QDC_CPU_WIDEN"


def widening_enabled() -> bool:
    return os.environ.get(SCALAR_SWITCH, "1") != "0"


def widening_mode() -> str:
    """What the switch says, as it enters the cache key."""
    return os.environ.get(SCALAR_SWITCH, "1")


# Statement kinds the width-W lowering implements; any other kind keeps the task scalar.
_PURE = (ir.Const, ir.ArgLoad, ir.NdarrayShape, ir.Unary, ir.Binary, ir.Cast, ir.Select, ir.GlobalPtr,
         ir.RandomState, ir.TempLoad, ir.LoopIndex)
_LOCALS = (ir.Alloca, ir.LocalLoad, ir.LocalStore, ir.LocalAccumulate, ir.LocalArray, ir.ArrayLoad, ir.ArrayStore)
_MEMORY = (ir.GlobalLoad, ir.GlobalStore, ir.AtomicRMW, ir.TempStore, ir.TempAtomic, ad.TempAtomicAdd,
           ir.DebugMessage)
_CONTROL = (ir.If, ir.RangeFor, ir.While, ir.Break, ir.Continue)
_ADSTACK = (ad.AdStackAlloca, ad.AdStackPush, ad.AdStackPop, ad.AdStackLoadTop, ad.AdStackLoadTopAdj,
            ad.AdStackAccAdjoint)
SUPPORTED = _PURE + _LOCALS + _MEMORY + _CONTROL + _ADSTACK
# Atomic operations combined over the lanes first (then one atomic per vector).
COMBINED_ATOMICS = ("add", "sub", "min", "max", "and", "or", "xor")
ACCUMULATE_OPS = ("add", "mul", "min", "max", "and", "or", "xor")
_SCALAR_TYPES = (T.u1, T.i8, T.i16, T.i32, T.i64, T.u8, T.u16, T.u32, T.u64, T.f32, T.f64)


# A multi-dimensional range runs lanes along its rows (widen.py, `wide_loop`): rows known to be
# shorter than the fewest lanes of any level (x86-64-v2's 16) would leave most lanes idle.
SHORTEST_ROW = 16


class Refused(Exception):
    pass


class WidenPlan:
    """What the lowering of one task needs: the varying values, the masked loops, the `if`s
    after which lanes may have left a masked loop, the widest float type the body uses (W is
    the ISA level's lane count for it), and whether its adstacks count per lane."""

    def __init__(self, task: ir.Task):
        self.task = task
        self.varying: set = {task.index, *task.axis_index[-1:]}  # outer coordinates: uniform in a row
        self.masked_loops: set = set()
        self.kills: set = set()  # Ifs holding a break/continue of the innermost (masked) loop
        self.accumulators: dict = {}  # chunk_init alloca the body accumulates into -> its op (in program order)
        self.float_bits = 32
        self.has_adstacks = False
        self.lane_counts = False  # adstack operations in narrow code: each lane's stack keeps its own count
        self.registers = REGISTERS_PER_STEP  # W is this many vector registers' worth of lanes (`_size_lanes`)
        self.registers_reason: str | None = None  # why fewer than REGISTERS_PER_STEP, for `qdc inspect`
        self.lane_cap: int | None = None  # the most lanes worth running (a short constant range)
        self.data_dependent_loads = 0  # loads at addresses computed from data (`_indirect_accesses`)
        self.one_register_at_512_bits = False  # W is one register at AVX-512 (`_only_accumulations`)
        # Widened for its gathers alone (no inner loop): at an ISA level without gather
        # instructions the scalar code is as fast and far less code (widen_codegen.py)
        self.gathers_only = False
        # loop -> the varying loads in it that read the same element on every iteration, read once
        # before it instead (`_invariant_loads`)
        self.invariant_loads: dict = {}
        # atomics at an element no other iteration writes: plain read-modify-writes (`own_updates`)
        self.own_updates: set = set()


def plan(task: ir.Task) -> WidenPlan | str:
    """The plan for `task`, or why it keeps the scalar code."""
    if not widening_enabled():
        return f"the width-W lowering is off ({SCALAR_SWITCH}=0)"
    if task.kind != "range_for" or task.serial:
        return "a serial task"
    if task.axis_index and isinstance(task.axes[-1], ir.Const) and task.axes[-1].value < SHORTEST_ROW:
        return f"rows of {task.axes[-1].value} elements, fewer than a vector's lanes"
    # A local is varying once a varying value or narrow code stores to it; that may make more
    # values varying and more code narrow: walk again until no local changes (each walk only
    # adds, and a refusal stays one).
    varying_locals: set = set()
    while True:
        p = WidenPlan(task)
        walk = _Analysis(p, varying_locals)
        try:
            walk.block(task.body, narrow=False, loop=None)
        except Refused as e:
            return str(e)
        if walk.varying_stores <= varying_locals:
            break
        varying_locals |= walk.varying_stores
    has_inner_loop = any(isinstance(s, (ir.RangeFor, ir.While)) for s in ir.walk(task.body))
    if widening_mode() != "all" and not has_inner_loop:
        gathers, scatters = _indirect_accesses(task, p)
        if scatters:  # one atomic per lane, in order: no faster than the scalar loop, and more code
            return "no inner loop, and atomics at data-dependent addresses"
        if not gathers:  # LLVM's loop vectoriser widens the task's own loop as it is, in less build time
            return "no inner loop (LLVM's loop vectoriser widens the task's loop)"
    loops = [s for s in ir.walk(task.body) if isinstance(s, (ir.RangeFor, ir.While))]
    if loops and not p.has_adstacks and all(_unrolled_by_llvm(loop) for loop in loops):
        return "inner loops of a few constant trips, which LLVM unrolls to widen the task's loop"
    inner = _inner_loop_vectorised_by_llvm(task, p)
    if inner is not None:
        where = f" (line {inner.loc.line})" if inner.loc else ""
        return "an inner loop over contiguous elements, which LLVM's loop vectoriser widens" + where
    _size_lanes(task, p, has_inner_loop)
    p.invariant_loads = _invariant_loads(task, p)
    p.own_updates = own_updates(task)
    return p


# The cost model of W. Code size, and with it build time (LLVM's object emission above all),
# grows with W times the operations done lane by lane: a load or an atomic at a data-dependent
# address is one scalar access per lane (no gather or scatter instruction below AVX-512, and
# many of them at it), each with its address arithmetic. DiffMPM's P2G gradient took 2.4 s to
# build portable at four registers of lanes, 0.75 s at one (and ran as fast).
# Over this many lane-by-lane operations per step, W shrinks to fewer registers.
LANE_OPERATION_BUDGET = 256  # W (at the widest level) x accesses done lane by lane


def _size_lanes(task: ir.Task, p: WidenPlan, has_inner_loop: bool) -> None:
    """How many vector registers' worth of lanes W is (`p.registers`, at most `p.lane_cap`
    lanes), and why if fewer than REGISTERS_PER_STEP. Four hide the latency of a loop-carried
    chain, or of gathers from memory (see REGISTERS_PER_STEP; a gathering benchmark ran 6%
    slower at one); lane-by-lane accesses beyond the budget halve them, down to one."""
    gathers, atomics = _indirect_accesses(task, p)
    per_lane = gathers + atomics
    widest = lanes_for(512, p.float_bits) // REGISTERS_PER_STEP  # lanes of one register, widest level
    registers = REGISTERS_PER_STEP
    p.gathers_only = not has_inner_loop
    while registers > 1 and registers * widest * per_lane > LANE_OPERATION_BUDGET:
        registers //= 2
    reasons = []
    if registers < REGISTERS_PER_STEP:
        reasons.append(f"{registers} vector register{'s' if registers > 1 else ''} of lanes: {per_lane} "
                       f"accesses at data-dependent addresses, done lane by lane (code size)")
    p.registers, p.data_dependent_loads = registers, gathers
    trips = _constant_row(task)
    if trips is not None and registers * widest > trips:  # lanes beyond the row would only idle
        p.lane_cap = 1 << (max(trips, 2).bit_length() - 1)
        reasons.append(f"at most {p.lane_cap} lanes (one vector register at least): the range has {trips} "
                       f"iterations{' a row' if task.axis_index else ''}")
    elif registers == REGISTERS_PER_STEP and has_inner_loop and not gathers and not p.has_adstacks \
            and _only_accumulations(task):
        p.one_register_at_512_bits = True
        reasons.append("1 vector register of lanes at AVX-512: the inner loops carry only accumulations, "
                       "whose latency the next iterations' independent work hides")
    p.registers_reason = "; ".join(reasons) or None


_ACCUMULATING = ("add", "sub", "min", "max")


def _only_accumulations(task: ir.Task) -> bool:
    """Whether every float that the task's inner loops hand from one iteration to the next is
    an accumulation (`acc += f(...)`, min, max) of values computed without such floats, and at
    least one is: the chain from one iteration to the next is then one add, and the rest of
    each iteration (an all-pairs force's square root and division) is independent work that
    the CPU overlaps across iterations. So one AVX-512 register of lanes runs as fast as four
    (n-body's kick, one thread: 0.090 against 0.091 ms) in less build time. Narrower levels keep
    four registers: at x86-64-v3 the kick ran 15% slower at two (16 lanes), 20% at one. A chain
    through the iteration's own work (`v = sin(v)`, `z = z * z + c`) is bound by its latency: it
    keeps four registers at every level."""
    carried_any = False
    for loop in ir.walk(task.body):
        if not isinstance(loop, (ir.RangeFor, ir.While)):
            continue
        declared, read, writes = set(), set(), []
        for s in ir.walk_nested(loop):
            if isinstance(s, ir.ArrayStore) and s.array.type.is_float:
                return False  # a float carried in a local array: not counted as an accumulation
            if isinstance(s, ir.Alloca):
                declared.add(s)
            elif isinstance(s, ir.LocalLoad) and s.var.type.is_float:
                read.add(s.var)
            elif isinstance(s, (ir.LocalStore, ir.LocalAccumulate)) and s.var.type.is_float:
                writes.append(s)
        carried = {w.var for w in writes if w.var in read} - declared
        if not carried:
            continue
        carried_any = True
        for w in writes:
            if w.var not in carried:
                continue
            if isinstance(w, ir.LocalAccumulate):
                added = w.value if w.op in _ACCUMULATING else None
            else:
                added = _accumulated_term(w)
            if added is None or _reads_any(added, carried):
                return False
    return carried_any


def _accumulated_term(store: ir.LocalStore):
    """x where `store` writes `var op x` (op an accumulation, `var` read just before), else None."""
    v = store.value
    if not isinstance(v, ir.Binary) or v.op not in _ACCUMULATING:
        return None
    own = [o for o in (v.a, v.b) if isinstance(o, ir.LocalLoad) and o.var is store.var]
    if not own or v.op == "sub" and v.a not in own:
        return None
    return v.b if v.a in own else v.a


def _reads_any(value, carried: set) -> bool:
    """Whether `value` is computed from a load of one of the `carried` locals."""
    seen, todo = set(), [value]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        if isinstance(s, ir.LocalLoad) and s.var in carried:
            return True
        todo.extend(o for o in s.operands() if isinstance(o, ir.Stmt))
    return False


def _constant_row(task: ir.Task) -> int | None:
    """The iterations the lanes of a step share, if constant: a row of a multi-dimensional
    range, else the whole range."""
    if task.axis_index:
        last = task.axes[-1]
        return last.value if isinstance(last, ir.Const) else None
    if isinstance(task.begin, ir.Const) and isinstance(task.end, ir.Const):
        return max(task.end.value - task.begin.value, 0)
    return None


def _inner_loop_vectorised_by_llvm(task: ir.Task, p: WidenPlan):
    """An inner loop with uniform bounds that carries no float from one iteration to the next
    and reads or writes memory along its own index: the scalar code's loop vectoriser widens it
    with contiguous vector accesses, where lanes of the task's iterations would gather and
    scatter across rows. Such a task is faster as it is."""
    from ..llvm.llvm_arith import carries_state
    for loop in ir.walk(task.body):
        if not isinstance(loop, ir.RangeFor) or loop in p.masked_loops or carries_state(loop):
            continue
        along = {loop.index}
        for s in ir.walk_nested(loop):
            if isinstance(s, ir.Cast) and s.x in along or isinstance(s, ir.Binary) and s.op in ("add", "sub") \
                    and (s.a in along or s.b in along):
                along.add(s)
            elif isinstance(s, ir.GlobalPtr) and s.indices and s.indices[-1] in along:
                return loop
    return None


UNROLLED_TRIPS = 16  # a constant trip count up to this: LLVM unrolls the loop completely
# Math that the scalar code of a loop-carried chain calls from the C library (cpu/target.py's
# chain_math_table): unrolled or not, LLVM does not widen those calls.
CHAIN_MATH = ("sin", "cos", "tan", "exp", "log", "pow", "asin", "acos", "atan", "tanh", "atan2")


def _unrolled_by_llvm(loop) -> bool:
    """A loop with constant bounds and few trips, whose body LLVM's full unrolling copies out:
    then its loop vectoriser widens the task's loop over contiguous elements, as fast as lanes
    (a 2-D stencil with a 4-trip loop: 0.38 against 0.39 ms) in less build time."""
    return isinstance(loop, ir.RangeFor) and isinstance(loop.begin, ir.Const) and isinstance(loop.end, ir.Const) \
        and loop.end.value - loop.begin.value <= UNROLLED_TRIPS \
        and not any(isinstance(s, (ir.Break, ir.Continue)) or getattr(s, "op", None) in CHAIN_MATH
                    for s in ir.walk(loop.body))


def _coordinate_ranges(task: ir.Task) -> dict | None:
    """{the task's index and its row coordinates: (first, last) value of any iteration}, where the
    range and the row extents are constants; else None."""
    if not (isinstance(task.begin, ir.Const) and isinstance(task.end, ir.Const)) \
            or not all(isinstance(e, ir.Const) for e in task.axes):
        return None
    first, last = task.begin.value, task.end.value - 1
    if first > last or first < 0:
        return None
    ranges = {task.index: (first, last)}
    if task.axis_index:
        row = 1
        for extent in task.axes:
            row *= extent.value
        ranges[task.axis_index[0]] = (first // row, last // row)
        ranges.update((c, (0, e.value - 1)) for c, e in zip(task.axis_index[1:], task.axes))
    return ranges


def _statically_in_bounds(task: ir.Task):
    """A test of whether a GlobalPtr's element is in bounds for every iteration of `task`, known
    at compile time: each index a constant below its axis's extent, or the task's index or a row
    coordinate of it whose every value is (a field's; an ndarray's shape is known at launch only).
    None where the task's range is not constant."""
    ranges = _coordinate_ranges(task)
    if ranges is None:
        return None

    def in_bounds(ptr) -> bool:
        shape = getattr(ptr.target, "shape", None)
        return shape is not None and len(shape) == len(ptr.indices) and all(
            isinstance(i, ir.Const) and 0 <= i.value < n or i in ranges and ranges[i][1] < n
            for i, n in zip(ptr.indices, shape))
    return in_bounds


def _invariant_loads(task: ir.Task, p: WidenPlan) -> dict:
    """loop -> the varying loads inside it (at any depth) whose element is the same on every
    iteration and in bounds for every lane (`_statically_in_bounds`), from a field the loop does
    not write: read once before the loop, under the lanes that enter it, rather than gathered on
    every iteration. The scalar code's LICM does not move a load out of a branch, nor LLVM's a
    masked gather; n-body's kick gathered its body's position (`pos[i, k]`, strided) three times
    per pair, one load per lane at levels whose gathers LLVM does not use (x86-64-v2, v3). In
    bounds, reading the element early cannot fault, even for a lane whose iteration would not
    have read it."""
    in_bounds = _statically_in_bounds(task)
    if in_bounds is None:
        return {}
    hoisted, found = set(), {}
    for loop in ir.walk(task.body):  # outer loops first: a load goes before the outermost it can
        if not isinstance(loop, (ir.RangeFor, ir.While)):
            continue
        inside = list(ir.walk_nested(loop))
        written = {_memory(s.ptr.target) for s in inside if isinstance(s, (ir.GlobalStore, ir.AtomicRMW))}
        loads = [s for s in inside if isinstance(s, ir.GlobalLoad) and s not in hoisted and s in p.varying
                 and isinstance(s.ptr, ir.GlobalPtr) and _memory(s.ptr.target) not in written and in_bounds(s.ptr)]
        if loads:
            found[loop] = loads
            hoisted.update(loads)
    return found


def own_updates(task: ir.Task) -> set:
    """The atomics of the body at an element that no other iteration of the task writes, so that
    they need no atomic instruction on any thread: a plain read-modify-write (the scalar code,
    which the loop vectoriser widens whoever runs the chunk; W lanes: a gather, the operation and
    a scatter, or a loop over the lanes where the level has no scatter). So it is for a field
    every write of which in the task (store or atomic) has the task's index, or each of its row
    coordinates, at one axis each, the same axes for all writes (`_OwnElementAxes`): two
    iterations then never write one element, and the lanes of a step never coincide (n-body's
    `vel[i, 0] += ...`, `pos[i, k] += ...` of `for i, k in pos`, a gradient's `x.grad[f, p] +=
    ...`). Not for ndarrays: two arguments may be one array."""
    if task.kind != "range_for" or task.serial:
        return set()
    writes: dict = {}
    for s in ir.walk(task.body):
        if isinstance(s, (ir.GlobalStore, ir.AtomicRMW)):
            if not isinstance(s.ptr, ir.GlobalPtr):
                return set()
            writes.setdefault(_memory(s.ptr.target), []).append(s)
    own = set()
    axes = _OwnElementAxes(task)
    for field_writes in writes.values():
        if axes.of(field_writes):
            own.update(s for s in field_writes if isinstance(s, ir.AtomicRMW) and s.op in COMBINED_ATOMICS
                       and s.type is not T.u1)
    return own


class _OwnElementAxes:
    """Whether the writes of one field in `task` are each at the iteration's own element. An
    element's offset is the sum of index x stride over the axes: with the coordinates at the
    same axes in every write, each within its axis's extent below the first of them (constants
    there too), and the same value for every iteration above it (constants, arguments), two
    iterations' elements differ by their coordinates, unless the writes' values above differ
    and the first coordinate may leave its axis (then they must be the same values)."""

    def __init__(self, task: ir.Task):
        self.coordinates = {c: d for d, c in enumerate(task.axis_index)} or {task.index: 0}
        self.ranges = _coordinate_ranges(task) or {}
        self.invariant: dict = {}

    def of(self, writes: list) -> bool:
        shape = getattr(writes[0].ptr.target, "shape", None)
        if shape is None:
            return False
        patterns, prefixes = set(), set()
        for s in writes:
            indices = s.ptr.indices
            pattern = tuple(self.coordinates.get(i) for i in indices)
            if len(indices) != len(shape) or sorted(a for a in pattern if a is not None) != list(
                    range(len(self.coordinates))):
                return False
            first = next(k for k, a in enumerate(pattern) if a is not None)
            if not all(self.is_invariant(i) for i in indices[:first]) or not all(
                    self.within(i, n) for i, n in zip(indices[first + 1:], shape[first + 1:])):
                return False
            patterns.add(pattern)
            prefixes.add(tuple(i.value if isinstance(i, ir.Const) else i for i in indices[:first]))
        if len(patterns) != 1:
            return False
        first = next(k for k, a in enumerate(next(iter(patterns))) if a is not None)
        return len(prefixes) == 1 or self.within(writes[0].ptr.indices[first], shape[first])

    def within(self, index, extent: int) -> bool:
        """Whether `index` is within [0, extent) in every iteration, as known at compile time."""
        if isinstance(index, ir.Const):
            return 0 <= index.value < extent
        bounds = self.ranges.get(index)
        return bounds is not None and 0 <= bounds[0] and bounds[1] < extent

    def is_invariant(self, value) -> bool:
        """Whether `value` is the same in every iteration of a launch: constants, arguments,
        shapes and what the body computes from them alone."""
        known = self.invariant.get(value)
        if known is None:
            if isinstance(value, (ir.Const, ir.ArgLoad, ir.NdarrayShape)):
                known = True
            elif isinstance(value, (ir.Unary, ir.Binary, ir.Cast, ir.Select)):
                known = all(self.is_invariant(o) for o in value.operands())
            else:
                known = False
            self.invariant[value] = known
        return known


def _memory(target) -> tuple:
    """What identifies the memory of a field or ndarray (its companion gradient is other memory)."""
    return type(target).__name__, getattr(target, "slot", getattr(target, "arg_index", None)), target.is_grad


def _indirect_accesses(task: ir.Task, p: WidenPlan) -> tuple[int, int]:
    """(loads, atomics) of the body at addresses that vary with the lanes other than by the task
    index plus a uniform offset (data-dependent, as a grid cell computed from a position).
    LLVM's loop vectoriser does not widen a loop that gathers such addresses next to stores it
    cannot tell apart from them (G2P's reads of the grid: 3x faster at W lanes)."""
    along = {task.index, *task.axis_index}  # a coordinate of a multi-dimensional range: along a row
    indirect = set()
    for s in ir.walk(task.body):
        if isinstance(s, ir.Cast) and s.x in along or isinstance(s, ir.Binary) and s.op in ("add", "sub") \
                and (s.a in along and s.b not in p.varying or s.b in along and s.a not in p.varying):
            along.add(s)
        elif isinstance(s, ir.GlobalPtr) and any(i in p.varying and i not in along for i in s.indices):
            indirect.add(s)
    loads = sum(isinstance(s, ir.GlobalLoad) and s.ptr in indirect for s in ir.walk(task.body))
    atomics = sum(isinstance(s, ir.AtomicRMW) and s.ptr in indirect for s in ir.walk(task.body))
    return loads, atomics


class _Analysis:
    def __init__(self, p: WidenPlan, varying_locals: set):
        self.p, self.varying_locals = p, varying_locals
        self.varying_stores: set = set()  # locals this walk found a varying store to
        self.body_allocas: set = set()
        self.used: set = set()
        for block in (p.task.body, p.task.chunk_final):
            for s in ir.walk(block):
                self.used.update(s.operands())
        self.chunk_allocas = {s for s in p.task.chunk_init.stmts if isinstance(s, ir.Alloca)}

    def refuse(self, s, why: str):
        where = f" (line {s.loc.line})" if getattr(s, "loc", None) else ""
        raise Refused(why + where)

    def block(self, block: ir.Block, narrow: bool, loop) -> bool:
        """Walks `block`; whether it holds a break/continue of `loop` (not crossing inner loops)."""
        exits = False
        for s in block.stmts:
            exits |= self.stmt(s, narrow, loop)
        return exits

    def stmt(self, s, narrow: bool, loop) -> bool:
        p = self.p
        if not isinstance(s, SUPPORTED):
            self.refuse(s, f"{type(s).__name__} is not lowered at W lanes")
        if s.type is not None and not isinstance(s, ad.AdStackAlloca) and s.type not in _SCALAR_TYPES:
            self.refuse(s, f"a {s.type} value")
        if s.type is T.f64:
            p.float_bits = 64
        operands = s.operands()
        varying_in = any(o in p.varying for o in operands)
        if isinstance(s, ir.Alloca):
            self.body_allocas.add(s)
            if s in self.varying_locals:
                p.varying.add(s)
        elif isinstance(s, ir.LocalLoad):
            if s.var not in self.body_allocas:
                self.refuse(s, "a read of a chunk-level local")
            if s.var in self.varying_locals:
                p.varying.add(s)
        elif isinstance(s, ir.LocalArray):
            if s.type is T.u1:
                self.refuse(s, "a local array of u1")
            self.body_allocas.add(s)
            if s in self.varying_locals:
                p.varying.add(s)
        elif isinstance(s, ir.ArrayLoad):
            if s.array not in self.body_allocas:
                self.refuse(s, "a read of a chunk-level local")
            if varying_in:  # a varying array, or a varying index
                p.varying.add(s)
        elif isinstance(s, ir.ArrayStore):
            if s.array not in self.body_allocas:
                self.refuse(s, "a write of a chunk-level local")
            if narrow or varying_in:
                self.varying_stores.add(s.array)
        elif isinstance(s, ir.LocalStore):
            if s.var not in self.body_allocas:
                self.refuse(s, "a write of a chunk-level local")
            if narrow or varying_in:
                self.varying_stores.add(s.var)
        elif isinstance(s, ir.LocalAccumulate):
            if s.op not in ACCUMULATE_OPS:
                self.refuse(s, f"accumulate_{s.op}")
            if s.var in self.chunk_allocas:
                if p.accumulators.setdefault(s.var, s.op) != s.op:
                    self.refuse(s, "two kinds of accumulation into one local")
            elif s.var not in self.body_allocas:
                self.refuse(s, "an accumulation into a local of another scope")
            else:
                self.varying_stores.add(s.var)
        elif isinstance(s, (ir.AtomicRMW, ir.TempAtomic, ad.TempAtomicAdd)):
            op = getattr(s, "op", "add")
            if op not in COMBINED_ATOMICS:
                self.refuse(s, f"atomic {op}")
            if s in self.used:
                self.refuse(s, "an atomic whose old value is used")
        elif isinstance(s, ir.TempStore):
            if varying_in:
                self.refuse(s, "a varying value stored to a kernel temporary")
        elif isinstance(s, (ir.GlobalLoad,)):
            if varying_in:
                p.varying.add(s)
        elif isinstance(s, _ADSTACK):
            p.has_adstacks = True
            if narrow:  # lanes may push and pop different counts: a count per lane
                p.lane_counts = True
            if isinstance(s, ad.AdStackAlloca):
                if s.type not in _SCALAR_TYPES:
                    self.refuse(s, f"an adstack of {s.type}")
                if s.type is T.f64:
                    p.float_bits = 64
            if isinstance(s, ad.ADSTACK_READS):
                p.varying.add(s)
        elif isinstance(s, ir.If):
            varying = s.cond in p.varying
            exits = self.block(s.then_block, narrow or varying, loop)
            exits |= self.block(s.else_block, narrow or varying, loop)
            if exits and (varying or loop in p.masked_loops):
                self.mark_masked(loop, s)
            return exits
        elif isinstance(s, ir.RangeFor):
            masked = s.begin in p.varying or s.end in p.varying
            if masked:
                p.varying.add(s.index)
                p.masked_loops.add(s)
            self.loop_body(s, narrow)
            return False
        elif isinstance(s, ir.While):
            self.loop_body(s, narrow)
            return False
        elif isinstance(s, (ir.Break, ir.Continue)):
            if loop is None:
                self.refuse(s, f"{type(s).__name__.lower()} outside a loop of the body")
            return True
        elif isinstance(s, _PURE) and varying_in:
            p.varying.add(s)
        return False

    def loop_body(self, s, narrow: bool):
        """A loop's body; walked again if it turns out masked (then its body is narrow, which
        may refuse adstack operations in it, and `kills` must be complete)."""
        p = self.p
        before = (set(p.varying), set(p.masked_loops), set(p.kills))
        self.block(s.body, narrow or s in p.masked_loops, s)
        if s in p.masked_loops and not (narrow or s in before[1]):
            p.varying, p.masked_loops, p.kills = before[0], before[1] | {s}, before[2]
            if isinstance(s, ir.RangeFor):
                p.varying.add(s.index)
            self.block(s.body, True, s)

    def mark_masked(self, loop, if_stmt):
        self.p.masked_loops.add(loop)
        self.p.kills.add(if_stmt)


# W is this many vector registers' worth of lanes. A loop-carried chain (`v = sin(v)` repeated)
# is bound by the latency of each step, not by throughput: four independent registers in flight
# per step hide it (the dynamic-loop gradient on one thread of the 2-core VM, AVX-512: 1
# register 8.1 / 11.3 ms forward / grad, 2: 4.4 / 8.1, 4: 2.8 / 5.8; AVX2 14.2 / 20.2,
# 8.1 / 14.4, 5.0 / 10.1; SSE4 27 / 67, 18 / 37 at 4; 8 registers was slower again). The price
# is build time, about linear in W: that kernel's gradient builds in 131 / 217 / 327 ms native
# at 1 / 2 / 4 registers (before the lane-by-lane large trig reduction, inline_math_vector.py,
# which brought 4 to ~200 ms); tasks without an inner loop are not widened at all.
REGISTERS_PER_STEP = 4


def level_lanes(p: WidenPlan, vector_bits: int) -> int:
    """W of the plan at a level of `vector_bits` vector registers."""
    registers = 1 if p.one_register_at_512_bits and vector_bits >= 512 else p.registers
    return lanes_for(vector_bits, p.float_bits, registers, p.lane_cap)


def lanes_for(vector_bits: int, float_bits: int, registers: int = REGISTERS_PER_STEP, cap: int | None = None) -> int:
    """W: `registers` vector registers of `vector_bits` of the task's widest float, at most `cap`
    lanes but one register at least."""
    one = max(vector_bits // float_bits, 2)
    return max(min(one * registers, cap or one * registers), one)
