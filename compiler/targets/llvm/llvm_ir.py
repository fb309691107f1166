"""IR → LLVM IR (llvmlite). Shared by the LLVM-based backends; `cpu.py` adds the CPU driver.

Every task becomes `void @<task>_chunk(ptr ctx, iN begin, iN end)` running the task body for
indices [begin, end) (a serial task has no index and runs once), and an entry of its own,
`void @<task entry>(ptr ctx)`, that computes its range and dispatches it. The kernel entry
`void @<entry>(ptr ctx)` calls the task entries in order; how a range is split over threads
is the backend's business (the `dispatch` given to `emit_kernel`).
"""
from __future__ import annotations

from llvmlite import ir as ll
from llvmlite.ir._utils import NameScope

from qdc.runtime.contract import types as T
from qdc.runtime.contract.artifact import KernelMeta

from qdc.runtime.contract.bounds import MAX_AXES

from ... import ir
from ...passes.bounds_checks import checked_accesses
from ..base import Unsupported, lower_statement
from .llvm_adstack import AdStackLowering
from .llvm_arith import ArithLowering
from .llvm_atomics import AtomicLowering
from .llvm_local_arrays import LocalArrayLowering
from .llvm_messages import MessageLowering
from .llvm_simt import SimtLowering
from .llvm_types import FLOAT_BITS, I1, I8, I16, I64, PTR, VOID, float_suffix, lltype, memtype
from . import inline_math
from .target import Inline, Intrinsic, PerWidth


class ModuleBuilder:
    """One LLVM module holding one kernel (its tasks and entry point)."""

    def __init__(self, name: str, triple: str = "", data_layout: str = ""):
        self.module = ll.Module(name=name)
        if triple:
            self.module.triple = triple
        if data_layout:
            self.module.data_layout = data_layout
        self._decls: dict = {}

    def declare(self, name: str, ret, args) -> ll.Function:
        fn = self._decls.get(name) or self.module.globals.get(name)
        if fn is None:
            fn = ll.Function(self.module, ll.FunctionType(ret, args), name=name)
            self._decls[name] = fn
        return fn

    def math(self, impl, t, nargs: int) -> ll.Function:
        """The function implementing a math op for float type `t`, as the target's math table
        says (llvm/target.py): an overloaded intrinsic or a function the target links."""
        if isinstance(impl, PerWidth):
            impl = impl.for_bits(FLOAT_BITS[str(t)])
        if isinstance(impl, Intrinsic):
            return self.declare(f"{impl.name}.{float_suffix(t)}", t, [t] * nargs)
        if isinstance(impl, Inline):
            return inline_math.define(self.module, impl.op, FLOAT_BITS[str(t)])
        return self.declare(impl.name_for(FLOAT_BITS[str(t)]), t, [t] * nargs)


