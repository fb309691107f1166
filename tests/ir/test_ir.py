"""The IR itself: building it by hand, printing it, and the verifier's checks."""
import re

import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.commands.inspect import inspect_ir
from qdc.runtime.contract import types as T


def new_kernel():
    return ir.KernelIR("k", [ir.Param("n", "scalar", T.i32), ir.Param("a", "ndarray", T.f32, 1)])


def emit(block, stmt):
    return block.append(stmt)


def saxpy_like():
    """`for i in range(n): a[i] = a[i] * 2.0`, built statement by statement."""
    k = new_kernel()
    b = k.body
    n = emit(b, ir.ArgLoad(0, T.i32))
    zero = emit(b, ir.Const(0, T.i32))
    loop = emit(b, ir.RangeFor(zero, n, T.i32))
    ptr = emit(loop.body, ir.GlobalPtr(ir.NdarrayRef(1, "a", T.f32, 1, False), [loop.index]))
    v = emit(loop.body, ir.GlobalLoad(ptr))
    two = emit(loop.body, ir.Const(2.0, T.f32))
    emit(loop.body, ir.GlobalStore(ptr, emit(loop.body, ir.Binary("mul", v, two, T.f32))))
    return k, loop


def test_hand_built_ir_verifies_and_prints():
    k, _ = saxpy_like()
    ir.verify(k)
    assert ir.print_kernel(k) == (
        "kernel k(n: i32, a: ndarray(f32, ndim=1))\n"
        "  %0 = arg_load n : i32\n"
        "  %1 = const 0 : i32\n"
        "  for %2 : i32 in [%1, %0) {\n"
        "    %3 = global_ptr a[%2] : f32\n"
        "    %4 = global_load %3 : f32\n"
        "    %5 = const 2.0 : f32\n"
        "    %6 = mul %4 %5 : f32\n"
        "    global_store %3 %6\n"
        "  }\n")


def test_printer_shows_tasks_with_their_ranges():
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def k(n: qd.i32):
        x[0] = 1.0
        for i in range(n):
            x[i] = x[i] + 1.0

    text = inspect_ir(k)
    assert re.search(r"task k_t0_serial serial \{", text)
    task = re.search(r"task k_t1_range range_for\(range\) \{\n\s+prologue \{\n(.*?)\n\s+\}\n"
                     r"\s+for (%\d+) : i32 in \[(%\d+), (%\d+)\) \{", text, re.S)
    assert task, text
    prologue = task.group(1)
    assert f"{task.group(3)} = const 0 : i32" in prologue
    assert f"{task.group(4)} = max" in prologue  # the range is clamped at zero


def test_clone_stmt_copies_nested_blocks_and_the_loop_index():
    k, loop = saxpy_like()
    mapping = {}
    copy = ir.clone_stmt(loop, mapping)
    k.body.append(copy)
    assert copy.index is not loop.index and copy.index.loop is copy
    assert copy.body.stmts[0].indices == [copy.index]
    ir.verify(k)


def rejects(k, pattern, offloaded=False):
    with pytest.raises(ir.IRVerifyError, match=pattern):
        ir.verify(k, offloaded=offloaded)


def test_verifier_rejects_use_before_definition():
    k = new_kernel()
    one = ir.Const(1, T.i32)
    emit(k.body, ir.Binary("add", one, one, T.i32))
    emit(k.body, one)
    rejects(k, "not defined before this use")


def test_verifier_rejects_a_value_from_a_sibling_branch():
    k = new_kernel()
    cond = emit(k.body, ir.Const(True, T.u1))
    branch = emit(k.body, ir.If(cond))
    inner = emit(branch.then_block, ir.Const(1, T.i32))
    emit(branch.else_block, ir.Binary("add", inner, inner, T.i32))
    rejects(k, "not defined before this use")


def test_verifier_rejects_a_loop_index_outside_its_loop():
    k, loop = saxpy_like()
    emit(k.body, ir.Cast(loop.index, T.f32))
    rejects(k, "loop index outside its loop")


