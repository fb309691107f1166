"""Artifact task records: entry, trip count, launch policy and adstack ids; the TempRead leaf of
SizeExpr trees; the schema checks that refuse a record missing or mistyping any of them."""
import copy

import msgpack
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.artifact_schema import check_kernel_meta
from qdc.runtime import sizeexpr_eval as ev
from qdc.runtime.contract import sizeexpr as se


@qd.kernel
def two_tasks(a: qd.types.ndarray(qd.f32, ndim=1), n: qd.i32):
    for i in range(n):
        a[i] = a[i] * 2.0
    for j in a:
        a[j] += 1.0


def _meta(kernel, *args, variant="forward"):
    from qdc.compiler.jit.kernel import kernel_of
    return kernel_of(kernel).compile(args, variant).meta


def test_task_records_have_entry_trip_count_and_launch_policy():
    a = np.ones(8, np.float32)
    two_tasks(a, 3)
    np.testing.assert_allclose(a, [3, 3, 3, 2, 2, 2, 2, 2])
    meta = _meta(two_tasks, a, 3)
    assert FORMAT_V4 == A.FORMAT_VERSION
    t0, t1 = meta.tasks
    assert (t0.entry, t1.entry) == (meta.entry + "_t0", meta.entry + "_t1")
    names = ([p.name for p in meta.params], [])
    assert se.to_text(se.from_nodes(t0.iterations), *names) == "max(n, 0)"
    assert se.to_text(se.from_nodes(t1.iterations), *names) == "shape(a,0)"
    for t in meta.tasks:
        assert t.launch["policy"] == "cpu_chunks" and t.launch["parallel_from"] >= 1 and t.adstacks == []
    assert not hasattr(t0, "range")
    d = meta.to_dict()
    check_kernel_meta(d)
    assert set(d["tasks"][0]) == {"name", "kind", "serial", "source_kind", "entry", "iterations", "launch",
                                  "adstacks"}


FORMAT_V4 = 4

x = qd.field(qd.f32, shape=8, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)
steps = qd.field(qd.i32, shape=())


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(steps[None]):
            v = qd.sin(v)
        loss[None] += v


def test_grad_kernel_tasks_list_their_adstacks_and_stacks_lose_the_dispatch():
    steps[None] = 3
    chain()
    meta = _meta(chain, variant="grad")
    stacks = meta.adstack["stacks"]
    assert stacks and all("iterations" not in r and "parallel_from" not in r for r in stacks)
    listed = sorted(s for t in meta.tasks for s in t.adstacks)
    assert listed == list(range(len(stacks)))
    for t in meta.tasks:
        assert all(stacks[s]["task"] == meta.tasks.index(t) for s in t.adstacks)


@qd.kernel
def counted(out: qd.types.ndarray(qd.i32, ndim=1), m: qd.i32):
    n = 0
    while n * n < m:
        n += 1
    for i in range(n):
        out[i] = i + 1


def test_trip_count_from_a_temporary_is_a_temp_read_evaluated_on_the_device_value():
    out = np.zeros(16, np.int32)
    counted(out, 10)
    assert list(out[:5]) == [1, 2, 3, 4, 0]
    meta = _meta(counted, out, 10)
    tree = se.from_nodes(meta.tasks[-1].iterations)
    assert se.reads_temps(tree), se.to_text(tree)
    temps = {}
    leaf = next(e for e in se.walk(tree) if isinstance(e, se.TempRead))
    temps[leaf.slot] = 4
    env = ev.LaunchEnv([out, 10], (), lambda slot, dtype: temps[slot])
    assert ev.evaluate(tree, env) == 4
    with pytest.raises(se.SizeExprError, match="earlier task"):
        ev.evaluate(tree, ev.LaunchEnv([out, 10]))


def test_temp_read_nodes_round_trip_and_are_validated():
    e = se.Add(se.TempRead(2, se.TEMP_DTYPES.index("i32")), se.Const(1))
    assert se.from_nodes(se.to_nodes(e)) == e
    assert se.to_text(e) == "temp2:i32 + 1"
    with pytest.raises(ValueError, match="temporary dtype"):
        se.from_nodes([["temp", [0, 99], []]])


def _good_meta() -> dict:
    return {"name": "k", "entry": "k", "num_temps": 1, "is_grad": False,
            "params": [["n", "scalar", "i32", 0, False, False]], "fields": [],
            "tasks": [{"name": "t0", "kind": "serial", "serial": True, "source_kind": "serial", "entry": "k_t0",
                       "iterations": se.to_nodes(se.Const(1)), "launch": {"policy": "cpu_chunks", "parallel_from": 0},
                       "adstacks": []},
                      {"name": "t1", "kind": "range_for", "serial": False, "source_kind": "range", "entry": "k_t1",
                       "iterations": se.to_nodes(se.TempRead(0, 2)), "launch": {"policy": "grid", "block_dim": 128},
                       "adstacks": []}]}


def _broken(edit):
    d = copy.deepcopy(_good_meta())
    edit(d)
    return d


