"""The binding entries of a CPU kernel library (runtime/devices/cpu/numpy_binding.py says why and
what the words mean):
- `i32 @<entry>_np(ptr ctx)` binds each numpy array the launch code passed by address, then
  runs the fused entry and returns 0; it returns 1, having run nothing, when an array fails a
  check.
- `ptr @<entry>_py(ptr self, ptr args, i64 nargs)`, a METH_FASTCALL function whose `self` is
  the ctx buffer (a ctypes object): it binds every argument itself (numpy arrays, Python
  floats, ints and bools), runs the fused entry and returns None; it returns `self`, having
  run nothing, when an argument is not one it binds, which the launch code then binds in
  Python (raising for what is wrong). The runtime's KEPT marker for an array says that the launch
  code bound it itself (a qd.ndarray it caches): its words are left as they are; a watched
  tensor is checked against torch's address of its data (tensor_watch.py). Every check of the
  Python binding is made on every call, so nothing is cached between launches."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract.artifact import KernelMeta
from qdc.runtime.contract.types import by_name
from qdc.runtime.contract import cpu_binding as nb

from ..llvm.llvm_types import I32, I64, PTR
from . import tensor_watch

NUMPY_ENTRY_SUFFIX = "_np"
F32, F64 = ll.FloatType(), ll.DoubleType()


class _Binder:
    """Emits the checks and stores of one binding entry into `b`; a failed check branches to
    `refuse`."""

    def __init__(self, b: ll.IRBuilder, ctx, meta: KernelMeta, refuse):
        self.b, self.ctx, self.meta, self.refuse = b, ctx, meta, refuse
        self.fn = b.function
        self.overflow_flag = None  # the Python entry's int for PyLong_AsLongLongAndOverflow

    def word_ptr(self, index: int):
        return self.b.gep(self.ctx, [ll.Constant(I64, index)], source_etype=I64)

    def word(self, index: int):
        return self.b.load(self.word_ptr(index), typ=I64)

    def field(self, obj, offset: int, typ):
        return self.b.load(self.b.gep(obj, [ll.Constant(I64, offset)], source_etype=ll.IntType(8)), typ=typ)

    def require(self, ok, name: str) -> None:
        """Continue in a new block where `ok` holds; refuse otherwise."""
        then = self.fn.append_basic_block(name)
        self.b.cbranch(ok, then, self.refuse)
        self.b.position_at_end(then)

    def python_word(self, which: int):
        return self.word(nb.python_word(self.meta.ctx_words, len(self.meta.params), which))

    def array(self, i: int, p, obj) -> None:
        """Check numpy array `obj` for parameter `i` and write its data pointer and shape."""
        b, meta = self.b, self.meta
        self.require(b.icmp_unsigned("==", self.field(obj, nb.OFFSET_TYPE, I64), self.word(nb.type_word(meta.ctx_words))),
                     f"check.{p.name}")
        flags = b.zext(self.field(obj, nb.OFFSET_FLAGS, I32), I64)
        need = self.word(nb.flags_word(meta.ctx_words, i))
        ok = b.and_(b.icmp_signed("==", self.field(obj, nb.OFFSET_NDIM, I32), ll.Constant(I32, p.ndim)),
                    b.and_(b.icmp_unsigned("==", self.field(obj, nb.OFFSET_DESCR, I64),
                                           self.word(nb.dtype_word(meta.ctx_words, i))),
                           b.icmp_unsigned("==", b.and_(flags, need), need)))
        self.require(ok, f"fill.{p.name}")
        b.store(self.field(obj, nb.OFFSET_DATA, I64), self.word_ptr(p.slot))
        dims = self.field(obj, nb.OFFSET_DIMS, PTR)
        for k in range(p.ndim):
            b.store(b.load(b.gep(dims, [ll.Constant(I64, k)], source_etype=I64), typ=I64), self.word_ptr(p.slot + 1 + k))

    def scalar(self, p, obj) -> None:
        """Write Python scalar `obj` as the word `struct.pack` would (the value in the low bytes,
        zeros above), refusing what it would not pack and what the entry leaves to Python (a
        bool or int for a float, numpy scalars, 0/1 for a bool)."""
        b = self.b
        if p.dtype == "u1":
            is_true = b.icmp_unsigned("==", b.ptrtoint(obj, I64), self.python_word(nb.PY_TRUE))
            is_false = b.icmp_unsigned("==", b.ptrtoint(obj, I64), self.python_word(nb.PY_FALSE))
            self.require(b.or_(is_true, is_false), f"bool.{p.name}")
            b.store(b.zext(is_true, I64), self.word_ptr(p.slot))
            return
        kind = self.field(obj, nb.OFFSET_TYPE, I64)
        if p.dtype[0] == "f":
            self.require(b.icmp_unsigned("==", kind, self.python_word(nb.PY_FLOAT)), f"float.{p.name}")
            value = self.field(obj, nb.FLOAT_VALUE, F64)
            if p.dtype == "f64":
                b.store(b.bitcast(value, I64), self.word_ptr(p.slot))
                return
            single = b.fptrunc(value, F32)
            # struct's OverflowError: a finite value beyond the largest f32
            overflow = b.and_(b.fcmp_ordered("==", b.call(self.intrinsic("llvm.fabs.f32", F32), [single]),
                                             ll.Constant(F32, float("inf"))),
                              b.fcmp_ordered("!=", b.call(self.intrinsic("llvm.fabs.f64", F64), [value]),
                                             ll.Constant(F64, float("inf"))))
            self.require(b.not_(overflow), f"f32.{p.name}")
            b.store(b.zext(b.bitcast(single, I32), I64), self.word_ptr(p.slot))
            return
        self.require(b.icmp_unsigned("==", kind, self.python_word(nb.PY_LONG)), f"int.{p.name}")
        overflow = self.overflow_flag
        as_long = _Callee(b.inttoptr(self.python_word(nb.PY_AS_LONG), PTR), ll.FunctionType(I64, [PTR, PTR]))
        value = b.call(as_long, [obj, overflow])
        bits = by_name(p.dtype).nbytes * 8
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if p.dtype[0] == "i" else (0, min((1 << bits) - 1, (1 << 63) - 1))
        ok = b.and_(b.icmp_signed("==", b.load(overflow, typ=I32), ll.Constant(I32, 0)),
                    b.and_(b.icmp_signed(">=", value, ll.Constant(I64, low)), b.icmp_signed("<=", value, ll.Constant(I64, high))))
        self.require(ok, f"range.{p.name}")
        b.store(value if bits == 64 else b.zext(b.trunc(value, ll.IntType(bits)), I64), self.word_ptr(p.slot))

    def intrinsic(self, name: str, typ):
        module = self.fn.module
        return module.globals.get(name) or ll.Function(module, ll.FunctionType(typ, [typ]), name=name)


class _Callee:
    """A function pointer read from the ctx, as llvmlite's `call` wants its callee."""

    def __init__(self, pointer, function_type):
        self.pointer, self.function_type = pointer, function_type

    @property
    def type(self):
        return self.pointer.type

    def get_reference(self):
        return self.pointer.get_reference()


