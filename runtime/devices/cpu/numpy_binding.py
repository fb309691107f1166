"""Binding numpy arrays inside the CPU kernel's fused entry (issue 14: a launch with a different
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

The words the prologue compares against follow the kernel's own ctx words (KernelMeta.ctx_words
= E): word E holds the address of numpy.ndarray, and for parameter i word E + 1 + 2i the
address of its dtype object and E + 2 + 2i the flag bits it must have. The field offsets of
numpy's array struct (PyArrayObject_fields, unchanged from numpy 1.7 through 2.x) are checked
against a live array before the launcher uses this path (`numpy_layout_matches`); a kernel
library carries the prologue when it exports MARKER.

The Python entry goes further (issue 14: a launch costs less than a ctypes call of a no-op):
`<entry>_py` is a METH_FASTCALL function that `PyCFunction_NewEx` makes a builtin of, with the
launcher's ctx buffer (a ctypes object) for `self`. It binds every argument from the Python
objects themselves: numpy arrays as above, Python floats (an f32 out of range is refused, as
struct refuses it), ints (through PyLong_AsLongLongAndOverflow, range-checked per type) and
True/False, then runs the fused entry, without releasing the GIL and without a ctypes call.
It returns None, or the buffer, having run nothing, for an argument it leaves to Python. The
interpreter's addresses it needs are ctx words (`PY_*`), so the library links against no
Python; the object layouts it reads are checked on live objects (`python_layout_matches`).
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np

MARKER = "qdc_numpy_prologue_v1"
SENTINEL = (1 << 64) - 1  # a shape word no array can have (shapes are below 2**63)

# PyArrayObject_fields: PyObject_HEAD (refcount, type), data, nd, dimensions, strides, base, descr, flags
OFFSET_TYPE, OFFSET_DATA, OFFSET_NDIM, OFFSET_DIMS, OFFSET_DESCR, OFFSET_FLAGS = 8, 16, 24, 32, 56, 64
C_CONTIGUOUS, WRITEABLE = 0x0001, 0x0400  # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE


# The Python entry (`<entry>_py`, a METH_FASTCALL function of its own: see PYTHON_ENTRY below)
# reads these after the numpy words: the addresses of float, int, True, False, None, and of
# Py_IncRef and PyLong_AsLongLongAndOverflow (the library links against no Python).
PY_FLOAT, PY_LONG, PY_TRUE, PY_FALSE, PY_NONE, PY_INCREF, PY_AS_LONG = range(7)
PY_WORDS = 7


def extra_words(num_params: int) -> int:
    return 1 + 2 * num_params + PY_WORDS


def python_word(ctx_words: int, num_params: int, which: int) -> int:
    return ctx_words + 1 + 2 * num_params + which


def type_word(ctx_words: int) -> int:
    return ctx_words


def dtype_word(ctx_words: int, index: int) -> int:
    return ctx_words + 1 + 2 * index


def flags_word(ctx_words: int, index: int) -> int:
    return ctx_words + 2 + 2 * index


def required_flags(writes: bool) -> int:
    return C_CONTIGUOUS | (WRITEABLE if writes else 0)


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
            dims = _read(base + OFFSET_DIMS, ctypes.c_void_p)
            flags = _read(base + OFFSET_FLAGS, ctypes.c_int)
            _layout_checked = (_read(base + OFFSET_TYPE, ctypes.c_void_p) == id(np.ndarray)
                               and _read(base + OFFSET_DATA, ctypes.c_void_p) == a.ctypes.data
                               and _read(base + OFFSET_NDIM, ctypes.c_int) == 2
                               and [_read(dims + 8 * k, ctypes.c_int64) for k in range(2)] == [3, 5]
                               and _read(base + OFFSET_DESCR, ctypes.c_void_p) == id(a.dtype)
                               and flags & (C_CONTIGUOUS | WRITEABLE) == C_CONTIGUOUS | WRITEABLE)
            a.flags.writeable = False
            _layout_checked = _layout_checked and not _read(base + OFFSET_FLAGS, ctypes.c_int) & WRITEABLE
        except (ValueError, OSError, TypeError):
            _layout_checked = False
    return _layout_checked


PYTHON_MARKER = "qdc_python_entry_v1"
PYTHON_ENTRY_SUFFIX = "_py"
PYTHON_SCALARS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "u1")
FLOAT_VALUE = 16  # PyFloatObject.ob_fval
CDATA_POINTER = 16  # a ctypes object's b_ptr: the Python entry's `self` is the ctx buffer
METH_FASTCALL = 0x0080


def python_entry_possible(meta) -> bool:
    """Whether a kernel gets the Python entry: every parameter bound by it (numpy arrays the
    prologue binds, Python floats, ints and bools for scalars of these types; not the elements
    of a vector argument, which is one value for several records)."""
    return bool(meta.params) and all(eligible(p) if p.kind == "ndarray" else p.dtype in PYTHON_SCALARS
                                     and not p.element_shape for p in meta.params)


_python_layout: bool | None = None


def python_layout_matches() -> bool:
    """Whether this interpreter's objects have their type, a float's value and a ctypes
    buffer's pointer where the Python entry reads them (tested once, on live objects)."""
    global _python_layout
    if _python_layout is None:
        x, buf = 1.75, (ctypes.c_uint64 * 1)()
        _python_layout = (sys.implementation.name == "cpython" and hasattr(ctypes, "pythonapi")
                          and _read(id(x) + OFFSET_TYPE, ctypes.c_void_p) == id(float)
                          and _read(id(x) + FLOAT_VALUE, ctypes.c_double) == x
                          and _read(id(buf) + CDATA_POINTER, ctypes.c_void_p) == ctypes.addressof(buf)
                          and numpy_layout_matches())
    return _python_layout


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

    def __init__(self, address: int, name: str, buf):
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
        lib[PYTHON_MARKER]
        fn = lib[meta.entry + PYTHON_ENTRY_SUFFIX]
    except (AttributeError, TypeError):
        return None
    if not (python_entry_possible(meta) and python_layout_matches()):
        return None
    return PythonEntry(_address(fn), meta.name, buf)


