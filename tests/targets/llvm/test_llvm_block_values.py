"""The shared LLVM lowering emits a ctx word, and an index widened to 64 bits, once per block
(llvm_ir._Env.in_block): a block's further accesses to the same ndarray reuse them, another block
reads its own (a value of one branch does not dominate the other), and the kernel computes the same."""
from __future__ import annotations

import re

import numpy as np

import qdc as qd
from qdc.compiler.driver import kernel as compiling
from qdc.compiler.driver.options import Options
from qdc.compiler.frontend.ast_to_ir import FrontEnd
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.passes.pipeline import run_pipeline
from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.llvm_pipeline import largest_function
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.targets.llvm import llvm_ir
from qdc.compiler.targets.llvm.llvm_text import module_text

V3 = qd.types.ndarray(dtype=qd.f32, ndim=2)
F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _norms(v: V3, out: F1, signed: qd.i32, n: qd.i32):
    for i in range(n):  # an i32 index: widened to 64 bits for the address
        if signed > 0:
            out[i] = v[i, 0] * v[i, 0] + v[i, 1] * v[i, 1] + v[i, 2] * v[i, 2]
        else:
            out[i] = -(v[i, 0] + v[i, 1] + v[i, 2])


def _arrays(rng, n: int) -> tuple:
    return rng.standard_normal((n, 3)).astype(np.float32), np.zeros(n, np.float32)


@qd.kernel
def _sum_of(a: F1, b: F1, out: F1, n: qd.i32):
    for i in range(n):
        out[i] = a[i] + b[i]


def _generated(kernel, arrays: tuple):
    """The generated (unoptimised) module of `kernel` for `arrays`."""
    k = kernel_of(kernel)
    params = k.specialise(arrays)[1]
    opts = Options()
    kir = FrontEnd(k.fn, params, opts, None, arch="cpu").build()
    run_pipeline(kir)
    meta = compiling.build_meta(kir, "qdc_" + kir.name, False, None, False, CPU.launch_policy)
    return codegen.generate_llvm(kir, meta, False, target=CPU, levels=(codegen._host_level(),))


def _generated_chunk(arrays: tuple) -> dict:
    """{block label: its instructions} of the generated scalar chunk of `_norms`."""
    text = module_text(_generated(_norms, arrays))
    chunk = re.search(r'define [^\n]*_chunk"?\(.*?\n}\n', text, re.S).group(0)
    blocks, label = {}, None
    for line in chunk.splitlines()[1:]:
        if line and not line.startswith(" ") and line.endswith(":"):
            label = line[:-1].strip('"')
        elif label:
            blocks.setdefault(label, []).append(line.strip())
    return blocks


def test_a_block_reads_each_ctx_word_once_and_each_branch_its_own(rng):
    blocks = _generated_chunk((*_arrays(rng, 8), 1, 8))
    branches = [lines for label, lines in blocks.items() if label.startswith(("if.then", "if.else"))]
    assert len(branches) == 2
    for lines in branches:
        words = [line.split("i64 ")[-1] for line in lines if re.search(r"getelementptr i64, ptr %\S+, i64 \d+$", line)]
        assert words and len(words) == len(set(words)), lines  # v's base and extents read once
        indices = [line for line in lines if " sext " in line or " zext " in line]
        assert len(indices) == len(set(line.split(" to ")[0].split(" = ")[1] for line in indices)), lines
        assert indices and not any(re.search(r"[sz]ext i\d+ -?\d+ to", line) for line in indices)  # constants: i64 ones


def test_the_pipeline_sizes_a_function_as_if_every_value_were_emitted(rng, monkeypatch):
    """llvm_pipeline's thresholds were measured on functions without the reuse: a function is
    sized by its instructions and those it reused, so a kernel gets the pipeline it had."""
    arrays = (*_arrays(rng, 8)[1:], np.zeros(8, np.float32), np.zeros(8, np.float32), 8)
    reused = _generated(_sum_of, arrays)
    monkeypatch.setattr(llvm_ir._Env, "in_block", lambda self, key, make: make())
    every = _generated(_sum_of, arrays)
    chunks = [next(fn for fn in module.functions if fn.name.endswith("_chunk")) for module in (reused, every)]
    instructions = [sum(len(block.instructions) for block in fn.blocks) for fn in chunks]
    assert instructions[0] < instructions[1]  # the index's widening, emitted once
    assert instructions[0] + chunks[0].unemitted_instructions == instructions[1]
    assert largest_function(reused) == largest_function(every)


def test_the_kernel_computes_what_numpy_does(rng):
    v, out = _arrays(rng, 37)
    _norms(v, out, 1, len(out))
    np.testing.assert_allclose(out, (v * v).sum(axis=1), rtol=1e-6)
    _norms(v, out, 0, len(out))
    np.testing.assert_allclose(out, -v.sum(axis=1), rtol=1e-6)
