"""qdc: an ahead-of-time compiler and thin runtime for Quadrants-style Python kernels.

`import qdc as qd` is the kernel language. Everything that needs the compiler (llvmlite) is
imported lazily on first use, so `from qdc.runtime import load` stays compiler-free.
"""
from __future__ import annotations

import importlib

from qdc.runtime.contract.errors import AdStackOverflowError, CacheError, QdcCompileError, QdcError  # noqa: F401
from qdc.runtime.fields import Field, Ndarray, field, ndarray  # noqa: F401
from qdc.runtime.contract.types import f16, f32, f64, i8, i16, i32, i64, u1, u8, u16, u32, u64  # noqa: F401

__version__ = "0.1.0"

cpu, cuda, vulkan, metal, amdgpu = "cpu", "cuda", "vulkan", "metal", "amdgpu"
gpu = "gpu"  # qd.init(arch=qd.gpu): the first of cuda, vulkan, metal, amdgpu that works here

# Kernel-language names defined in qdc.compiler.language.lang, loaded on first access.
_LANG = {"kernel", "func", "static", "ndrange", "loop_config", "types", "sin", "cos", "tan", "asin",
         "acos", "atan", "atan2", "tanh", "exp", "log", "sqrt", "rsqrt", "floor", "ceil", "round", "pow",
         "select", "cast", "atomic_add", "atomic_sub", "atomic_min", "atomic_max", "atomic_and",
         "atomic_or", "atomic_xor", "template", "Template", "abs", "min", "max"}
_API = {"init", "sync", "reset"}


def __getattr__(name):
    if name == "ad":  # qd.ad.Tape
        return importlib.import_module("qdc.compiler.language.ad")
    if name == "aot":  # qd.aot.instantiate
        return importlib.import_module("qdc.compiler.language.aot")
    if name == "math":  # qd.math.vec3, qd.math.dot, ...
        return importlib.import_module("qdc.compiler.language.mathlib")
    if name in ("Vector", "Matrix"):
        return getattr(importlib.import_module("qdc.compiler.language.matrix"), name)
    if name == "adstack_heap_bytes":
        return importlib.import_module("qdc.runtime.adstack").adstack_heap_bytes
    if name in _LANG:
        return getattr(importlib.import_module("qdc.compiler.language.lang"), name)
    if name in _API:
        return getattr(importlib.import_module("qdc.compiler.language.api"), name)
    raise AttributeError(f"module 'qdc' has no attribute '{name}'")
