"""Atomics of a CPU chunk that runs alone (one thread, or a range too small to share) are plain
loads and stores (compiler/targets/llvm/llvm_ir.py, `atomic_update`); shared chunks keep the
atomic instructions. Each atomic op and type, scalar and width-W code (a task with an inner
loop), against a numpy replay in iteration order: with one thread every final value, and every
old value the atomic returns (scalar code), must match exactly; with several threads the final values (exact
for integers, within rounding of the summation order for floats)."""

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.jit.kernel import kernel_of

N, M = 3000, 7  # N iterations over M targets: every target is updated many times, by every lane of a step

OPS = {"add": qd.atomic_add, "sub": qd.atomic_sub, "mul": qd.atomic_mul, "min": qd.atomic_min,
       "max": qd.atomic_max, "and": qd.atomic_and, "or": qd.atomic_or, "xor": qd.atomic_xor}
REPLAY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum, "max": np.maximum,
          "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
NP = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "f32": np.float32, "f64": np.float64}
CASES = [(op, t) for op in ("add", "sub", "mul", "min", "max") for t in ("i32", "u32", "i64", "f32", "f64")]
CASES += [(op, t) for op in ("and", "or", "xor") for t in ("i32", "u32", "i64")]
# width-W code: atomic_mul keeps a task scalar
WIDE_CASES = [(op, t) for op, t in CASES if op in ("add", "min", "max") or (op, t) in (("sub", "f32"), ("xor", "i64"))]
SHARED_CASES = [("add", "f32"), ("sub", "f64"), ("add", "i64"), ("min", "i32"), ("max", "u32"), ("min", "f64"),
                ("or", "u32"), ("xor", "i32")]


def _inputs(rng, op: str, dtype):
    if op == "mul":  # factors near 1 keep products finite and exact enough to compare
        values = rng.choice([1, 1, 1, 2, 3], N) if np.issubdtype(dtype, np.integer) else rng.uniform(0.97, 1.03, N)
        start = np.ones(M)
    elif np.issubdtype(dtype, np.unsignedinteger):
        values, start = rng.integers(0, 2 ** 20, N), rng.integers(2 ** 20, 2 ** 21, M)
    elif np.issubdtype(dtype, np.integer):
        values, start = rng.integers(-2 ** 20, 2 ** 20, N), rng.integers(-2 ** 20, 2 ** 20, M)
    else:
        values, start = rng.uniform(-4, 4, N), rng.uniform(-4, 4, M)
    return values.astype(dtype), start.astype(dtype)


def _replay(op: str, values, start):
    """The targets and the old values of N atomics applied in iteration order."""
    out, old = start.copy(), np.empty_like(values)
    with np.errstate(over="ignore"):
        for i, v in enumerate(values):
            old[i] = out[i % M]
            out[i % M] = REPLAY[op](out[i % M], v)
    return out, old


def _kernel(op: str, dtype, wide: bool):
    atomic, t = OPS[op], getattr(qd, dtype)
    A = qd.types.ndarray(dtype=t, ndim=1)
    if wide:  # the inner loop makes the task a width-W one; it runs once per iteration
        @qd.kernel
        def k(values: A, out: A, old: A, trips: qd.i32):
            for i in range(values.shape[0]):
                for _ in range(trips):  # (an atomic whose old value is used keeps a task scalar)
                    atomic(out[i % M], values[i])
        return k

    @qd.kernel
    def k(values: A, out: A, old: A, trips: qd.i32):
        for i in range(values.shape[0]):
            old[i] = atomic(out[i % M], values[i])
    return k


@pytest.mark.parametrize("op,dtype,wide", [c + (False,) for c in CASES] + [c + (True,) for c in WIDE_CASES],
                         ids=[f"{op}-{t}" for op, t in CASES] + [f"{op}-{t}-wide" for op, t in WIDE_CASES])
def test_one_thread_replays_in_order(rng, op, dtype, wide):
    qd.init(arch=qd.cpu, cpu_max_num_threads=1)
    values, start = _inputs(rng, op, NP[dtype])
    want_out, want_old = _replay(op, values, start)
    out, old = start.copy(), np.zeros_like(values)
    k = _kernel(op, dtype, wide)
    k(values, out, old, 1)
    np.testing.assert_array_equal(out, want_out)
    if not wide:
        np.testing.assert_array_equal(old, want_old)
    lanes = kernel_of(k).compile((values, out, old, 1)).meta.tasks[0].launch.get("lanes", 1)
    assert (lanes > 1) == wide, lanes


@pytest.mark.parametrize("op,dtype", SHARED_CASES, ids=[f"{op}-{t}" for op, t in SHARED_CASES])
def test_shared_chunks_stay_atomic(rng, op, dtype):
    qd.init(arch=qd.cpu, cpu_max_num_threads=16)  # more threads than cores: chunks interleave
    npt = NP[dtype]
    values, start = _inputs(rng, op, npt)
    values = np.tile(values, 40)  # enough work for the range to be shared
    want = start.copy()
    for r in range(M):
        want[r] = REPLAY[op].reduce(np.concatenate([[start[r]], values[r::M]]).astype(npt))
    out, old = start.copy(), np.zeros_like(values)
    _kernel(op, dtype, False)(values, out, old, 1)
    if np.issubdtype(npt, np.floating) and op in ("add", "sub"):
        bound = 4 * len(values) / M * np.finfo(npt).eps * (np.abs(values).sum() / M + np.abs(start).max())
        np.testing.assert_allclose(out, want, rtol=0, atol=bound)  # any summation order's rounding
    else:
        np.testing.assert_array_equal(out, want)
