"""CUDA keeps an adstack's count in a register (compiler/targets/cuda/block_reduce.py): the PTX of
a dynamic-loop gradient stores pushed values and adjoints to the heap but never a 64-bit count
after a push or pop, and still assembles; the overflow check stays (an atomic max)."""
from __future__ import annotations

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cuda import toolkit


def test_the_count_is_never_stored_to_the_heap():
    qd.init(arch=qd.cpu)
    x = qd.field(qd.f32, shape=64, needs_grad=True)
    trips = qd.field(qd.i32, shape=())
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def compute():
        for i in x:
            v = x[i]
            for _ in range(trips[None]):
                v = v * v * 0.5 + 0.25
            y[None] += v

    k = kernel_of(compute)
    ptx = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda", variant="grad").artifacts["ptx"].decode()
    stores = [line.split()[0] for line in ptx.splitlines() if line.strip().startswith("st.")]
    assert stores and all(".b64" not in s and ".u64" not in s for s in stores), stores  # f32 entries only
    assert "atom.max.u64" in ptx  # a push past the capacity still records the overflow
    if toolkit.ptxas_path() is not None and toolkit.assembling_gpu("sm_70") is not None:
        toolkit.assemble(ptx, toolkit.assembling_gpu("sm_70"))
