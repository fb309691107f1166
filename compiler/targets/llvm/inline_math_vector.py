"""The inline math of inline_math.py at W lanes: `<W x float>` and `<W x double>` functions,
for code that is already vector-shaped (the CPU's width-W lowering of parallel tasks,
compiler/targets/cpu/widen.py), where no loop vectoriser would widen a scalar call.

The algorithms are the scalar ones, word for word: `VectorOps` gives fdlibm.py's
`Float64Math` and inline_math_f32.py's `FloatMath` the same operations over vectors
(constants splatted, intrinsics at their vector overloads, comparisons giving `<W x i1>`), so
each lane computes exactly the bits the scalar function computes. Two things differ in form:
- `branch` (a costly case under a condition: f32 trig's large-argument reduction, f64 trig)
  computes the common side alone when every lane takes it, else both sides selected per lane
  (as the loop vectoriser's if-conversion does);
- f32 trig's large-argument reduction (Payne-Hanek, for |x| >= 800) runs lane by lane through
  the scalar code, only for lanes that need it (`VectorFloatMath.reduce`);
- f32 sin, cos and tan where every lane's argument is below pi/4 compute only the polynomial
  of quadrant 0 (the reduction of such an argument is exact and trivial): a loop-carried
  `v = sin(v)` chain of small values runs ~2x as fast.
f32 pow has no vector form here (its double-precision core is written against scalar types):
`vector_math` returns None for it and the caller applies the scalar function lane by lane.
"""
from __future__ import annotations

from llvmlite import ir as ll

from ..fdlibm import Float64Math
from .inline_math import OPS, math_function
from .inline_math_f32 import FLOAT_OPS, TRIG_FLOAT_LIMIT, FloatMath, FloatOps
from .llvm_ops import F32, F64, I1, I32, I64, LlvmOps

SMALL_TRIG_ARGUMENT = 0.78  # below pi/4 with margin: |x 2/pi| <= 0.497 rounds to n = 0

# The ops `define` gives at W lanes, by float width.
VECTOR_OPS = {32: tuple(op for op in OPS if op != "pow"), 64: OPS}


def splat(typ, value, lanes: int):
    """A `<lanes x typ>` constant of `value` in every lane."""
    return ll.Constant(ll.VectorType(typ, lanes), [ll.Constant(typ, value)] * lanes)


class _VectorMixin:
    """LlvmOps' operations over `<W x T>` values (W = `lanes`)."""

    FLOAT, SUFFIX = F64, "f64"

    def __init__(self, builder: ll.IRBuilder, lanes: int):
        super().__init__(builder)
        self.lanes = lanes
        self.vf = ll.VectorType(self.FLOAT, lanes)
        self.vi32, self.vi64 = ll.VectorType(I32, lanes), ll.VectorType(I64, lanes)

    def _call(self, intrinsic: str, *args):
        name = f"{intrinsic}.v{self.lanes}{self.SUFFIX}"
        return self.b.call(self._intrinsic(name, self.vf, [self.vf] * len(args)), list(args))

    def c(self, v):
        return splat(self.FLOAT, float(v), self.lanes)

    def ci(self, v):
        return splat(I32, int(v), self.lanes)

    def cl(self, v):
        return splat(I64, int(v) & (2 ** 64 - 1), self.lanes)

    def not_(self, a):
        return self.b.xor(a, splat(I1, 1, self.lanes))

    def branch(self, cond, then, otherwise):
        """`then` alone where every lane takes it (the common case: the costly side is for rare
        arguments), else both sides selected per lane (what if-conversion makes of the scalar
        branch)."""
        return self.uniform_or_mixed(cond, then, lambda: [self.b.select(cond, t, e)
                                                          for t, e in zip(then(), otherwise())], "lanes")

    def uniform_or_mixed(self, cond, uniform, mixed, prefix: str) -> tuple:
        """`uniform()` where every lane of `cond` holds, else `mixed()` (each a sequence of
        values, emitted in a block of its own), joined by phis."""
        b = self.b
        every = b.call(self._intrinsic(f"llvm.vector.reduce.and.v{self.lanes}i1", I1, [cond.type]), [cond])
        common, other, merge = (b.function.append_basic_block(f"{prefix}.{name}") for name in ("all", "mixed",
                                                                                               "merge"))
        b.cbranch(every, common, other)
        ends, values = [], []
        for block, make in ((common, uniform), (other, mixed)):
            b.position_at_end(block)
            values.append(make())
            ends.append(b.block)
            b.branch(merge)
        b.position_at_end(merge)
        out = []
        for fast, slow in zip(*values):
            phi = b.phi(fast.type)
            phi.add_incoming(fast, ends[0])
            phi.add_incoming(slow, ends[1])
            out.append(phi)
        return tuple(out)

    def to_i32(self, a):
        return self.b.fptosi(a, self.vi32)

    def i32_to_f(self, a):
        return self.b.sitofp(a, self.vf)

    def bits(self, a):
        return self.b.bitcast(a, self.vi64 if self.FLOAT is F64 else self.vi32)

    def from_bits(self, a):
        return self.b.bitcast(a, self.vf)

    def l_from_i32(self, a):
        return self.b.sext(a, self.vi64)

    def l_to_i32(self, a):
        return self.b.trunc(a, self.vi32)


class VectorDoubleOps(_VectorMixin, LlvmOps):
    pass


class VectorFloatOps(_VectorMixin, FloatOps):
    FLOAT, SUFFIX = F32, "f32"
    INTEGERS_FROM = FloatOps.INTEGERS_FROM


