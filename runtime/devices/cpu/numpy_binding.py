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
"""
from __future__ import annotations

import ctypes

import numpy as np

MARKER = "qdc_numpy_prologue_v1"
SENTINEL = (1 << 64) - 1  # a shape word no array can have (shapes are below 2**63)

# PyArrayObject_fields: PyObject_HEAD (refcount, type), data, nd, dimensions, strides, base, descr, flags
OFFSET_TYPE, OFFSET_DATA, OFFSET_NDIM, OFFSET_DIMS, OFFSET_DESCR, OFFSET_FLAGS = 8, 16, 24, 32, 56, 64
C_CONTIGUOUS, WRITEABLE = 0x0001, 0x0400  # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE


def extra_words(num_params: int) -> int:
    return 1 + 2 * num_params


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

    def fill(self, words) -> None:
        from ...contract.types import by_name
        base = self.meta.ctx_words
        words[type_word(base)] = id(np.ndarray)
        for i in self.params:
            p = self.meta.params[i]
            words[dtype_word(base, i)] = id(by_name(p.dtype).np_dtype)  # a builtin dtype: lives as long as numpy
            words[flags_word(base, i)] = required_flags(bool(p.writes))
