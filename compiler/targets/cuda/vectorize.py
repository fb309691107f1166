"""Element-wise range-for tasks with 128-bit loads and stores (CUDA).

A grid-stride thread that loads one 4-byte element per iteration keeps too few bytes in flight
to reach the memory bound: on an H200, saxpy over 2^26 f32 ran at 0.84 of PyTorch's `add_` and
a copy at 0.74 of cuMemcpyDtoD; the same loops with 128-bit loads ran at 1.00 and 0.98
(bench/bench_cuda.py --variants, docs/benchmarks.md). So a task whose body is element-wise
runs four consecutive indices per grid-stride iteration: every array it reads is loaded as one
<4 x T> from the first of them (ld.v4), the body runs four times reading and writing lanes, and
every array it writes is stored as one <4 x T> (st.v4).

Element-wise, here: a 1-D range, no chunk_init/chunk_final, and a flat body (no control flow,
locals, atomics, messages, random numbers, adstacks or temporaries written) whose every global
access is element `index` itself of a field or ndarray with one axis and a 4-byte element, and
that loads nothing after its first store. Then lane k of a copy reads only element 4j + k, which
no other copy writes, and reads it before its own copy writes anything; two arrays are either
the same buffer or disjoint buffers (fields, qd.ndarrays and the device copies of numpy
arguments are separate allocations), so the result is the scalar loop's even when one array is
passed twice. At run time the vector loop covers the range only where every array's address
and the range's begin allow 16-byte accesses; the remaining elements (and everything where they
do not) take the scalar grid-stride loop.
"""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import types as T

from ... import ir
from ..llvm.llvm_types import I64, PTR, lltype, memtype

LANES = 4
ALLOWED = (ir.Const, ir.ArgLoad, ir.NdarrayShape, ir.Unary, ir.Binary, ir.Cast, ir.Select, ir.StopGrad,
           ir.GlobalPtr, ir.GlobalLoad, ir.GlobalStore, ir.TempLoad)


def _key(target) -> tuple:
    if isinstance(target, ir.FieldRef):
        return ("field", target.slot)
    return ("ndarray", target.arg_index, target.is_grad)


def plan(task: ir.Task) -> dict | None:
    """{array key: (target, loaded, stored)} of an element-wise task (module docstring), else None."""
    if task.kind == "serial" or task.serial or task.axis_index or task.chunk_init.stmts or task.chunk_final.stmts \
            or ir.uses_simt(task) is not None:  # a block's threads must run its iterations one by one
        return None
    arrays: dict = {}
    stored_any = False
    for s in task.body.stmts:
        if not isinstance(s, ALLOWED):
            return None
        if isinstance(s, ir.GlobalPtr):
            t = s.target
            one_axis = len(t.shape) == 1 if isinstance(t, ir.FieldRef) else t.ndim == 1
            if not one_axis or len(s.indices) != 1 or s.indices[0] is not task.index or s.type.nbytes != 4 \
                    or s.type is T.u1:
                return None
            arrays.setdefault(_key(t), [t, False, False])
        elif isinstance(s, ir.GlobalLoad):
            if stored_any or not isinstance(s.ptr, ir.GlobalPtr):
                return None
            arrays[_key(s.ptr.target)][1] = True
        elif isinstance(s, ir.GlobalStore):
            if not isinstance(s.ptr, ir.GlobalPtr):
                return None
            stored_any = True
            arrays[_key(s.ptr.target)][2] = True
    if not stored_any:
        return None
    return {k: tuple(v) for k, v in arrays.items()}


class Lanes:
    """The vector registers of one grid-stride iteration: per array its <4 x T> value."""

    def __init__(self, arrays: dict):
        self.arrays, self.values, self.lane = arrays, {}, 0


def lane_env(base_env_class):
    """A chunk environment whose global accesses of element `index` read and write lanes."""

    class LaneEnv(base_env_class):
        lanes: Lanes = None

        def s_GlobalPtr(self, s):
            return ("lanes", _key(s.target))

        def s_GlobalLoad(self, s):
            _, key = self.v(s.ptr)
            return self.b.extract_element(self.lanes.values[key], ll.Constant(I64, self.lanes.lane))

        def s_GlobalStore(self, s):
            _, key = self.v(s.ptr)
            lanes = self.lanes
            lanes.values[key] = self.b.insert_element(lanes.values[key], self.v(s.value),
                                                      ll.Constant(I64, lanes.lane))

    return LaneEnv


def emit_vector_loop(cg, env, task: ir.Task, arrays: dict, first, end, step):
    """The vector loop over the aligned part of [begin, end) (begin = first - this thread's id),
    leaving in the returned i64 where the scalar loop's thread-0 index starts."""
    b = env.b
    thread = cg.thread_id(b)
    begin = b.sub(first, thread)
    bases = {key: base_pointer(cg, env, target) for key, (target, _, _) in arrays.items()}
    misaligned = b.and_(begin, ll.Constant(I64, LANES - 1))
    for base in bases.values():
        misaligned = b.or_(misaligned, b.and_(b.ptrtoint(base, I64), ll.Constant(I64, 4 * LANES - 1)))
    span = b.sub(end, begin)
    groups = b.select(b.and_(b.icmp_signed("==", misaligned, ll.Constant(I64, 0)),
                             b.icmp_signed(">", span, ll.Constant(I64, 0))),
                      b.sdiv(span, ll.Constant(I64, LANES)), ll.Constant(I64, 0))
    lanes = Lanes(arrays)
    lane_env_obj = lane_env(type(env))(cg, b, env.ctx)
    lane_env_obj.lanes = lanes
    it = lltype(task.index.type)

    def body_group(j):
        start = b.add(begin, b.mul(j, ll.Constant(I64, LANES), flags=("nsw",)), flags=("nsw",))
        for key, (target, loaded, _) in arrays.items():
            vec_t = ll.VectorType(memtype(target.dtype), LANES)
            if loaded:
                ptr = b.gep(bases[key], [start], inbounds=True, source_etype=memtype(target.dtype))
                lanes.values[key] = b.load(ptr, typ=vec_t, align=4 * LANES)
            else:
                lanes.values[key] = ll.Constant(vec_t, ll.Undefined)
        for lane in range(LANES):
            lanes.lane = lane
            index = b.add(start, ll.Constant(I64, lane), flags=("nsw",))
            lane_env_obj.vals[task.index] = b.trunc(index, it) if it.width < 64 else index
            lane_env_obj.block(task.body)
        for key, (target, _, stored) in arrays.items():
            if stored:
                ptr = b.gep(bases[key], [start], inbounds=True, source_etype=memtype(target.dtype))
                b.store(lanes.values[key], ptr, align=4 * LANES)

    lane_env_obj.loop(thread, groups, ir.Block(), body_group, name="vec", step=step)
    return b.add(begin, b.mul(groups, ll.Constant(I64, LANES), flags=("nsw",)), flags=("nsw",))


def base_pointer(cg, env, target):
    """The address of element 0 of a field or ndarray (as the shared lowering's GlobalPtr)."""
    if isinstance(target, ir.FieldRef):
        return env.ctx_word(cg.meta.field_slot0 + target.slot, PTR)
    slot = cg.param_slot[target.arg_index]
    return env.ctx_word(slot + 1 + target.ndim if target.is_grad else slot, PTR)