@pytest.mark.parametrize("edit, why", [
    (lambda d: d["tasks"][0].pop("entry"), "expected the keys"),
    (lambda d: d["tasks"][0].update(range=None), "expected the keys"),
    (lambda d: d["tasks"][0].update(entry="no spaces"), "entry symbol"),
    (lambda d: d["tasks"][0].update(kind="other"), "task record 0"),
    (lambda d: d["tasks"][1].update(launch={"policy": "warp"}), "launch policy"),
    (lambda d: d["tasks"][1].update(launch={"policy": "grid", "block_dim": -1}), "block_dim"),  # 0: device default
    (lambda d: d["tasks"][1].update(launch={"policy": "grid", "block_dim": 64, "x": 1}), "launch policy"),
    (lambda d: d["tasks"][0].update(launch={"policy": "cpu_chunks", "parallel_from": -1}), "parallel_from"),
    (lambda d: d["tasks"][0].update(launch=[]), "launch policy"),
    (lambda d: d["tasks"][1].update(iterations=se.to_nodes(se.TempRead(5, 2))), "does not have"),
    (lambda d: d["tasks"][1].update(iterations=[["bogus", [], []]]), "iterations"),
    (lambda d: d["tasks"][0].update(iterations=[]), "serial task"),
    (lambda d: d["tasks"][0].update(adstacks=[0]), "adstack"),
    (lambda d: d["tasks"][0].update(adstacks="x"), "adstacks"),
    (lambda d: d["tasks"][1].update(bindings=[]), "bindings"),
    (lambda d: d["tasks"][1].update(bindings=[[0, 0, "args", 0], [0, 0, "temps", 0]]), "binding"),
    (lambda d: d["tasks"][1].update(bindings=[[0, 1, "field", 0]]), "names no field"),
    (lambda d: d["tasks"][1].update(bindings=[[0, 1, "ndarray", 0]]), "names no such ndarray"),
    (lambda d: d["tasks"][1].update(bindings=[[0, 1, "texture", 0]]), "binding"),
    (lambda d: d["tasks"][1].update(bindings=[[9, 1, "args", 0]]), "binding"),
    (lambda d: d.update(tasks={}), "tasks"),
    (lambda d: d.update(adstack={"stacks": [{"task": 1, "dtype": "f32", "adjoint": True, "max_size": 4,
                                             "iterations": [], "parallel_from": 0}]}), "adstack record 0"),
    (lambda d: d.update(adstack={"stacks": [{"task": 1, "dtype": "f32", "adjoint": True, "max_size": 4}]}),
     "do not match"),
    (lambda d: d.update(adstack={"stacks": [{"task": 1, "dtype": "f32", "adjoint": True, "max_size": 4,
                                             "size_expr": se.to_nodes(se.TempRead(0, 2))}]}), "temporary"),
])
def test_malformed_task_records_are_refused(edit, why):
    check_kernel_meta(_good_meta())
    with pytest.raises(ValueError, match=why):
        A.KernelMeta.from_dict(_broken(edit))


def test_good_records_round_trip():
    d = _good_meta()
    d["adstack"] = {"stacks": [{"task": 1, "dtype": "f32", "adjoint": True, "max_size": 4}]}
    d["tasks"][1]["adstacks"] = [0]
    meta = A.KernelMeta.from_dict(d)
    assert meta.tasks[1].launch == {"policy": "grid", "block_dim": 128} and meta.tasks[1].adstacks == [0]
    assert A.KernelMeta.from_dict(meta.to_dict()).to_dict() == meta.to_dict()


def test_descriptor_bindings_round_trip():
    """SPIR-V tasks will name the buffer behind each (set, binding); the schema is checked now."""
    d = _good_meta()
    d["params"].append(["a", "ndarray", "f32", 1, True, True])
    d["tasks"][1]["bindings"] = [[0, 0, "args", 0], [0, 1, "ndarray", 1], [0, 2, "ndarray_grad", 1],
                                 [0, 3, "temps", 0], [1, 0, "adstack_float", 0]]
    meta = A.KernelMeta.from_dict(d)
    assert meta.tasks[1].bindings[1] == [0, 1, "ndarray", 1] and meta.tasks[0].bindings == []
    assert "bindings" not in meta.tasks[0].to_dict()
    assert A.KernelMeta.from_dict(meta.to_dict()).to_dict() == meta.to_dict()


def test_version_3_records_are_refused_as_stale():
    payload = msgpack.packb({"x": 1}, use_bin_type=True)
    old = msgpack.packb(["qdc", A.ENTRY_RECORD, 3, A.sha256(payload), payload], use_bin_type=True)
    with pytest.raises(A.RecordError, match="version 3") as e:
        A.decode_record(old, A.ENTRY_RECORD)
    assert e.value.version_mismatch


def test_the_library_exports_every_task_entry():
    a = np.ones(4, np.float32)
    two_tasks(a, 2)
    from qdc.compiler.jit.kernel import kernel_of
    compiled = kernel_of(two_tasks).compile((a, 2))
    loaded = context.current().device.load_kernel(compiled.artifacts, compiled.meta)
    for i, t in enumerate(compiled.meta.tasks):
        assert loaded.task(i) is not None  # resolved by its symbol: ctypes raises when it is missing
    assert loaded.task_symbols == [t.entry for t in compiled.meta.tasks]
