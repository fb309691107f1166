"""The pass pipeline: what each pass does to the IR, and that none of it changes results."""
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.commands.inspect import inspect_ir
from qdc.compiler.passes import pipeline
from qdc.compiler.passes.store_forward import eliminate_dead_stores, forward_stores
from qdc.runtime.contract import types as T


def loop_body(text: str, task: int = -1) -> str:
    """The printed body of the `task`-th range-for task."""
    bodies = re.findall(r"\n(\s+)for %\d+ : \w+ in \[.*?\) \{\n(.*?)\n\1\}", text, re.S)
    return bodies[task][1]


def test_folded_constant_stays_folded():
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def fill():
        for i in x:
            x[i] = qd.cast(2, qd.i32) * 3 + 1

    assert re.search(r"mul %\d+ %\d+ : i32", inspect_ir(fill, after="type_check"))
    folded = inspect_ir(fill, after="constant_fold")
    assert "const 7 : i32" in folded and " mul " not in folded
    final = inspect_ir(fill)
    assert "const 7.0 : f32" in loop_body(final) and " mul " not in final
    fill()
    np.testing.assert_array_equal(x.to_numpy(), np.full(8, 7, np.float32))


def dead_code_kernel():
    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            unused = a[i] * 3.0  # noqa: F841  (dead pure op)
            t = 1.0  # dead store: overwritten before any read
            t = a[i]
            a[i] = t + a.shape[0] + a.shape[0]
    return k


def test_dead_pure_op_and_dead_store_are_removed(rng):
    k = dead_code_kernel()
    a = rng.standard_normal(37).astype(np.float32)
    before = inspect_ir(k, a, after="type_check")
    assert " mul " in before and "const 1.0" in before
    text = inspect_ir(k, a)
    assert " mul " not in text and "const 1.0" not in text
    assert "alloca" not in text and "local_store" not in text
    expect = a + np.float32(37) + np.float32(37)
    k(a)
    np.testing.assert_array_equal(a, expect)


def test_cse_merges_duplicate_shape_loads(rng):
    k = dead_code_kernel()
    a = rng.standard_normal(5).astype(np.float32)
    assert inspect_ir(k, a, after="type_check").count("ndarray_shape a.shape[0]") == 3
    assert inspect_ir(k, a, after="simplify").count("ndarray_shape a.shape[0]") == 1
    body = loop_body(inspect_ir(k, a))
    assert body.count("ndarray_shape a.shape[0]") == 1 and body.count("cast") == 1


def test_store_forwarding_removes_loads():
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def k(s: qd.f32):
        for i in x:
            v = 0.0
            v = x[i] * s  # assigned twice: a local variable
            w = v + 1.0  # assigned once: the front end binds w to its value
            x[i] = w * v

    assert inspect_ir(k, after="type_check").count("local_load") == 3  # s, v, v
    text = inspect_ir(k)
    assert "local_load" not in text and "alloca" not in text
    xs = np.arange(8, dtype=np.float32)
    x.from_numpy(xs)
    k(1.5)
    v = xs * np.float32(1.5)
    np.testing.assert_array_equal(x.to_numpy(), (v + np.float32(1)) * v)


def test_store_forwarding_respects_loops_and_branches(rng):
    x = qd.field(qd.f32, shape=64)
    y = qd.field(qd.f32, shape=64)

    @qd.kernel
    def k(m: qd.i32):
        for i in x:
            v = 0.0
            for j in range(m):
                v = v + 1.0
            w = 1.0
            if x[i] > 0:
                w = 2.0
            y[i] = v + w

    body = loop_body(inspect_ir(k), 0)
    inner = re.search(r"for serial .*?\{\n(.*?)\n\s+\}", body, re.S).group(1)
    assert "local_load" in inner  # the loop-carried value is not the value before the loop
    xs = rng.standard_normal(64).astype(np.float32)
    x.from_numpy(xs)
    m = int(rng.integers(2, 9))
    k(m)
    np.testing.assert_array_equal(y.to_numpy(), m + np.where(xs > 0, 2.0, 1.0).astype(np.float32))


