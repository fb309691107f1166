"""qdc: an ahead-of-time compiler and thin runtime for Quadrants-style Python kernels.

`import qdc as qd` is the kernel language. Everything that needs the compiler (llvmlite) is
imported lazily on first use, so `from qdc.runtime import load` stays compiler-free. The
`qdc-runtime` distribution ships this same file without the compiler: there the runtime's names
(`qd.ndarray`, `qd.sync`, dtypes, errors) work and the compiler's raise ModuleNotFoundError.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

from qdc.runtime.contract import arches as _arches
from qdc.runtime.contract.errors import (AdStackOverflowError, CacheError, DeviceLostError,  # noqa: F401
                                       KernelNotPrebuiltError, QdcCompileError, QdcError)
from qdc.runtime.fields import Field, Ndarray, field, ndarray  # noqa: F401
from qdc.runtime.contract.types import f16, f32, f64, i8, i16, i32, i64, u1, u8, u16, u32, u64  # noqa: F401

# Quadrants' long names of the scalar types
int8, int16, int32, int64, uint8, uint16, uint32, uint64 = i8, i16, i32, i64, u8, u16, u32, u64
float16, float32, float64 = f16, f32, f64

__version__ = "0.1.0"

gpu = "gpu"  # qd.init(arch=qd.gpu): the first GPU arch of the arch table that works here

# Kernel-language names defined in qdc.compiler.language.lang, loaded on first access.
_LANG = {"static", "ndrange", "grouped", "loop_config", "types", "sin", "cos", "tan", "asin",
         "acos", "atan", "atan2", "tanh", "exp", "log", "sqrt", "rsqrt", "floor", "ceil", "round", "pow",
         "select", "cast", "atomic_add", "atomic_sub", "atomic_min", "atomic_max", "atomic_and",
         "atomic_or", "atomic_xor", "atomic_mul", "atomic_exchange", "template", "Template", "abs", "min", "max",
         "random", "stop_grad", "raw_div", "raw_mod", "bit_shr", "Struct", "dataclass", "static_assert", "outer"}
_DECORATORS = {"kernel", "func"}  # qdc.compiler.jit.kernel
_API = {"init", "reset"}
# Quadrants' names (a Quadrants program runs on qdc: quadrants_compat/): name -> defining module
_QUADRANTS_NAMES = {
    "Tensor": "qdc.runtime.tensors", "VectorTensor": "qdc.runtime.tensors", "MatrixTensor": "qdc.runtime.tensors",
    "tensor": "qdc.runtime.tensors", "Backend": "qdc.runtime.tensors", "Layout": "qdc.runtime.tensors",
    "svd": "qdc.compiler.language.svd",
    "perf_dispatch": "qdc.runtime.perf_dispatch", "data_oriented": "qdc.compiler.language.data_oriented",
    "DEBUG": "qdc.quadrants_compat.logging", "TRACE": "qdc.quadrants_compat.logging",
    "INFO": "qdc.quadrants_compat.logging", "WARN": "qdc.quadrants_compat.logging",
    "ERROR": "qdc.quadrants_compat.logging", "CRITICAL": "qdc.quadrants_compat.logging",
    "set_logging_level": "qdc.quadrants_compat.logging", "is_logging_effective": "qdc.quadrants_compat.logging",
}
_QUADRANTS_MODULES = {"_logging": "qdc.quadrants_compat.logging", "lang": "qdc.quadrants_compat.lang"}


def install_as_quadrants() -> None:
    """Make every later `import quadrants` resolve to qdc (quadrants_compat/)."""
    importlib.import_module("qdc.quadrants_compat").install()


class _TorchModule:
    """`import qdc.torch` finds qdc/runtime/torch_ops.py (differentiable PyTorch ops): a file or
    folder named `torch` in this package's root would shadow the real torch for every script
    run from the repository, whose root is this package. The module is the same object under
    both names."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.util.spec_from_loader(name, _TorchModule) if name == "qdc.torch" else None

    @staticmethod
    def create_module(spec):
        return importlib.import_module("qdc.runtime.torch_ops")

    @staticmethod
    def exec_module(module):
        pass


if not any(getattr(finder, "__qualname__", None) == "_TorchModule" and getattr(finder, "__module__", None) == __name__
           for finder in sys.meta_path):
    sys.meta_path.append(_TorchModule)


def __getattr__(name):
    if name == "torch":  # qdc.torch without `import qdc.torch`
        return importlib.import_module("qdc.torch")
    if name in _arches.names():  # qd.cpu, qd.cuda, ...: an arch is named by its own name
        return name
    if name == "ad":  # qd.ad.Tape
        return _compiler_module("qdc.compiler.jit.ad", name)
    if name == "aot":  # qd.aot.instantiate
        return _compiler_module("qdc.compiler.jit.aot", name)
    if name == "simt":  # qd.simt.block, qd.simt.subgroup, qd.simt.grid, qd.simt.warp
        return _compiler_module("qdc.compiler.language.simt", name)
    if name == "graph":  # qd.graph.do_while
        return _compiler_module("qdc.compiler.language.graph", name)
    if name == "algorithms":  # qd.algorithms.sort
        return _compiler_module("qdc.compiler.language.algorithms", name)
    if name == "math":  # qd.math.vec3, qd.math.dot, ...
        return _compiler_module("qdc.compiler.language.mathlib", name)
    if name in ("Vector", "Matrix", "zero"):
        return getattr(_compiler_module("qdc.compiler.language.matrix", name), name)
    if name == "from_dlpack":  # qd.from_dlpack(obj): a qd.ndarray over another library's array
        return importlib.import_module("qdc.runtime.dlpack").from_dlpack
    if name == "adstack_heap_bytes":
        return importlib.import_module("qdc.runtime.adstack").adstack_heap_bytes
    if name == "sync":  # kept here after the first call: a loop of launch + qd.sync() pays no lookup
        sync = globals()["sync"] = importlib.import_module("qdc.runtime").sync
        return sync
    if name in _DECORATORS:
        return getattr(_compiler_module("qdc.compiler.jit.kernel", name), name)
    if name in _LANG:
        return getattr(_compiler_module("qdc.compiler.language.lang", name), name)
    if name in _API:
        return getattr(_compiler_module("qdc.compiler.jit.api", name), name)
    if name in _QUADRANTS_NAMES:
        return getattr(importlib.import_module(_QUADRANTS_NAMES[name]), name)
    if name in _QUADRANTS_MODULES:
        return importlib.import_module(_QUADRANTS_MODULES[name])
    if name in ("x64", "arm64"):  # Quadrants' names of the CPU arch
        return "cpu"
    raise AttributeError(f"module 'qdc' has no attribute '{name}'")


def _compiler_module(module: str, name: str):
    """The compiler module defining `qd.<name>`; where only qdc-runtime is installed, an error
    saying what to install instead of a bare missing-module one."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != "qdc.compiler":
            raise
        hint = " (a deployment chooses its device with qdc.runtime.load(..., arch=...))" if name in _API else ""
        raise ModuleNotFoundError(f"qd.{name} needs the qdc compiler, which is not installed here (only "
                                  f"qdc-runtime, which runs prebuilt kernels): pip install qdc{hint}",
                                  name="qdc.compiler") from None
