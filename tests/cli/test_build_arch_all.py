"""`qdc build --arch all` on kernels a target cannot express (docs/api.md, The qdc command: it works on any
machine): such a kernel variant is skipped for that arch, with its reason, in the output, the
summary and the module record, which loading reports; an arch named explicitly still fails
with the located error."""
import os
import subprocess
import sys

import numpy as np
import pytest

from qdc.compiler import targets
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver import options as options_mod
from qdc.compiler.targets.base import Capabilities, TargetCannotExpress
from qdc.runtime.bundle import open_store
from qdc.runtime.cache import read_module
from qdc.runtime.contract.errors import QdcCompileError, QdcError
from qdc.runtime.loader import load

from backend_util import need_every_arch_toolchain

from conftest import REPO_ROOT as REPO


def qdc_cli(*args):
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True, cwd=REPO)


def test_arch_all_skips_what_metal_cannot_express_and_an_explicit_metal_fails(tmp_path):
    need_every_arch_toolchain()
    cache = str(tmp_path / "cache")
    r = qdc_cli("build", "kernels/", "--arch", "all", "--cache", cache, "-j", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    skipped = [line for line in r.stdout.splitlines() if "] skipped " in line]
    assert len(skipped) == 2, r.stdout
    for kernel, line in zip(("sum_of", "dot"), skipped):  # one line each, with the located reason
        assert f"skipped reduction.{kernel} (metal): " in line
        assert os.path.join("kernels", "reduction.py") in line and "type f64 needs Float64, which target 'metal' does not have" in line
    summary = r.stdout.strip().splitlines()[-1]
    assert "for cpu, cuda, vulkan, metal, amdgpu:" in summary
    assert "2 skipped (target cannot express them), 0 failed" in summary, summary
    store = open_store(cache)
    metal = read_module(store, "reduction", "metal")
    assert sorted(metal["kernels"]) == ["max_abs"]
    assert sorted(metal["skipped"]) == ["dot", "sum_of"]
    assert "reduction.py:10:5: type f64 needs Float64, which target 'metal' does not have" in metal["skipped"]["sum_of"]
    assert "skipped" not in read_module(store, "reduction", "cpu")
    assert sorted(read_module(store, "reduction", "cpu")["kernels"]) == ["dot", "max_abs", "sum_of"]

    listing = qdc_cli("ls", "--cache", cache).stdout
    assert "reduction (metal): 1 kernel," in listing
    assert [line.split()[:2] for line in listing.splitlines() if " skipped " in line] == [["dot", "skipped"],
                                                                                         ["sum_of", "skipped"]]

    again = qdc_cli("build", "kernels/", "--arch", "all", "--cache", cache)  # still skipped, never cached
    assert again.returncode == 0 and "2 skipped (target cannot express them), 0 failed" in again.stdout, again.stdout

    explicit = qdc_cli("build", "kernels/reduction.py", "--arch", "metal", "--cache", cache)
    assert explicit.returncode == 1, explicit.stdout + explicit.stderr
    assert "reduction.py:10:5: error: type f64 needs Float64, which target 'metal' does not have" in explicit.stderr
    assert "total[None] = 0.0" in explicit.stderr  # the source line
    assert "0 built, 1 cached, 2 failed" in explicit.stdout
    listed = qdc_cli("build", "kernels/reduction.py", "--arch", "cpu,metal", "--cache", cache)
    assert listed.returncode == 1 and "2 failed" in listed.stdout  # only `all` skips


MIXED = '''import qdc as qd

wide = qd.field(qd.f64, shape=())
x = qd.field(qd.f32, shape=8, needs_grad=True)
total = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def widen(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        wide[None] += qd.cast(a[i], qd.f64)


@qd.kernel
def damped(n: qd.i32):
    for i in x:
        v = x[i]
        for _ in range(n):  # a dynamic loop: the gradient keeps v on an f32 adstack
            v = qd.sin(v) * 0.95 + 0.01
        total[None] += v
'''


@pytest.fixture
def narrow_cpu(monkeypatch):
    """The CPU target as one without f64 and with only i32/u1 adstacks (as Metal lacks f64):
    the in-process build below must skip what it cannot express."""
    cpu = targets.get("cpu")
    monkeypatch.setattr(cpu, "capabilities", Capabilities(float64=False, adstack_dtypes=frozenset(("i32", "u1"))))
    return cpu


def _build(tmp_path, skip: bool):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "mixed.py").write_text(MIXED, encoding="utf-8")
    out, log = [], []
    opts = options_mod.Options(cpu_target="native")  # one shared library, not one per ISA level: faster
    report = build_mod.build([str(src)], ["cpu"], opts, str(tmp_path / "cache"), jobs=1,
                             log=log.append, out=out.append, skip_unexpressible=skip)
    return report, out, log


def test_an_explicit_arch_fails_on_what_it_cannot_express(tmp_path, narrow_cpu):
    report, out, log = _build(tmp_path, skip=False)
    assert (report.built, report.skipped, report.failed) == (1, 0, 2), out + log
    assert any("mixed.py:11:9: error: type f64 needs Float64, which target 'cpu' does not have" in e for e in log), log
    assert any("error: kernel 'damped': the f32 value of 'v' must be kept on an adstack" in e for e in log), log
    with pytest.raises(FileNotFoundError):  # a failed kernel: no module record
        read_module(open_store(str(tmp_path / "cache")), "mixed", "cpu")


def test_loading_a_skipped_kernel_says_why(tmp_path, narrow_cpu, rng):
    report, out, log = _build(tmp_path, skip=True)
    assert (report.built, report.skipped, report.failed) == (1, 2, 0), out + log
    assert not log
    assert "1 built, 0 cached, 2 skipped (target cannot express them), 0 failed" in out[-1]
    assert sum(" skipped mixed." in line for line in out) == 2

    mod = load(str(tmp_path / "cache"), "mixed", arch="cpu")
    with pytest.raises(QdcError, match=r"kernel 'mixed.widen' was not built for arch 'cpu': `qdc build --arch all` "
                                       r"skipped it because the target cannot express it: .*mixed.py:11:9: "
                                       r"type f64 needs Float64, which target 'cpu' does not have"):
        mod.widen(np.ones(4, np.float32))
    with pytest.raises(QdcError, match="'mixed.widen' was not built"):
        mod.widen.grad()
    v0 = rng.random(8).astype(np.float32)
    mod.x.from_numpy(v0)
    mod.damped(3)  # the forward variant was built: it runs
    v = v0.astype(np.float64)
    for _ in range(3):
        v = np.sin(v) * 0.95 + 0.01
    np.testing.assert_allclose(mod.total[None], v.sum(), rtol=1e-5)
    with pytest.raises(QdcError, match=r"kernel 'damped.grad' was not built for arch 'cpu'.*the f32 value of 'v' "
                                       r"must be kept on an adstack"):
        mod.damped.grad(3)


def test_cannot_express_is_a_located_compile_error():
    assert issubclass(TargetCannotExpress, QdcCompileError)  # explicit builds and direct mode report it as one