def local_var_kernel():
    """`v = 1; v = 2; load v` at the top of a hand-built kernel; returns (kernel, stores, load)."""
    k = ir.KernelIR("k", [])
    v = k.body.append(ir.Alloca(T.i32, "v"))
    s1 = k.body.append(ir.LocalStore(v, k.body.append(ir.Const(1, T.i32))))
    s2 = k.body.append(ir.LocalStore(v, k.body.append(ir.Const(2, T.i32))))
    return k, v, (s1, s2)


def test_dead_store_elimination_keeps_a_store_a_break_may_expose():
    k, v, (s1, s2) = local_var_kernel()
    assert eliminate_dead_stores(k)
    assert s1 not in k.body.stmts and s2 in k.body.stmts

    # while { v = 1; if c { break }; v = 2 }; load v  -- the first store is live after a break
    k = ir.KernelIR("k", [])
    v = k.body.append(ir.Alloca(T.i32, "v"))
    loop = k.body.append(ir.While())
    s1 = loop.body.append(ir.LocalStore(v, loop.body.append(ir.Const(1, T.i32))))
    branch = loop.body.append(ir.If(loop.body.append(ir.Const(True, T.u1))))
    branch.then_block.append(ir.Break())
    loop.body.append(ir.LocalStore(v, loop.body.append(ir.Const(2, T.i32))))
    k.body.append(ir.LocalLoad(v))
    ir.verify(k)
    assert not eliminate_dead_stores(k)
    assert s1 in loop.body.stmts


def test_store_forwarding_is_conservative_about_nested_writes():
    k, v, _ = local_var_kernel()
    body = k.body
    loop = body.append(ir.While())  # while { if load(v) == 2 { v = 3 } else { break } }
    seen = loop.body.append(ir.LocalLoad(v))
    cond = loop.body.append(ir.Binary("eq", seen, loop.body.append(ir.Const(2, T.i32)), T.u1))
    branch = loop.body.append(ir.If(cond))
    branch.then_block.append(ir.LocalStore(v, branch.then_block.append(ir.Const(3, T.i32))))
    branch.else_block.append(ir.Break())
    after = body.append(ir.LocalLoad(v))
    use = body.append(ir.Binary("add", after, after, T.i32))
    ir.verify(k)
    forward_stores(k)
    ir.verify(k)
    assert seen in loop.body.stmts  # the loop writes v: its first read is not the value before it
    assert use.a is after and after in body.stmts  # nor is the read after the loop

    k, v, (_, s2) = local_var_kernel()
    load = k.body.append(ir.LocalLoad(v))
    use = k.body.append(ir.Unary("neg", load, T.i32))
    assert forward_stores(k)
    assert load not in k.body.stmts and use.x is s2.value


def test_offload_makes_serial_and_range_tasks_with_temps_between_them():
    x = qd.field(qd.f32, shape=8)
    y = qd.field(qd.f32, shape=8)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def k():
        s = x[0] * 2.0
        x[1] = 5.0  # x changes after the load: `s` cannot be recomputed, it travels in a temp
        for i in range(8):
            y[i] = s
        for j in range(n[None]):
            x[j] = 1.0

    text = inspect_ir(k)
    tasks = re.findall(r"task (\w+) (serial|range_for)", text)
    assert [kind for _, kind in tasks] == ["serial", "range_for", "range_for"], text
    serial, first_loop, second_loop = re.split(r"\n  task ", text)[1:]
    assert re.search(r"temp_store t0 %\d+", serial)
    assert "temp_load t0 : f32" in loop_body(first_loop)
    prologue = re.search(r"prologue \{\n(.*?)\n\s+\}", second_loop, re.S).group(1)
    assert "global_load" in prologue and "global_load" not in loop_body(second_loop)
    assert "temps t0: f32" in text

    xs = np.array([3, 9, 9, 9, 9, 9, 9, 9], np.float32)
    x.from_numpy(xs)
    n[None] = 5
    k()
    np.testing.assert_array_equal(y.to_numpy(), np.full(8, 6, np.float32))
    np.testing.assert_array_equal(x.to_numpy(), [1, 1, 1, 1, 1, 9, 9, 9])


