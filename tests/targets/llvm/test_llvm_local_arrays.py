"""Local arrays (a vector local indexed at run time: compiler/passes/local_arrays.py) in the shared
LLVM lowering, for each target that uses it:

- cpu: an `alloca [10 x float]` and GEPs by the index clamped to 8 (a read) or 9 (a write), no
  select over the components;
- cuda: PTX that keeps the array in local memory and assembles with ptxas where it is installed;
- amdgpu: the array in private memory (address space 5), a code object where ld.lld is installed.
"""
from __future__ import annotations

import re

import pytest

from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
from qdc.compiler.targets.cuda import toolkit

from local_arrays_util import compiled_rotate as _compiled


def test_cpu_indexes_an_array_in_memory(monkeypatch):
    monkeypatch.setenv(SCALAR_SWITCH, "0")  # the scalar code (the width-W code: test_cpu_widen_local_arrays.py)
    compiled = _compiled("cpu")
    text = str(codegen.generate_llvm(compiled.ir, compiled.meta, target=CPU))
    assert re.search(r"alloca \[10 x float\]", text), text
    dynamic = re.findall(r"getelementptr inbounds \[10 x float\], \[10 x float\]\* %\S+, i32 0, i32 %", text)
    assert len(dynamic) == 2  # the read and the write at run-time indices
    assert not re.search(r"= select\s+i1 \S+ float", text)  # no chain over the components
    assert re.search(r"= select\s+i1 \S+ i32 \S+ i32 8\n", text) and re.search(r"= select\s+i1 \S+ i32 \S+ i32 9\n", text)


def test_cuda_keeps_the_array_in_local_memory():
    ptx = _compiled("cuda").artifacts["ptx"].decode()
    assert ".local" in ptx and ("ld.local" in ptx or "st.local" in ptx)
    gpu = toolkit.assembling_gpu("sm_70")
    if toolkit.ptxas_path() is not None and gpu is not None:
        toolkit.assemble(ptx, gpu)


def test_amdgpu_keeps_the_array_in_private_memory():
    from qdc.compiler.targets.amdgpu import linker
    from qdc.compiler.targets.amdgpu.codegen import generate_llvm
    from qdc.compiler.targets.amdgpu.target import TARGET
    compiled = _compiled("cpu")  # the IR: target-neutral
    text = generate_llvm(compiled.ir, compiled.meta, False, TARGET)
    assert re.search(r"alloca \[10 x float\], addrspace\(5\)", text), text
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})")
    assert _compiled("amdgpu").artifacts
