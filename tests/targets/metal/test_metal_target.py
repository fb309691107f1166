"""The Metal target: MSL built on any machine through spirv-cross, no Mac needed.

- every kernel shape the CUDA target's tests compile (test_cuda_target.py's `kernels`) builds
  for metal, except those that need 64-bit types, which Metal lacks (no double; no 64-bit
  atomics, so no Int64): those are compile errors at their line naming the type and 'metal';
- each task's MSL holds exactly one kernel function, named as the task's entry, whose
  `[[buffer(N)]]` arguments are exactly the task record's bindings (N = binding number, the
  name saying the resource), and whose workgroup-size function constant defaults to the
  block_dim its launch policy records (the size the device dispatches);
- the adstack uses the float/int heaps with 32-bit indices (adstack_layout.spirv_heap(False));
- a missing spirv-cross is a clear error naming the package; `qdc build --arch metal` and
  `qdc inspect --msl` work here. Skipped, saying why, without spirv-cross.
"""
from __future__ import annotations

import re

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.metal import msl
from qdc.runtime.contract.adstack_layout import spirv_heap
from qdc.runtime.contract.errors import QdcCompileError
from test_cuda_target import CASES, kernels  # noqa: F401 (the fixture: the kernels the suite compiles)
from backend_util import build_and_list

# Kernels of CASES that use f64 / i64 / u64, which Metal cannot represent.
NEEDS_64_BIT = {"math64", "every_dtype", "atomics", "dynamic_loop64"}


def _need_spirv_cross():
    if msl.spirv_cross_path() is None:
        pytest.skip(f"spirv-cross not installed ({msl.INSTALL_HINT}): MSL not generated")


def _compile(kernels, name: str, variant: str = "forward", **options):
    _need_spirv_cross()
    k = kernels[name][0]._primal
    return K.compile_kernel(k.fn, k.params, Options(arch="metal", **options), arch="metal", variant=variant)


def _kernel_functions(source: str) -> list:
    return re.findall(r"^kernel void (\w+)\((.*)\)$", source, re.M)


@pytest.mark.parametrize("name,variant", CASES)
def test_each_kernel_has_one_msl_kernel_per_task_bound_as_its_metadata_says(kernels, name, variant):
    if name in NEEDS_64_BIT:
        with pytest.raises(QdcCompileError, match=r"(f64|i64|u64).*target 'metal'") as e:
            _compile(kernels, name, variant)
        assert e.value.line  # located at the statement that needs the type
        return
    compiled = _compile(kernels, name, variant)
    for i, task in enumerate(compiled.meta.tasks):
        source = compiled.artifacts[f"msl_t{i}"].decode()
        functions = _kernel_functions(source)
        assert [f for f, _ in functions] == [task.entry], source[:2000]
        assert not re.search(r"\batomic[A-Z]\w*\(", source)  # GLSL's atomics are no MSL
        params = functions[0][1]
        # a buffer viewed through several element types is one aliased `void*` argument
        bound = {int(n): name for name, n in re.findall(r"device \w+\*?&? ?(\w+) \[\[buffer\((\d+)\)\]\]", params)}
        assert len(bound) == len(re.findall(r"\[\[buffer\(", params))  # no index bound twice
        for alias, n in re.findall(r"device auto& (\w+) = \*\(device \w+\*\)spvBufferAliasSet0Binding(\d+);", source):
            bound[int(n)] = re.sub(r"_\d+$", "", alias)
        expected = {b: (f"{res}{index}" if res in ("field", "ndarray", "ndarray_grad") else res)
                    for _set, b, res, index in task.bindings}
        assert bound == expected
        block = task.launch["block_dim"]
        assert block >= 1 and re.search(rf"\[\[function_constant\(0\)\]\];\nconstant uint \w+ = "
                                        rf"is_function_constant_defined\(\w+\) \? \w+ : {block}u;", source)


def test_launch_policies_record_the_dispatched_workgroup_size(kernels):
    meta = _compile(kernels, "control_flow").meta
    assert [t.launch for t in meta.tasks] == [{"policy": "grid", "block_dim": b} for b in (256, 1, 128)]


def test_adstack_uses_the_spirv_heaps_with_32_bit_indices(kernels):
    compiled = _compile(kernels, "dynamic_loop", "grad")
    assert compiled.meta.adstack["layout"] == spirv_heap(False).record()
    resources = {b[2] for t in compiled.meta.tasks for b in t.bindings}
    assert {"adstack_meta", "adstack_float"} <= resources
    source = "".join(compiled.artifacts[k].decode() for k in compiled.artifacts if k.startswith("msl_t"))
    assert "ulong" not in source and "double" not in source


def test_a_64_bit_kernel_is_refused_at_its_line():
    _need_spirv_cross()
    qd.init(arch=qd.cpu)
    total = qd.field(qd.f64, shape=())

    @qd.kernel
    def wide(a: qd.types.ndarray(qd.f32, ndim=1)):
        for i in a:
            total[None] += qd.f64(a[i])

    k = wide._primal
    with pytest.raises(QdcCompileError, match="f64 needs Float64, which target 'metal' does not have") as e:
        K.compile_kernel(k.fn, k.params, Options(arch="metal"), arch="metal")
    assert "total[None] += qd.f64(a[i])" in str(e.value)


def test_32_bit_atomics_are_metal_atomics():
    """Integer and float atomics of 32 bits (f32 add, min and max as compare-and-swap loops) are
    MSL's atomic_*_explicit functions on device atomics, never a GLSL name spirv-cross passes on."""
    _need_spirv_cross()
    qd.init(arch=qd.cpu)
    ints = qd.field(qd.i32, shape=8)
    flags = qd.field(qd.u1, shape=8)

    @qd.kernel
    def atomics32(a: qd.types.ndarray(qd.f32, ndim=1), u: qd.types.ndarray(qd.u32, ndim=1)):
        for i in range(8):
            qd.atomic_add(a[0], 1.5)
            qd.atomic_min(a[1], a[i])
            qd.atomic_max(a[2], a[i])
            qd.atomic_and(ints[0], i)
            qd.atomic_or(ints[1], i)
            qd.atomic_xor(ints[2], i)
            qd.atomic_min(ints[4], i)
            qd.atomic_max(u[0], qd.u32(i))
            flags[i] = qd.atomic_add(ints[3], 1) > 3

    k = atomics32._primal
    source = K.compile_kernel(k.fn, k.params, Options(arch="metal"), arch="metal").artifacts["msl_t0"].decode()
    used = set(re.findall(r"\b(atomic\w*)\(", source))
    assert used and all(re.fullmatch(r"atomic_\w+_explicit", name) for name in used), used
    assert {"atomic_compare_exchange_weak_explicit", "atomic_fetch_and_explicit"} <= used


def test_missing_spirv_cross_names_the_package(kernels, monkeypatch):
    monkeypatch.setattr(msl, "spirv_cross_path", lambda: None)
    k = kernels["saxpy"][0]._primal
    with pytest.raises(QdcCompileError, match="apt-get install -y spirv-cross"):
        K.compile_kernel(k.fn, k.params, Options(arch="metal"), arch="metal")


def test_qdc_build_and_inspect_msl_without_a_mac(tmp_path):
    _need_spirv_cross()
    saxpy, grad = build_and_list(tmp_path, "metal", "msl")
    assert "// task 0 (saxpy_t0_range)" in saxpy and "[[buffer(0)]]" in saxpy
    assert len(_kernel_functions(saxpy)) == 1
    assert "kernel void" in grad, grad
