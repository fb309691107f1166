"""DLPack capsules (https://dmlc.github.io/dlpack/latest/python_spec.html): reading another
library's (`import_array`) and making one over a field's or ndarray's memory (`export`, behind
qd.ndarray's `__dlpack__`). runtime/dlpack.py builds `qd.from_dlpack` on them.

The capsule's C structures are read and written here with ctypes, the same for host and device
memory: a consumer takes the `DLManagedTensor` out of a capsule named "dltensor", renames it
"used_dltensor" and calls its deleter once done with the memory; a producer's capsule frees
what it holds when it dies unconsumed. The legacy (unversioned) capsule is what every library
exchanges; a CUDA export waits for the kernels queued on qdc's stream before it hands the memory
over (a host wait at the conversion, never per launch).

An exported tensor can outlive the interpreter: torch frees the tensors it still holds at exit,
some of them after Python has finalised, and calling a Python deleter then crashes the process.
So an export's `DLManagedTensor` lives in C memory (malloc), and once the interpreter starts to
exit (atexit) every export still held points its deleter at libc's `free` of that memory: native
code that needs no interpreter.
"""
from __future__ import annotations

import atexit
import ctypes
import weakref

import numpy as np

from . import context

# DLDeviceType and DLDataTypeCode values of dlpack.h
CPU, CUDA, CUDA_HOST, ROCM = 1, 2, 3, 10
_INT, _UINT, _FLOAT, _BOOL = 0, 1, 2, 6
_CODES = {"i": _INT, "u": _UINT, "f": _FLOAT}
_DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cpu", ROCM: "rocm"}
ARCH_DEVICES = {"cpu": CPU, "cuda": CUDA, "amdgpu": ROCM}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _ManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedTensorVersioned(ctypes.Structure):  # DLPack 1.0: a version and flags (read-only, copied)
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_NAME, _USED_NAME = b"dltensor", b"used_dltensor"
_VERSIONED_NAME, _USED_VERSIONED_NAME = b"dltensor_versioned", b"used_dltensor_versioned"
_FORMATS = {_NAME: (_ManagedTensor, _USED_NAME), _VERSIONED_NAME: (_ManagedTensorVersioned, _USED_VERSIONED_NAME)}
_api = ctypes.pythonapi
_get_pointer = _api.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_set_name = _api.PyCapsule_SetName
_set_name.restype, _set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_is_valid = _api.PyCapsule_IsValid
_is_valid.restype, _is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = _api.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, _Destructor]
_libc = ctypes.CDLL(None)
_malloc, _free = _libc.malloc, _libc.free
_malloc.restype, _malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_free.restype, _free.argtypes = None, [ctypes.c_void_p]
_NATIVE_FREE = ctypes.cast(_free, _Deleter)
_pointer_of_capsule = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_valid_capsule = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))


# ---- consuming ------------------------------------------------------------------------------------

class ExternalMemory:
    """Another library's array as a DLPack capsule described it: `ptr` (data plus byte offset),
    `shape`, `dtype_name` (qdc's, None where qdc has no such type), `device` (name, ordinal) and
    `contiguous`. The producer's memory stays alive until this object dies (its deleter runs then)."""

    def __init__(self, capsule):
        name = _VERSIONED_NAME if _is_valid(capsule, _VERSIONED_NAME) else _NAME
        structure, used_name = _FORMATS[name]
        address = _get_pointer(capsule, name)  # raises ValueError for a used or foreign capsule
        managed = structure.from_address(address)
        self.read_only = name == _VERSIONED_NAME and bool(managed.flags & _READ_ONLY)
        t = managed.dl_tensor
        self.shape = tuple(t.shape[k] for k in range(t.ndim))
        strides = None if not t.strides else tuple(t.strides[k] for k in range(t.ndim))
        self.contiguous = strides is None or _c_contiguous(self.shape, strides)
        self.ptr = (t.data or 0) + t.byte_offset
        self.device = (_DEVICE_NAMES.get(t.device.device_type, f"device type {t.device.device_type}"), t.device.device_id)
        self.dtype_name = _dtype_name(t.dtype)
        _set_name(capsule, used_name)  # ours now: the capsule's destructor leaves it alone
        deleter = managed.deleter
        if ctypes.cast(deleter, ctypes.c_void_p).value:
            weakref.finalize(self, deleter, address)


def _c_contiguous(shape: tuple, strides: tuple) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _dtype_name(dtype: _DataType) -> str | None:
    if dtype.lanes != 1:
        return None
    if dtype.code == _BOOL and dtype.bits == 8:
        return "u1"
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f"}.get(dtype.code)
    name = f"{kind}{dtype.bits}" if kind else None
    return name if name in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64") else None


