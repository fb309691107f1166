"""Large regions of a huge task body are lowered as functions of their own
(compiler/targets/llvm/llvm_outline.py), which the CPU module's parts compile in parallel
(cpu/module_split.py): a generated kernel of a few thousand statements is outlined into several
functions, computes what it computed in one (and what plain Python computes), builds the same
bytes on one thread and two, and shows its outlined functions in `qdc inspect --llvm`; small
bodies and regions that leave a loop around them are not outlined."""
import importlib.util
import os
import re
import sys
import textwrap
import types

import numpy as np
import pytest

from qdc.compiler import compile_threads
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options, resolve
from qdc.compiler.targets.cpu import codegen, module_split
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
from qdc.compiler.targets.llvm import llvm_outline
from qdc.runtime.loader import load

from remote_util import qdc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "bench"))
from bench_outline import huge_kernel_source  # noqa: E402  (the benchmark's kernel)


def _reference(source: str, x: np.ndarray):
    """(y, total) of the kernel run as plain Python."""
    shim = types.SimpleNamespace(kernel=lambda fn: fn, Vector=list, f32=None,
                                 types=types.SimpleNamespace(ndarray=lambda **kwargs: None))
    namespace = {"qd": shim}
    exec(compile(source.replace("import qdc as qd", ""), "huge_reference", "exec"), namespace)  # noqa: S102
    y, total = np.zeros(len(x)), np.zeros(1)
    namespace["huge"](x.astype(np.float64), y, total)
    return y, total[0]


@pytest.fixture
def huge_source(tmp_path, monkeypatch):
    monkeypatch.setenv(SCALAR_SWITCH, "0")  # the scalar chunk (a width-W one is not outlined)
    source = huge_kernel_source()
    (tmp_path / "huge_src.py").write_text(source, encoding="utf-8")
    return source


def _compiled(tmp_path, module_name: str, kernel: str):
    """The compiled kernel `kernel` of tmp_path/<module_name>.py."""
    spec = importlib.util.spec_from_file_location(module_name, tmp_path / f"{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    k = getattr(module, kernel)._primal
    return K.compile_kernel(k.fn, k.params, Options())


def _build(tmp_path, name: str) -> str:
    cache = str(tmp_path / name)
    report = build_mod.build([str(tmp_path / "huge_src.py")], ["cpu"], resolve({}, {}), cache, jobs=1,
                             log=lambda text: None)
    assert report.ok and report.built == 1, report.errors
    return cache


def test_a_huge_body_outlined_computes_what_it_did_whole(tmp_path, huge_source, monkeypatch, rng):
    x = rng.uniform(-1.0, 1.0, 200 + int(rng.integers(0, 50))).astype(np.float32)
    y_want, total_want = _reference(huge_source, x)
    outlined = _build(tmp_path, "outlined")
    shown = qdc("inspect", "huge_src.huge", "--cache", outlined, "--llvm").stdout
    regions = set(re.findall(r'^define internal [^@\n]*@"?(huge_t0_range_chunk\.outlined\d+)"?\(', shown, re.M))
    assert len(regions) >= 4, shown[:2000]
    monkeypatch.setattr(llvm_outline, "OUTLINED_TASK_STATEMENTS", 10 ** 9)
    whole = _build(tmp_path, "whole")
    assert ".outlined" not in qdc("inspect", "huge_src.huge", "--cache", whole, "--llvm").stdout
    results = []
    for cache in (outlined, whole):
        y, total = np.zeros_like(x), np.zeros(1, np.float32)
        load(cache, "huge_src").huge(x, y, total)
        np.testing.assert_allclose(y, y_want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(total[0], total_want, rtol=1e-4)
        results.append(y)
    np.testing.assert_array_equal(results[0], results[1])  # the same operations, whatever the functions


@pytest.mark.parametrize("cpu_target", ["native", "portable"])  # portable: the regions' level copies too
def test_outlined_regions_build_the_same_bytes_on_one_thread_and_two(tmp_path, huge_source, monkeypatch, cpu_target):
    monkeypatch.setattr(module_split, "MIN_PART_LINES", 300)  # parts for this kernel's size
    compiled = _compiled(tmp_path, "huge_src", "huge")
    from qdc.compiler.targets.cpu.platforms import cpu_levels, host_platform
    levels = cpu_levels(cpu_target, host_platform())
    bodies = [task.task_name + "_chunk" for task in compiled.ir.tasks]
    text = codegen._generated(compiled.ir, compiled.meta, False, CPU, host_platform(), levels, bodies, 3)[2]
    signatures = re.findall(r'^define internal (.*@"huge_t0_range_chunk\.outlined\d+".*)$', text, re.M)
    # the ctx and the local array `v` by pointer, the chunk's `alone` flag, the variables `acc`
    # and `k` by value and back as the result
    assert signatures and all(s.count("ptr noalias") == 2 and " i1 " in s and s.startswith("{") for s in signatures)
    parts, shared = module_split.split_module(text)
    defining = [set(re.findall(r'^define hidden [^@\n]*@"?([-\w.]+\.outlined\d+)"?\(', part, re.M)) for part in parts]
    assert sum(bool(d) for d in defining) >= 2  # the regions are dealt to several parts
    assert sum(len(d) for d in defining) == len(set().union(*defining)) >= 4 and set().union(*defining) <= shared
    built = []
    for threads in (1, 2):
        with compile_threads.limited_threads(threads):
            built.append(codegen.compile_kernel(compiled.ir, compiled.meta, 3, cpu_target=cpu_target, target=CPU))
    assert built[0] == built[1]
    linked = built[0]["ll"].decode()  # the parts linked back: the regions internal again
    assert re.search(r'^define internal [^@\n]*@"?huge_t0_range_chunk\.outlined1"?\(', linked, re.M)


def test_only_huge_bodies_and_regions_that_stay_inside_are_outlined(tmp_path, huge_source):
    task = _compiled(tmp_path, "huge_src", "huge").ir.tasks[0]
    regions = llvm_outline.outlined_regions(task)
    assert len(regions) >= 4
    from qdc.compiler import ir
    for region in regions:  # each `break` and `continue` in a region is of a loop inside it
        for block in region.blocks():
            for s in ir.walk(block):
                if isinstance(s, (ir.Break, ir.Continue)):
                    owner = s.block.parent
                    while not isinstance(owner, (ir.RangeFor, ir.While)):
                        assert owner is not region
                        owner = owner.block.parent
    guarded = [s for s in task.body.stmts if isinstance(s, ir.If)]
    assert guarded and not set(regions) & set(guarded)  # it holds a `continue` of the task's loop
    small = textwrap.dedent('''
        import qdc as qd

        @qd.kernel
        def small(x: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(x.shape[0]):
                for j in range(4):
                    x[i] = x[i] * 0.5 + j
        ''')
    (tmp_path / "small_src.py").write_text(small, encoding="utf-8")
    assert llvm_outline.outlined_regions(_compiled(tmp_path, "small_src", "small").ir.tasks[0]) == {}