class KernelCodegen:
    """Lowers one offloaded KernelIR into `mb.module` following `meta`'s ctx layout."""

    # Atomics that a backend proved no other thread races with (the CPU's own-element updates,
    # cpu/widen_plan.own_updates): plain read-modify-writes.
    plain_updates: frozenset | set = frozenset()

    def __init__(self, mb: ModuleBuilder, kernel: ir.KernelIR, meta: KernelMeta, fast_math: bool = False, *,
                 target):
        self.mb, self.k, self.meta = mb, kernel, meta
        self.fast_math = fast_math
        self.target = target  # an LlvmTarget: its math table and thread slice index (target.py)
        self.param_slot = {i: p.slot for i, p in enumerate(meta.params)}
        # debug=True: the id of each checked access (meta.debug_checks is the table)
        self.check_id = {s: i for i, s in enumerate(checked_accesses(kernel))} if meta.debug_checks else {}
        assert len(self.check_id) == len(meta.debug_checks), "bounds-check table out of step with the IR"

    # ---- kernel and tasks -----------------------------------------------------------------
    def emit_kernel(self, dispatch) -> ll.Function:
        """`dispatch(builder, ctx, task, chunk_fn, begin, end)` emits the range launch of a task.
        Each task gets its own entry `void @<task entry>(ptr ctx)` (its record's `entry`: the
        asynchronous path launches tasks one by one), and the kernel entry `void @<entry>(ptr
        ctx)` calls them in order (the fast path: one foreign call runs the whole kernel)."""
        task_entries = [self.emit_task_entry(task, record.entry, dispatch)
                        for task, record in zip(self.k.tasks, self.meta.tasks)]
        entry = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR]), name=self.meta.entry)
        b = start_function(entry)
        ctx = entry.args[0]
        ctx.add_attribute("noalias")
        for fn in task_entries:
            b.call(fn, [ctx])
        b.ret_void()
        return entry

    def emit_task_entry(self, task: ir.Task, name: str, dispatch) -> ll.Function:
        """`void @<name>(ptr ctx)`: the whole task, its range computed from the ctx."""
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR]), name=name)
        b = start_function(fn)
        ctx = fn.args[0]
        ctx.add_attribute("noalias")
        chunk = self.emit_chunk(task)
        if task.kind == "serial":
            b.call(chunk, [ctx])
        else:
            env = _Env(self, b, ctx)
            env.block(task.prologue)
            begin, end = env.v(task.begin), env.v(task.end)
            dispatch(b, ctx, task, chunk, begin, end, self.task_cost(task))
        b.ret_void()
        return fn

    def outlined_regions(self, task: ir.Task) -> dict:
        """The statements of `task`'s body lowered as functions of their own (`emit_outlined`,
        the CPU's: llvm_outline.py), as keys; none by default."""
        return {}

    @staticmethod
    def task_cost(task: ir.Task) -> int:
        """A rough per-iteration cost (statements, inner loops weighted) used to decide threading
        (also by adstack sizing, which must know how many threads a launch will use)."""
        def cost(block, weight):
            total = 0
            for s in block.stmts:
                total += weight
                for blk in s.blocks():
                    total += cost(blk, weight * (32 if isinstance(s, (ir.RangeFor, ir.While)) else 1))
            return total
        return cost(task.body, 1)

    def emit_chunk(self, task: ir.Task) -> ll.Function:
        """`<task>_chunk(ctx)` for a serial task; `<task>_chunk(ctx, begin, end, alone)` for a
        range-for task: its chunk_init, the body for every index in [begin, end), then (if the
        chunk was not empty) its chunk_final. `alone` (i1, see `_Env.atomic_update`): no other
        thread runs any code of the launch meanwhile."""
        if task.kind == "serial":
            fnty = ll.FunctionType(VOID, [PTR])
        else:
            fnty = chunk_type(task)
        fn = ll.Function(self.mb.module, fnty, name=task.task_name + "_chunk")
        fn.linkage = "internal"
        fn.args[0].add_attribute("noalias")
        b = start_function(fn)
        env = _ChunkEnv(self, b, fn.args[0])
        env.regions = self.outlined_regions(task)
        if task.kind == "serial":
            env.block(task.body)
            if not b.block.is_terminated:
                b.ret_void()
            return fn
        begin, end, env.alone = fn.args[1], fn.args[2], fn.args[3]
        env.block(task.chunk_init)
        if task.axis_index:
            self.emit_rows(env, task, begin, end)
        else:
            env.loop(begin, end, task.body, env.binder(task.index))
        if task.chunk_final.stmts:
            with b.if_then(b.icmp_signed("<", begin, end)):
                env.block(task.chunk_final)
        b.ret_void()
        return fn

    def emit_rows(self, env: "_Env", task: ir.Task, begin, end) -> None:
        """The body for every index in [begin, end), walked as rows of the task's grid
        (`Task.axes`): the first index is divided into coordinates once, the innermost
        coordinate is each row's loop variable, and the outer ones carry like an odometer."""
        b, it = env.b, begin.type
        extents = [env.v(a) for a in task.axes]
        coords = [env.entry_alloca(it, f"coord{d}") for d in range(len(task.axis_index))]
        flat = env.entry_alloca(it, "row_start")
        start_bb, head, exit_bb = (b.append_basic_block(n) for n in ("rows.start", "rows.head", "rows.exit"))
        b.cbranch(b.icmp_signed("<", begin, end), start_bb, exit_bb)
        b.position_at_end(start_bb)  # the range is not empty: every extent is >= 1
        store_coordinates(b, begin, coords, extents)
        b.store(begin, flat)
        b.branch(head)
        b.position_at_end(head)
        start = b.load(flat, typ=it)
        for c, coord in zip(task.axis_index[:-1], coords[:-1]):
            env.vals[c] = b.load(coord, typ=it)
        first = b.load(coords[-1], typ=it)
        length = b.sub(extents[-1], first)
        length = b.select(b.icmp_signed("<", b.sub(end, start), length), b.sub(end, start), length)
        self.emit_row(env, task, first, b.add(first, length, flags=("nsw",)), b.sub(start, first), exit_bb)
        after = b.add(start, length, flags=("nsw",))
        b.store(after, flat)
        b.store(ll.Constant(it, 0), coords[-1])
        carry_to_outer_coordinates(b, coords, extents, ll.Constant(I1, 1))
        b.cbranch(b.icmp_signed("<", after, end), head, exit_bb)
        b.position_at_end(exit_bb)

    @staticmethod
    def emit_row(env: "_Env", task: ir.Task, first, stop, row_base, exit_bb) -> None:
        """One row: the innermost coordinate runs over [first, stop) and the flat index is
        `row_base` plus it. A `break` (serialized loops) leaves the whole chunk."""
        def bind(col):
            env.vals[task.axis_index[-1]] = col
            env.vals[task.index] = env.b.add(row_base, col, flags=("nsw",))
        env.loop(first, stop, task.body, bind, break_to=exit_bb, name="row")


