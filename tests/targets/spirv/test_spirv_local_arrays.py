"""Local arrays (a vector local indexed at run time: compiler/passes/local_arrays.py) in SPIR-V:
a Function-storage variable of an OpTypeArray, zeroed by a store of OpConstantNull, accessed by
OpAccessChain at the clamped index; no OpSelect over the components; the module passes
spirv-val. Metal's MSL (through spirv-cross) declares the array. Results on a device: the
arch-parametrised tests of tests/frontend/test_indexed_vector_locals.py."""
from __future__ import annotations

import re

import pytest

from qdc.compiler.targets.metal import msl
from qdc.compiler.targets.spirv import tools

from local_arrays_util import compiled_rotate as _compiled


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
