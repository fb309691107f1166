"""The numpy-binding entry of a CPU kernel library (runtime/devices/cpu/numpy_binding.py says why
and what the words mean): `i32 @<entry>_np(ptr ctx)` binds each numpy array the launch code
passed by address, then runs the fused entry and returns 0; it returns 1, having run nothing,
when an array fails a check."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract.artifact import KernelMeta
from qdc.runtime.devices.cpu import numpy_binding as nb

from ..llvm.llvm_ir import I32, I64, PTR

NUMPY_ENTRY_SUFFIX = "_np"


def add_numpy_entry(module: ll.Module, meta: KernelMeta) -> None:
    params = [(i, p) for i, p in enumerate(meta.params) if nb.eligible(p)]
    if not params:
        return
    entry = module.globals[meta.entry]
    fn = ll.Function(module, ll.FunctionType(I32, [PTR]), name=meta.entry + NUMPY_ENTRY_SUFFIX)
    ctx = fn.args[0]
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    refuse = fn.append_basic_block("refuse")

    def word(index: int):
        return b.gep(ctx, [ll.Constant(I64, index)], source_etype=I64)

    def field(obj, offset: int, typ):
        return b.load(b.gep(obj, [ll.Constant(I64, offset)], source_etype=ll.IntType(8)), typ=typ)

    for i, p in params:
        bind = fn.append_basic_block(f"bind.{p.name}")
        check = fn.append_basic_block(f"check.{p.name}")
        fill = fn.append_basic_block(f"fill.{p.name}")
        done = fn.append_basic_block(f"done.{p.name}")
        b.cbranch(b.icmp_unsigned("==", b.load(word(p.slot + 1), typ=I64), ll.Constant(I64, nb.SENTINEL)), bind, done)
        b.position_at_end(bind)
        obj = b.inttoptr(b.load(word(p.slot), typ=I64), PTR)
        is_ndarray = b.icmp_unsigned("==", field(obj, nb.OFFSET_TYPE, I64), b.load(word(nb.type_word(meta.ctx_words)), typ=I64))
        b.cbranch(is_ndarray, check, refuse)
        b.position_at_end(check)
        flags = b.zext(field(obj, nb.OFFSET_FLAGS, I32), I64)
        need = b.load(word(nb.flags_word(meta.ctx_words, i)), typ=I64)
        ok = b.and_(b.icmp_signed("==", field(obj, nb.OFFSET_NDIM, I32), ll.Constant(I32, p.ndim)),
                    b.and_(b.icmp_unsigned("==", field(obj, nb.OFFSET_DESCR, I64),
                                           b.load(word(nb.dtype_word(meta.ctx_words, i)), typ=I64)),
                           b.icmp_unsigned("==", b.and_(flags, need), need)))
        b.cbranch(ok, fill, refuse)
        b.position_at_end(fill)
        b.store(field(obj, nb.OFFSET_DATA, I64), word(p.slot))
        dims = field(obj, nb.OFFSET_DIMS, PTR)
        for k in range(p.ndim):
            b.store(b.load(b.gep(dims, [ll.Constant(I64, k)], source_etype=I64), typ=I64), word(p.slot + 1 + k))
        b.branch(done)
        b.position_at_end(done)
    b.call(entry, [ctx])
    b.ret(ll.Constant(I32, 0))
    b.position_at_end(refuse)
    b.ret(ll.Constant(I32, 1))
    marker = ll.GlobalVariable(module, I32, name=nb.MARKER)
    marker.global_constant = True
    marker.initializer = ll.Constant(I32, 1)