class VectorFloatMath(FloatMath):
    """FloatMath over `<W x float>`."""

    def __init__(self, builder: ll.IRBuilder, lanes: int):
        self.o = VectorFloatOps(builder, lanes)
        self.b = builder
        self.lanes = lanes

    # sin, cos and tan where every lane is below SMALL_TRIG_ARGUMENT: such an x reduces to
    # (hi, lo, n) = (x, +0, 0) exactly (x 2/pi rounds to 0, every product with n is +0), so the
    # reduction is skipped and the quadrant-0 polynomial alone is left once the constant n folds;
    # the same operations on the same values as the full path, hence the same bits.
    def sin(self, x):
        return self._small_or_full(x, FloatMath.sin_reduced)

    def cos(self, x):
        return self._small_or_full(x, FloatMath.cos_reduced)

    def tan(self, x):
        return self._small_or_full(x, FloatMath.tan_reduced)

    def _small_or_full(self, x, of_reduced):
        o = self.o
        below = o.lt(o.fabs(x), o.c(SMALL_TRIG_ARGUMENT))
        return o.uniform_or_mixed(below, lambda: (of_reduced(self, x, x, o.c(0.0), o.ci(0)),),
                                  lambda: (of_reduced(self, x, *self.reduce(x)),), "trig.small")[0]

    def reduce(self, x):
        """(hi, lo, n) as FloatMath.reduce: the float reduction where every lane is below
        TRIG_FLOAT_LIMIT (the common case), else the float reduction where it applies and
        Payne-Hanek for the other lanes one at a time, through the scalar code
        (`_large_reduction_function`): at W lanes its 64-bit integer products would be most of
        a kernel's machine code, for arguments that rarely occur."""
        o, b = self.o, self.b
        small = o.lt(o.fabs(x), o.c(TRIG_FLOAT_LIMIT))

        def mixed():
            near, far = self._reduce_float(x), self._reduce_lane_by_lane(x)
            return [b.select(small, a, c) for a, c in zip(near, far)]
        return o.uniform_or_mixed(small, lambda: self._reduce_float(x), mixed, "trig")

    def _reduce_lane_by_lane(self, x):
        """FloatMath._reduce_large of each lane, in a loop over the lanes."""
        o, b, w = self.o, self.b, self.lanes
        fn = _large_reduction_function(b.module)
        entry = b.function.entry_basic_block
        slots = ll.IRBuilder(entry)
        slots.position_at_start(entry)
        lanes = ll.Constant(I32, w)
        arrays = [slots.alloca(t, size=lanes) for t in (F32, F32, I32)]  # hi, lo, n of each lane
        argument = slots.alloca(F32, size=lanes)
        b.store(x, b.bitcast(argument, ll.PointerType(o.vf)), align=4)  # the arrays are only 4-byte aligned
        index = slots.alloca(I32)
        b.store(ll.Constant(I32, 0), index)
        head, body, done = (b.function.append_basic_block(name) for name in ("lanes.head", "lanes.body", "lanes.done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.load(index, typ=I32)
        b.cbranch(b.icmp_unsigned("<", i, ll.Constant(I32, w)), body, done)
        b.position_at_end(body)
        lane = b.load(b.gep(argument, [i], source_etype=F32), typ=F32)
        result = b.call(fn, [lane])
        for k, (array, t) in enumerate(zip(arrays, (F32, F32, I32))):
            b.store(b.extract_value(result, k), b.gep(array, [i], source_etype=t))
        b.store(b.add(i, ll.Constant(I32, 1)), index)
        b.branch(head)
        b.position_at_end(done)
        return tuple(b.load(b.bitcast(array, ll.PointerType(t)), typ=t, align=4)
                     for array, t in zip(arrays, (o.vf, o.vf, o.vi32)))


def _large_reduction_function(module: ll.Module) -> ll.Function:
    """`{float, float, i32} (float)`: FloatMath._reduce_large of one float, defined once."""
    name = "__qdc_vm_reduce_large_f32"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    result = ll.LiteralStructType([F32, F32, I32])
    fn = ll.Function(module, ll.FunctionType(result, [F32]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    value = ll.Constant(result, None)
    for k, part in enumerate(FloatMath(b)._reduce_large(fn.args[0])):
        value = b.insert_value(value, part, k)
    b.ret(value)
    return fn


def function_name(op: str, bits: int, lanes: int) -> str:
    return f"__qdc_vm_{op}_v{lanes}f{bits}"


def vector_math(module: ll.Module, op: str, bits: int, lanes: int) -> ll.Function | None:
    """`<lanes x f{bits}> op(<lanes x f{bits}>...)` in `module`, defined on first use; None
    where `op` has no vector form (the caller goes lane by lane)."""
    if op not in VECTOR_OPS[bits]:
        return None
    t = ll.VectorType(F64 if bits == 64 else F32, lanes)
    fn, b = math_function(module, function_name(op, bits, lanes), t, op)
    if b is None:
        return fn
    if bits == 32 and op in FLOAT_OPS:
        b.ret(getattr(VectorFloatMath(b, lanes), op)(*fn.args))
        return fn
    wide = ll.VectorType(F64, lanes)
    value = Float64Math(VectorDoubleOps(b, lanes))(op, *(a if bits == 64 else b.fpext(a, wide) for a in fn.args))
    b.ret(value if bits == 64 else b.fptrunc(value, t))
    return fn
