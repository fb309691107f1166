"""LLVM's options for small modules (compiler/targets/cpu/codegen.py): a module whose functions
are all at most SMALL_MODULE_LARGEST_FUNCTION instructions is built without non-trivial loop
unswitching and loop strength reduction, LLVM's defaults restored after it, and computes the
same. Large modules: test_cpu_llvm_pipeline.py."""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cpu import codegen

F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _either_side(a: F1, b: F1, flag: qd.i32):
    """A branch on a value the loop does not change: LLVM's non-trivial unswitching would copy
    the loop for each side."""
    for i in range(a.shape[0]):
        if flag > 0:
            b[i] = a[i] * 2.0 + 1.0
        else:
            b[i] = a[i] - 3.0


@qd.kernel
def _accumulate(a: F1, b: F1):
    """Atomics: the loop is copied for `alone`, whose plain read-modify-writes vectorise."""
    for i in range(a.shape[0]):
        b[i] += 2.0 * a[i]


@qd.kernel
def _chain(a: F1, n: qd.i32):
    """A dynamic inner loop: its task runs W iterations at a time (a width-W chunk)."""
    for i in range(a.shape[0]):
        v = a[i]
        for _ in range(n):
            v = v * 0.5 + 1.0
        a[i] = v


def _compile(monkeypatch, kernel, arrays: tuple, limit: int) -> tuple[str, list]:
    """`kernel`'s optimised LLVM IR with SMALL_MODULE_LARGEST_FUNCTION = limit, and the LLVM
    options the build set, in order."""
    calls = []
    set_option = llvm.set_option

    def recording(name, option):
        calls.append(option)
        set_option(name, option)
    monkeypatch.setattr(codegen, "SMALL_MODULE_LARGEST_FUNCTION", limit)
    monkeypatch.setattr(llvm, "set_option", recording)
    k = kernel_of(kernel)
    text = K.compile_kernel(k.fn, k.specialise(arrays)[1], Options()).artifacts["ll"].decode()
    return text, calls


def test_small_modules_are_built_without_unswitching_and_strength_reduction(monkeypatch):
    arrays = (np.zeros(4, np.float32), np.zeros(4, np.float32), 1)
    small, calls = _compile(monkeypatch, _either_side, arrays, 10**9)
    assert calls == [codegen._NO_STRENGTH_REDUCTION, codegen._NO_UNSWITCHING, *codegen._LLVM_DEFAULTS]
    assert ".us" not in small  # LLVM names the blocks of an unswitched loop's copy `<block>.us`
    large, calls = _compile(monkeypatch, _either_side, arrays, 0)
    assert calls == []
    assert ".us" in large, "LLVM's defaults no longer unswitch this loop: the test checks nothing"


def test_small_modules_with_atomics_keep_unswitching(monkeypatch):
    small, calls = _compile(monkeypatch, _accumulate, (np.zeros(4, np.float32),) * 2, 10**9)
    assert calls == [codegen._NO_STRENGTH_REDUCTION, *codegen._LLVM_DEFAULTS]
    assert ".us" in small and "atomicrmw" in small
    assert re.search(r"fadd <\d+ x float>", small), "the copy for a thread alone is not vectorised"


def test_small_modules_with_width_w_chunks_keep_strength_reduction(monkeypatch):
    _, calls = _compile(monkeypatch, _chain, (np.zeros(4, np.float32), 3), 10**9)
    assert calls == [codegen._NO_UNSWITCHING, *codegen._LLVM_DEFAULTS]


def test_strength_reduction_is_left_out_on_x86_only():
    text = 'define internal void @"t_chunk"(ptr %".1") {\nentry:\n  ret void\n}\n'
    assert codegen.small_module_options(10, text, False, "x86_64") == (codegen._NO_STRENGTH_REDUCTION,
                                                                       codegen._NO_UNSWITCHING)
    assert codegen.small_module_options(10, text, False, "aarch64") == (codegen._NO_UNSWITCHING,)
    assert codegen.small_module_options(codegen.SMALL_MODULE_LARGEST_FUNCTION + 1, text, False, "x86_64") == ()


def test_small_module_options_compute_the_same(rng):
    """Both sides of the branch, and the atomics on one thread (plain updates, `alone`) and on
    several, against numpy."""
    n = 1000 + int(rng.integers(0, 100))
    a = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    for threads in (1, 4):
        qd.init(arch=qd.cpu, cpu_max_num_threads=threads)
        for flag in (1, 0):
            b = np.zeros(n, np.float32)
            _either_side(a, b, flag)
            qd.sync()
            np.testing.assert_array_equal(b, a * np.float32(2.0) + np.float32(1.0) if flag else a - np.float32(3.0))
        b = rng.uniform(-1.0, 1.0, n).astype(np.float32)
        want = b + np.float32(2.0) * a
        _accumulate(a, b)
        qd.sync()
        np.testing.assert_array_equal(b, want)
