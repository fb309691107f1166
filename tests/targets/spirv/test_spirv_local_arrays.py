"""Local arrays (a vector local indexed at run time: compiler/passes/local_arrays.py) in SPIR-V:
a Function-storage variable of an OpTypeArray, zeroed by a store of OpConstantNull, accessed by
OpAccessChain at the clamped index; no OpSelect over the components; the module passes
spirv-val. Metal's MSL (through spirv-cross) declares the array. Results on a device: the
arch-parametrised tests of tests/frontend/test_indexed_vector_locals.py."""
from __future__ import annotations

import re

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.metal import msl
from qdc.compiler.targets.spirv import tools

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


def test_vulkan_indexes_a_function_array():
    if tools.tool("spirv-dis") is None:
        pytest.skip("spirv-dis not installed (SPIRV-Tools)")
    module = _compiled("vulkan").artifacts["spirv_t0"]
    text = tools.disassemble(module)
    array = re.search(r"(%\w+) = OpTypeArray %float (%\w+)", text)
    assert array, text
    assert re.search(rf"{re.escape(array.group(2))} = OpConstant %uint 10\n", text)
    pointer = re.search(rf"(%\w+) = OpTypePointer Function {re.escape(array.group(1))}\n", text).group(1)
    variable = re.search(rf"(%\w+) = OpVariable {re.escape(pointer)} Function\n", text).group(1)
    assert re.search(rf"OpStore {re.escape(variable)} %\w+\n", text)  # zeroed (OpConstantNull)
    assert "OpConstantNull" in text
    chains = re.findall(rf"= OpAccessChain %_ptr_Function_float {re.escape(variable)} (%\w+)\n", text)
    assert len(chains) >= 2
    float_selects = re.findall(r"= OpSelect %float ", text)
    assert not float_selects  # no chain over the components
    if tools.have_validator():
        assert tools.validate(module) is None


def test_metal_declares_the_array():
    if msl.spirv_cross_path() is None:
        pytest.skip(f"spirv-cross not installed ({msl.INSTALL_HINT}): MSL not generated")
    source = _compiled("metal").artifacts["msl_t0"].decode()
    assert re.search(r"spvUnsafeArray<float, 10>|float \w+\[10\]", source), source
