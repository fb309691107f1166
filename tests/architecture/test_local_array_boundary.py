"""Vector locals indexed at run time cross into the targets in one form only (ir/local_arrays.py):
ComponentLoad and ComponentStore are the front end's and the passes' (autodiff expands them, the
last pass of both pipelines turns them into local arrays or expands them), so no target names
them; every lowering of the IR (the shared LLVM one, the CPU's width-W one, SPIR-V) lowers
LocalArray, ArrayLoad and ArrayStore itself."""
from __future__ import annotations

import os

from qdc.compiler.autodiff.grad_kernel import GRAD_PIPELINE
from qdc.compiler.passes.local_arrays import group_local_arrays
from qdc.compiler.passes.pipeline import PIPELINE
from qdc.compiler.targets.cpu.widen import WideChunkEnv
from qdc.compiler.targets.cpu.widen_local_arrays import LaneLocalArrays
from qdc.compiler.targets.llvm.llvm_ir import _Env
from qdc.compiler.targets.spirv.lowering import TaskLowering

from conftest import REPO_ROOT as ROOT

ARRAY_STATEMENTS = ("LocalArray", "ArrayLoad", "ArrayStore")


def test_no_target_sees_component_accesses():
    folder = os.path.join(ROOT, "compiler", "targets")
    for path, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(path, name), encoding="utf-8").read()
                assert "ComponentLoad" not in text and "ComponentStore" not in text, os.path.join(path, name)


def test_both_pipelines_end_with_the_local_arrays_pass():
    assert PIPELINE[-1] == ("local_arrays", group_local_arrays)
    assert GRAD_PIPELINE[-1] == ("local_arrays", group_local_arrays)


def test_every_lowering_lowers_local_arrays():
    for lowering in (_Env, TaskLowering):
        for name in ARRAY_STATEMENTS:
            assert callable(getattr(lowering, f"s_{name}", None)), (lowering, name)
    for name in ARRAY_STATEMENTS:  # the width-W code's own, not only the scalar code's
        assert getattr(WideChunkEnv, f"s_{name}") is getattr(LaneLocalArrays, f"s_{name}")
