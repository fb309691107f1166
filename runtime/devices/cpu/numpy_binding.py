"""Binding numpy arrays inside the CPU kernel's fused entry (a launch with a different
array on every call).

Getting a numpy array's data pointer from Python costs more than the whole launch of a
cached array (the buffer protocol: ~200 ns), so for a numpy argument the launch code writes
only the array object's address (`id(a)`) into the parameter's pointer word and SENTINEL into
its first shape word; the fused entry (compiler/targets/cpu/codegen.py, `add_numpy_prologue`)
then checks, for each such parameter, the array's type (numpy.ndarray itself, not a
subclass), ndim, dtype (the builtin dtype object, by address), and flags (C-contiguous, and
writeable when the kernel writes it), and replaces the two words by the data pointer and the
shape before any task runs. When a check fails it runs nothing and returns 1: the launch
code then binds the array in Python (`bind`, which accepts what it should and raises naming
what is wrong) and launches again. The call holds the GIL (PyDLL), so the array cannot change
while it is read.

The words the prologue compares against and the offsets it reads are the contract's
(runtime/contract/cpu_binding.py). The field offsets of
numpy's array struct (PyArrayObject_fields, unchanged from numpy 1.7 through 2.x) are checked
against a live array before the launcher uses this path (`numpy_layout_matches`); a kernel
library carries the prologue when it exports its MARKER.

The Python entry goes further (a launch costs less than a ctypes call of a no-op):
`<entry>_py` is a METH_FASTCALL function that `PyCFunction_NewEx` makes a builtin of, with the
launcher's ctx buffer (a ctypes object) for `self`. It binds every argument from the Python
objects themselves: numpy arrays as above, Python floats (an f32 out of range is refused, as
struct refuses it), ints (through PyLong_AsLongLongAndOverflow, range-checked per type) and
True/False, then runs the fused entry, without releasing the GIL and without a ctypes call.
It returns None, or the buffer, having run nothing, for an argument it leaves to Python. For an
array it bound itself the launch code passes KEPT, the runtime's own marker object, so that no
argument a program passes (None included) can stand for one (libraries built before the marker
take None). The
interpreter's addresses it needs are ctx words, so the library links against no
Python; the object layouts it reads are checked on live objects (`python_layout_matches`).
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from ...contract import cpu_binding as layout
from ...contract.types import by_name


def _read(address: int, ctype):
    return ctype.from_address(address).value


_layout_checked: bool | None = None


def numpy_layout_matches() -> bool:
    """Whether this numpy's arrays have the fields where the prologue reads them (tested once, on
    a live array: its type, data pointer, ndim, shape, dtype object and flags)."""
    global _layout_checked
    if _layout_checked is None:
        a = np.zeros((3, 5), np.float32)
        base = id(a)
        try:
            dims = _read(base + layout.OFFSET_DIMS, ctypes.c_void_p)
            flags = _read(base + layout.OFFSET_FLAGS, ctypes.c_int)
            _layout_checked = (_read(base + layout.OFFSET_TYPE, ctypes.c_void_p) == id(np.ndarray)
                               and _read(base + layout.OFFSET_DATA, ctypes.c_void_p) == a.ctypes.data
                               and _read(base + layout.OFFSET_NDIM, ctypes.c_int) == 2
                               and [_read(dims + 8 * k, ctypes.c_int64) for k in range(2)] == [3, 5]
                               and _read(base + layout.OFFSET_DESCR, ctypes.c_void_p) == id(a.dtype)
                               and flags & layout.required_flags(True) == layout.required_flags(True))
            a.flags.writeable = False
            _layout_checked = _layout_checked and not _read(base + layout.OFFSET_FLAGS, ctypes.c_int) & layout.WRITEABLE
        except (ValueError, OSError, TypeError):
            _layout_checked = False
    return _layout_checked


METH_FASTCALL = 0x0080
_python_layout: bool | None = None


def python_layout_matches() -> bool:
    """Whether this interpreter's objects have their type, a float's value and a ctypes
    buffer's pointer where the Python entry reads them (tested once, on live objects)."""
    global _python_layout
    if _python_layout is None:
        x, buf = 1.75, (ctypes.c_uint64 * 1)()
        _python_layout = (sys.implementation.name == "cpython" and hasattr(ctypes, "pythonapi")
                          and _read(id(x) + layout.OFFSET_TYPE, ctypes.c_void_p) == id(float)
                          and _read(id(x) + layout.FLOAT_VALUE, ctypes.c_double) == x
                          and _read(id(buf) + layout.CDATA_POINTER, ctypes.c_void_p) == ctypes.addressof(buf)
                          and numpy_layout_matches())
    return _python_layout


