"""The width-W lowering of a parallel task's chunk for the CPU: W iterations at a time, as ISPC
runs a program instance per SIMD lane (design: docs/design.md, "CPU code").

`<task>_chunk(ctx, begin, end)` walks [begin, end) in steps of W. Lane l of a step runs
iteration base + l; the lanes past `end` in the last step are off in the *execution mask*
(`exec`, `<W x i1>`), so the remainder runs masked, with no scalar copy of the body. What
widen_plan.py calls varying is a `<W x T>` value, uniform values stay scalar (splatted where
they meet a vector):
- a load or store through the task index (plus uniform terms) is one masked vector load or
  store; other varying addresses gather and scatter (masked);
- an `if` on a varying condition runs each side under its lanes' mask, skipped when no lane
  takes it; loops that lanes leave at different iterations run while any lane is active
  (break and continue clear lanes); locals written under a partial mask keep the other
  lanes' values (select);
- a reduction (`accumulate`) keeps W partial results in a vector, combined once per chunk;
  an atomic on one address combines the active lanes first and issues one atomic, one on
  varying addresses issues an atomic per active lane, one at the iteration's own element a
  plain read-modify-write (widen_memory.py, which also reads before an inner loop the loads
  that are the same on each of its iterations);
- math calls the W-lane variants of the inline math (llvm/inline_math_vector.py); an
  operation with no vector form runs the scalar code lane by lane;
- adstacks: a slice per lane, interleaved element by element (widen_adstack.py); local arrays an
  array of vectors, one element per lane (widen_local_arrays.py).
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T
from qdc.runtime.contract.bounds import MAX_AXES

from ... import ir
from ..llvm.inline_math_vector import splat, vector_math
from ..llvm.llvm_arith import _FCMP
from ..llvm.llvm_ir import _ChunkEnv, carry_to_outer_coordinates, chunk_type, start_function, store_coordinates
from ..llvm.llvm_types import FLOAT_BITS, I1, I8, I32, I64, PTR, float_suffix, lltype, memtype
from ..llvm.target import Inline, Intrinsic, PerWidth
from .widen_adstack import LaneAdStacks
from .widen_local_arrays import LaneLocalArrays
from .widen_memory import LaneMemory, _Ptr, splat_constant, whole_vector
from .widen_plan import WidenPlan



def emit_wide_chunk(cg, task: ir.Task, plan: WidenPlan, lanes: int, vector_memory: bool | None,
                    name: str) -> ll.Function:
    """`void @<name>(ptr ctx, iN begin, iN end, i1 alone)`: the chunk of `task` at `lanes` lanes;
    `vector_memory`: whether the loads hoisted out of loops and the updates of the iteration's
    own elements are vector gathers and scatters, else loops over the lanes (widen_codegen)."""
    fn = ll.Function(cg.mb.module, chunk_type(task), name=name)
    fn.linkage = "internal"
    fn.args[0].add_attribute("noalias")
    b = start_function(fn)
    env = WideChunkEnv(cg, b, fn.args[0], plan, lanes)
    env.vector_memory = bool(vector_memory)
    begin, end, env.alone = fn.args[1], fn.args[2], fn.args[3]
    env.block(task.chunk_init)
    env.wide_loop(task, begin, end)
    if task.chunk_final.stmts:
        with b.if_then(b.icmp_signed("<", begin, end)):
            env.block(task.chunk_final)
    b.ret_void()
    return fn


class _MaskedLoop:
    """A loop of the body that lanes leave at different iterations: `active` (lanes still in
    it), `cont` (lanes that continued this iteration), `latch` (the next iteration)."""

    def __init__(self, active, cont, latch, exit_bb):
        self.active, self.cont, self.latch, self.exit = active, cont, latch, exit_bb


class WideChunkEnv(LaneMemory, LaneAdStacks, LaneLocalArrays, _ChunkEnv):
    def __init__(self, cg, builder, ctx, plan: WidenPlan, lanes: int):
        super().__init__(cg, builder, ctx)
        self.plan, self.W = plan, lanes
        self.wide = False      # lowering the body (chunk_init and chunk_final are scalar code)
        self.exec = None       # the lanes running the statement being lowered
        self.narrow = 0        # > 0: some lanes may be off for reasons other than the range's end
        self.dead = False      # every lane of the block left it (masked break/continue)
        self.lin: dict = {}    # varying value -> its lane-0 scalar: the value is that + lane number
        self.acc: dict = {}    # chunk_init alloca -> the vector of W partial results
        self.hoisted: set = set()  # loads (and their addresses) lowered before their loop
        self.vector_memory = True  # hoisted loads and own updates: gathers and scatters, else lane loops

    # ---- helpers --------------------------------------------------------------------------
    def vt(self, t: T.DataType):
        return ll.VectorType(lltype(t), self.W)

    @staticmethod
    def is_vec(v) -> bool:
        return isinstance(getattr(v, "type", None), ll.VectorType)

    def splat(self, v):
        if self.is_vec(v):
            return v
        if isinstance(v, ll.Constant):
            return splat_constant(v, self.W)
        vt = ll.VectorType(v.type, self.W)
        undef = whole_vector(vt, ll.Undefined)
        one = self.b.insert_element(undef, v, ll.Constant(I32, 0))
        return self.b.shuffle_vector(one, undef, whole_vector(ll.VectorType(I32, self.W), 0))

    def vv(self, s):
        """Operand `s` as a vector."""
        return self.splat(self.v(s))

    def lane_numbers(self, typ):
        return ll.Constant(ll.VectorType(typ, self.W), [ll.Constant(typ, i) for i in range(self.W)])

    def intrinsic(self, name: str, ret, args: list, values: list, **kw):
        return self.b.call(self.mb.declare(name, ret, args), values, **kw)

    def any_lane(self, mask):
        w = self.W
        return self.intrinsic(f"llvm.vector.reduce.or.v{w}i1", I1, [mask.type], [mask])

    def lane(self, v, i: int):
        return self.b.extract_element(v, ll.Constant(I32, i))

    def vector_suffix(self, vt) -> str:
        e = vt.element
        name = "p0" if isinstance(e, ll.PointerType) else ({"float": "f32", "double": "f64"}.get(str(e)) or str(e))
        return f"v{vt.count}{name}"

    # ---- the body loop --------------------------------------------------------------------
    def wide_loop(self, task: ir.Task, begin, end):
        """The body for [begin, end), W indices a step; the last step's lanes past `end` off. A
        multi-dimensional range (`Task.axes`) is walked by rows, as the scalar code walks it: a
        step's lanes lie in one row (fewer than W at a row's end), the outer coordinates are
        uniform and the innermost one is the lane's, so accesses along a row stay contiguous."""
        b, w = self.b, self.W
        it = begin.type
        for var, op in self.plan.accumulators.items():
            self.acc[var] = self.entry_alloca(self.vt(var.type), f"{var.var_name}.lanes")
            b.store(self.identity_vector(op, var.type), self.acc[var])
        counter = self.entry_alloca(I64, "base")
        begin64 = b.sext(begin, I64) if it.width < 64 else begin
        end64 = b.sext(end, I64) if it.width < 64 else end
        b.store(begin64, counter)
        head, body_bb, latch, exit_bb = (b.append_basic_block(f"lanes.{p}") for p in ("head", "body", "latch", "exit"))
        rows = self.start_rows(task, begin, end, head, exit_bb) if task.axis_index else None
        b.branch(head)
        b.position_at_end(head)
        base64 = b.load(counter, typ=I64)
        b.cbranch(b.icmp_signed("<", base64, end64), body_bb, exit_bb)
        b.position_at_end(body_bb)
        left = b.sub(end64, base64)  # > 0; lane l runs if l < left (no index arithmetic can wrap)
        step = ll.Constant(I64, w)
        if rows is not None:
            left, step = self.bind_row(task, rows, left)
        self.exec = b.icmp_signed("<", self.lane_numbers(I64), self.splat(left))
        base = b.trunc(base64, it) if it.width < 64 else base64
        self.vals[task.index] = b.add(self.splat(base), self.lane_numbers(it))
        self.lin[task.index] = base
        self.wide = True
        self.loops.append((latch, exit_bb))
        self.block(task.body)
        self.loops.pop()
        self.wide, self.dead = False, False
        if not b.block.is_terminated:
            b.branch(latch)
        b.position_at_end(latch)
        b.store(b.add(b.load(counter, typ=I64), step), counter)
        if rows is not None:
            self.next_row_position(rows, step)
        b.branch(head)
        b.position_at_end(exit_bb)
        for var, lanes in self.acc.items():  # the W partial results into the chunk's accumulator
            t, op = var.type, self.plan.accumulators[var]
            self.scalar_accumulate(op, self.v(var), self.reduce(op, b.load(lanes, typ=self.vt(t)), t), t)

    def start_rows(self, task: ir.Task, begin, end, head, exit_bb):
        """(coordinate slots, extents): `begin`'s coordinates, divided out where the range is
        not empty (then every extent is >= 1)."""
        b, it = self.b, begin.type
        extents = [self.v(a) for a in task.axes]  # of axes 1..n-1
        coords = [self.entry_alloca(it, f"coord{d}") for d in range(len(task.axis_index))]
        start = b.append_basic_block("lanes.rows")
        b.cbranch(b.icmp_signed("<", begin, end), start, exit_bb)
        b.position_at_end(start)
        store_coordinates(b, begin, coords, extents)
        return coords, extents

    def bind_row(self, task: ir.Task, rows, left):
        """The step's coordinates; (lanes that run, the step) for `left` indices left in the range."""
        b, w = self.b, self.W
        coords, extents = rows
        it = lltype(task.index.type)
        for coord, slot in zip(task.axis_index[:-1], coords[:-1]):
            self.vals[coord] = b.load(slot, typ=it)  # uniform in the step
        column = b.load(coords[-1], typ=it)
        self.vals[task.axis_index[-1]] = b.add(self.splat(column), self.lane_numbers(it))
        self.lin[task.axis_index[-1]] = column
        in_row = b.sub(extents[-1], column)
        in_row = b.sext(in_row, I64) if it.width < 64 else in_row
        left = b.select(b.icmp_signed("<", in_row, left), in_row, left)
        return left, b.select(b.icmp_signed("<", left, ll.Constant(I64, w)), left, ll.Constant(I64, w))

    def next_row_position(self, rows, step) -> None:
        """The coordinates advanced by `step`, which ends in the current row: the innermost one,
        then (at the row's end) the outer ones as an odometer."""
        b = self.b
        coords, extents = rows
        it = extents[-1].type  # the index type, as the coordinates
        column = b.add(b.load(coords[-1], typ=it), b.trunc(step, it) if it.width < 64 else step)
        carry = b.icmp_signed("==", column, extents[-1])
        b.store(b.select(carry, ll.Constant(it, 0), column), coords[-1])
        carry_to_outer_coordinates(b, coords, extents, carry)

    # ---- structure --------------------------------------------------------------------------
    def block(self, block: ir.Block):
        for s in block.stmts:
            if self.b.block.is_terminated or self.dead:
                return
            self.stmt(s)

    # ---- values -------------------------------------------------------------------------------
    def _scalar(self, s):
        return getattr(_ChunkEnv, "s_" + type(s).__name__)(self, s)

    def _pure(self, s, vector):
        """`s` as scalar code when its operands are uniform, else `vector()` (None: by lane)."""
        if not self.wide or not any(self.is_vec(self.vals.get(o)) for o in s.operands()):
            return self._scalar(s)
        out = vector()
        return out if out is not None else self.by_lane(s)

    def by_lane(self, s):
        """The scalar code of `s` once per lane, the results gathered into a vector."""
        b = self.b
        saved = {o: self.vals[o] for o in s.operands()}
        out = whole_vector(self.vt(s.type), ll.Undefined)
        for i in range(self.W):
            for o, v in saved.items():
                self.vals[o] = self.lane(v, i) if self.is_vec(v) else v
            out = b.insert_element(out, self._scalar(s), ll.Constant(I32, i))
        self.vals.update(saved)
        return out

    def s_Unary(self, s):
        return self._pure(s, lambda: self.unary(s))

    def unary(self, s):
        b, t, op = self.b, s.type, s.op
        x = self.v(s.x)
        if op == "neg":
            return b.fneg(x, flags=self.flags) if t.is_float else b.sub(splat(x.type.element, 0, self.W), x)
        if op == "not":
            return b.xor(x, splat(I1, 1, self.W))
        if op == "bit_not":
            return b.xor(x, splat(x.type.element, -1, self.W))
        if not t.is_float:
            if op == "abs" and t.kind == "int":
                zero = splat(x.type.element, 0, self.W)
                return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
            return x if op == "abs" else None
        if op == "rsqrt":
            root = self.vector_math_call("sqrt", [x])
            return None if root is None else b.fdiv(splat(x.type.element, 1.0, self.W), root, flags=self.flags)
        return self.vector_math_call(op, [x])

    def vector_math_call(self, op: str, args: list):
        """`op` on vectors through the target's math table: a vector intrinsic, the vector
        variant of the inline math, or None (by lane)."""
        impl = self.cg.target.math_table.get(op)
        vt = args[0].type
        bits = FLOAT_BITS[str(vt.element)]
        if isinstance(impl, PerWidth):
            impl = impl.for_bits(bits)
        if isinstance(impl, Intrinsic):
            name = f"{impl.name}.v{self.W}{float_suffix(vt.element)}"
            return self.intrinsic(name, vt, [vt] * len(args), args)
        if isinstance(impl, Inline):
            fn = vector_math(self.mb.module, impl.op, bits, self.W)
            return None if fn is None else self.b.call(fn, args)
        return None

    def s_Binary(self, s):
        return self._pure(s, lambda: self.binary(s))

    def binary(self, s):
        b, t, op = self.b, s.a.type, s.op
        x, y = self.vv(s.a), self.vv(s.b)
        if op in ir.COMPARISONS:
            if t.is_float:
                return b.fcmp_unordered("!=", x, y) if op == "ne" else b.fcmp_ordered(_FCMP[op], x, y)
            return (b.icmp_signed if t.kind == "int" else b.icmp_unsigned)(_FCMP[op], x, y)
        if t.is_float:
            simple = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "truediv": b.fdiv}
            if op in simple:
                return simple[op](x, y, flags=self.flags)
            if op in ("min", "max"):
                return self.intrinsic(f"llvm.{op}num.{self.vector_suffix(x.type)}", x.type, [x.type] * 2, [x, y])
            if op in ("pow", "atan2"):
                return self.vector_math_call(op, [x, y])
            return None
        simple = {"add": b.add, "sub": b.sub, "mul": b.mul, "bit_and": b.and_, "bit_or": b.or_, "bit_xor": b.xor}
        if op in simple:
            return simple[op](x, y)
        et = x.type.element
        if op in ("shl", "shr"):
            amount = b.and_(y, splat(et, et.width - 1, self.W))
            if op == "shl":
                return b.shl(x, amount)
            return b.ashr(x, amount) if t.kind == "int" else b.lshr(x, amount)
        if op in ("min", "max"):
            cmp = b.icmp_signed if t.kind == "int" else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", x, y), x, y)
        return None

    def s_Cast(self, s):
        return self._pure(s, lambda: self.cast(s))

    def cast(self, s):
        b, src, dst = self.b, s.x.type, s.type
        x = self.v(s.x)
        vt = self.vt(dst)
        if src is dst:
            return x
        if dst is T.u1:
            if src.is_float:
                return b.fcmp_unordered("!=", x, splat(x.type.element, 0.0, self.W))
            return b.icmp_unsigned("!=", x, splat(x.type.element, 0, self.W))
        if src.is_float and dst.is_float:
            return b.fpext(x, vt) if dst.bits > src.bits else b.fptrunc(x, vt)
        if src.is_float:
            kind = "fptosi" if dst.kind == "int" else "fptoui"
            return self.intrinsic(f"llvm.{kind}.sat.{self.vector_suffix(vt)}.{self.vector_suffix(x.type)}",
                                  vt, [x.type], [x])
        if dst.is_float:
            return b.uitofp(x, vt) if src.kind in ("uint", "bool") else b.sitofp(x, vt)
        if s.x in self.lin and src.kind == "int" and dst.bits >= src.bits:
            self.lin[s] = b.sext(self.lin[s.x], lltype(dst)) if dst.bits > src.bits else self.lin[s.x]
        if dst.bits > src.bits:
            return b.sext(x, vt) if src.kind == "int" else b.zext(x, vt)
        if dst.bits < src.bits:
            return b.trunc(x, vt)
        return x

    def s_Select(self, s):
        def vector():
            cond = self.v(s.cond)
            a, c = self.v(s.a), self.v(s.b)
            if self.is_vec(cond) or self.is_vec(a) or self.is_vec(c):
                a, c = self.splat(a), self.splat(c)
            return self.b.select(cond, a, c)
        return self._pure(s, vector)

    def index_like(self, s):
        """Records `s` as index-like (lane-0 value + lane number) when it adds a uniform value
        to an index-like one; called for integer additions and subtractions."""
        if not isinstance(s, ir.Binary) or s.op not in ("add", "sub") or s.type.is_float:
            return
        a, c = self.vals.get(s.a), self.vals.get(s.b)
        if s.a in self.lin and not self.is_vec(c):
            self.lin[s] = (self.b.add if s.op == "add" else self.b.sub)(self.lin[s.a], c)
        elif s.op == "add" and s.b in self.lin and not self.is_vec(a):
            self.lin[s] = self.b.add(a, self.lin[s.b])

    def stmt(self, s):
        if s in self.hoisted:
            return
        super().stmt(s)
        if self.wide and isinstance(s, ir.Binary) and s in self.vals and self.is_vec(self.vals[s]):
            self.index_like(s)

    # ---- locals ---------------------------------------------------------------------------------
    def s_Alloca(self, s):
        if not self.wide or s not in self.plan.varying:  # a uniform local: one scalar
            return self._scalar(s)
        slot = self.entry_alloca(self.vt(s.type), s.var_name)
        self.b.store(splat(lltype(s.type), 0 if not s.type.is_float else 0.0, self.W), slot)
        return slot

    def s_LocalLoad(self, s):
        if not self.wide or s.var not in self.plan.varying:
            return self._scalar(s)
        return self.b.load(self.v(s.var), typ=self.vt(s.type))

    def s_LocalStore(self, s):
        if not self.wide or s.var not in self.plan.varying:  # uniform: never stored to by narrow code
            return self._scalar(s)
        self.store_lanes(self.v(s.var), self.vv(s.value), s.var.type)

    def store_lanes(self, slot, value, t):
        """A local's new value in the running lanes; the others keep theirs where lanes may be
        off for control flow (lanes past the range's end hold values nothing reads)."""
        if self.narrow:
            value = self.b.select(self.exec, value, self.b.load(slot, typ=self.vt(t)))
        self.b.store(value, slot)

    def s_LocalAccumulate(self, s):
        if not self.wide:
            return super().s_LocalAccumulate(s)
        t = s.var.type
        slot = self.acc.get(s.var, None) or self.v(s.var)
        old = self.b.load(slot, typ=self.vt(t))
        x = self.b.select(self.exec, self.vv(s.value), self.identity_vector(s.op, t))
        self.b.store(self.combine(s.op, old, x, t), slot)

    def identity_vector(self, op: str, t: T.DataType):
        et = lltype(t)
        if t.is_float:
            value = {"add": -0.0, "mul": 1.0, "min": float("inf"), "max": float("-inf")}[op]
        elif op in ("min", "max"):
            signed = t.kind == "int"
            low, high = (-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if signed else (0, (1 << t.bits) - 1)
            value = high if op == "min" else low
        else:
            value = {"add": 0, "mul": 1, "and": -1, "or": 0, "xor": 0}[op]
        return splat(et, value, self.W)

    def combine(self, op: str, x, y, t: T.DataType):
        """op(x, y) lane by lane (reassociable: reductions and combined atomics)."""
        b = self.b
        if t.is_float:
            if op in ("add", "mul"):
                return (b.fadd if op == "add" else b.fmul)(x, y, flags=("reassoc",) + self.flags)
            return self.intrinsic(f"llvm.{op}num.{self.vector_suffix(x.type)}", x.type, [x.type] * 2, [x, y])
        if op in ("min", "max"):
            cmp = b.icmp_signed if t.kind == "int" else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", x, y), x, y)
        return {"add": b.add, "mul": b.mul, "and": b.and_, "or": b.or_, "xor": b.xor}[op](x, y)

    def reduce(self, op: str, vec, t: T.DataType):
        """The W lanes of `vec` combined by `op` (a horizontal reduction)."""
        et, vt = vec.type.element, vec.type
        if t.is_float:
            if op in ("add", "mul"):
                start = ll.Constant(et, -0.0 if op == "add" else 1.0)
                return self.intrinsic(f"llvm.vector.reduce.f{op}.{self.vector_suffix(vt)}", et, [et, vt],
                                      [start, vec], fastmath=("reassoc",))
            return self.intrinsic(f"llvm.vector.reduce.f{op}.{self.vector_suffix(vt)}", et, [vt], [vec])
        if op in ("min", "max"):
            op = ("s" if t.kind == "int" else "u") + op
        return self.intrinsic(f"llvm.vector.reduce.{op}.{self.vector_suffix(vt)}", et, [vt], [vec])

    def scalar_accumulate(self, op: str, slot, x, t: T.DataType):
        b = self.b
        old = b.load(slot, typ=lltype(t))
        if t.is_float and op in ("min", "max"):
            new = self.intrinsic(f"llvm.{op}num.{float_suffix(old.type)}", old.type, [old.type] * 2, [old, x])
        elif not t.is_float and op in ("min", "max"):
            cmp = b.icmp_signed if t.kind == "int" else b.icmp_unsigned
            new = b.select(cmp("<" if op == "min" else ">", old, x), old, x)
        elif t.is_float:
            new = (b.fadd if op == "add" else b.fmul)(old, x, flags=("reassoc",) + self.flags)
        else:
            new = {"add": b.add, "mul": b.mul, "and": b.and_, "or": b.or_, "xor": b.xor}[op](old, x)
        b.store(new, slot)

    # ---- globals ----------------------------------------------------------------------------------
    def s_GlobalPtr(self, s):
        if not self.wide or not any(self.is_vec(self.vals.get(o)) for o in s.indices):
            return self._scalar(s)
        b, target = self.b, s.target
        base, dims = self.global_base(target)
        last = len(s.indices) - 1
        check = self.cg.check_id.get(s)  # debug=True: checked lane by lane, so gathered
        contiguous = check is None and all(not self.is_vec(self.v(i)) for i in s.indices[:-1]) \
            and s.indices[-1] in self.lin
        if check is None and not contiguous:
            return _Ptr("varying", self.lanes_addresses(s, base, dims))
        linear = None
        indices = []
        for k, (idx, dim) in enumerate(zip(s.indices, dims)):
            i = self.lin[idx] if contiguous and k == last else self.v(idx)
            i = self.widen_index(i, idx.type)
            indices.append(i)
            if linear is not None:
                if self.is_vec(i) or self.is_vec(linear):
                    linear, i, dim = self.splat(linear), self.splat(i), self.splat(dim)
                linear = b.add(b.mul(linear, dim, flags=("nsw",)), i, flags=("nsw",))
            else:
                linear = i
        elem = memtype(s.type)
        if contiguous:
            return _Ptr("contiguous", b.gep(base, [linear], inbounds=True, source_etype=elem))
        offsets = b.mul(self.splat(linear), splat(I64, s.type.nbytes, self.W), flags=("nsw",))
        addresses = b.inttoptr(b.add(self.splat(b.ptrtoint(base, I64)), offsets), ll.VectorType(PTR, self.W))
        if check is not None:
            addresses = self.lanes_bounds_checked(addresses, check, indices, dims)
        return _Ptr("varying", addresses)

    def lanes_addresses(self, s, base, dims: list):
        """The lanes' addresses of GlobalPtr `s` (some index varying): the offset of its uniform
        indices (index x stride of each axis) in scalar code, that of its varying ones (index x
        stride in bytes) in W-lane code, added once, rather than every axis's step of the
        element's index in W-lane 64-bit arithmetic with the uniform values splatted (half of
        P2G.grad's x86-64-v4 chunk)."""
        b = self.b
        strides = [ll.Constant(I64, 1)]
        for dim in reversed(dims[1:]):
            strides.insert(0, b.mul(strides[0], dim, flags=("nsw",)))
        uniform, lanes = None, None
        for idx, stride in zip(s.indices, strides):
            i = self.widen_index(self.v(idx), idx.type)
            if self.is_vec(i):
                part = b.mul(i, self.splat(b.mul(stride, ll.Constant(I64, s.type.nbytes), flags=("nsw",))),
                             flags=("nsw",))
                lanes = part if lanes is None else b.add(lanes, part, flags=("nsw",))
            else:
                part = b.mul(i, stride, flags=("nsw",))
                uniform = part if uniform is None else b.add(uniform, part, flags=("nsw",))
        first = base if uniform is None else b.gep(base, [uniform], source_etype=memtype(s.type))
        return b.inttoptr(b.add(self.splat(b.ptrtoint(first, I64)), lanes), ll.VectorType(PTR, self.W))

    def lanes_bounds_checked(self, addresses, check: int, indices: list, dims: list):
        """The lanes' addresses where every index is below its dimension, else the error
        buffer's scratch element, after the running lanes that fail record the first failure
        (lane by lane, as the scalar code's iterations would: `bounds_checked`)."""
        b, w = self.b, self.W
        in_range = [b.icmp_unsigned("<", self.splat(i), self.splat(d)) for i, d in zip(indices, dims)]
        ok = in_range[0]
        for r in in_range[1:]:
            ok = b.and_(ok, r)
        bad = b.and_(self.exec, b.not_(ok))
        errors = self.ctx_word(self.cg.meta.debug_slot, PTR)
        with b.if_then(self.any_lane(bad), likely=False):
            for lane in range(w):
                with b.if_then(self.lane(bad, lane)):
                    code, value = ll.Constant(I64, 0), ll.Constant(I64, 0)
                    for axis in reversed(range(len(indices))):  # the first failing axis is reported
                        failed = b.not_(self.lane(in_range[axis], lane))
                        code = b.select(failed, ll.Constant(I64, check * MAX_AXES + axis + 1), code)
                        index = indices[axis]
                        value = b.select(failed, self.lane(index, lane) if self.is_vec(index) else index, value)
                    b.call(self.bounds_fail_fn(), [errors, code, value])
        scratch = self.splat(b.gep(errors, [ll.Constant(I64, 2)], source_etype=I64))
        return b.select(ok, addresses, scratch)

    def widen_index(self, i, t: T.DataType):
        b = self.b
        width = i.type.element.width if self.is_vec(i) else i.type.width
        if width >= 64:
            return i
        target = ll.VectorType(I64, self.W) if self.is_vec(i) else I64
        return b.sext(i, target) if t.kind == "int" else b.zext(i, target)

    def s_GlobalLoad(self, s):
        p = self.vals.get(s.ptr)
        if not self.wide or not isinstance(p, _Ptr):
            return self._scalar(s)
        b, w = self.b, self.W
        mt = memtype(s.type)
        vt = ll.VectorType(mt, w)
        zero = whole_vector(vt, None)
        align = ll.Constant(I32, s.type.nbytes)
        if p.kind == "contiguous":
            v = self.intrinsic(f"llvm.masked.load.{self.vector_suffix(vt)}.p0", vt, [PTR, I32, self.exec.type, vt],
                               [p.address, align, self.exec, zero])
        else:
            v = self.intrinsic(f"llvm.masked.gather.{self.vector_suffix(vt)}.{self.vector_suffix(p.address.type)}",
                               vt, [p.address.type, I32, self.exec.type, vt], [p.address, align, self.exec, zero])
        return b.icmp_unsigned("!=", v, splat(I8, 0, w)) if s.type is T.u1 else v

    def s_GlobalStore(self, s):
        p = self.vals.get(s.ptr)
        if not self.wide:
            return self._scalar(s)
        b, w = self.b, self.W
        value = self.v(s.value)
        if not isinstance(p, _Ptr) and not self.is_vec(value):  # one value to one address
            with b.if_then(self.any_lane(self.exec)):
                self._scalar(s)
            return
        value = self.splat(value)
        if s.value.type is T.u1:
            value = b.zext(value, ll.VectorType(I8, w))
        vt = value.type
        align = ll.Constant(I32, s.value.type.nbytes)
        if isinstance(p, _Ptr) and p.kind == "contiguous":
            self.intrinsic(f"llvm.masked.store.{self.vector_suffix(vt)}.p0", ll.VoidType(),
                           [vt, PTR, I32, self.exec.type], [value, p.address, align, self.exec])
            return
        # lanes in order, the last running lane's value stays where addresses coincide (as in
        # the scalar code's iteration order)
        addresses = p.address if isinstance(p, _Ptr) else self.splat(p)
        self.intrinsic(f"llvm.masked.scatter.{self.vector_suffix(vt)}.{self.vector_suffix(addresses.type)}",
                       ll.VoidType(), [vt, addresses.type, I32, self.exec.type], [value, addresses, align, self.exec])

    def s_AtomicRMW(self, s):
        p = self.vals.get(s.ptr)
        if not self.wide:
            return self._scalar(s)
        if s in self.plan.own_updates and isinstance(p, _Ptr):
            self.own_update(s, p)
        elif isinstance(p, _Ptr):
            self.atomic_by_lane(s.op, p, s.value, s.type)
        else:
            self.combined_atomic(s.op, p, s.value, s.type)

    def s_TempAtomic(self, s):
        if not self.wide:
            return self._scalar(s)
        self.combined_atomic(s.op, self.temp_ptr(s.slot), s.value, s.type)

    def s_TempAtomicAdd(self, s):
        if not self.wide:
            return self._scalar(s)
        self.combined_atomic("add", self.temp_ptr(s.slot), s.value, s.value.type)

    def s_TempStore(self, s):
        if not self.wide:
            return self._scalar(s)
        with self.b.if_then(self.any_lane(self.exec)):
            self._scalar(s)

    def combined_atomic(self, op: str, ptr, value: ir.Stmt, t: T.DataType):
        """The running lanes' values combined, then one atomic (none if no lane runs)."""
        b = self.b
        combine = "add" if op == "sub" else op
        lanes = b.select(self.exec, self.vv(value), self.identity_vector(combine, t))
        total = self.reduce(combine, lanes, t)
        with b.if_then(self.any_lane(self.exec)):
            self.scalar_atomic(op, ptr, total, t)

    def scalar_atomic(self, op: str, ptr, v, t: T.DataType):
        self.atomic_update(op, ptr, v, t)

    def s_DebugMessage(self, s):
        """A print, failed assert or debug check's report: one record per running lane, in lane
        order (records of one parallel launch are unordered: README, print)."""
        if not self.wide:
            return super().s_DebugMessage(s)
        saved = {v: self.vals[v] for v in s.values}
        for i in range(self.W):
            with self.b.if_then(self.lane(self.exec, i)):
                for v, value in saved.items():
                    self.vals[v] = self.lane(value, i) if self.is_vec(value) else value
                super().s_DebugMessage(s)
        self.vals.update(saved)

    # ---- control flow -----------------------------------------------------------------------------
    def s_If(self, s):
        if not self.wide:
            return self._scalar(s)
        b = self.b
        cond = self.v(s.cond)
        outer = self.exec
        if not self.is_vec(cond):  # both sides see the same lanes
            then_bb, else_bb, merge = (b.append_basic_block(n) for n in ("if.then", "if.else", "if.end"))
            b.cbranch(cond, then_bb, else_bb)
            for bb, blk in ((then_bb, s.then_block), (else_bb, s.else_block)):
                b.position_at_end(bb)
                self.block(blk)
                self.dead = False  # a masked break on one side leaves the other side's lanes be
                if not b.block.is_terminated:
                    b.branch(merge)
            b.position_at_end(merge)
        else:
            merge = b.append_basic_block("wif.end")
            self.narrow += 1
            for lanes, blk in ((b.and_(outer, cond), s.then_block), (b.and_(outer, b.not_(cond)), s.else_block)):
                if not blk.stmts:
                    continue
                run = b.append_basic_block("wif.side")
                after = b.append_basic_block("wif.next")
                b.cbranch(self.any_lane(lanes), run, after)
                b.position_at_end(run)
                self.exec = lanes
                self.block(blk)
                self.dead = False
                if not b.block.is_terminated:
                    b.branch(after)
                b.position_at_end(after)
                self.exec = outer
            self.narrow -= 1
            b.branch(merge)
            b.position_at_end(merge)
        self.dead = False
        self.exec = outer
        if s in self.plan.kills:  # lanes may have left the loop: drop them, and skip on if none is left
            loop = self.innermost_masked()
            self.exec = b.and_(outer, self.live(loop))
            go_on = b.append_basic_block("wif.live")
            b.cbranch(self.any_lane(self.exec), go_on, loop.latch)
            b.position_at_end(go_on)

    def innermost_masked(self) -> _MaskedLoop:
        loop = self.loops[-1]
        assert isinstance(loop, _MaskedLoop), "a lane-killing if outside a masked loop"
        return loop

    def live(self, loop: _MaskedLoop):
        b, mt = self.b, ll.VectorType(I1, self.W)
        return b.and_(b.load(loop.active, typ=mt), b.not_(b.load(loop.cont, typ=mt)))

    def s_Break(self, s):
        loop = self.loops[-1]
        if not self.wide or not isinstance(loop, _MaskedLoop):
            return self._scalar(s)
        b, mt = self.b, ll.VectorType(I1, self.W)
        b.store(b.and_(b.load(loop.active, typ=mt), b.not_(self.exec)), loop.active)
        self.dead = True

    def s_Continue(self, s):
        loop = self.loops[-1]
        if not self.wide or not isinstance(loop, _MaskedLoop):
            return self._scalar(s)
        b, mt = self.b, ll.VectorType(I1, self.W)
        b.store(b.or_(b.load(loop.cont, typ=mt), self.exec), loop.cont)
        self.dead = True

    def s_RangeFor(self, s):
        if self.wide:
            self.hoist_invariant_loads(s)
        if not self.wide or s not in self.plan.masked_loops:
            return self._scalar(s)
        b, mt = self.b, ll.VectorType(I1, self.W)
        begin, end = self.vv(s.begin), self.vv(s.end)
        counter = self.entry_alloca(begin.type, "wloop")
        b.store(begin, counter)

        def step(loop):
            i = b.load(counter, typ=begin.type)
            running = b.and_(b.load(loop.active, typ=mt), b.icmp_signed("<", i, end))
            b.store(running, loop.active)
            self.vals[s.index] = i
            return running

        def advance():
            b.store(b.add(b.load(counter, typ=begin.type), splat(begin.type.element, 1, self.W)), counter)

        self.masked_loop(s.body, step, advance)

    def s_While(self, s):
        if self.wide:
            self.hoist_invariant_loads(s)
        if not self.wide or s not in self.plan.masked_loops:
            return self._scalar(s)
        mt = ll.VectorType(I1, self.W)
        self.masked_loop(s.body, lambda loop: self.b.load(loop.active, typ=mt), lambda: None)

    def masked_loop(self, body: ir.Block, step, advance):
        """A loop run while any lane is active: `step(loop)` gives (and records) the lanes that
        run this iteration, `advance()` ends an iteration."""
        b, mt = self.b, ll.VectorType(I1, self.W)
        outer = self.exec
        active, cont = self.entry_alloca(mt, "lanes.active"), self.entry_alloca(mt, "lanes.cont")
        b.store(outer, active)
        head, body_bb, latch, exit_bb = (b.append_basic_block(f"wloop.{p}") for p in ("head", "body", "latch", "exit"))
        loop = _MaskedLoop(active, cont, latch, exit_bb)
        b.branch(head)
        b.position_at_end(head)
        running = step(loop)
        b.cbranch(self.any_lane(running), body_bb, exit_bb)
        b.position_at_end(body_bb)
        b.store(whole_vector(mt, None), cont)
        self.exec = running
        self.narrow += 1
        self.loops.append(loop)
        self.block(body)
        self.loops.pop()
        self.narrow -= 1
        self.dead = False
        if not b.block.is_terminated:
            b.branch(latch)
        b.position_at_end(latch)
        advance()
        b.branch(head)
        b.position_at_end(exit_bb)
        self.exec = outer
