"""The `qdc` command: build errors and exit codes, ls/inspect/verify/clean, configuration
files, and concurrent builds into one cache."""
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from qdc.cli.main import cli
from qdc.runtime.cache import Cache, list_modules
from qdc.runtime.loader import load

GOOD = '''
import qdc as qd

acc = qd.field(qd.f32, shape=())


@qd.kernel
def axpb(a: qd.f32, b: qd.f32, v: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(v.shape[0]):
        v[i] = a * v[i] + b


@qd.kernel
def total(v: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(v.shape[0]):
        acc[None] += v[i]
'''

BAD = '''import qdc as qd

out = qd.field(qd.f32, shape=4)


@qd.kernel
def fine():
    for i in out:
        out[i] = 1.0


@qd.kernel
def broken():
    for i in out:
        out[i] = 2.0
        try_this = {1: 2}
'''

RAISES = '''import qdc as qd

x = qd.field(qd.f32, shape=4)
BAD_SIZE = 1 // 0
'''


def qdc_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def _write(folder, **files):
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text, encoding="utf-8")
    return str(folder)


def test_compile_and_import_errors_fail_alone_with_their_location(tmp_path, rng):
    src = _write(tmp_path / "k", good=GOOD, bad=BAD, raises=RAISES)
    cache = str(tmp_path / "cache")
    r = qdc_cli("build", src, "--cache", cache, "-j", "2")
    assert r.returncode == 1
    bad_path = os.path.join(src, "bad.py")
    line = BAD.splitlines().index("        try_this = {1: 2}") + 1
    assert f"{bad_path}:{line}:20: error:" in r.stderr, r.stderr
    assert "        try_this = {1: 2}\n" + " " * 19 + "^" in r.stderr
    assert f"{os.path.join(src, 'raises.py')}:4:1: error: importing the module failed: ZeroDivisionError" in r.stderr
    assert ": 3 built, 0 cached, 1 failed, 1 module error" in r.stdout.splitlines()[-1], r.stdout  # the summary
    # Everything else was built: the good module loads; the failed one has no record.
    assert list_modules(Cache(cache)) == [("good", "cpu")]
    good = load(cache, "good")
    v = rng.random(50).astype(np.float32)
    want = np.float32(2.0) * v + np.float32(0.25)
    good.axpb(2.0, 0.25, v)
    np.testing.assert_allclose(v, want, rtol=1e-6)
    good.total(v)
    np.testing.assert_allclose(good.acc[None], want.sum(), rtol=1e-5)


def test_usage_errors_exit_2(tmp_path):
    src = _write(tmp_path / "k", good=GOOD)
    runner = CliRunner()
    for args, message in [(["build", src, "--arch", "tpu"], "unknown arch 'tpu'"),
                          (["build", str(tmp_path / "nothing")], "no such file or folder"),
                          (["clean", "--cache", str(tmp_path)], "--max-size SIZE or --all"),
                          (["clean", "--cache", str(tmp_path), "--max-size", "lots"], "invalid size"),
                          (["inspect", "nodot", "--cache", str(tmp_path)], "MODULE.KERNEL"),
                          (["build"], "give kernel PATHS or --manifest FILE")]:
        r = runner.invoke(cli, args)
        assert r.exit_code == 2 and message in r.output, (args, r.output)


@pytest.fixture
def small_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _write(tmp_path / "k", good=GOOD)
    r = CliRunner().invoke(cli, ["build", src, "--cache", "c", "-j", "1"])
    assert r.exit_code == 0, r.output
    return str(tmp_path / "c")


def test_ls_and_inspect(small_cache):
    runner = CliRunner()
    r = runner.invoke(cli, ["ls", "--cache", small_cache])
    assert r.exit_code == 0
    assert "good (cpu): 2 kernels, 1 field," in r.output and "axpb" in r.output and "total" in r.output

    r = runner.invoke(cli, ["inspect", "good.axpb", "--cache", small_cache])
    assert r.exit_code == 0
    for text in ("kernel axpb (forward, cpu)", "param     a: f32", "param     v: ndarray(f32, ndim=1)",
                 "task      axpb_t0_range: range_for, entry qdc_axpb_t0, shape(v,0) iterations, on ",
                 "kernel.so", "kernel.bc", "sha256"):
        assert text in r.output, text
    assert "kernel axpb(" in runner.invoke(cli, ["inspect", "good.axpb", "--ir", "--cache", small_cache]).output
    llvm = runner.invoke(cli, ["inspect", "good.total", "--llvm", "--cache", small_cache])
    assert llvm.exit_code == 0 and "define void @qdc_total" in llvm.output
    assert "no adstacks" in runner.invoke(cli, ["inspect", "good.total", "--size-expr", "--cache", small_cache]).output
    ptx = runner.invoke(cli, ["inspect", "good.total", "--ptx", "--cache", small_cache])
    assert ptx.exit_code == 1 and "no ptx artifact" in ptx.output
    missing = runner.invoke(cli, ["inspect", "good.nope", "--cache", small_cache])
    assert missing.exit_code == 1 and "has no kernel 'nope'" in missing.output


