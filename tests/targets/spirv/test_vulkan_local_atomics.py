"""A parallel loop reducing into a kernel-scope local (`x = 0; for i in range(n):
qd.atomic_add(x, 1); return x`) gives the exact count at every scale, and its SPIR-V keeps the
structure that is safe on any driver's SIMT execution:

- subgroup operations (the per-subgroup combine before the one atomic, memory.py flush_partial)
  are never inside a loop, so no loop's exit waits on lanes of the subgroup that left it;
  the reduction and the election of the invocation that applies it are in one block;
- a compare-and-swap loop (float min/max) is lock-free: it leaves as soon as its own exchange
  saw the value it expected, holds no subgroup operation or barrier, and no invocation waits
  on another's progress;
- no barrier at all (a barrier in lane-divergent control flow hangs a GPU)."""
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.spirv import tools

SCALES = [1, 10, 60, 1024, 100000]


@qd.kernel
def count(n: qd.template()) -> qd.i32:
    x = 0
    for i in range(n):
        qd.atomic_add(x, 1)
    return x


@qd.kernel
def float_count(n: qd.template()) -> qd.f32:
    x = 0.0
    for i in range(n):
        qd.atomic_add(x, 1.0)
    return x


@qd.kernel
def extremes(a: qd.types.ndarray(dtype=qd.f32, ndim=1), out: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.i32:
    hi = -1e30
    lo = 1e30
    biggest = -(2**30)
    for i in a:
        qd.atomic_max(hi, a[i])
        qd.atomic_min(lo, a[i])
        qd.atomic_max(biggest, qd.cast(a[i] * 1000.0, qd.i32))
    out[0] = hi
    out[1] = lo
    return biggest


@pytest.mark.parametrize("n", SCALES)
def test_counting_into_a_local_is_exact_at_every_scale(arch, n):
    assert count(n) == n
    assert float_count(n) == float(n)  # every partial is an integer below 2^24: exact in f32


@pytest.mark.parametrize("n", SCALES)
def test_min_and_max_into_locals_equal_numpy(arch, rng, n):
    a = rng.uniform(-1000.0, 1000.0, n).astype(np.float32)
    out = np.zeros(2, np.float32)
    biggest = extremes(a, out)
    assert out.tolist() == [a.max(), a.min()]
    assert biggest == int((a * np.float32(1000.0)).astype(np.int32).max())


def _modules(kernel, **templates) -> list[bytes]:
    k = kernel._primal
    bound = k.template_params.bind(templates) if templates else None
    compiled = K.compile_kernel(k.fn, k.params, Options(), arch="vulkan", templates=bound)
    return [compiled.artifacts[f"spirv_t{i}"] for i in range(len(compiled.meta.tasks))]


def simt_hazards(text: str) -> list[str]:
    """What in a disassembled module could hang or race under SIMT execution (see the module
    docstring); [] when none. Blocks are in structured order, a loop spans from its header to
    its merge label."""
    problems, loops, results_of_cas = [], [], set()
    block_ops: list = []
    for line in text.splitlines():
        label = re.match(r"\s*(%\w+) = OpLabel", line)
        if label:
            if loops and loops[-1]["merge"] == label.group(1):
                loop = loops.pop()
                if loop["cas"] and not loop["exits_on_cas"]:
                    problems.append(f"a compare-and-swap loop not left on its own exchange's result: {loop['header']}")
            block_ops = []
            continue
        op = re.search(r"\bOp\w+", line)
        if op is None:
            continue
        op = op.group(0)
        block_ops.append(op)
        merge = re.match(r"\s*OpLoopMerge (%\w+)", line)
        if merge:
            loops.append({"merge": merge.group(1), "header": line.strip(), "cas": False, "exits_on_cas": False})
        if op == "OpControlBarrier":
            problems.append("a barrier")
        if op.startswith("OpGroupNonUniform"):
            if loops:
                problems.append(f"{op} inside a loop")
            if op == "OpGroupNonUniformElect" and not any(o.startswith("OpGroupNonUniform") and o != op
                                                          for o in block_ops):
                problems.append("an election in another block than the reduction it applies")
        if op == "OpAtomicCompareExchange":
            results_of_cas.add(line.split("=")[0].strip())
            for loop in loops:
                loop["cas"] = True
        if op == "OpIEqual" and loops and any(r in line.split() for r in results_of_cas):
            loops[-1]["exits_on_cas"] = True
    return problems


@pytest.mark.parametrize("kernel,templates", [(count, {"n": 100000}), (float_count, {"n": 60}), (extremes, {})],
                         ids=["count", "float_count", "extremes"])
def test_reductions_into_locals_are_simt_safe(kernel, templates):
    texts = []
    for module in _modules(kernel, **templates):
        assert tools.validate(module) is None
        texts.append(tools.disassemble(module))
        assert simt_hazards(texts[-1]) == []
    joined = "\n".join(texts)
    if kernel is count:  # combined across the subgroup, then one atomic per subgroup
        assert "OpGroupNonUniformIAdd" in joined and "OpGroupNonUniformElect" in joined
    if kernel is extremes:
        assert "OpAtomicCompareExchange" in joined  # float max/min: the lock-free loop


def test_the_checker_sees_a_subgroup_operation_in_a_loop():
    text = """
    %1 = OpLabel
    OpLoopMerge %3 %2 None
    %4 = OpGroupNonUniformIAdd %int %uint_3 Reduce %5
    %2 = OpLabel
    %3 = OpLabel
    OpControlBarrier %uint_2 %uint_2 %uint_264
    """
    assert simt_hazards(text) == ["OpGroupNonUniformIAdd inside a loop", "a barrier"]