def store_coordinates(b: ll.IRBuilder, index, coords: list, extents: list) -> None:
    """The coordinates of flat `index` in the row-major grid into the slots `coords` (every
    extent >= 1: `extents[d - 1]` is coordinate d's)."""
    rest = index
    for coord, extent in zip(reversed(coords[1:]), reversed(extents)):
        b.store(b.srem(rest, extent), coord)
        rest = b.sdiv(rest, extent)
    b.store(rest, coords[0])


def carry_to_outer_coordinates(b: ll.IRBuilder, coords: list, extents: list, carry) -> None:
    """The outer coordinates (slots `coords[:-1]`) after the innermost one wrapped (`carry`, an
    i1) as an odometer: `extents[d - 1]` is coordinate d's extent."""
    it = extents[-1].type
    for d in reversed(range(len(coords) - 1)):
        bumped = b.add(b.load(coords[d], typ=it), b.zext(carry, it))
        if d > 0:
            carry = b.icmp_signed("==", bumped, extents[d - 1])
            bumped = b.select(carry, ll.Constant(it, 0), bumped)
        b.store(bumped, coords[d])


def chunk_type(task: ir.Task) -> ll.FunctionType:
    """`void (ptr ctx, iN begin, iN end, i1 alone)`: a range-for task's chunk (KernelCodegen.emit_chunk)."""
    it = lltype(task.index.type)
    return ll.FunctionType(VOID, [PTR, it, it, I1])


def start_function(fn: ll.Function) -> ll.IRBuilder:
    """An entry block reserved for allocas, branching to the block the returned builder fills."""
    if type(fn.scope) is NameScope:
        fn.scope = _ValueNames(fn.scope)
    entry = fn.append_basic_block("allocas")
    body = fn.append_basic_block("body")
    ll.IRBuilder(entry).branch(body)
    return ll.IRBuilder(body)


class _ValueNames(NameScope):
    """The names of a function's values as llvmlite's NameScope gives them, an unnamed value's
    (most of them) without its general deduplication: llvmlite names those ".1", ".2", ... (the
    first number after the last one given that no value holds), which is a third of the cost
    of making an instruction. Takes over `scope`'s names (the function's arguments')."""

    def __init__(self, scope: NameScope):
        super().__init__()
        self._useset, self._basenamemap = scope._useset, scope._basenamemap

    def register(self, name, deduplicate=False):
        if name or not deduplicate:
            return super().register(name, deduplicate)
        used, numbers = self._useset, self._basenamemap
        number = numbers[""] + 1
        name = f".{number}"
        while name in used:
            number += 1
            name = f".{number}"
        numbers[""] = number
        used.add(name)
        return name


