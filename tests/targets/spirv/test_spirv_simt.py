"""qd.simt in SPIR-V (compiler/targets/spirv/simt.py), compiled without a device: every module
passes spirv-val, declares the capability of each group operation it uses (which the device
checks at load) and records the subgroup size it was built for."""
import pytest

from qdc.compiler.targets.spirv import tools
from qdc.runtime.devices.vulkan import kernels as vk_kernels
from qdc.runtime.devices.vulkan.kernels import declared_capabilities, spirv_words

from simt_kernels_util import GRAD_KERNELS, KERNELS, TILE_KERNELS, compile_simt
import test_simt

SHUFFLE, SHUFFLE_RELATIVE, BALLOT, VOTE = 65, 66, 64, 62
WORKGROUP = 4  # StorageClass


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k._primal.fn.__name__)
def test_every_module_validates_and_records_its_subgroup_size(kernel):
    if not tools.have_validator():
        pytest.skip("spirv-val is not installed (the vulkan extra installs it)")
    compiled = compile_simt(kernel, "vulkan", vulkan_subgroup_size=16)
    for i, task in enumerate(compiled.meta.tasks):
        assert tools.validate(compiled.artifacts[f"spirv_t{i}"]) is None
        assert task.launch.get("subgroup_size") in (None, 16)  # recorded by the tasks with block-level code
    assert any(task.launch.get("subgroup_size") == 16 for task in compiled.meta.tasks)


@pytest.mark.parametrize("kernel", GRAD_KERNELS, ids=lambda k: k._primal.fn.__name__)
def test_every_gradient_module_validates(kernel):
    if not tools.have_validator():
        pytest.skip("spirv-val is not installed (the vulkan extra installs it)")
    for size in (8, 32, 64):
        compiled = compile_simt(kernel, "vulkan", variant="grad", vulkan_subgroup_size=size)
        for i in range(len(compiled.meta.tasks)):
            assert tools.validate(compiled.artifacts[f"spirv_t{i}"]) is None


@pytest.mark.parametrize("kernel", TILE_KERNELS, ids=("tile16", "tile32"))
def test_tile_modules_validate(kernel):
    if not tools.have_validator():
        pytest.skip("spirv-val is not installed (the vulkan extra installs it)")
    compiled = compile_simt(kernel, "vulkan", vulkan_subgroup_size=32)
    for i in range(len(compiled.meta.tasks)):
        assert tools.validate(compiled.artifacts[f"spirv_t{i}"]) is None


def test_group_operations_declare_their_capabilities():
    caps = set(declared_capabilities(spirv_words(compile_simt(test_simt.exchanges, "vulkan").artifacts["spirv_t0"],
                                                 "exchanges")))
    assert {SHUFFLE, SHUFFLE_RELATIVE, BALLOT, VOTE} <= caps
    assert all(c in vk_kernels.CAPABILITY_NEEDS for c in (SHUFFLE, SHUFFLE_RELATIVE, BALLOT, VOTE))


def test_shared_arrays_are_workgroup_variables():
    words = spirv_words(compile_simt(test_simt.reverse_in_block, "vulkan").artifacts["spirv_t0"], "reverse")
    variables, i = [], 5
    while i < len(words):
        count, opcode = int(words[i]) >> 16, int(words[i]) & 0xFFFF
        if opcode == 59:  # OpVariable: result type, id, storage class
            variables.append(int(words[i + 3]))
        i += count
    assert variables.count(WORKGROUP) == 3  # the f32, vec3 and 2-D i32 arrays
