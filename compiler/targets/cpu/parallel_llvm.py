"""LLVM's work on one kernel's module parts (module_split.py) in parallel threads: each part is
parsed into an LLVM context of its own, optimised and emitted with a target machine of its own,
and the parts' objects are linked into the kernel's one library (link.py).

llvmlite calls LLVM through ctypes, which releases the GIL, but it serialises every call of its
library behind one process-wide lock (`llvmlite.binding.ffi.lib`), so two threads optimising
two modules would take turns. LLVM itself needs no such lock between contexts, target machines
and pass builders that no other thread uses: a part's worker thread calls the few long-running
functions (parse, verify, optimise, print, bitcode, emit) of its own objects directly
(`_call`); every other call, and every call of any other thread, goes through llvmlite's lock
as before.

How many threads: compiler/compile_threads.py (the cores, shared among `qdc build -j N`'s
processes; one with `-j 1`). The parts and their order do not depend on it: a kernel builds the
same bytes whatever the number of threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
from llvmlite.binding import ffi

from ...compile_threads import compile_threads

_worker = threading.local()  # `unlocked`: this thread is a part's worker


def _call(name: str):
    """llvmlite's C function `name`: without llvmlite's lock on a part's worker thread."""
    wrapped = getattr(ffi.lib, name)
    return getattr(wrapped, "_cfn", wrapped) if getattr(_worker, "unlocked", False) else wrapped


def parse(text: str) -> llvm.ModuleRef:
    """The module of IR `text`, verified, in an LLVM context of its own."""
    context = llvm.create_context()
    with ffi.OutputString() as errors:
        module = llvm.ModuleRef(_call("LLVMPY_ParseAssembly")(context, ctypes.c_char_p(text.encode()), errors),
                                context)
        if errors:
            module.close()
            raise RuntimeError(f"LLVM IR parsing error\n{errors}")
    with ffi.OutputString() as errors:
        if _call("LLVMPY_VerifyModule")(module, errors):
            raise RuntimeError(str(errors))
    return module


def run_passes(manager, module: llvm.ModuleRef, builder) -> None:
    """Run the module pass `manager` (made by pass builder `builder`) on `module`."""
    _call("LLVMPY_RunNewModulePassManager")(manager, module, builder)


def printed(module: llvm.ModuleRef) -> str:
    """`str(module)`."""
    with ffi.OutputString() as out:
        _call("LLVMPY_PrintModuleToString")(module, out)
        return str(out)


def bitcode(module: llvm.ModuleRef) -> bytes:
    """`module.as_bitcode()`."""
    data, size = ctypes.c_char_p(None), ctypes.c_size_t(-1)
    _call("LLVMPY_WriteBitcodeToString")(module, ctypes.byref(data), ctypes.byref(size))
    try:
        return ctypes.string_at(data, size.value)
    finally:
        ffi.lib.LLVMPY_DisposeString(data)


def emitted(machine, module: llvm.ModuleRef, as_object: bool = True) -> bytes:
    """The object (else the assembly text's bytes) of `module` for target `machine`."""
    with ffi.OutputString() as errors:
        buffer = _call("LLVMPY_TargetMachineEmitToMemory")(machine, module, int(as_object), errors)
        if not buffer:
            raise RuntimeError(str(errors))
    try:
        return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buffer), ffi.lib.LLVMPY_GetBufferSize(buffer))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buffer)


class StepTimes:
    """Per step of a part's work (parse, optimisation, ...): [wall, CPU] seconds of its thread."""

    def __init__(self):
        self.steps: dict = {}

    @contextlib.contextmanager
    def step(self, name: str):
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            pair = self.steps.setdefault(name, [0.0, 0.0])
            pair[0] += time.perf_counter() - wall0
            pair[1] += time.thread_time() - cpu0


def run_parts(work, parts: list, sizes: list[int]) -> tuple[list, list]:
    """([work(part, its StepTimes) for each part], [each part's StepTimes]), in the parts' order,
    on up to compile_threads() threads, the largest parts (`sizes`) first; on this thread alone
    where one thread is asked for."""
    times = [StepTimes() for _ in parts]
    threads = min(compile_threads(), len(parts))
    if threads <= 1:
        return [work(part, t) for part, t in zip(parts, times)], times

    def on_worker(i):
        _worker.unlocked = True
        try:
            return work(parts[i], times[i])
        finally:
            _worker.unlocked = False
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="qdc-llvm") as pool:
        futures = {i: pool.submit(on_worker, i) for i in sorted(range(len(parts)), key=lambda i: (-sizes[i], i))}
        return [futures[i].result() for i in range(len(parts))], times
