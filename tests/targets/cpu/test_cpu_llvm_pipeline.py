"""LLVM's pipeline by kernel size (compiler/targets/cpu/llvm_pipeline.py): a module with a
function above LARGE_FUNCTION instructions is optimised at O1 without the vectorisers, that
function for size (optnone entry functions do not count), records that in its optimised IR,
builds the same bytes every time, and computes what numpy does, portable or native; smaller
modules keep O3 with both vectorisers, but for a portable x86-64 module of scalar task code,
which has no SLP vectoriser."""
from __future__ import annotations

import platform
import re
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from llvmlite import ir as ll

from qdc.compiler.targets.cpu import llvm_pipeline
from qdc.runtime.loader import load

from remote_util import qdc, tree

# Enough branches for a task body above LARGE_FUNCTION instructions (as generated: the inline
# math's functions, inlined by the optimiser, do not count, so the terms are plain arithmetic).
TERMS = 400

SOURCE = textwrap.dedent(f'''
    import qdc as qd

    F = qd.types.ndarray(dtype=qd.f32, ndim=1)


    @qd.kernel
    def large(x: F, out: F):
        for i in range(x.shape[0]):
            v = x[i]
            acc = 0.0
            for k in qd.static(range({TERMS})):
                if v > (k - {TERMS // 2}) / 256.0:
                    acc += v * (k % 7 + 1)
                else:
                    acc -= v * v * (k % 5)
            out[i] = acc


    @qd.kernel
    def small(x: F, out: F):
        for i in range(x.shape[0]):
            out[i] = x[i] * 2.0 + 1.0
''')


def _function(module: ll.Module, name: str, size: int, optnone: bool = False) -> None:
    fn = ll.Function(module, ll.FunctionType(ll.VoidType(), []), name)
    if optnone:
        fn.attributes.add("noinline")
        fn.attributes.add("optnone")
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    slot = b.alloca(ll.IntType(32))
    for _ in range(size - 2):
        b.store(ll.Constant(ll.IntType(32), 1), slot)
    b.ret_void()


def test_pipeline_by_largest_function():
    limit = llvm_pipeline.LARGE_FUNCTION
    small, large = ll.Module(), ll.Module()
    _function(small, "entry", 10 * limit, optnone=True)  # optnone functions are not optimised: not counted
    _function(small, "body", limit)
    _function(large, "body", limit + 1)
    _function(large, "helper", limit)
    assert llvm_pipeline.largest_function(small) == limit
    assert llvm_pipeline.choose(small, 3) == llvm_pipeline.Pipeline(3, True, True)
    chosen = llvm_pipeline.choose(large, 3)
    assert (chosen.speed_level, chosen.loop_vectorization, chosen.slp_vectorization) == (1, False, False)
    assert chosen.for_size == ("body",)
    assert chosen.describe() == f"O1, vectorisers: none, optsize: 1 function (largest function {limit + 1} > {limit} instructions)"
    llvm_pipeline.mark(large, chosen)
    text = str(large)
    assert 'define void @"body"() optsize' in text and 'define void @"helper"()\n' in text
    assert "!qdc.llvm_pipeline" in text
    # opt_level 0 and 1 stay what they ask for, whatever the size
    assert llvm_pipeline.choose(large, 1) == llvm_pipeline.Pipeline(1, False, False)
    assert llvm_pipeline.choose(large, 0) == llvm_pipeline.Pipeline(0, False, False)


