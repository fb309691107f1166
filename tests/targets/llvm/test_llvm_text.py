"""llvm_text.module_text writes the same text as llvmlite's `str(module)`: for the modules of
kernels that use every kind of instruction the lowering emits (loops, branches, selects, casts,
comparisons, atomics, inline math, adstacks in a gradient, width-W chunks with masked loads and
gathers), generated for every ISA level of a portable x86-64 and aarch64 build."""
from __future__ import annotations

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cpu import codegen
from qdc.compiler.targets.cpu.isa_levels import PORTABLE
from qdc.compiler.targets.cpu.platforms import cpu_levels, cpu_platforms
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.targets.llvm.llvm_text import module_text

x = y = n = counts = loss = None


@pytest.fixture(scope="module", autouse=True)
def _fields():
    global x, y, n, counts, loss
    qd.init(arch=qd.cpu)
    x = qd.field(qd.f32, shape=64, needs_grad=True)
    y = qd.Vector.field(3, qd.f64, shape=(8, 8))
    n = qd.field(qd.i32, shape=())
    counts = qd.field(qd.i32, shape=16)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def chains():
    for i in x:
        v = x[i]
        for _ in range(n[None]):  # a dynamic loop: width-W lanes; its gradient needs an adstack
            v = qd.sin(v) * 0.9 + qd.exp(-v) * 0.1
        if v > 0.5:
            v = qd.sqrt(v)
        loss[None] += v


@qd.kernel
def mixed(scale: qd.f64, shift: qd.i64):
    for i, j in y:
        p = y[i, j]
        k = qd.cast(p[0] * scale, qd.i32) % 16
        qd.atomic_add(counts[k], 1)
        y[i, j] = qd.Vector([p[1], p[2], p[0]]) * (-1.0 if (i ^ j) & 1 else 1.0) + qd.cast(shift, qd.f64)
        x[(i + j + counts[(i * 3) % 16]) % 64] = qd.max(x[i], qd.f32(j))


def _compiled(kernel, variant: str):
    k = kernel_of(kernel)
    return K.compile_kernel(k.fn, k.params_for(Options()), Options(), variant=variant)


@pytest.mark.parametrize("kernel, variant", [(chains, "forward"), (chains, "grad"), (mixed, "forward")])
def test_module_text_is_llvmlites_text(kernel, variant):
    compiled = _compiled(kernel, variant)
    for platform in cpu_platforms("x86_64,aarch64"):
        for level in cpu_levels(PORTABLE, platform):
            module = codegen.generate_llvm(compiled.ir, compiled.meta, target=CPU, levels=(level,),
                                           platform=platform)
            assert module_text(module) == str(module), (platform.name, level.name)
