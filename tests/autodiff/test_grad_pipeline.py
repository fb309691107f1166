"""Gradient kernels go through the pass machinery forward kernels do (passes/pipeline.py): the
forward list up to PIPELINE_STOP, the reverse-mode transform, then GRAD_PIPELINE, each step's IR
dumped under its name and, with QDC_VERIFY_IR=1 (the suite sets it), verified right after it,
an error naming the step that broke the IR."""
import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.autodiff import grad_kernel
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.passes import pipeline
from qdc.runtime.contract import types as T


def _dynamic_loop_kernel():
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def k():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.5
            y[None] += v
    return k._primal


def test_every_step_of_a_gradient_kernel_is_dumped_by_name():
    k = _dynamic_loop_kernel()
    steps = []
    compiled = K.compile_kernel(k.fn, k.params, Options(), variant="grad", dump=lambda name, text: steps.append((name, text)))
    forward = [name for name, _ in pipeline.PIPELINE[:[n for n, _ in pipeline.PIPELINE].index(grad_kernel.PIPELINE_STOP) + 1]
               if name != "forward_mode"]  # a pass of the forward_ad variant only
    assert [name for name, _ in steps] == forward + ["reverse_mode"] + [name for name, _ in grad_kernel.GRAD_PIPELINE]
    reverse = dict(steps)["reverse_mode"]
    assert "ad_stack_push" in reverse and "k_grad_t0" in reverse
    final = compiled.artifacts["ir"].decode()  # also with the stacks numbered by their sizing
    assert [line for line in steps[-1][1].splitlines() if "stack_id" not in line] == \
        [line for line in final.splitlines() if "stack_id" not in line]


def test_a_gradient_pass_that_breaks_the_ir_is_named(monkeypatch):
    def breaks_types(kir):
        for s in ir.walk(kir.body):
            if isinstance(s, ir.Const) and s.type is T.f32:
                s.value = 1  # an int in an f32 constant

    monkeypatch.setattr(grad_kernel, "GRAD_PIPELINE", grad_kernel.GRAD_PIPELINE + [("breaks_types", breaks_types)])
    k = _dynamic_loop_kernel()
    with pytest.raises(ir.IRVerifyError, match="after pass 'breaks_types': f32 constant must be a float"):
        K.compile_kernel(k.fn, k.params, Options(), variant="grad")
