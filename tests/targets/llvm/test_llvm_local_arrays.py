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

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
from qdc.compiler.targets.cuda import toolkit

F32 = qd.types.ndarray(qd.f32, ndim=1)


@qd.kernel
def rotate(a: F32, out: F32, n: qd.i32):
    for p in range(a.shape[0]):
        m = qd.Matrix([[a[p], 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
        for j in range(n):
            m[j % 3, (j + 1) % 3] = m[(j + 2) % 3, j % 3] * 0.5
        out[p] = m[0, 1] + m[2, 2]


def _compiled(arch: str):
    qd.init(arch=qd.cpu)
    k = rotate._primal
    return K.compile_kernel(k.fn, k.params, Options(arch=arch), arch=arch)


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
    qd.init(arch=qd.cpu)
    k = rotate._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="cpu"), arch="cpu")  # the IR: target-neutral
    text = generate_llvm(compiled.ir, compiled.meta, False, TARGET)
    assert re.search(r"alloca \[10 x float\], addrspace\(5\)", text), text
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})")
    assert _compiled("amdgpu").artifacts