def add_numpy_entry(module: ll.Module, meta: KernelMeta) -> None:
    params = [(i, p) for i, p in enumerate(meta.params) if nb.eligible(p)]
    if not params:
        return
    entry = module.globals[meta.entry]
    fn = ll.Function(module, ll.FunctionType(I32, [PTR]), name=meta.entry + NUMPY_ENTRY_SUFFIX)
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    refuse = fn.append_basic_block("refuse")
    binder = _Binder(b, fn.args[0], meta, refuse)
    for i, p in params:
        bind = fn.append_basic_block(f"bind.{p.name}")
        done = fn.append_basic_block(f"done.{p.name}")
        b.cbranch(b.icmp_unsigned("==", binder.word(p.slot + 1), ll.Constant(I64, nb.SENTINEL)), bind, done)
        b.position_at_end(bind)
        binder.array(i, p, b.inttoptr(binder.word(p.slot), PTR))
        b.branch(done)
        b.position_at_end(done)
    b.call(entry, [fn.args[0]])
    b.ret(ll.Constant(I32, 0))
    b.position_at_end(refuse)
    b.ret(ll.Constant(I32, 1))
    _compile_lightly(fn)
    _marker(module, nb.MARKER)
    if nb.python_entry_possible(meta):
        add_python_entry(module, meta)


def add_python_entry(module: ll.Module, meta: KernelMeta) -> None:
    entry = module.globals[meta.entry]
    fn = ll.Function(module, ll.FunctionType(PTR, [PTR, PTR, I64]), name=meta.entry + nb.PYTHON_ENTRY_SUFFIX)
    this, args, nargs = fn.args
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    refuse = fn.append_basic_block("refuse")
    ctx = b.load(b.gep(this, [ll.Constant(I64, nb.CDATA_POINTER)], source_etype=ll.IntType(8)), typ=PTR)
    binder = _Binder(b, ctx, meta, refuse)
    binder.overflow_flag = b.alloca(I32)
    binder.require(b.icmp_signed("==", nargs, ll.Constant(I64, len(meta.params))), "arguments")
    for i, p in enumerate(meta.params):
        obj = b.load(b.gep(args, [ll.Constant(I64, i)], source_etype=PTR), typ=PTR)
        if p.kind == "ndarray":  # KEPT: the launch code bound it (a qd.ndarray, a tensor) and its words stand
            bind, done = fn.append_basic_block(f"bind.{p.name}"), fn.append_basic_block(f"bound.{p.name}")
            kept = binder.word(nb.watch_word(meta.ctx_words, len(meta.params), nb.WATCH_KEPT))
            b.cbranch(b.icmp_unsigned("==", b.ptrtoint(obj, I64), kept), done, bind)
            b.position_at_end(bind)
            tensor_watch.bind_array(binder, i, p, obj, _Callee)
            b.branch(done)
            b.position_at_end(done)
        else:
            binder.scalar(p, obj)
    b.call(entry, [ctx])

    def return_new_reference(obj):
        b.call(_Callee(b.inttoptr(binder.python_word(nb.PY_INCREF), PTR), ll.FunctionType(ll.VoidType(), [PTR])), [obj])
        b.ret(obj)
    return_new_reference(b.inttoptr(binder.python_word(nb.PY_NONE), PTR))
    b.position_at_end(refuse)
    return_new_reference(this)
    _compile_lightly(fn)
    _marker(module, nb.PYTHON_MARKER)
    _marker(module, nb.PYTHON_BOUND_MARKER)
    _marker(module, nb.PYTHON_WATCH_MARKER)


def _compile_lightly(fn: ll.Function) -> None:
    """The binding entries are straight-line loads, compares and stores, which the optimiser
    and instruction selection at O3 hardly improve but spent ~10 ms per kernel on, a fifth of
    a small kernel's build (README, build throughput); unoptimised, a launch measured 1-3%
    slower (`python3 bench/launch_ab.py`), a few ns."""
    fn.attributes.add("optnone")
    fn.attributes.add("noinline")


def _marker(module: ll.Module, name: str) -> None:
    marker = ll.GlobalVariable(module, I32, name=name)
    marker.global_constant = True
    marker.initializer = ll.Constant(I32, 1)
