"""Letting the CPU kernel library's Python entry check a cached torch tensor itself
(compiler/targets/cpu/tensor_watch.py emits the check; runtime/contract/cpu_binding.py has the
words).

A cached tensor must be rebound when its storage was replaced under the same object
(`t.set_(...)`, `t.resize_(...)`, `t.data = ...`): only torch knows where its data is now.
Asking it from Python (`data_ptr()`, ~50 ns) costs about what a whole numpy launch costs. PyTorch
has a stable C ABI for this, the shim its ahead-of-time compiled models call:
`aoti_torch_get_data_ptr(handle, &data)` on an `AtenTensorHandle`, a heap `at::Tensor` sharing
the tensor's implementation (so it follows `set_`, `resize_` and `.data =`, which change that
implementation in place). The launcher makes one handle per watched tensor
(`torch._C._aoti.unsafe_alloc_void_ptr_from_tensor`), writes the tensor's address and the
handle into the parameter's watch words and the function's address into the WATCH_GET word,
and the entry calls it at every launch: a few ns. It is the address `data_ptr()` returns, taken
the same way (`at::Tensor::data_ptr`, which also gives a copy-on-write tensor its own memory).

Used only where every piece is there and behaves so on a live tensor (`data_pointer_function`
checks a fresh tensor, one after `set_` and one after `.data =`), and only for tensors of
exactly torch.Tensor or torch.nn.Parameter (a subclass may answer `data_ptr()` itself).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys

from .contract import cpu_binding as layout

_GET: int | None = None  # the address of aoti_torch_get_data_ptr once checked; 0: not usable
_delete = None  # aoti_torch_delete_tensor_object, as a ctypes function


def data_pointer_function() -> int:
    """The address of the shim's `aoti_torch_get_data_ptr`, or 0 where it is not usable."""
    global _GET, _delete
    if _GET is None:
        _GET = 0
        torch = sys.modules.get("torch")
        try:
            lib = ctypes.CDLL(_torch_library(torch))
            get, delete = lib.aoti_torch_get_data_ptr, lib.aoti_torch_delete_tensor_object
            get.restype, get.argtypes = ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
            delete.restype, delete.argtypes = ctypes.c_int32, [ctypes.c_void_p]
            alloc = torch._C._aoti.unsafe_alloc_void_ptr_from_tensor
        except (AttributeError, OSError, TypeError):
            return 0
        _delete = delete
        if _answers_as_data_ptr(torch, get, alloc):
            _GET = ctypes.cast(get, ctypes.c_void_p).value
    return _GET


def _torch_library(torch) -> str:
    """The path of the loaded library that exports the shim (libtorch_cpu)."""
    found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))
    if not found:
        raise OSError("no libtorch_cpu")
    return found[0]


def _answers_as_data_ptr(torch, get, alloc) -> bool:
    """Whether the shim, through a handle, gives `data_ptr()` of a live tensor, also after its
    storage was replaced in place."""
    t = torch.arange(8, dtype=torch.float32)
    handle = TensorHandle(_capsule_pointer(alloc(t)))
    data = ctypes.c_void_p()

    def agrees() -> bool:
        return get(handle.address, ctypes.byref(data)) == 0 and (data.value or 0) == t.data_ptr()
    ok = agrees()
    t.set_(torch.zeros(16))
    ok = ok and agrees()
    t.data = torch.ones(4)
    return ok and agrees()


def watchable(a) -> bool:
    """Whether tensor `a` may be watched: exactly a torch tensor or parameter, the shim usable."""
    global _WATCHED_TYPES
    if _WATCHED_TYPES is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _WATCHED_TYPES = (torch.Tensor, torch.nn.Parameter) if data_pointer_function() else ()
    return type(a) in _WATCHED_TYPES


_WATCHED_TYPES: tuple | None = None  # what `watchable` takes: () where the shim cannot be used


class Watches:
    """The tensors a launcher's Python entry watches, one per parameter at most, and the words
    that say so (`words`: the launcher's ctx as uint64s; `ctx_words`, `count`: the kernel's ctx
    size and parameter count). A watched tensor is kept alive with its handle while its address
    is in the words, so no other object can have that address."""

    def __init__(self, words, ctx_words: int, count: int):
        self.words, self.base, self.count = words, ctx_words, count
        self.watched: dict = {}  # parameter -> (TensorHandle, tensor)

    def __contains__(self, index: int) -> bool:
        return index in self.watched

    def watch(self, index: int, a) -> None:
        handle = TensorHandle.of(a)
        self.watched[index] = (handle, a)
        self.words[layout.watch_word(self.base, self.count, layout.WATCH_GET)] = data_pointer_function()
        self.words[layout.watched_handle_word(self.base, self.count, index)] = handle.address
        self.words[layout.watched_object_word(self.base, self.count, index)] = id(a)

    def unwatch(self, index: int) -> None:
        self.words[layout.watched_object_word(self.base, self.count, index)] = 0
        self.words[layout.watched_handle_word(self.base, self.count, index)] = 0
        del self.watched[index]  # deletes the handle, lets the tensor go


class TensorHandle:
    """An `at::Tensor` on the heap sharing a tensor's implementation (what the shim takes),
    deleted with this object."""
    __slots__ = ("address",)

    def __init__(self, address: int):
        self.address = address

    @classmethod
    def of(cls, a) -> "TensorHandle":
        return cls(_capsule_pointer(sys.modules["torch"]._C._aoti.unsafe_alloc_void_ptr_from_tensor(a)))

    def __del__(self):
        if self.address and _delete is not None:
            address, self.address = self.address, 0
            _delete(address)


def _capsule_pointer(capsule) -> int:
    """The pointer in an unnamed capsule (what torch hands a new handle out in)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, None)