def test_clean_max_size_and_all(small_cache):
    runner = CliRunner()
    foreign = os.path.join(small_cache, ".gitkeep")
    open(foreign, "w", encoding="utf-8").close()
    r = runner.invoke(cli, ["clean", "--cache", small_cache, "--max-size", "10G"])
    assert r.exit_code == 0 and "evicted 0 entries" in r.output
    r = runner.invoke(cli, ["clean", "--cache", small_cache, "--max-size", "0"])
    assert "evicted 2 entries" in r.output and "good (cpu)" in r.output
    assert Cache(small_cache).entries() == [] and list_modules(Cache(small_cache)) == []
    assert runner.invoke(cli, ["clean", "--cache", small_cache, "--all"]).exit_code == 0
    assert os.path.exists(foreign)  # only the cache's own folders are touched


def _built_options(cache):
    entries = Cache(cache).entries()
    assert entries
    return [Cache(cache).lookup(e["key"]).record["options"] for e in entries]


def test_options_come_from_flags_then_file_then_defaults(tmp_path, monkeypatch):
    src = _write(tmp_path / "k", good=GOOD)
    runner = CliRunner()
    proj = tmp_path / "proj"
    proj.mkdir()
    monkeypatch.chdir(proj)
    (proj / "qdc.yaml").write_text("opt_level: 1\nfast-math: true\ncache_dir: from_yaml\n", encoding="utf-8")
    assert runner.invoke(cli, ["build", src, "-j", "1"]).exit_code == 0
    assert {(o["opt_level"], o["fast_math"]) for o in _built_options(str(proj / "from_yaml"))} == {(1, True)}
    (proj / "sub").mkdir()
    monkeypatch.chdir(proj / "sub")  # the file is found upwards; its cache_dir is relative to it
    r = runner.invoke(cli, ["build", src, "-j", "1"])
    assert r.exit_code == 0 and ": 0 built, 2 cached" in r.output, r.output
    monkeypatch.chdir(proj)
    assert runner.invoke(cli, ["build", src, "-j", "1", "--opt-level", "2", "--cache", "flag"]).exit_code == 0
    assert {(o["opt_level"], o["fast_math"]) for o in _built_options(str(proj / "flag"))} == {(2, True)}

    (proj / "qdc.yaml").unlink()
    (proj / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.qdc]\ndefault_fp = "f64"\n', encoding="utf-8")
    assert runner.invoke(cli, ["build", src, "-j", "1", "--cache", "toml"]).exit_code == 0
    assert {(o["opt_level"], o["default_fp"]) for o in _built_options(str(proj / "toml"))} == {(3, "f64")}

    (proj / "pyproject.toml").write_text('[tool.qdc]\nopt_levle = 2\n', encoding="utf-8")
    r = runner.invoke(cli, ["build", src])
    assert r.exit_code == 2 and "pyproject.toml [tool.qdc]: unknown option 'opt_levle'" in r.output


def test_three_concurrent_builds_into_one_cache(tmp_path, rng):
    src = _write(tmp_path / "k", good=GOOD, other=GOOD.replace("a * v[i] + b", "a * v[i] - b"))
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-m", "qdc.cli.main", "build", src, "--cache", cache, "-j", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    r = qdc_cli("verify", "--cache", cache)
    assert r.returncode == 0 and "0 bad" in r.stdout
    assert len(Cache(cache).entries()) == 3  # `total` is the same kernel in both modules: one entry
    assert os.listdir(os.path.join(cache, "tmp")) == []
    other = load(cache, "other")
    v = rng.random(20).astype(np.float32)
    want = np.float32(3.0) * v - np.float32(1.0)
    other.axpb(3.0, 1.0, v)
    np.testing.assert_allclose(v, want, rtol=1e-6)


SHARED = '''
import qdc as qd

grid = qd.field(qd.i32, shape=(4, 5))
'''

USER = '''
import qdc as qd
import shared


@qd.kernel
def number_cells(offset: qd.i32):
    for i, j in shared.grid:
        shared.grid[i, j] = i * 10 + j + offset
'''


def test_a_kernel_may_use_a_field_of_another_kernel_module(tmp_path, rng):
    src = _write(tmp_path / "k", shared=SHARED, user=USER)
    cache = str(tmp_path / "cache")
    r = CliRunner().invoke(cli, ["build", src, "--cache", cache, "-j", "1"])
    assert r.exit_code == 0, r.output
    user = load(cache, "user")
    offset = int(rng.integers(-100, 100))
    user.number_cells(offset)
    i, j = np.indices((4, 5))
    np.testing.assert_array_equal(user.grid.to_numpy(), i * 10 + j + offset)
    assert load(cache, "shared").grid.shape == (4, 5)
