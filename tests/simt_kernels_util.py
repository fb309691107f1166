"""The block-level kernels of tests/language/test_simt.py and test_simt_standins.py compiled for an arch without its
device (the compiler alone), for the target tests of every GPU arch."""
import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

import test_simt
import test_simt_gradients
import test_simt_standins
import test_simt_tiles

KERNELS = (test_simt.indices, test_simt.reverse_in_block, test_simt.exchanges, test_simt.subgroup_scans,
           test_simt.block_scans, test_simt.publish, test_simt.shared_dtypes, test_simt_standins.cholesky_solve,
           test_simt_standins.overlapping_pairs, test_simt_standins.jacobi)
# Kernels whose values are all 32-bit (Metal has no 64-bit types; `exchanges` shuffles f64 and
# ballots into a u64, `shared_dtypes` shares f64)
KERNELS_32 = tuple(k for k in KERNELS if k not in (test_simt.exchanges, test_simt.shared_dtypes))


# Tile16x16 and Tile32x32 kernels (subgroups of 32 lanes hold both)
TILE_KERNELS = tuple(test_simt_tiles.FACTOR_AND_SOLVE.values())
# Kernels whose gradient kernels the target tests compile too (variant="grad")
GRAD_KERNELS = (test_simt_gradients.exchanges, test_simt_gradients.shared_stages, test_simt_gradients.relax,
                test_simt_gradients.cholesky_solve)


def compile_simt(kernel, arch: str, variant: str = "forward", **options):
    qd.init(arch=qd.cpu)
    k = kernel._primal
    return K.compile_kernel(k.fn, k.params, Options(arch=arch, **options), arch=arch, variant=variant)
