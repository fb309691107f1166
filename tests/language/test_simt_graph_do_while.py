"""`while qd.graph.do_while(flag):` in graph=True kernels, on every arch the suite runs: the body
runs, then again while the 0-d i32 flag is nonzero; nested and sibling loops, top-level loops
around them, numpy and qd.ndarray flags; misuse is a located compile error."""
import numpy as np
import pytest

import qdc as qd

I32_0D = qd.types.ndarray(qd.i32, ndim=0)
F32_1D = qd.types.ndarray(qd.f32, ndim=1)


@qd.kernel(graph=True)
def count_down(x: F32_1D, counter: I32_0D):
    for i in range(x.shape[0]):
        x[i] = x[i] + 100.0
    while qd.graph.do_while(counter):
        for i in range(x.shape[0]):
            x[i] = x[i] + 1.0
        counter[()] = counter[()] - 1
    for i in range(x.shape[0]):
        x[i] = x[i] * 2.0


def test_counter_runs_the_body_that_many_times(arch, rng):
    x0 = rng.standard_normal(1000).astype(np.float32)
    x, counter = qd.ndarray(qd.f32, shape=(1000,)), qd.ndarray(qd.i32, shape=())
    x.from_numpy(x0)
    counter.from_numpy(np.array(7, np.int32))
    count_down(x, counter)
    np.testing.assert_allclose(x.to_numpy(), (x0 + 107) * 2, rtol=1e-6)
    assert int(counter.to_numpy()) == 0
    a, c = x0.copy(), np.array(1, np.int32)  # numpy arguments too; a flag of 1 runs the body once
    count_down(a, c)
    np.testing.assert_allclose(a, (x0 + 101) * 2, rtol=1e-6)
    assert int(c) == 0


@qd.kernel(graph=True)
def halve_until_small(x: F32_1D, keep_going: I32_0D, passes: I32_0D):
    while qd.graph.do_while(keep_going):
        for i in range(x.shape[0]):
            x[i] = x[i] * 0.5
        passes[()] = passes[()] + 1
        keep_going[()] = 0
        for i in range(x.shape[0]):  # the flag a parallel loop computes
            if x[i] > 1.0:
                keep_going[()] = 1


def test_a_flag_the_body_computes_stops_the_loop(arch, rng):
    x0 = rng.uniform(0, 1000, 256).astype(np.float32)
    x, flag, passes = qd.ndarray(qd.f32, shape=(256,)), qd.ndarray(qd.i32, shape=()), qd.ndarray(qd.i32, shape=())
    x.from_numpy(x0)
    flag.from_numpy(np.array(1, np.int32))
    halve_until_small(x, flag, passes)
    want = x0.copy()
    n = 0
    while True:
        want *= 0.5
        n += 1
        if not (want > 1).any():
            break
    np.testing.assert_array_equal(x.to_numpy(), want)
    assert int(passes.to_numpy()) == n


@qd.kernel(graph=True)
def nested(x: qd.types.ndarray(qd.i32, ndim=1), outer: I32_0D, inner: I32_0D, other: I32_0D):
    for i in range(x.shape[0]):
        x[i] = x[i] + 100
    while qd.graph.do_while(outer):
        inner[()] = 5
        while qd.graph.do_while(inner):
            for i in range(x.shape[0]):
                x[i] = x[i] + 1
            inner[()] = inner[()] - 1
        outer[()] = outer[()] - 1
    while qd.graph.do_while(other):
        for i in range(x.shape[0]):
            x[i] = x[i] * 3
        other[()] = other[()] - 1


def test_nested_and_sibling_loops(arch):
    x = np.arange(16, dtype=np.int32)
    outer, inner, other = np.array(3, np.int32), np.array(1, np.int32), np.array(2, np.int32)
    nested(x, outer, inner, other)
    np.testing.assert_array_equal(x, (np.arange(16) + 100 + 15) * 9)
    assert (int(outer), int(inner), int(other)) == (0, 0, 0)


@qd.kernel(graph=True)
def flag_of_a_field(x: F32_1D, counter: qd.types.ndarray(qd.f32, ndim=0)):
    while qd.graph.do_while(counter):
        for i in range(x.shape[0]):
            x[i] = 1.0


@qd.kernel(graph=True)
def under_a_loop(x: F32_1D, counter: I32_0D):
    for i in range(x.shape[0]):
        while qd.graph.do_while(counter):
            x[i] = 1.0


@qd.kernel(graph=True)
def with_gradient(x: F32_1D, y: F32_1D, counter: I32_0D):
    while qd.graph.do_while(counter):
        for i in range(x.shape[0]):
            y[i] += x[i] * x[i]
        counter[()] = counter[()] - 1


def test_misuse_is_a_located_error():
    x = np.zeros(4, np.float32)
    with pytest.raises(qd.QdcCompileError, match=r"test_simt_graph_do_while.py:\d+:\d+: .*0-d qd.i32 ndarray"):
        flag_of_a_field(x, np.array(1, np.float32))
    with pytest.raises(qd.QdcCompileError, match=r"test_simt_graph_do_while.py:\d+:\d+: .*at the kernel's top level"):
        under_a_loop(x, np.array(1, np.int32))
    xs, ys = qd.ndarray(qd.f32, shape=(4,), needs_grad=True), qd.ndarray(qd.f32, shape=(4,), needs_grad=True)
    with pytest.raises(qd.QdcCompileError, match="qd.graph.do_while cannot be used in kernel 'with_gradient'"):
        with_gradient.grad(xs, ys, np.array(1, np.int32))


def test_metadata_with_a_malformed_loop_record_is_refused():
    from qdc.compiler.driver import kernel as K
    from qdc.compiler.driver.options import Options
    from qdc.runtime.contract.artifact import KernelMeta
    k = nested._primal
    meta = K.compile_kernel(k.fn, k.params, Options(arch="cpu"), arch="cpu").meta.to_dict()
    assert len(meta["graph_loops"]) == 3  # outer, inner (inside outer), other
    KernelMeta.from_dict(meta)
    for bad in ([[0, 99, 1]], [[0, 2, 0]], [[1, 3, 1], [2, 4, 2]]):  # past the tasks; not an i32 0-d; overlapping
        with pytest.raises(ValueError, match="graph_loops"):
            KernelMeta.from_dict({**meta, "graph_loops": bad})
