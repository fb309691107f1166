"""simplify's schedule: it skips only steps that would find nothing, so it ends where running
every step in turn until a whole round changes nothing ends, with nothing left for any step."""
import qdc as qd
from qdc.compiler import ir
from qdc.compiler.frontend.ast_to_ir import FrontEnd
from qdc.compiler.jit.api import direct_options
from qdc.compiler.passes import simplify as simplify_module
from qdc.compiler.passes.pipeline import PIPELINE, run_passes

x = qd.field(qd.f32, shape=16)
m = qd.field(qd.i32, shape=16)
out = qd.field(qd.i32, shape=16)
n = qd.field(qd.i32, shape=())


@qd.func
def offset(v, s):
    t = v * s
    t = t + 0 * s  # a dead store before
    return t


@qd.kernel
def mixed():
    total = 0
    for i in range(16):
        p = m[i] + 1  # two loads of one element: one load (CSE, load forwarding), then one sum (CSE)
        q = m[i] + 1
        twice = p + p
        r = min(p, q)  # p once p and q are one sum (folding), then r + p is twice (CSE)
        w = offset(r, 1) + p
        if i % 2 == 0:
            out[i] = w + twice
        else:
            out[i] = m[i] * offset(q, 2)
        total += out[i]
    for j in range(n[None]):
        k = j * 1
        x[k] = x[k] + x[k] * 0.0
    n[None] = total


def _reference_simplify(k: ir.KernelIR) -> bool:
    """Every step in turn until a whole round changes nothing."""
    changed_any = False
    while True:
        changed = False
        for step in simplify_module._STEPS:
            changed |= step(k)
        changed_any |= changed
        if not changed:
            return changed_any


def _compiled(simplify) -> ir.KernelIR:
    kir = FrontEnd(mixed.fn, [], direct_options()).build()
    passes = [(name, simplify if fn is simplify_module.simplify else fn) for name, fn in PIPELINE]
    return run_passes(kir, passes, "the front end", verify_each=True)


def test_simplify_ends_where_running_every_step_ends():
    scheduled, reference = _compiled(simplify_module.simplify), _compiled(_reference_simplify)
    assert ir.print_kernel(scheduled) == ir.print_kernel(reference)


def test_simplify_leaves_nothing_for_any_step():
    kir = FrontEnd(mixed.fn, [], direct_options()).build()
    run_passes(kir, PIPELINE, "the front end", stop_after="simplify")
    assert not [step.__name__ for step in simplify_module._STEPS if step(kir)]
