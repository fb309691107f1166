"""A kernel whose matrix local is indexed at run time (so its lowering holds a local array:
compiler/passes/local_arrays.py), shared by the LLVM and SPIR-V lowering tests."""
from __future__ import annotations

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

F32 = qd.types.ndarray(qd.f32, ndim=1)


@qd.kernel
def rotate(a: F32, out: F32, n: qd.i32):
    for p in range(a.shape[0]):
        m = qd.Matrix([[a[p], 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
        for j in range(n):
            m[j % 3, (j + 1) % 3] = m[(j + 2) % 3, j % 3] * 0.5
        out[p] = m[0, 1] + m[2, 2]


def compiled_rotate(arch: str):
    """`rotate` compiled for `arch` (its IR, metadata and artifacts)."""
    qd.init(arch=qd.cpu)
    k = rotate._primal
    return K.compile_kernel(k.fn, k.params, Options(arch=arch), arch=arch)
