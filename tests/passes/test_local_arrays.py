"""Vector locals indexed at run time, on the IR (compiler/passes/local_arrays.py, ir/local_arrays.py):

- the front end makes `m[i, j]` / `m[i, j] = x` of a local of 4+ components inside the kernel's
  loops one ComponentLoad / ComponentStore, not a chain of selects or a store per component;
  smaller locals and kernel-scope ones keep the scalar form;
- the pipeline's last pass makes such a local one LocalArray (one element more where a write at a
  run-time index needs the element for out-of-range indices), its accesses ArrayLoad /
  ArrayStore at an i32 index clamped by one unsigned compare and select, and leaves no
  ComponentLoad / ComponentStore behind; a local some of whose scalars something else uses is
  expanded to the scalar form instead;
- autodiff sees the scalar form only: the gradient kernel has no component accesses and no local
  arrays (its adstacks are per scalar);
- the verifier refuses an array index outside the array, a non-i32 index, an array used as a value.
"""
from __future__ import annotations

import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.commands.inspect import kernel_ir
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.passes.local_arrays import expand_component_accesses

F32 = qd.types.ndarray(qd.f32, ndim=1)


def _count(k: ir.KernelIR, cls) -> int:
    return sum(isinstance(s, cls) for s in ir.walk(k.body))


