"""Adjoints in registers (compiler/autodiff/register_adjoints.py): a stack none of whose pushes
can follow one of its adjoint operations keeps the top's adjoint in a local and its entries
hold the primal only. The gradients must be bit for bit those of the heap's adjoint (the same
additions in the same order), on every arch; a stack whose pushes may follow an accumulation
keeps its adjoint slot."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.autodiff import grad_kernel, register_adjoints
from qdc.compiler.ir.adstack import AdStackAccAdjoint, AdStackAlloca, AdStackLoadTopAdj, AdStackPop, AdStackPush
from qdc.runtime.contract import types as T


def _programs():
    x = qd.field(qd.f32, shape=37, needs_grad=True)
    w = qd.field(qd.f64, shape=37, needs_grad=True)
    n = qd.field(qd.i32, shape=37)
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    z = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def chains():
        for i in x:
            v, u = x[i], w[i]
            for t in range(n[i]):  # a trip count per iteration: stacks of different depths
                v = qd.sin(v) * 0.95 + 0.01 * u
                if t % 3 == 1:
                    u = qd.cos(u) * v + u * 0.5
            y[None] += v * v
            z[None] += u
    return (x, w, n, y, z), chains


def _gradients(arch, cache_dir, rng_state):
    qd.init(arch=arch, cache_dir=cache_dir)
    (x, w, n, y, z), chains = _programs()
    rng = np.random.default_rng(rng_state)
    x.from_numpy(rng.uniform(-1, 1, 37).astype(np.float32))
    w.from_numpy(rng.uniform(-1, 1, 37))
    n.from_numpy(rng.integers(0, 40, 37).astype(np.int32))
    chains()
    y.grad[None], z.grad[None] = 1.0, 0.5
    chains.grad()
    stacks = chains.grad.compile().meta.adstack["stacks"]
    return x.grad.to_numpy(), w.grad.to_numpy(), [r["adjoint"] for r in stacks if r["dtype"][0] == "f"]


def test_gradients_are_bit_for_bit_those_of_the_heap_adjoint(arch, tmp_path, monkeypatch, rng):
    state = int(rng.integers(0, 1 << 31))
    in_registers = _gradients(arch, str(tmp_path / "registers"), state)
    monkeypatch.setattr(grad_kernel, "GRAD_PIPELINE",
                        [(name, p) for name, p in grad_kernel.GRAD_PIPELINE if name != "adjoints_in_registers"])
    on_the_heap = _gradients(arch, str(tmp_path / "heap"), state)
    qd.init(arch=qd.cpu)
    assert in_registers[2] and not any(in_registers[2]) and all(on_the_heap[2])
    for mine, heap in zip(in_registers[:2], on_the_heap[:2]):
        np.testing.assert_array_equal(mine.view(np.uint8), heap.view(np.uint8))


def _task_with(body_builder) -> tuple:
    """A range-for task over [0, 4) whose body `body_builder(block, stack, value)` fills."""
    k = ir.KernelIR("k", [])
    task = ir.Task("range_for")
    zero, four = ir.Const(0, T.i32), ir.Const(4, T.i32)
    task.prologue.append(zero)
    task.prologue.append(four)
    task.begin, task.end = zero, four
    k.body.append(task)
    stack = task.body.append(AdStackAlloca(T.f32, 0, "v"))
    value = task.body.append(ir.Const(1.5, T.f32))
    body_builder(task.body, stack, value)
    return k, stack


def _loop(block):
    lo, hi = block.append(ir.Const(0, T.i32)), block.append(ir.Const(3, T.i32))
    return block.append(ir.RangeFor(lo, hi, T.i32, serial=True)).body


def test_pushes_then_adjoint_operations_move_the_adjoint_into_a_local():
    def body(block, stack, value):
        push_loop = _loop(block)
        push_loop.append(AdStackPush(stack, value))
        pop_loop = _loop(block)
        pop_loop.append(AdStackAccAdjoint(stack, value))
        pop_loop.append(AdStackLoadTopAdj(stack))
        pop_loop.append(AdStackPop(stack))
    k, stack = _task_with(body)
    register_adjoints.adjoints_in_registers(k)
    assert stack.adjoint is False
    ops = [s for s in ir.walk(k.body) if isinstance(s, (AdStackAccAdjoint, AdStackLoadTopAdj))]
    assert not ops


@pytest.mark.parametrize("case", ["push_after_accumulate", "both_in_one_loop"])
def test_a_push_that_may_follow_an_accumulation_keeps_the_adjoint_slot(case):
    def body(block, stack, value):
        if case == "push_after_accumulate":
            block.append(AdStackPush(stack, value))
            block.append(AdStackAccAdjoint(stack, value))
            block.append(AdStackPush(stack, value))  # over an entry whose adjoint is nonzero
        else:  # textually in order, but the next iteration's push follows this one's accumulation
            loop = _loop(block)
            loop.append(AdStackPush(stack, value))
            loop.append(AdStackAccAdjoint(stack, value))
        block.append(AdStackLoadTopAdj(stack))
    k, stack = _task_with(body)
    register_adjoints.adjoints_in_registers(k)
    assert stack.adjoint is True
    assert any(isinstance(s, AdStackAccAdjoint) for s in ir.walk(k.body))