class _Kept:
    """The type of KEPT: the argument that leaves an array's words as the launch code bound them."""
    __slots__ = ()

    def __repr__(self):
        return "<qdc kept words>"


KEPT = _Kept()


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p), ("flags", ctypes.c_int),
                ("doc", ctypes.c_char_p)]


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


class PythonEntry:
    """`function(*args)`: the kernel's Python entry as a builtin function whose `self` is the
    launcher's ctx buffer: it binds every argument and launches, returning None, or returns
    the buffer, having run nothing, when an argument is not one it binds (the launch code
    then binds in Python). The method definition must outlive the function: kept here."""

    def __init__(self, address: int, name: str, buf, keeps_bound: bool = False, watches: bool = False):
        self.keeps_bound = keeps_bound  # KEPT for an array: its words, bound by the launch code, stand
        self.watches = watches  # a cached tensor is passed itself, checked by the entry (runtime/tensor_watch.py)
        self.kept = KEPT
        self.definition = _MethodDef(name.encode(), address, METH_FASTCALL, None)
        new_function = ctypes.pythonapi.PyCFunction_NewEx
        new_function.restype = ctypes.py_object
        new_function.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
        self.function = new_function(ctypes.addressof(self.definition), buf, None)
        self.buf = buf


def python_entry(lib, meta, buf) -> PythonEntry | None:
    """The kernel's Python entry bound to `buf`, when its library has one and this interpreter
    lays its objects out as the entry expects."""
    try:
        lib[layout.PYTHON_MARKER]
        fn = lib[meta.entry + layout.PYTHON_ENTRY_SUFFIX]
    except (AttributeError, TypeError):
        return None
    if not (layout.python_entry_possible(meta) and python_layout_matches()):
        return None
    return PythonEntry(_address(fn), meta.name, buf, _exports(lib, layout.PYTHON_BOUND_MARKER),
                       _exports(lib, layout.PYTHON_WATCH_MARKER))


def _exports(lib, name: str) -> bool:
    try:
        return bool(lib[name])
    except (AttributeError, TypeError):
        return False


class NumpyBinding:
    """What a launcher needs to use a library's numpy-binding entry: `call` (returns nonzero when
    an array was refused), `params` (the indices bound natively), `ctx_words` (the ctx size it
    needs) and `fill(words)`, which writes the words the entry compares against."""

    def __init__(self, call, meta):
        self.call, self.meta = call, meta
        self.params = [i for i, p in enumerate(meta.params) if layout.eligible(p)]
        self.ctx_words = meta.ctx_words + layout.extra_words(len(meta.params))
        self.sentinel = layout.SENTINEL

    def python_entry(self, lib, buf) -> PythonEntry | None:
        return python_entry(lib, self.meta, buf) if lib is not None else None

    def fill(self, words) -> None:
        base = self.meta.ctx_words
        words[layout.type_word(base)] = id(np.ndarray)
        for i in self.params:
            p = self.meta.params[i]
            words[layout.dtype_word(base, i)] = id(by_name(p.dtype).np_dtype)  # a builtin dtype: lives as long as numpy
            words[layout.flags_word(base, i)] = layout.required_flags(bool(p.writes))
        if not python_layout_matches():
            return
        api = ctypes.pythonapi
        for which, address in ((layout.PY_FLOAT, id(float)), (layout.PY_LONG, id(int)), (layout.PY_TRUE, id(True)),
                               (layout.PY_FALSE, id(False)), (layout.PY_NONE, id(None)),
                               (layout.PY_INCREF, _address(api.Py_IncRef)),
                               (layout.PY_AS_LONG, _address(api.PyLong_AsLongLongAndOverflow))):
            words[layout.python_word(base, len(self.meta.params), which)] = address  # builtins: live as long as Python
        words[layout.watch_word(base, len(self.meta.params), layout.WATCH_KEPT)] = id(KEPT)  # lives as long as qdc