class _Env(AdStackLowering, ArithLowering, AtomicLowering, LocalArrayLowering, MessageLowering, SimtLowering):
    """Emission state inside one LLVM function."""

    def __init__(self, cg: KernelCodegen, builder: ll.IRBuilder, ctx):
        self.cg, self.b, self.ctx = cg, builder, ctx
        self.vals: dict = {}
        self.loops: list = []  # (continue_target, break_target)
        self.mb = cg.mb
        self.alloca_builder = None
        self.flags = ("fast",) if cg.fast_math else ()
        self.where = None  # source location of the innermost statement being lowered that has one
        self.enclosing_loops: list = []  # the loops around the statement being lowered, outermost first
        self.carrying: dict = {}  # loop -> carries_state(loop), found only where math is lowered
        self.alone = None  # an i1: this thread runs alone (plain read-modify-writes); None: it may not
        self.values_block, self.block_values = None, {}  # in_block's values of the builder's block
        self.regions: dict = {}  # statements lowered as a call (KernelCodegen.outlined_regions)

    def v(self, s):
        return self.vals[s]

    def ctx_word(self, slot: int, typ):
        """Word `slot` of the ctx as a `typ`, read once per block: the ctx does not change while
        a kernel runs, and a kernel's field and ndarray accesses read their base pointers and
        extents over and over (a third of a large kernel's instructions)."""
        return self.in_block(("ctx", slot, str(typ)), lambda: self.b.load(
            self.b.gep(self.ctx, [ll.Constant(I64, slot)], source_etype=I64), typ=typ))

    def in_block(self, key, make):
        """The value `make()` emits, emitted once per block for `key` (which names its operands:
        an llvmlite value by its id), and the same value again later in the block: a value that
        only depends on its operands (a ctx word, an index widened to 64 bits). LLVM merges the
        copies anyway (EarlyCSE: the same code after it), but each copy is generated, printed and
        parsed first. The instructions a reuse saves are counted (`count_unemitted`)."""
        block = self.b.block
        if block is not self.values_block:
            self.values_block, self.block_values = block, {}
        known = self.block_values.get(key)
        if known is not None:
            self.count_unemitted(known[1])
            return known[0]
        emitted = len(block.instructions)
        value = make()
        self.block_values[key] = (value, len(block.instructions) - emitted)
        return value

    def count_unemitted(self, instructions: int) -> None:
        """Count `instructions` that the function would have had without a value's reuse or
        folding, in `unemitted_instructions` of the function (llvm_pipeline's size of a function
        is the one its thresholds were measured with, so a kernel builds with the same pipeline
        and the same bytes)."""
        fn = self.b.function
        fn.unemitted_instructions = getattr(fn, "unemitted_instructions", 0) + instructions

    def entry_alloca(self, typ, name=""):
        """Allocas go in the function's entry block (so mem2reg promotes them), which holds
        nothing else: every function body starts in a second block, see `start_function`."""
        blk = self.b.function.entry_basic_block
        if self.alloca_builder is None:
            self.alloca_builder = ll.IRBuilder(blk)
        self.alloca_builder.position_before(blk.terminator)
        space = getattr(self.cg.target, "alloca_addrspace", 0)
        if not space:
            return self.alloca_builder.alloca(typ, name=name)
        # a target whose stack is an address space of its own (AMDGPU: 5): cast to the flat
        # pointer every other access uses; the optimiser infers the address space back
        slot = _SpacedAlloca(self.alloca_builder.block, typ, space, name)
        self.alloca_builder._insert(slot)
        return self.alloca_builder.addrspacecast(slot, PTR)

    # ---- structure ------------------------------------------------------------------------
    def block(self, block: ir.Block):
        for s in block.stmts:
            if self.b.block.is_terminated:
                return  # code after break/continue is unreachable
            self.stmt(s)

    def binder(self, index: ir.LoopIndex):
        """`bind` for `loop`: the counter is the value of `index`."""
        def bind(i):
            self.vals[index] = i
        return bind

    def loop(self, begin, end, body: ir.Block, bind, break_to=None, name="loop", step=None):
        """A counted loop over [begin, end) running `body`; `bind(i)` publishes the counter as the
        values the body reads. `continue` goes to the next count, `break` to `break_to` (default:
        right after this loop). `step` (a value of the counter's type; default 1) is a GPU's
        grid stride: the caller makes sure `end + step` cannot overflow the counter."""
        b = self.b
        it = begin.type
        var = self.entry_alloca(it, name)
        b.store(begin, var)
        head, body_bb, latch, exit_bb = (b.append_basic_block(f"{name}.{part}")
                                         for part in ("head", "body", "latch", "exit"))
        b.branch(head)
        b.position_at_end(head)
        i = b.load(var, typ=it)
        b.cbranch(b.icmp_signed("<", i, end), body_bb, exit_bb)
        b.position_at_end(body_bb)
        bind(i)
        self.loops.append((latch, break_to or exit_bb))
        self.block(body)
        self.loops.pop()
        if not b.block.is_terminated:
            b.branch(latch)
        b.position_at_end(latch)
        b.store(b.add(b.load(var, typ=it), step if step is not None else ll.Constant(it, 1), flags=("nsw",)), var)
        b.branch(head)
        b.position_at_end(exit_bb)

    def stmt(self, s: ir.Stmt):
        """Lowers `s`; what goes wrong is a QdcCompileError at its line (or its nearest located
        enclosing statement's), naming it."""
        if s in self.regions:
            return self.cg.emit_outlined(self, s)
        r = lower_statement(self, self.cg.k, s, self.lower_stmt, "generating code")
        if r is not None:
            self.vals[s] = r

    def lower_stmt(self, s: ir.Stmt):
        method = getattr(self, "s_" + type(s).__name__, None)
        if method is None:
            raise Unsupported(f"target '{self.cg.target.arch}' cannot generate code for {type(s).__name__}")
        return method(s)

    # ---- values ---------------------------------------------------------------------------
    def s_Const(self, s):
        t = lltype(s.type)
        if s.type is T.u1:
            return ll.Constant(I1, int(bool(s.value)))
        return ll.Constant(t, s.value)

    def s_ArgLoad(self, s):
        v = self.ctx_word(self.cg.param_slot[s.arg_index], memtype(s.type) if s.type is not T.f16 else I16)
        if s.type is T.f16:
            return self.b.bitcast(v, ll.HalfType())
        return self.b.trunc(v, I1) if s.type is T.u1 else v

    def s_NdarrayShape(self, s):
        v = self.ctx_word(self.cg.param_slot[s.arg_index] + 1 + s.dim, I64)
        return self.b.trunc(v, lltype(s.type)) if s.type.bits < 64 else v

    def s_RandomState(self, s):
        word = self.ctx_word(self.cg.meta.random_slot + s.word // 2, I64)  # two u32 words per ctx word, low first
        if s.word % 2:
            word = self.b.lshr(word, ll.Constant(I64, 32))
        return self.b.trunc(word, lltype(s.type))


    # ---- locals and temporaries ---------------------------------------------------------------
    def s_Alloca(self, s):
        slot = self.entry_alloca(lltype(s.type), s.var_name)
        self.b.store(ll.Constant(lltype(s.type), 0 if not s.type.is_float else 0.0), slot)
        return slot

    def s_LocalLoad(self, s):
        return self.b.load(self.v(s.var), typ=lltype(s.type))

    def s_LocalStore(self, s):
        self.b.store(self.v(s.value), self.v(s.var))

    def temp_ptr(self, slot):
        base = self.ctx_word(self.cg.meta.temps_slot, PTR)
        return self.b.gep(base, [ll.Constant(I64, slot)], source_etype=I64)

    def s_TempLoad(self, s):
        v = self.b.load(self.temp_ptr(s.slot), typ=memtype(s.type))
        return self.b.trunc(v, I1) if s.type is T.u1 else v

    def s_TempStore(self, s):
        v = self.v(s.value)
        if s.value.type is T.u1:
            v = self.b.zext(v, I8)
        self.b.store(v, self.temp_ptr(s.slot))

    # ---- globals --------------------------------------------------------------------------------
    def global_base(self, target):
        """(base pointer, [extent of each axis as i64]) of a field or ndarray (argument or grad)."""
        if isinstance(target, ir.SharedRef):
            return self.shared_base(target)
        if isinstance(target, ir.FieldRef):
            return (self.ctx_word(self.cg.meta.field_slot0 + target.slot, PTR),
                    [ll.Constant(I64, d) for d in target.shape])
        slot = self.cg.param_slot[target.arg_index]
        return (self.ctx_word(slot + 1 + target.ndim if target.is_grad else slot, PTR),
                [self.ctx_word(slot + 1 + d, I64) for d in range(target.ndim)])

    def s_GlobalPtr(self, s):
        b = self.b
        target = s.target
        base, dims = self.global_base(target)
        linear = None
        indices = []
        for idx, dim in zip(s.indices, dims):
            i = self.v(idx)
            if i.type.width < 64:
                if isinstance(i, ll.Constant):
                    i = _widened(i, idx.type.kind == "int")
                    self.count_unemitted(1)
                else:
                    i = self.in_block(("index", id(i)), lambda: b.sext(i, I64) if idx.type.kind == "int"
                                      else b.zext(i, I64))
            indices.append(i)
            linear = i if linear is None else b.add(b.mul(linear, dim, flags=("nsw",)), i, flags=("nsw",))
        if linear is None:
            return base
        ptr = b.gep(base, [linear], inbounds=True, source_etype=memtype(s.type))
        check = self.cg.check_id.get(s)
        return ptr if check is None else self.bounds_checked(ptr, check, indices, dims)

    def bounds_checked(self, ptr, check: int, indices: list, dims: list):
        """`ptr` if every index is below its dimension (one unsigned compare each, which also
        catches negative ones), else the error buffer's scratch element, after recording the
        first failing axis and its index there (runtime/contract/bounds.py)."""
        b = self.b
        in_range = [b.icmp_unsigned("<", i, d) for i, d in zip(indices, dims)]
        ok = in_range[0]
        for r in in_range[1:]:
            ok = b.and_(ok, r)
        checked = b.block
        fail = b.append_basic_block("bounds.fail")
        cont = b.append_basic_block("bounds.ok")
        br = b.cbranch(ok, cont, fail)
        br.set_weights([1 << 20, 1])
        b.position_at_end(fail)
        code, value = ll.Constant(I64, 0), ll.Constant(I64, 0)
        for axis in reversed(range(len(indices))):  # the first failing axis is reported
            bad = b.not_(in_range[axis])
            code = b.select(bad, ll.Constant(I64, check * MAX_AXES + axis + 1), code)
            value = b.select(bad, indices[axis], value)
        errors = self.ctx_word(self.cg.meta.debug_slot, PTR)
        b.call(self.bounds_fail_fn(), [errors, code, value])
        scratch = b.gep(errors, [ll.Constant(I64, 2)], source_etype=I64)
        b.branch(cont)
        b.position_at_end(cont)
        out = b.phi(PTR)
        out.add_incoming(ptr, checked)
        out.add_incoming(scratch, fail)
        return out

    def bounds_fail_fn(self) -> ll.Function:
        """`void qdc_bounds_fail(ptr errors, i64 code, i64 index)`: the first failure of a
        launch (compare-and-swap from 0) stores its code and index."""
        fn = self.mb.module.globals.get("qdc_bounds_fail")
        if fn is not None:
            return fn
        fn = ll.Function(self.mb.module, ll.FunctionType(VOID, [PTR, I64, I64]), name="qdc_bounds_fail")
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        fn.attributes.add("cold")
        errors, code, index = fn.args
        b = ll.IRBuilder(fn.append_basic_block("entry"))
        won = b.extract_value(b.cmpxchg(errors, ll.Constant(I64, 0), code, "monotonic", "monotonic"), 1)
        with b.if_then(won):
            b.store(index, b.gep(errors, [ll.Constant(I64, 1)], source_etype=I64))
        b.ret_void()
        return fn

    def s_GlobalLoad(self, s):
        v = self.b.load(self.v(s.ptr), typ=memtype(s.type), align=s.type.nbytes)
        return self.b.icmp_unsigned("!=", v, ll.Constant(I8, 0)) if s.type is T.u1 else v

    def s_GlobalStore(self, s):
        v = self.v(s.value)
        if s.value.type is T.u1:
            v = self.b.zext(v, I8)
        self.b.store(v, self.v(s.ptr), align=s.value.type.nbytes)

    # ---- control flow ---------------------------------------------------------------------------
    def s_If(self, s):
        b = self.b
        then_bb = b.append_basic_block("if.then")
        else_bb = b.append_basic_block("if.else")
        merge = b.append_basic_block("if.end")
        b.cbranch(self.v(s.cond), then_bb, else_bb)
        for bb, blk in ((then_bb, s.then_block), (else_bb, s.else_block)):
            b.position_at_end(bb)
            self.block(blk)
            if not b.block.is_terminated:
                b.branch(merge)
        b.position_at_end(merge)

    def s_RangeFor(self, s):
        self.enclosing_loops.append(s)
        self.loop(self.v(s.begin), self.v(s.end), s.body, self.binder(s.index))
        self.enclosing_loops.pop()

    def s_While(self, s):
        self.enclosing_loops.append(s)
        self.while_loop(s)
        self.enclosing_loops.pop()

    def while_loop(self, s):
        b = self.b
        head = b.append_basic_block("while.body")
        exit_bb = b.append_basic_block("while.exit")
        b.branch(head)
        b.position_at_end(head)
        self.loops.append((head, exit_bb))
        self.block(s.body)
        self.loops.pop()
        if not b.block.is_terminated:
            b.branch(head)
        b.position_at_end(exit_bb)

    def s_Break(self, s):
        self.b.branch(self.loops[-1][1])

    def s_Continue(self, s):
        self.b.branch(self.loops[-1][0])

    def s_LoopIndex(self, s):  # defined by its loop
        return None


class _ChunkEnv(_Env):
    """`_Env` plus the statements only task chunks contain."""

    def s_LocalAccumulate(self, s):
        """`var = op(var, value)` with reassociation allowed: lets LLVM vectorise the loop."""
        b, t = self.b, s.var.type
        var, x = self.v(s.var), self.v(s.value)
        old = b.load(var, typ=lltype(t))
        if t.is_float:
            if s.op == "add":
                new = b.fadd(old, x, flags=("reassoc",) + self.flags)
            elif s.op == "mul":
                new = b.fmul(old, x, flags=("reassoc",) + self.flags)
            else:
                fn = self.mb.declare(f"llvm.{s.op}num.{float_suffix(old.type)}", old.type, [old.type, old.type])
                new = b.call(fn, [old, x], fastmath=("reassoc",))
        elif s.op in ("min", "max"):
            kind = ("s" if t.kind == "int" else "u") + s.op
            fn = self.mb.declare(f"llvm.{kind}.i{t.bits}", old.type, [old.type, old.type])
            new = b.call(fn, [old, x])
        else:
            new = {"add": b.add, "mul": b.mul, "and": b.and_, "or": b.or_, "xor": b.xor}[s.op](old, x)
        b.store(new, var)


class _SpacedAlloca(ll.instructions.AllocaInstr):
    """An alloca in address space `space` (llvmlite's IRBuilder.alloca has no address space)."""

    def __init__(self, parent, typ, space: int, name: str):
        super().__init__(parent, typ, None, name)
        self.type, self.space = ll.PointerType(addrspace=space), space

    def descr(self, buf):
        super().descr(buf)
        buf.append(f", addrspace({self.space})")


def _widened(c: ll.Constant, signed: bool) -> ll.Constant:
    """The i64 constant that sign- (`signed`) or zero-extends the integer constant `c`, as LLVM
    would fold the extension."""
    bits = c.type.width
    value = int(c.constant) % (1 << bits)
    return ll.Constant(I64, value - (1 << bits) if signed and value >> (bits - 1) else value)
