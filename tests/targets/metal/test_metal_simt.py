"""qd.simt on Metal: the SPIR-V of block-level code translates to MSL (spirv-cross) with
threadgroup memory, threadgroup barriers and simd_* functions."""
import shutil

import pytest

from simt_kernels_util import GRAD_KERNELS, KERNELS_32, TILE_KERNELS, compile_simt
import test_simt


@pytest.mark.parametrize("kernel", KERNELS_32 + TILE_KERNELS, ids=lambda k: k._primal.fn.__name__)
def test_translates_to_msl(kernel):
    if shutil.which("spirv-cross") is None:
        pytest.skip("spirv-cross is not installed (apt-get install spirv-cross)")
    compile_simt(kernel, "metal")


def test_msl_uses_threadgroup_memory_and_simd_functions():
    if shutil.which("spirv-cross") is None:
        pytest.skip("spirv-cross is not installed (apt-get install spirv-cross)")
    shared = compile_simt(test_simt.reverse_in_block, "metal").artifacts["msl_t0"].decode()
    assert "threadgroup float" in shared and "threadgroup_barrier" in shared
    scans = compile_simt(test_simt.subgroup_scans, "metal").artifacts["msl_t0"].decode()
    assert "simd_shuffle" in scans


@pytest.mark.parametrize("kernel", GRAD_KERNELS, ids=lambda k: k._primal.fn.__name__)
def test_gradients_translate_to_msl(kernel):
    if shutil.which("spirv-cross") is None:
        pytest.skip("spirv-cross is not installed (apt-get install spirv-cross)")
    msl = compile_simt(kernel, "metal", variant="grad").artifacts["msl_t0"].decode()
    assert "simd_shuffle" in msl or "threadgroup_barrier" in msl