@qd.kernel
def rotate(a: F32, out: F32, n: qd.i32):
    for p in a:
        m = qd.Matrix([[a[p], 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
        for j in range(n):
            m[j % 3, (j + 1) % 3] = m[(j + 2) % 3, j % 3] * 0.5
        out[p] = m[0, 1] + m[2, 2]


@qd.kernel
def small(a: F32, out: F32, n: qd.i32):
    for p in a:
        v = qd.Vector([a[p], 1.0, 2.0])
        for j in range(n):
            out[p] += v[j % 3]


@qd.kernel
def kernel_scope(out: F32, i: qd.i32):
    v = qd.Vector([1.0, 2.0, 3.0, 4.0])
    for p in out:
        out[p] = v[i]


@qd.kernel
def mixed_views(a: F32, out: F32, n: qd.i32):
    for p in a:
        v = qd.Vector([a[p], 1.0, 2.0, 3.0, 4.0])
        for j in range(n):
            v.xyzw[j % 4] = v[(j + 1) % 5]  # a view of four of the five scalars, indexed
        out[p] = v[4] + v[0]


def test_the_front_end_emits_one_statement_per_access():
    qd.init(arch=qd.cpu)
    k = kernel_ir(rotate, after="simplify")
    assert _count(k, ir.ComponentLoad) == 1 and _count(k, ir.ComponentStore) == 1
    assert _count(k, ir.Select) == 0
    (load,) = [s for s in ir.walk(k.body) if isinstance(s, ir.ComponentLoad)]
    assert len(load.components) == 9 and all(isinstance(v, ir.Alloca) for v in load.components)
    assert "component_load [" in ir.print_kernel(k) and "component_store [" in ir.print_kernel(k)


def test_the_last_pass_makes_one_local_array():
    qd.init(arch=qd.cpu)
    k = kernel_ir(rotate)
    ir.verify(k, offloaded=True)
    (array,) = [s for s in ir.walk(k.body) if isinstance(s, ir.LocalArray)]
    assert array.length == 9 + 1 and array.type is qd.f32 and array.var_name == "m"
    assert _count(k, ir.ComponentLoad) == _count(k, ir.ComponentStore) == 0
    assert not [s for s in ir.walk(k.body) if isinstance(s, ir.Alloca) and s.var_name == "m"]
    loads = [s for s in ir.walk(k.body) if isinstance(s, ir.ArrayLoad)]
    stores = [s for s in ir.walk(k.body) if isinstance(s, ir.ArrayStore)]
    run_time = [s for s in loads + stores if not isinstance(s.index, ir.Const)]
    assert len(run_time) == 2
    for s in run_time:  # i <u 9 ? i : 8 (a read) or 9 (a write, the element past the components)
        assert isinstance(s.index, ir.Select) and s.index.type is qd.i32
        inside, outside = s.index.cond, s.index.b
        assert inside.op == "lt" and inside.a.type is qd.u32 and inside.b.value == 9
        assert outside.value == (8 if isinstance(s, ir.ArrayLoad) else 9)
    assert _count(k, ir.Select) == 2  # the two clamps: no chain is left
    text = ir.print_kernel(k)
    assert "local_array 'm'[10] : f32" in text and "array_store %" in text


def test_small_and_kernel_scope_vectors_keep_the_scalar_form():
    qd.init(arch=qd.cpu)
    for kernel, selects in ((small, 2), (kernel_scope, 3)):
        k = kernel_ir(kernel)
        assert _count(k, ir.LocalArray) == 0 and _count(k, ir.ComponentLoad) == 0
        assert _count(k, ir.Select) == selects


def test_scalars_used_through_another_view_are_expanded():
    qd.init(arch=qd.cpu)
    before = kernel_ir(mixed_views, after="split_task_index")
    assert _count(before, ir.ComponentLoad) == 1 and _count(before, ir.ComponentStore) == 1
    k = kernel_ir(mixed_views)
    ir.verify(k, offloaded=True)
    assert _count(k, ir.LocalArray) == 0 and _count(k, ir.ComponentLoad) == _count(k, ir.ComponentStore) == 0
    assert _count(k, ir.Select) == 4 + 4  # v[j]: four selects over five; the write: one per scalar it views


def test_expansion_writes_selects_and_conditional_stores():
    qd.init(arch=qd.cpu)
    k = kernel_ir(rotate, after="simplify_tasks")
    assert expand_component_accesses(k)
    ir.verify(k, offloaded=True)
    assert _count(k, ir.ComponentLoad) == _count(k, ir.ComponentStore) == 0
    assert _count(k, ir.Select) == 8 + 9  # a chain over nine scalars, a conditional store to each
    stores = [s for s in ir.walk(k.body) if isinstance(s, ir.LocalStore) and isinstance(s.value, ir.Select)]
    assert len(stores) == 9 and all(s.value.cond.op == "eq" for s in stores)
    assert not expand_component_accesses(k)


def test_the_gradient_kernel_transforms_scalars():
    qd.init(arch=qd.cpu)
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def k(n: qd.i32):
        for p in x:
            v = qd.Vector([x[p], 1.0, 2.0, 3.0])
            for j in range(n):
                v[j % 4] = qd.sin(v[(j + 1) % 4])
            y[None] += v[0] * v[3]

    steps = []
    K.compile_kernel(k._primal.fn, k._primal.params, Options(), variant="grad",
                     dump=lambda name, text: steps.append((name, text)))
    reverse = dict(steps)["reverse_mode"]
    assert "component_" not in reverse and "local_array" not in reverse and "ad_stack_push" in reverse
    assert "component_" not in steps[-1][1] and "local_array" not in steps[-1][1]


def test_the_verifier_refuses_malformed_arrays():
    qd.init(arch=qd.cpu)
    k = kernel_ir(rotate)
    load = next(s for s in ir.walk(k.body) if isinstance(s, ir.ArrayLoad) and isinstance(s.index, ir.Const))
    good = load.index
    for bad, message in ((ir.Const(10, qd.i32), "outside a local array of 10"),
                         (ir.Const(1, qd.i64), "index is i32, got i64")):
        bad.block = good.block
        good.block.stmts.insert(good.block.stmts.index(good), bad)
        load.index = bad
        with pytest.raises(ir.IRVerifyError, match=message):
            ir.verify(k, offloaded=True)
        good.block.stmts.remove(bad)
        load.index = good
    ir.verify(k, offloaded=True)
    misuse = ir.Unary("neg", load.array, qd.f32)
    misuse.block = load.block
    load.block.stmts.insert(load.block.stmts.index(load) + 1, misuse)
    with pytest.raises(ir.IRVerifyError, match="local array is used as a value"):
        ir.verify(k, offloaded=True)
