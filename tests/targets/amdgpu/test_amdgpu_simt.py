"""qd.simt on AMDGPU (compiler/targets/amdgpu/simt.py), built without a GPU: a code object per
gfx target, wavefronts of 64 lanes (RDNA included), the block-level instructions in the
regenerated assembly."""
import llvmlite.binding as llvm
import pytest

from qdc.compiler.targets.amdgpu import linker
from qdc.compiler.targets.amdgpu.arch import DEFAULT_AMDGPU_TARGETS
from qdc.compiler.targets.amdgpu.code_object import CodeObject

from simt_kernels_util import GRAD_KERNELS, TILE_KERNELS, compile_simt
import test_simt


def test_code_objects_run_wavefronts_of_64_with_barriers_and_permutes():
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})")
    compiled = compile_simt(test_simt.block_scans, "amdgpu")
    for gfx in DEFAULT_AMDGPU_TARGETS:
        co = CodeObject(compiled.artifacts[f"hsaco_{gfx}"])
        assert all(k[".wavefront_size"] == 64 for k in co.kernels), gfx
        assert all(k[".group_segment_fixed_size"] > 0 for k in co.kernels), gfx  # the shared arrays (LDS)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = llvm.parse_bitcode(compiled.artifacts["bc"])
    tm = llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu="gfx90a")
    assembly = tm.emit_assembly(module)
    for instruction in ("s_barrier", "ds_bpermute_b32", "ds_write", "ds_read"):
        assert instruction in assembly, instruction


CASES = [(k, "grad") for k in GRAD_KERNELS] + [(k, "forward") for k in TILE_KERNELS]


@pytest.mark.parametrize("kernel, variant", CASES, ids=[f"{k._primal.fn.__name__}-{v}" for k, v in CASES])
def test_gradient_and_tile_code_objects_link(kernel, variant):
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})")
    compiled = compile_simt(kernel, "amdgpu", variant=variant)
    for gfx in DEFAULT_AMDGPU_TARGETS:
        assert all(k[".wavefront_size"] == 64 for k in CodeObject(compiled.artifacts[f"hsaco_{gfx}"]).kernels), gfx
