"""qd.simt on CUDA (compiler/targets/cuda/simt.py), compiled without a GPU: the PTX has the
block-level instructions and ptxas assembles it."""
import pytest

from qdc.compiler.targets.cuda import toolkit

from simt_kernels_util import GRAD_KERNELS, KERNELS, TILE_KERNELS, compile_simt
import test_simt


CASES = [(k, "forward") for k in KERNELS + TILE_KERNELS] + [(k, "grad") for k in GRAD_KERNELS]


@pytest.mark.parametrize("kernel, variant", CASES, ids=[f"{k._primal.fn.__name__}-{v}" for k, v in CASES])
def test_ptx_assembles(kernel, variant):
    ptx = compile_simt(kernel, "cuda", variant=variant).artifacts["ptx"].decode()
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    toolkit.assemble(ptx, toolkit.assembling_gpu("sm_70"))


def test_ptx_has_the_block_level_instructions():
    shared = compile_simt(test_simt.reverse_in_block, "cuda").artifacts["ptx"].decode()
    assert "bar.sync" in shared and ".shared" in shared and "st.shared" in shared
    exchanges = compile_simt(test_simt.exchanges, "cuda").artifacts["ptx"].decode()
    for instruction in ("shfl.sync.idx", "shfl.sync.up", "shfl.sync.down", "vote.sync.ballot", "%laneid"):
        assert instruction in exchanges, instruction
    assert "membar.gl" in compile_simt(test_simt.publish, "cuda").artifacts["ptx"].decode()


def test_the_sort_assembles():
    """qd.algorithms.sort (every phase a block-level task; 64-bit keys with values, so every
    variant of its digits and scatter) for CUDA: ptxas takes it."""
    import test_simt_algorithms
    ptx = compile_simt(test_simt_algorithms.sort_morton_keys, "cuda").artifacts["ptx"].decode()
    assert "vote.sync.ballot" in ptx and "bar.sync" in ptx
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    toolkit.assemble(ptx, toolkit.assembling_gpu("sm_70"))
    toolkit.assemble(compile_simt(test_simt_algorithms.sort_pairs, "cuda").artifacts["ptx"].decode(),
                     toolkit.assembling_gpu("sm_70"))
