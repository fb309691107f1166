"""One task of an offloaded kernel -> one SPIR-V compute module, following the Vulkan ABI
(compiler/targets/vulkan/target.py's docstring has it in full).

Shape of every module: one entry point, named as the task record's "entry" (so a module
swapped into another task's place is refused at load: runtime/contract/entry_points.py),
GLCompute, WorkgroupSize = (spec 0, spec 1, spec 2). The task prologue computes [begin,
end); invocation `id` runs iterations id, id + total, ... of the n = end - begin
(grid-stride: correct for any grid), `total` being the dispatched invocation count. A task's
`chunk_init` / `chunk_final` run once per invocation around its iterations: per-invocation
partials, combined across the subgroup, then one atomic per subgroup (memory.py,
flush_partial). A serial task, and a serial range-for, run on invocation 0 only. A task given a
`grid_temp` also computes its own grid when specialised to (runtime/contract/spirv_args.py,
GRID_BLOCK_SPEC_ID): its bounds come from device memory, and the host never reads them back.

Buffers are storage buffers in descriptor set 0, bound as the task record's "bindings" says.
A buffer used through several element types (u32 words and an f32 atomic on the temporaries,
say) gets one variable per type, all at its binding. With `address_arrays` the fields and
ndarrays are reached through their buffer device addresses instead (memory.py), for tasks
that use more arrays than a device lets one shader bind.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T
from qdc.runtime.contract.spirv_args import (GRID_BLOCK_SPEC_ID, GRID_CAP_SPEC_ID, SERIAL_CHUNK_SPEC_ID,  # the ABI
                                             arg_words)  # the devices share

from ... import ir
from ...passes.bounds_checks import checked_accesses
from ...ir.adstack import AdStackAlloca
from ..base import Capabilities, Unsupported, lower_statement
from .adstack import AdStackLowering
from .arith import ValueLowering
from .builder import FunctionBuilder, ModuleBuilder
from .local_arrays import LocalArrayLowering
from .memory import MemoryLowering
from .messages import MessageLowering
from .simt import SimtLowering
from .spec import GLSL, BuiltIn, Decoration, Op, StorageClass

DESCRIPTOR_SET = 0
DEFAULT_SPEC_BLOCK_DIM = 128  # the WorkgroupSize's default; the device always specialises it


class TaskLowering(SimtLowering, ValueLowering, MemoryLowering, LocalArrayLowering, AdStackLowering, MessageLowering):
    def __init__(self, kernel: ir.KernelIR, task: ir.Task, entry: str, capabilities: Capabilities, arch: str,
                 block_dim: int | None, debug: bool = False, fast_math: bool = False, address_arrays: bool = False,
                 grid_temp: int | None = None):
        self.k, self.task, self.entry, self.caps, self.arch = kernel, task, entry, capabilities, arch
        self.grid_temp = grid_temp  # the temporaries its grid goes to (grid_on_device), else None
        self.fast_math = fast_math
        self.m = ModuleBuilder()
        self.m.preserve_ieee = not fast_math
        self.fb = FunctionBuilder(self.m, self.m.void(), entry)
        self.vals: dict = {}
        self.loops: list = []          # (continue label, break label), innermost last
        self.where = None              # source location of the innermost located statement
        self.bindings: dict = {}       # (resource, index) -> binding number
        self.views: dict = {}          # (resource, index, element type id) -> variable
        # address_arrays: (resource, index) of each array reached by address -> its slot in "addresses"
        self.addressed: dict | None = {} if address_arrays else None
        self.aligned: dict = {}        # PhysicalStorageBuffer pointer id -> its alignment in bytes
        self.entry_values: dict = {}   # what memory.py's entry_value computed once, by key
        self.pointers: dict = {}       # GlobalPtr -> ((resource, index), linear index id)
        self.index_types: dict = {}    # GlobalPtr -> the type of its linear index (i32 or i64)
        *self.arg_word, self.random_word = arg_words(kernel.params)
        self.block_dim = block_dim or DEFAULT_SPEC_BLOCK_DIM
        # debug=True: GlobalPtr -> its check id (runtime/contract/bounds.py); `guards`: the
        # in-range condition of a checked pointer, which its store or atomic waits for
        self.check_ids = {p: i for i, p in enumerate(checked_accesses(kernel))} if debug else {}
        self.guards: dict = {}
        self.flushing_partials = False  # lowering chunk_final's atomics (memory.py, flush_partial)
        self.has_adstacks = any(isinstance(s, AdStackAlloca) for s in ir.walk_nested(task))

    # ---- types ----------------------------------------------------------------------------------
    def ty(self, t: T.DataType) -> int:
        if t is T.u1:
            return self.m.bool()
        if t.bits == 64 and not (self.caps.float64 if t.is_float else self.caps.int64):
            raise Unsupported(f"type {t.name} needs {'Float64' if t.is_float else 'Int64'}, which target "
                              f"'{self.arch}' does not have")
        return self.m.float(t.bits) if t.is_float else self.m.int(t.bits, t.kind == "int")

    def mem_type(self, t: T.DataType) -> T.DataType:
        """In memory a u1 is a byte."""
        return T.u8 if t is T.u1 else t

    def v(self, s):
        return self.vals[s]

    # ---- module ---------------------------------------------------------------------------------
    def lower(self) -> tuple[bytes, list]:
        """(the module's bytes, the task's bindings [[set, binding, resource, index], ...])."""
        self.builtins()
        task = self.task
        if task.kind == "serial":
            self.if_then(self.boolean(Op.IEqual, self.invocation, self.c(T.u32, 0)), lambda: self.block(task.body))
        else:
            self.range_task(task)
        if not self.fb.terminated:
            self.fb.ret()
        self.fb.finish()
        self.m.compute_entry_point(self.fb.id, self.entry)
        bindings = [[DESCRIPTOR_SET, b, resource, index] for (resource, index), b in self.bindings.items()]
        return self.m.to_bytes(), bindings

    def builtins(self) -> None:
        """`invocation` (the flat invocation id) and `total` (invocations dispatched), u32, per
        the ABI's 2-D grid: id = gid.x + gid.y * (groups.x * B)."""
        m, fb = self.m, self.fb
        u32 = self.ty(T.u32)
        v3 = m.vector(u32, 3)
        size_x = m.spec_const(u32, self.block_dim, 0)
        size = m.spec_composite(v3, size_x, m.spec_const(u32, 1, 1), m.spec_const(u32, 1, 2))
        m.decorate(size, Decoration.BuiltIn, BuiltIn.WorkgroupSize)
        gid_var = m.global_variable(v3, StorageClass.Input, "gl_GlobalInvocationID")
        m.decorate(gid_var, Decoration.BuiltIn, BuiltIn.GlobalInvocationId)
        groups_var = m.global_variable(v3, StorageClass.Input, "gl_NumWorkGroups")
        m.decorate(groups_var, Decoration.BuiltIn, BuiltIn.NumWorkgroups)
        gid, groups = fb.emit(Op.Load, v3, gid_var), fb.emit(Op.Load, v3, groups_var)
        gx, gy = (fb.emit(Op.CompositeExtract, u32, gid, i) for i in (0, 1))
        nx, ny = (fb.emit(Op.CompositeExtract, u32, groups, i) for i in (0, 1))
        self.block_size, self.groups = size_x, (nx, ny)  # for qd.simt's indices (simt.py)
        row = self.op(Op.IMul, T.u32, nx, size_x)
        self.invocation = self.op(Op.IAdd, T.u32, gx, self.op(Op.IMul, T.u32, gy, row))
        self.total = self.op(Op.IMul, T.u32, row, ny)

    def range_task(self, task: ir.Task) -> None:
        self.block(task.prologue)
        it = task.index.type
        begin, end = self.v(task.begin), self.v(task.end)
        n = self.op(Op.ISub, it, end, begin)
        if self.grid_temp is None:
            self.iterate(task, it, begin, n)
            return
        grid_block = self.m.spec_const(self.ty(T.u32), 0, GRID_BLOCK_SPEC_ID)
        self.if_then(self.boolean(Op.INotEqual, grid_block, self.c(T.u32, 0)),
                     lambda: self.write_grid(it, n, grid_block), lambda: self.iterate(task, it, begin, n))

    def write_grid(self, it: T.DataType, n: int, block: int) -> None:
        """Invocation 0 writes the task's dispatch, (min(ceil(n / block), cap), 1, 1) workgroups
        (none for n <= 0), to its grid temporaries."""
        cap = self.m.spec_const(self.ty(T.u32), 1, GRID_CAP_SPEC_ID)
        b = self.convert(block, T.u32, it)
        whole = self.op(Op.SDiv, it, n, b)
        partial = self.boolean(Op.SGreaterThan, self.op(Op.ISub, it, n, self.op(Op.IMul, it, whole, b)),
                               self.c(it, 0))
        groups = self.glsl(it, GLSL.SMin, self.op(Op.IAdd, it, whole, self.select(it, partial, self.c(it, 1),
                                                                                  self.c(it, 0))),
                           self.convert(cap, T.u32, it))
        groups = self.convert(self.select(it, self.boolean(Op.SGreaterThan, n, self.c(it, 0)), groups, self.c(it, 0)),
                              it, T.u32)

        def write():
            for k, word in enumerate((groups, self.c(T.u32, 1), self.c(T.u32, 1))):
                self.fb.emit_void(Op.Store, self.element("temps", 0, T.u32, self.c(T.u32, 2 * self.grid_temp + k)),
                                  word)
        self.if_then(self.boolean(Op.IEqual, self.invocation, self.c(T.u32, 0)), write)

    def iterate(self, task: ir.Task, it: T.DataType, begin: int, n: int) -> None:
        """The invocation's grid-stride share of the task's n iterations from `begin`."""
        total, stop = self.total, n
        if task.serial:
            start, stop, active = self.serial_chunk(it, n)
            step = self.c(it, 1)
        else:
            start = self.convert(self.invocation, T.u32, it)
            active = self.boolean(Op.SLessThan, start, n)
            if self.has_adstacks:  # only invocations the heaps hold a slice for run iterations
                total = self.glsl(T.u32, GLSL.UMin, total, self.adstack_invocations())
                active = self.boolean(Op.LogicalAnd, self.boolean(Op.ULessThan, self.invocation, total), active)
            step = self.convert(total, T.u32, it)

        uses = ir.users_count(task.chunk_final)
        flush = self.caps.subgroup_reductions and not any(uses.get(s) for s in task.chunk_final.stmts
                                                          if isinstance(s, (ir.AtomicRMW, ir.TempAtomic)))

        def iterations():
            self.block(task.chunk_init)
            self.counted_loop(it, start, stop, step, lambda i: self.bind_index(task, begin, i), task.body)
            self.flushing_partials = flush
            self.block(task.chunk_final)
            self.flushing_partials = False
        self.if_then(active, iterations)

    def serial_chunk(self, it: T.DataType, n: int) -> tuple:
        """(start, stop, active) of a serial range-for's dispatch: the first invocation of
        workgroup (c, last) runs iterations [c * C, c * C + C), to the end in the last chunk, C
        being the SERIAL_CHUNK_SPEC_ID constant; C = 0 (the default, one workgroup): all of them."""
        u32 = self.ty(T.u32)
        chunk_size = self.m.spec_const(u32, 0, SERIAL_CHUNK_SPEC_ID)
        group = self.input_builtin(BuiltIn.WorkgroupId, True)
        chunk, last = (self.fb.emit(Op.CompositeExtract, u32, group, i) for i in (0, 1))
        local = self.fb.emit(Op.CompositeExtract, u32, self.input_builtin(BuiltIn.LocalInvocationId, True), 0)
        start = self.convert(self.op(Op.IMul, T.u32, chunk, chunk_size), T.u32, it)
        whole = self.boolean(Op.LogicalOr, self.boolean(Op.IEqual, chunk_size, self.c(T.u32, 0)),
                             self.boolean(Op.INotEqual, last, self.c(T.u32, 0)))
        bounded = self.glsl(it, GLSL.SMin, n, self.op(Op.IAdd, it, start, self.convert(chunk_size, T.u32, it)))
        stop = self.select(it, whole, n, bounded)
        active = self.boolean(Op.LogicalAnd, self.boolean(Op.IEqual, local, self.c(T.u32, 0)),
                              self.boolean(Op.SLessThan, start, stop))
        return start, stop, active

    def bind_index(self, task: ir.Task, begin: int, offset: int) -> None:
        """The task's index (begin + offset) and, with row structure, its coordinates."""
        it = task.index.type
        index = self.op(Op.IAdd, it, begin, offset)
        self.vals[task.index] = index
        if task.axis_index:
            rest = index
            for coord, extent in zip(reversed(task.axis_index[1:]), reversed(task.axes)):
                self.vals[coord] = self.op(Op.SRem, it, rest, self.v(extent))
                rest = self.op(Op.SDiv, it, rest, self.v(extent))
            self.vals[task.axis_index[0]] = rest

    # ---- structured control flow ---------------------------------------------------------------------
    def if_then(self, cond: int, then, otherwise=None) -> None:
        fb = self.fb
        then_label, else_label, merge = fb.new_label(), fb.new_label(), fb.new_label()
        fb.selection(cond, then_label, else_label, merge)
        for label, emit in ((then_label, then), (else_label, otherwise)):
            fb.place(label)
            if emit is not None:
                emit()
            if not fb.terminated:
                fb.branch(merge)
        fb.place(merge)

    def structured_loop(self, more, step, body: ir.Block | None = None, on_continue=None) -> None:
        """header (OpLoopMerge) -> check: `more(None)` or leave -> `step()` then `body` -> continue
        block (`on_continue()`) -> header. break/continue in `body` leave / go to the continue block."""
        fb = self.fb
        header, check, body_label, cont, merge = (fb.new_label() for _ in range(5))
        fb.branch(header)
        fb.place(header)
        fb.loop_header(merge, cont)
        fb.branch(check)
        fb.place(check)
        fb.branch_conditional(more(None), body_label, merge)
        fb.place(body_label)
        step()
        if body is not None and not fb.terminated:
            self.loops.append((cont, merge))
            self.block(body)
            self.loops.pop()
        if not fb.terminated:
            fb.branch(cont)
        fb.place(cont)
        if on_continue is not None:
            on_continue()
        fb.branch(header)
        fb.place(merge)

    def counted_loop(self, t: T.DataType, start: int, end: int, step: int, bind, body: ir.Block) -> None:
        """for (i = start; i < end; i += step) { bind(i); body }, i of type `t`."""
        fb, it = self.fb, self.ty(t)
        var = fb.local_variable(it)
        fb.emit_void(Op.Store, var, start)
        less = Op.SLessThan if t.kind == "int" else Op.ULessThan
        self.structured_loop(lambda _: self.boolean(less, fb.emit(Op.Load, it, var), end),
                             lambda: bind(fb.emit(Op.Load, it, var)), body,
                             lambda: fb.emit_void(Op.Store, var, fb.emit(Op.IAdd, it, fb.emit(Op.Load, it, var), step)))

    def block(self, block: ir.Block) -> None:
        for s in block.stmts:
            if self.fb.terminated:
                return  # after break/continue: unreachable
            self.stmt(s)

    def stmt(self, s: ir.Stmt) -> None:
        """Lowers `s`; what goes wrong is a QdcCompileError at its line (or its nearest located
        enclosing statement's), naming it."""
        r = lower_statement(self, self.k, s, self.lower_stmt, "generating SPIR-V")
        if r is not None:
            self.vals[s] = r

    def lower_stmt(self, s: ir.Stmt):
        method = getattr(self, "s_" + type(s).__name__, None)
        if s.type is not None and not isinstance(s, ir.LoopIndex):
            self.ty(s.type)  # a type the target lacks is reported as the statement's own
        if method is None:
            raise Unsupported(f"target '{self.arch}' cannot generate code for {type(s).__name__} yet")
        return method(s)

    def s_If(self, s):
        self.if_then(self.v(s.cond), lambda: self.block(s.then_block), lambda: self.block(s.else_block))

    def s_RangeFor(self, s):
        def bind(i):
            self.vals[s.index] = i
        self.counted_loop(s.index.type, self.v(s.begin), self.v(s.end), self.c(s.index.type, 1), bind, s.body)

    def s_While(self, s):
        self.structured_loop(lambda _: self.m.const(self.m.bool(), True), lambda: None, s.body)

    def s_Break(self, s):
        self.fb.branch(self.loops[-1][1])

    def s_Continue(self, s):
        self.fb.branch(self.loops[-1][0])

    def s_LoopIndex(self, s):  # defined by its loop
        return None