@pytest.mark.parametrize("make, pattern", [
    (lambda b: ir.Binary("add", emit(b, ir.Const(1, T.i32)), emit(b, ir.Const(1.0, T.f32)), T.i32),
     "operands differ in type"),
    (lambda b: ir.Binary("lt", emit(b, ir.Const(1, T.i32)), emit(b, ir.Const(2, T.i32)), T.i32),
     "expected u1"),
    (lambda b: ir.Binary("bit_and", emit(b, ir.Const(1.0, T.f32)), emit(b, ir.Const(2.0, T.f32)), T.f32),
     "needs integer operands"),
    (lambda b: ir.Unary("sqrt", emit(b, ir.Const(4, T.i32)), T.i32), "needs a float operand"),
    (lambda b: ir.If(emit(b, ir.Const(1, T.i32))), "if condition has type i32"),
    (lambda b: ir.Const(300, T.i8), "does not fit in i8"),
    (lambda b: ir.Const(1, T.f32), "must be a float"),
    (lambda b: ir.LocalStore(emit(b, ir.Alloca(T.f32)), emit(b, ir.Const(1, T.i32))), "storing i32 into a f32"),
    (lambda b: ir.Binary("add", emit(b, ir.Alloca(T.i32)), emit(b, ir.Const(1, T.i32)), T.i32),
     "used as a value without a load"),
    (lambda b: ir.ArgLoad(0, T.f32), "parameter 'n' is i32"),
    (lambda b: ir.NdarrayShape(1, 1, T.i32), "dimension 1 out of range"),
    (lambda b: ir.GlobalPtr(ir.NdarrayRef(1, "a", T.f32, 1, False), []), "indexed with 0"),
    (lambda b: ir.TempLoad(0, T.f32), "temporary t0 does not exist"),
])
def test_verifier_rejects_wrong_types(make, pattern):
    k = new_kernel()
    emit(k.body, make(k.body))
    rejects(k, pattern)


def test_verifier_rejects_break_outside_a_loop():
    k = new_kernel()
    cond = emit(k.body, ir.Const(True, T.u1))
    branch = emit(k.body, ir.If(cond))
    emit(branch.then_block, ir.Break())
    rejects(k, "break outside a loop")


def test_break_inside_a_while_is_fine():
    k = new_kernel()
    loop = emit(k.body, ir.While())
    cond = emit(loop.body, ir.Const(True, T.u1))
    branch = emit(loop.body, ir.If(cond))
    emit(branch.then_block, ir.Break())
    ir.verify(k)


def test_verifier_rejects_a_statement_in_two_places_and_wrong_links():
    k = new_kernel()
    c = emit(k.body, ir.Const(1, T.i32))
    k.body.stmts.append(c)
    rejects(k, "appears twice|block link")
    k2 = new_kernel()
    c2 = ir.Const(1, T.i32)
    k2.body.stmts.append(c2)  # not through append(): no block link
    rejects(k2, "block link is wrong")


def offloaded_kernel():
    """One range-for task over [0, n) whose body stores the index into a[i]."""
    k = new_kernel()
    t = emit(k.body, ir.Task("range_for"))
    t.begin = emit(t.prologue, ir.Const(0, T.i32))
    t.end = emit(t.prologue, ir.ArgLoad(0, T.i32))
    t.index = ir.LoopIndex(t, T.i32)
    ptr = emit(t.body, ir.GlobalPtr(ir.NdarrayRef(1, "a", T.f32, 1, False), [t.index]))
    emit(t.body, ir.GlobalStore(ptr, emit(t.body, ir.Cast(t.index, T.f32))))
    return k, t


def test_verifier_checks_task_structure():
    k, t = offloaded_kernel()
    ir.verify(k, offloaded=True)
    assert "for %2 : i32 in [%0, %1)" in ir.print_kernel(k)

    k, t = offloaded_kernel()
    emit(t.body, ir.Cast(t.end, T.f32))  # a prologue value is not visible in the body
    rejects(k, "not defined before this use", offloaded=True)

    k, t = offloaded_kernel()
    t.end = emit(t.body, ir.Const(4, T.i32))
    rejects(k, "bounds must be computed in its prologue", offloaded=True)

    k, t = offloaded_kernel()
    emit(k.body, ir.Const(1, T.i32))
    rejects(k, "only tasks", offloaded=True)


def test_chunk_init_values_are_visible_in_body_and_chunk_final():
    k, t = offloaded_kernel()
    acc = emit(t.chunk_init, ir.Alloca(T.f32, "acc"))
    emit(t.body, ir.LocalAccumulate("add", acc, t.body.stmts[1]))
    total = emit(t.chunk_final, ir.LocalLoad(acc))
    first = emit(t.chunk_final, ir.Const(0, T.i32))
    ptr = emit(t.chunk_final, ir.GlobalPtr(ir.NdarrayRef(1, "a", T.f32, 1, False), [first]))
    emit(t.chunk_final, ir.AtomicRMW("add", ptr, total))
    ir.verify(k, offloaded=True)
    text = ir.print_kernel(k)
    assert "chunk_init {" in text and "chunk_final {" in text and "accumulate_add" in text
    emit(t.chunk_final, ir.Cast(t.index, T.f32))  # the index does not exist after the loop
    rejects(k, "loop index outside its loop", offloaded=True)
