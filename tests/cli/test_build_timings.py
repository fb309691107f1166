"""Where build time goes (compiler/timings.py): `qdc build --timings` prints each kernel
variant's phases per arch, largest first; `QDC_LOG=timings` prints them in direct mode; the
phases of a kernel add up to its compile time, a nested phase counted once, and the linker's
CPU time counts to the link. And `qdc build` gives the same cache whatever `-j`."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from qdc.compiler import timings
from qdc.compiler.commands import build as build_mod

from remote_util import qdc, tree, write_project

MODULE = textwrap.dedent('''
    import qdc as qd

    x = qd.field(qd.f32, shape=64, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    total = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def small():
        for i in x:
            x[i] = x[i] * 2.0

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.9 + 0.1
            total[None] += v
''')

ROW = re.compile(r"^  (\S+)\s+(cpu|vulkan)\s+([0-9.]+)\s+([0-9.]+)  (.*)$")


def test_build_timings_name_every_variant_and_phase_largest_first(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "timed.py").write_text(MODULE, encoding="utf-8")
    r = qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "--arch", "cpu,vulkan", "-j", 1, "--timings")
    rows = [ROW.match(line).groups() for line in r.stdout.splitlines() if ROW.match(line)]
    assert sorted((name, arch) for name, arch, *_ in rows) == sorted(
        (f"timed.{k}", arch) for k in ("small", "small.grad", "chain", "chain.grad") for arch in ("cpu", "vulkan"))
    cpu_ms = [float(row[2]) for row in rows]
    assert cpu_ms == sorted(cpu_ms, reverse=True)  # largest kernels first
    phases = {(name, arch): rest for name, arch, _, _, rest in rows}
    for name in ("timed.small", "timed.chain", "timed.chain.grad"):
        for phase in ("LLVM optimisation", "object emission", "linking"):
            assert phase in phases[(name, "cpu")]
        assert "SPIR-V generation" in phases[(name, "vulkan")]
    assert "autodiff" in phases[("timed.chain.grad", "cpu")]
    # a portable build generates the width-W code of each ISA level on its own
    assert "IR generation x86-64-v3" in phases[("timed.chain", "cpu")] or sys.platform != "linux" \
        or os.uname().machine != "x86_64"
    totals = r.stdout[r.stdout.index("all 8 kernel variants"):].splitlines()
    assert any(line.split()[:2] == ["front", "end"] for line in totals)
    assert any(line.strip().startswith("start-up before the first kernel") for line in totals)
    assert r.stdout.splitlines()[-1].startswith("qdc build: ")


def test_no_timings_without_the_flag(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "timed.py").write_text(MODULE, encoding="utf-8")
    r = qdc("build", tmp_path / "src", "--cache", tmp_path / "cache", "-j", 1)
    assert "where the time went" not in r.stdout


def test_direct_mode_logs_each_compile(tmp_path):
    script = tmp_path / "direct.py"
    script.write_text(MODULE + textwrap.dedent(f'''
        qd.init(arch=qd.cpu, cache_dir={str(tmp_path / "cache")!r})
        n[None] = 3
        chain()
        total.grad[None] = 1.0
        chain.grad()
    '''), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "QDC_CACHE_DIR"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**env, "QDC_LOG": "timings"})
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("[qdc timings]")]
    assert [line.split()[2] for line in lines] == ["chain", "chain.grad"], r.stderr
    assert all("LLVM optimisation" in line and "ms CPU" in line for line in lines)
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                           env={**env, "QDC_LOG": "timings"})
    assert "[qdc timings]" not in again.stderr  # cache hits compile nothing


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_nested_phase_is_taken_out_of_the_outer_one():
    start = time.perf_counter()
    with timings.recording() as spent:
        with timings.phase("outer"):
            _spin(0.02)
            with timings.phase("inner"):
                _spin(0.05)
                time.sleep(0.05)
        with timings.phase("inner"):
            _spin(0.01)
    assert list(spent.phases) == ["inner", "outer"]  # in the order they ended
    (inner_wall, inner_cpu), (outer_wall, outer_cpu) = spent.phases["inner"], spent.phases["outer"]
    total_wall = time.perf_counter() - start
    # CPU time by the thread's clock; wall time only by how the phases add up (a loaded machine
    # stretches every phase's wall time, never makes the outer one include the inner one's)
    assert 0.06 <= inner_cpu < 0.1 and inner_wall >= 0.11
    assert 0.02 <= outer_cpu < 0.05 and 0.02 <= outer_wall <= total_wall - inner_wall + 1e-3
    with timings.phase("unrecorded"):  # outside recording(): nothing kept, nothing raised
        pass
    assert "unrecorded" not in spent.phases


def test_a_tool_run_counts_its_cpu_time_to_the_phase():
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\nprint('done')"
    with timings.recording() as spent, timings.phase("linking"):
        code, output = timings.run_tool([sys.executable, "-c", busy])
    assert (code, output.strip()) == (0, "done")
    assert spent.phases["linking"][1] >= 0.2


def test_other_threads_phases_count_their_cpu_and_share_the_wall_time_waited():
    """A kernel's module parts compiled on other threads (targets/cpu/parallel_llvm.py)."""
    threads = [{"LLVM optimisation": [0.3, 0.25], "object emission": [0.1, 0.1]},
               {"LLVM optimisation": [0.4, 0.35]}]
    with timings.recording() as spent:
        timings.count_threads(threads, 0.4)
    assert spent.phases["LLVM optimisation"] == pytest.approx([0.35, 0.6])
    assert spent.phases["object emission"] == pytest.approx([0.05, 0.1])
    timings.count_threads(threads, 0.4)  # outside recording(): nothing kept, nothing raised


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_the_cache_is_the_same_whatever_the_number_of_jobs(tmp_path):
    src = write_project(tmp_path / "kernels", modules=2, kernels=3)  # 12 variants: -j2 uses a worker
    for jobs in (1, 2, 3):
        r = qdc("build", src, "--cache", tmp_path / f"j{jobs}", "-j", jobs)
        assert ": 12 built, 0 cached, 0 failed" in r.stdout.splitlines()[-1]
    entries = {jobs: {path: data for path, data in tree(tmp_path / f"j{jobs}").items() if path.startswith("entries")
                      and not path.endswith("meta.msgpack")} for jobs in (1, 2, 3)}  # meta holds a date
    assert entries[1] and entries[1] == entries[2] == entries[3]
    for jobs in (1, 2, 3):
        qdc("pack", "--cache", tmp_path / f"j{jobs}", "-o", tmp_path / f"j{jobs}.tgz")
    assert (tmp_path / "j1.tgz").read_bytes() == (tmp_path / "j2.tgz").read_bytes() == \
        (tmp_path / "j3.tgz").read_bytes()


def test_qdc_build_uses_every_core_by_default(tmp_path, monkeypatch):
    seen = {}
    real = build_mod.build

    def spy(*args, **kwargs):
        seen["jobs"] = args[4]
        return real(*args, **kwargs)
    monkeypatch.setattr(build_mod, "build", spy)
    src = write_project(tmp_path / "kernels", modules=1, kernels=1)
    qdc("build", src, "--cache", tmp_path / "cache")
    assert seen["jobs"] == (os.cpu_count() or 1)
