"""The CPU kernel library's argument-binding ABI: what the generated code
(compiler/targets/cpu/numpy_prologue.py) and the launcher (runtime/devices/cpu/numpy_binding.py)
agree on.

A numpy argument's pointer word holds the array object's address and its first shape word
SENTINEL; the library's `<entry>_np` entry checks the array's type, ndim, dtype and flags at
the OFFSET_* fields of numpy's array struct and binds it itself. The words it compares
against follow the kernel's own ctx words (KernelMeta.ctx_words = E): word E holds the
address of numpy.ndarray, and for parameter i word E + 1 + 2i the address of its dtype
object and E + 2 + 2i the flag bits it must have; the interpreter's addresses the Python entry
(`<entry>_py`) needs come after them (`PY_*`). A library carries the numpy entry when it
exports MARKER, the Python entry when it exports PYTHON_MARKER.
"""
from __future__ import annotations

MARKER = "qdc_numpy_prologue_v1"
SENTINEL = (1 << 64) - 1  # a shape word no array can have (shapes are below 2**63)

# PyArrayObject_fields: PyObject_HEAD (refcount, type), data, nd, dimensions, strides, base, descr, flags
OFFSET_TYPE, OFFSET_DATA, OFFSET_NDIM, OFFSET_DIMS, OFFSET_DESCR, OFFSET_FLAGS = 8, 16, 24, 32, 56, 64
C_CONTIGUOUS, WRITEABLE = 0x0001, 0x0400  # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE


# The Python entry (`<entry>_py`, a METH_FASTCALL function of its own: PYTHON_MARKER below)
# reads these after the numpy words: the addresses of float, int, True, False, None (what it
# returns when it launched), and of Py_IncRef and PyLong_AsLongLongAndOverflow (the library
# links against no Python).
PY_FLOAT, PY_LONG, PY_TRUE, PY_FALSE, PY_NONE, PY_INCREF, PY_AS_LONG = range(7)
PY_WORDS = 7

# Then, for libraries that export PYTHON_WATCH_MARKER: WATCH_KEPT, the address of the object the
# launch code passes for an array it bound itself (the runtime's own marker, never an argument a
# program can pass; libraries without the marker take None for it), and the tensor watch:
# WATCH_GET, the address of a function `int get(void *handle, void **data)` (PyTorch's stable C
# shim, aoti_torch_get_data_ptr; 0 without torch), and per parameter the address of the tensor
# object whose words the parameter holds (0: none) and its handle. The Python entry launches
# with a watched tensor's words only while `get` returns 0 and the address the pointer word holds.
WATCH_KEPT, WATCH_GET = 0, 1
WATCH_WORDS = 2


def extra_words(num_params: int) -> int:
    return 1 + 2 * num_params + PY_WORDS + WATCH_WORDS + 2 * num_params


def watch_word(ctx_words: int, num_params: int, which: int) -> int:
    return ctx_words + 1 + 2 * num_params + PY_WORDS + which


def watched_object_word(ctx_words: int, num_params: int, index: int) -> int:
    return watch_word(ctx_words, num_params, WATCH_WORDS + 2 * index)


def watched_handle_word(ctx_words: int, num_params: int, index: int) -> int:
    return watch_word(ctx_words, num_params, WATCH_WORDS + 1 + 2 * index)


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


def eligible(param) -> bool:
    """Whether the prologue binds this parameter (a ParamMeta): an ndarray with a shape word,
    whose gradient the kernel does not use (a numpy array has none), of scalar elements (the
    launcher checks a vector element's axes itself)."""
    return param.kind == "ndarray" and param.ndim >= 1 and not param.needs_grad \
        and not getattr(param, "element_shape", ())


PYTHON_MARKER = "qdc_python_entry_v1"
PYTHON_ENTRY_SUFFIX = "_py"
# Exported by libraries whose Python entry takes None for an array the launch code bound itself
PYTHON_BOUND_MARKER = "qdc_python_entry_bound_v1"
# Exported by libraries whose Python entry also takes a watched tensor (WATCH_GET above)
PYTHON_WATCH_MARKER = "qdc_python_entry_watch_v1"
PYTHON_SCALARS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "u1")
FLOAT_VALUE = 16  # PyFloatObject.ob_fval
CDATA_POINTER = 16  # a ctypes object's b_ptr: the Python entry's `self` is the ctx buffer


def python_entry_possible(meta) -> bool:
    """Whether a kernel gets the Python entry: every parameter bound by it (numpy arrays the
    prologue binds, Python floats, ints and bools for scalars of these types; not the elements
    of a vector argument, which is one value for several records)."""
    return bool(meta.params) and all(eligible(p) if p.kind == "ndarray" else p.dtype in PYTHON_SCALARS
                                     and not p.element_shape for p in meta.params)
