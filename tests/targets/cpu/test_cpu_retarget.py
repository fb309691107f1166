"""macOS arm64's library made from Linux aarch64's optimised armv8.2-a IR where a portable build
makes both (compiler/targets/cpu/retarget.py, platforms.OPTIMISED_WITH): not optimised again,
the same entries and imports as a library optimised on its own, the same bytes from one build to
the next, its own optimisation where Linux's declared a function the generated IR did not, and a
cache key that says so. The libraries' structure and disassembly: test_cpu_cross_targets.py."""
import os
import shutil
import subprocess

import pytest

from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver.options import resolve
from qdc.compiler.targets import lld
from qdc.compiler.targets.cpu import codegen, platforms
from qdc.compiler.targets.cpu.isa_levels import PLATFORMS, parse_cpu_targets
from qdc.runtime.cache import Cache, read_module
from qdc.runtime.contract.entry_points import defined_entries

pytestmark = pytest.mark.skipif(not lld.find("ld.lld") or not lld.find("ld64.lld"),
                                reason=f"no ld.lld / ld64.lld {lld.MIN_LLD}+ ({lld.INSTALL_HINT})")

SOURCE = '''
import qdc as qd

x = qd.field(qd.f32, shape=64, needs_grad=True)
d = qd.field(qd.f64, shape=16)
loss = qd.field(qd.f32, shape=(), needs_grad=True)
steps = qd.field(qd.i32, shape=())


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(steps[None]):
            v = qd.sin(v) * 0.9
        loss[None] += v


@qd.kernel
def tangents():
    """A serial chain of f64 tan: a call of the C math library."""
    qd.loop_config(serialize=True)
    for i in range(16):
        v = d[i]
        for _ in range(steps[None]):
            v = qd.tan(v) * 0.5
        d[i] = v
'''
MACOS = PLATFORMS["aarch64-macos"]


def _build(folder, cpu_targets, monkeypatch):
    """The cache, and the triples of the modules LLVM optimised, in order."""
    optimised, optimise = [], codegen.optimise

    def recording(module, opt_level, level=None, platform=None, pipeline=None):
        optimised.append(platform.triple)
        return optimise(module, opt_level, level, platform, pipeline)
    monkeypatch.setattr(codegen, "optimise", recording)
    (folder / "retarget.py").write_text(SOURCE, encoding="utf-8")
    cache = str(folder / f"cache-{cpu_targets}")
    report = build_mod.build([str(folder / "retarget.py")], ["cpu"], resolve({"cpu_targets": cpu_targets}, {}),
                             cache, jobs=1, log=lambda text: None)
    assert report.ok and report.built == 3, report.errors
    return cache, optimised


def _dylib(cache, kernel):
    entry = Cache(cache).lookup(read_module(Cache(cache), "retarget", "cpu")["kernels"][kernel])
    return entry.artifacts["dylib_arm64"], os.path.join(entry.where, "kernel.dylib_arm64")


def _imports(path):
    nm = shutil.which("llvm-nm") or next((shutil.which(f"llvm-nm-{v}") for v in range(40, 13, -1)
                                          if shutil.which(f"llvm-nm-{v}")), None)
    if nm is None:
        pytest.skip("no llvm-nm (apt-get install llvm)")
    listed = subprocess.run([nm, "-u", path], capture_output=True, text=True, check=True).stdout
    return sorted(listed.split())


def test_macos_is_not_optimised_again_beside_linux(tmp_path, monkeypatch):
    both, optimised = _build(tmp_path, "aarch64", monkeypatch)
    assert MACOS.triple not in optimised and len(optimised) == 3  # Linux's three kernels
    alone, optimised = _build(tmp_path, "aarch64-macos", monkeypatch)
    assert optimised == [MACOS.triple] * 3
    for kernel in ("chain", "chain.grad", "tangents"):
        (made, made_path), (own, own_path) = _dylib(both, kernel), _dylib(alone, kernel)
        assert defined_entries(made) == defined_entries(own) and "qdc_set_cpu_level" not in defined_entries(made)
        assert _imports(made_path) == _imports(own_path)
    assert "_tan" in _imports(_dylib(both, "tangents")[1])


def test_the_same_bytes_from_one_build_to_the_next(tmp_path, monkeypatch):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first, _ = _build(tmp_path / "one", "aarch64", monkeypatch)
    second, _ = _build(tmp_path / "two", "aarch64", monkeypatch)
    for kernel in ("chain", "chain.grad", "tangents"):
        assert _dylib(first, kernel)[0] == _dylib(second, kernel)[0]


def test_a_function_optimisation_declared_keeps_macos_optimised_on_its_own(tmp_path, monkeypatch):
    """Linux's library-call simplifier may call what only glibc has (exp10f): where Linux's
    optimised IR declares a function its generated IR did not, macOS is optimised for itself.
    Here the generated IR is made to look as if it had not called `tan`."""
    declared = codegen.declared_functions
    monkeypatch.setattr(codegen, "declared_functions", lambda text: declared(text) - {"tan"})
    cache, optimised = _build(tmp_path, "aarch64", monkeypatch)
    assert optimised.count(MACOS.triple) == 1  # tangents' alone
    assert "_tan" in _imports(_dylib(cache, "tangents")[1])


def test_the_cache_key_says_which_library_is_made_from_which():
    both = platforms.target_description("portable", parse_cpu_targets("aarch64"))
    assert both.endswith("/optimised as aarch64-linux armv8.2-a")
    alone = platforms.target_description("portable", parse_cpu_targets("aarch64-macos"))
    assert "optimised as" not in alone
    assert "optimised as" not in platforms.target_description("armv8.2-a", parse_cpu_targets("aarch64"))