def test_pipeline_verifies_between_passes_when_asked(monkeypatch):
    """A pass that breaks the IR is caught right after it runs, naming it."""
    x = qd.field(qd.f32, shape=4)

    @qd.kernel
    def k():
        for i in x:
            x[i] = 1.0

    def break_types(kir):
        for s in ir.walk(kir.body):
            if isinstance(s, ir.Const) and s.type is T.f32:
                s.value = 1  # an int in an f32 constant
        return True

    monkeypatch.setattr(pipeline, "PIPELINE", pipeline.PIPELINE + [("breaks_types", break_types)])
    with pytest.raises(ir.IRVerifyError, match="after pass 'breaks_types': f32 constant must be a float"):
        inspect_ir(k)


def test_type_check_reports_at_the_user_line(monkeypatch):
    from qdc.compiler.passes.type_check import type_check
    k = ir.KernelIR("k", [])
    k.body.append(ir.Const(1, T.f32, ir.SourceLoc("model.py", 12, 5)))
    with pytest.raises(qd.QdcCompileError, match=r"model.py:12:5: error: internal compiler error \(IR type check\)"):
        type_check(k)


def semantic_kernels():
    """Kernels built fresh (a new compile each call) touching every pass's territory."""
    @qd.kernel
    def mix(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1),
            out: qd.types.ndarray(dtype=qd.f32, ndim=1), iout: qd.types.ndarray(dtype=qd.i32, ndim=1), s: qd.f32):
        scale = s * 2.0
        for i in range(a.shape[0]):
            v = a[i] * scale
            k = b[i] % 7
            acc = 0
            j = 0
            while True:
                if j >= k:
                    break
                j += 1
                if j % 3 == 0:
                    continue
                acc += j * (b[i] // 3)
            if v > 0.5:
                v = v - 1.0
            elif v < -0.5:
                v = -v
            out[i] = v + a.shape[0] * 0.0 + (qd.cast(4, qd.i32) - 4)
            iout[i] = acc + (k << 2) - (k ^ 5)
    return mix


def reference(a, b, s):
    v = a * np.float32(s * 2.0)
    v = np.where(v > 0.5, v - np.float32(1), np.where(v < -0.5, -v, v)).astype(np.float32)
    iout = np.empty_like(b)
    for i, bi in enumerate(b):
        k = bi % 7
        acc = sum(j * (bi // 3) for j in range(1, k + 1) if j % 3 != 0)
        iout[i] = acc + (k << 2) - (k ^ 5)
    return v, iout


@pytest.mark.parametrize("optimised", [True, False])
def test_optimisation_does_not_change_results(rng, monkeypatch, tmp_path, optimised):
    """The same kernel with the full pipeline and with only the passes codegen needs agrees
    with numpy (and therefore with itself)."""
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))  # the cache key does not know about PIPELINE
    if not optimised:
        bare = [(n, p) for n, p in pipeline.PIPELINE if n in ("type_check", "offload")]
        monkeypatch.setattr(pipeline, "PIPELINE", bare)
    n = 301
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.integers(-50, 50, n).astype(np.int32)
    s = float(rng.uniform(0.2, 2.0))
    out, iout = np.zeros(n, np.float32), np.zeros(n, np.int32)
    kernel = semantic_kernels()
    compiled = kernel.compile((a, b, out, iout, s))
    assert ("alloca 's'" in ir.print_kernel(compiled.ir)) != optimised  # each variant really compiled
    kernel(a, b, out, iout, s)
    v, ref_i = reference(a, b, np.float32(s))
    np.testing.assert_array_equal(iout, ref_i)
    np.testing.assert_allclose(out, v, rtol=1e-6, atol=1e-6)