def import_array(obj, stream: int | None = None) -> ExternalMemory:
    """The memory of DLPack object `obj` (its `__dlpack__`, asked to be ready on `stream` where
    the producer is on a CUDA device)."""
    options = {"stream": stream} if stream is not None else {}
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), **options)
    except TypeError:  # a producer older than DLPack 1.0: the legacy capsule
        capsule = obj.__dlpack__(**options)
    return ExternalMemory(capsule)


def host_array(memory: ExternalMemory, np_dtype) -> np.ndarray:
    """A numpy view of C-contiguous host memory described by a capsule, which keeps `memory` (and
    so the producer's array) alive; read-only where the producer said so."""
    count = int(np.prod(memory.shape, dtype=np.int64))
    if count == 0:
        return np.empty(memory.shape, np_dtype)
    raw = (ctypes.c_uint8 * (count * np.dtype(np_dtype).itemsize)).from_address(memory.ptr)
    raw.memory = memory
    view = np.frombuffer(raw, np.uint8).view(np_dtype).reshape(memory.shape)
    view.flags.writeable = not memory.read_only
    return view


# ---- producing ------------------------------------------------------------------------------------

def dlpack_device(array) -> tuple[int, int]:
    """`__dlpack_device__` of a qd.ndarray: where its memory is, on the active runtime."""
    rt = context.current()
    kind = ARCH_DEVICES.get(rt.arch)
    if kind is None:
        raise BufferError(f"{array._what()}: DLPack has no device for arch {rt.arch} memory; use to_numpy()")
    return kind, (int(rt.device.device) if rt.arch == "cuda" else 0)


def export(array, stream=None, max_version=None, dl_device=None, copy=None):
    """`__dlpack__` of a qd.ndarray: a capsule over its memory (no copy), once the kernels queued
    before it have finished."""
    kind, ordinal = dlpack_device(array)
    if copy:
        raise BufferError(f"{array._what()}: __dlpack__(copy=True) is not supported; the export is always in place")
    if dl_device is not None and tuple(dl_device) != (kind, ordinal):
        raise BufferError(f"{array._what()}: cannot export to device {tuple(dl_device)}: its memory is on "
                          f"{(kind, ordinal)}")
    context.current().device.sync()  # the launches before the export have written what it exports
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    return _capsule(array, kind, ordinal, versioned)


_exports: dict = {}  # address of a malloc'ed DLManagedTensor -> (its structure, the array it keeps alive)


@_Deleter
def _delete(address):
    if _exports.pop(address, None) is not None:
        _free(address)


@_Destructor
def _destroy_capsule(capsule):
    for name in (_NAME, _VERSIONED_NAME):
        if _valid_capsule(capsule, name):  # never consumed: nobody else will call the deleter
            _delete(_pointer_of_capsule(capsule, name))


@atexit.register
def _leave_exports_to_native_code():
    """From here on, a consumer freeing an export calls libc's `free` of its structure, not
    Python (which may be gone by then); the arrays stay referenced until the interpreter ends."""
    for managed, _array in _exports.values():
        managed.deleter = _NATIVE_FREE


def _capsule(array, kind: int, ordinal: int, versioned: bool):
    dtype = array.dtype.name
    structure = _ManagedTensorVersioned if versioned else _ManagedTensor
    ndim = len(array.storage_shape)
    # One block: the structure, then its shape (int64s, aligned as the structure is).
    address = _malloc(ctypes.sizeof(structure) + 8 * max(ndim, 1))
    if not address:
        raise MemoryError(f"{array._what()}: no memory for a DLPack tensor structure")
    ctypes.memset(address, 0, ctypes.sizeof(structure))
    managed = structure.from_address(address)
    shape = (ctypes.c_int64 * max(ndim, 1)).from_address(address + ctypes.sizeof(structure))
    shape[:ndim] = array.storage_shape
    if versioned:
        managed.version, managed.flags = _Version(1, 0), 0
    t = managed.dl_tensor
    t.data, t.device = array.allocation().ptr, _Device(kind, ordinal)
    t.ndim, t.shape, t.strides, t.byte_offset = ndim, shape, None, 0
    t.dtype = _DataType(_BOOL, 8, 1) if dtype == "u1" else _DataType(_CODES[dtype[0]], int(dtype[1:]), 1)
    managed.deleter = _delete
    _exports[address] = (managed, array)
    return _new_capsule(address, _VERSIONED_NAME if versioned else _NAME, _destroy_capsule)
