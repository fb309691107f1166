"""A CPU kernel's optimised LLVM IR text ("ll") is made from its bitcode when read, never stored
(compiler/targets/llvm/llvm_artifacts.py)."""
from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.llvm.llvm_artifacts import LlvmArtifacts

F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _scale_into(a: F1, b: F1):
    for i in range(a.shape[0]):
        b[i] = a[i] * 3.0


def _artifacts() -> LlvmArtifacts:
    k = kernel_of(_scale_into)
    arrays = (np.zeros(4, np.float32), np.zeros(4, np.float32))
    return K.compile_kernel(k.fn, k.specialise(arrays)[1], Options(), "cpu").artifacts


def test_the_text_is_the_bitcode_disassembled_on_first_use():
    artifacts = _artifacts()
    assert isinstance(artifacts, LlvmArtifacts) and "ll" not in artifacts and "bc" in artifacts
    text = artifacts["ll"].decode()
    assert text == str(llvm.parse_bitcode(artifacts["bc"]))
    assert 'define void @"qdc__scale_into' in text or "define void @qdc__scale_into" in text
    assert artifacts.get("ll") is artifacts["ll"]  # made once, then kept


def test_what_has_no_bitcode_has_no_text():
    artifacts = LlvmArtifacts(so=b"\x7fELF")
    assert artifacts.get("ll") is None and artifacts.get("ll", b"") == b""
    with pytest.raises(KeyError):
        artifacts["ll"]
    with pytest.raises(KeyError):
        artifacts["spirv_t0"]


def test_a_direct_mode_run_stores_the_bitcode_and_never_makes_the_text(monkeypatch, tmp_path):
    made = []
    missing = LlvmArtifacts.__missing__
    monkeypatch.setattr(LlvmArtifacts, "__missing__", lambda self, kind: made.append(kind) or missing(self, kind))
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    a, b = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    _scale_into(a, b)
    np.testing.assert_array_equal(b, a * 3.0)
    stored = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert any(name.endswith(".bc") for name in stored), stored
    assert not any(name.endswith(".ll") for name in stored), stored
    assert made == []
