"""The Python entry's check of a watched tensor (runtime/contract/cpu_binding.py, WATCH_GET).

A contiguous CPU torch tensor that the launch code bound keeps its words between launches, as a
qd.ndarray does, but its storage can be replaced under the same object (`t.set_(...)`,
`t.resize_(...)`, `t.data = ...`), and only torch knows where its data is now. The launch code
therefore passes the tensor itself, and the entry launches with the parameter's words only if
the argument is the tensor they were bound for and torch's stable C shim
(`aoti_torch_get_data_ptr`, called through the handle the runtime made for that tensor) says
its data is still at the address the pointer word holds. Anything else goes to the numpy
binding, which refuses what is not a numpy array: the launch code then binds it in Python. A
numpy array bound here leaves no tensor watched, so a tensor that comes back after it is
rebound in Python whatever its address."""
from __future__ import annotations

from llvmlite import ir as ll

from qdc.runtime.contract import cpu_binding as nb

from ..llvm.llvm_types import I32, I64, PTR


def bind_array(binder, i: int, p, obj, callee) -> None:
    """Check or bind array argument `obj` of parameter `i` (`p`) in the Python entry: a watched
    tensor against torch's address of its data, anything else as a numpy array. `callee(pointer,
    function type)` makes a function pointer callable."""
    b, meta = binder.b, binder.meta
    count = len(meta.params)
    watched = nb.watched_object_word(meta.ctx_words, count, i)
    check = binder.fn.append_basic_block(f"watched.{p.name}")
    numpy = binder.fn.append_basic_block(f"numpy.{p.name}")
    done = binder.fn.append_basic_block(f"array.{p.name}")
    b.cbranch(b.icmp_unsigned("==", b.ptrtoint(obj, I64), binder.word(watched)), check, numpy)
    b.position_at_end(check)
    data = b.alloca(I64)
    get = b.inttoptr(binder.word(nb.watch_word(meta.ctx_words, count, nb.WATCH_GET)), PTR)
    handle = b.inttoptr(binder.word(nb.watched_handle_word(meta.ctx_words, count, i)), PTR)
    status = b.call(callee(get, ll.FunctionType(I32, [PTR, PTR])), [handle, data])
    binder.require(b.and_(b.icmp_signed("==", status, ll.Constant(I32, 0)),
                          b.icmp_unsigned("==", b.load(data, typ=I64), binder.word(p.slot))), f"moved.{p.name}")
    b.branch(done)
    b.position_at_end(numpy)
    binder.array(i, p, obj)
    b.store(ll.Constant(I64, 0), binder.word_ptr(watched))  # its words are the array's now
    b.branch(done)
    b.position_at_end(done)