def eligible(param) -> bool:
    """Whether the prologue binds this parameter (a ParamMeta): an ndarray with a shape word,
    whose gradient the kernel does not use (a numpy array has none), of scalar elements (the
    launcher checks a vector element's axes itself)."""
    return param.kind == "ndarray" and param.ndim >= 1 and not param.needs_grad \
        and not getattr(param, "element_shape", ())


class NumpyBinding:
    """What a launcher needs to use a library's numpy-binding entry: `call` (returns nonzero when
    an array was refused), `params` (the indices bound natively), `ctx_words` (the ctx size it
    needs) and `fill(words)`, which writes the words the entry compares against."""

    def __init__(self, call, meta):
        self.call, self.meta = call, meta
        self.params = [i for i, p in enumerate(meta.params) if eligible(p)]
        self.ctx_words = meta.ctx_words + extra_words(len(meta.params))
        self.sentinel = SENTINEL

    def python_entry(self, lib, buf) -> PythonEntry | None:
        return python_entry(lib, self.meta, buf) if lib is not None else None

    def fill(self, words) -> None:
        from ...contract.types import by_name
        base = self.meta.ctx_words
        words[type_word(base)] = id(np.ndarray)
        for i in self.params:
            p = self.meta.params[i]
            words[dtype_word(base, i)] = id(by_name(p.dtype).np_dtype)  # a builtin dtype: lives as long as numpy
            words[flags_word(base, i)] = required_flags(bool(p.writes))
        if not python_layout_matches():
            return
        api = ctypes.pythonapi
        for which, address in ((PY_FLOAT, id(float)), (PY_LONG, id(int)), (PY_TRUE, id(True)),
                               (PY_FALSE, id(False)), (PY_NONE, id(None)),
                               (PY_INCREF, _address(api.Py_IncRef)),
                               (PY_AS_LONG, _address(api.PyLong_AsLongLongAndOverflow))):
            words[python_word(base, len(self.meta.params), which)] = address  # builtins: live as long as Python