def test_large_kernel_builds_alike_and_computes(tmp_path, rng):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "sized.py").write_text(SOURCE, encoding="utf-8")
    for cache, target in (("a", "native"), ("b", "native"), ("portable", "portable")):
        qdc("build", tmp_path / "src", "--cache", tmp_path / cache, "-j", 1, "--cpu-target", target)
    built = [{path: data for path, data in tree(tmp_path / cache).items()
              if path.startswith("entries") and not path.endswith("meta.msgpack")} for cache in ("a", "b")]
    assert built[0] and built[0] == built[1]  # the same bytes every build (meta.msgpack holds a date)

    from qdc.runtime.cache import Cache, read_module
    import llvmlite.binding as llvm
    cache = Cache(str(tmp_path / "a"))
    kernels = read_module(cache, "sized", "cpu")["kernels"]
    chosen = {}
    for name in ("large", "small"):
        text = str(llvm.parse_bitcode(cache.lookup(kernels[name]).artifacts["bc"]))
        groups = dict(re.findall(r"^attributes (#\d+) = \{(.*)\}$", text, re.M))
        chunk = re.search(rf"^define internal .*@{name}_t0_range_chunk\(.*\) .*?(#\d+) \{{$", text, re.M)
        chosen[name] = ("O1, vectorisers: none, optsize: 1 function (" in text, "optsize" in groups[chunk.group(1)])
    assert chosen == {"large": (True, True), "small": (False, False)}  # the reason, and the task body for size

    x = rng.uniform(-1.0, 1.0, 1000 + int(rng.integers(0, 100))).astype(np.float32)
    v = x.astype(np.float64)
    want, scale = np.zeros_like(v), np.zeros_like(v)
    for k in range(TERMS):
        term = np.where(v > (k - TERMS // 2) / 256.0, v * (k % 7 + 1), -v * v * (k % 5))
        want += term
        scale += np.abs(term)
    for cache in ("a", "portable"):
        mod = load(str(tmp_path / cache), "sized")
        out = np.zeros_like(x)
        mod.large(x, out)
        assert np.all(np.abs(out - want) <= TERMS * 2.0**-23 * scale)  # f32 rounding of each term and sum
        mod.small(x, out)
        np.testing.assert_array_equal(out, x * np.float32(2.0) + np.float32(1.0))


def test_portable_scalar_modules_have_no_slp():
    module = ll.Module()
    _function(module, "body", 10)
    scalar = {"task": SimpleNamespace(max_lanes=1)}
    module.widen_choices = scalar
    assert llvm_pipeline.choose(module, 3) == llvm_pipeline.Pipeline(3, True, True)  # native: one level
    chosen = llvm_pipeline.choose(module, 3, 3, "x86_64")
    assert chosen == llvm_pipeline.Pipeline(3, True, False, "3 ISA levels of scalar task code")
    assert chosen.describe() == "O3, vectorisers: loop (3 ISA levels of scalar task code)"
    assert llvm_pipeline.choose(module, 3, 3, "aarch64") == llvm_pipeline.Pipeline(3, True, True)
    assert llvm_pipeline.choose(module, 1, 3, "x86_64") == llvm_pipeline.Pipeline(1, False, False)
    module.widen_choices = {**scalar, "wide": SimpleNamespace(max_lanes=16)}  # a width-W chunk: SLP kept
    assert llvm_pipeline.choose(module, 3, 3, "x86_64") == llvm_pipeline.Pipeline(3, True, True)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")
def test_portable_scalar_kernel_says_so_and_computes(tmp_path, rng):
    """The portable library of a kernel of scalar task code records its pipeline in its optimised
    IR (the native one has LLVM's default and no record), its loop is still vectorised, and it
    computes what numpy does for every trip count."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "sized.py").write_text(SOURCE, encoding="utf-8")
    for target in ("portable", "native"):
        qdc("build", tmp_path / "src", "--cache", tmp_path / target, "-j", 1, "--cpu-target", target)
    from qdc.runtime.cache import Cache, read_module
    import llvmlite.binding as llvm
    seen = {}
    for target in ("portable", "native"):
        cache = Cache(str(tmp_path / target))
        key = read_module(cache, "sized", "cpu")["kernels"]["small"]
        text = str(llvm.parse_bitcode(cache.lookup(key).artifacts["bc"]))
        seen[target] = ("O3, vectorisers: loop (3 ISA levels of scalar task code)" in text, "vector.body:" in text)
    assert seen == {"portable": (True, True), "native": (False, True)}

    mod = load(str(tmp_path / "portable"), "sized")
    for n in (1, 15, 63, 64, 65, 1000 + int(rng.integers(0, 100))):
        x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
        out = np.zeros_like(x)
        mod.small(x, out)
        np.testing.assert_array_equal(out, x * np.float32(2.0) + np.float32(1.0))
