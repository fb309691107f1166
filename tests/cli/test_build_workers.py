"""`qdc build -j N` on Linux forks its workers from the building process once the kernel
modules are imported (compiler/commands/build_workers.py, `ForkedWorker`); every kernel is built once,
each worker exits when its job pipe closes, and a worker that dies fails only its own job."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from qdc.runtime.loader import load

MODULE = textwrap.dedent('''
    import qdc as qd

    F = qd.types.ndarray(dtype=qd.f32, ndim=1)
''') + "".join(textwrap.dedent(f'''
    @qd.kernel
    def k{i}(out: F, a: F):
        for j in range(out.shape[0]):
            out[j] = a[j] * {i + 1}.0 + {i}.0
''') for i in range(8))


def build(*args):
    env = {k: v for k, v in os.environ.items() if k != "QDC_CACHE_DIR"}
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_forked_workers_build_every_kernel_once(tmp_path, rng):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "many.py").write_text(MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = build(str(tmp_path / "src"), "--cache", cache, "-j", "4", "--cpu-target", "native")
    assert r.returncode == 0, r.stderr
    assert ": 8 built, 0 cached, 0 failed" in r.stdout.splitlines()[-1], r.stdout
    assert sorted(line.split()[2] for line in r.stdout.splitlines() if " built " in line and "[" in line) == \
        sorted(f"many.k{i}" for i in range(8))
    mod = load(cache, "many")
    a = rng.random(33, dtype=np.float32)
    for i in range(8):
        out = np.zeros_like(a)
        getattr(mod, f"k{i}")(out, a)
        np.testing.assert_allclose(out, a * np.float32(i + 1) + np.float32(i), rtol=1e-6)
    again = build(str(tmp_path / "src"), "--cache", cache, "-j", "4", "--cpu-target", "native")
    assert ": 0 built, 8 cached, 0 failed" in again.stdout.splitlines()[-1], again.stdout


def _echo_until_told_to_die(jobs, results):
    for line in jobs:
        if line.strip() == "die":
            os._exit(7)
        results.write(line.upper())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_forked_workers_exit_when_their_own_pipe_closes_and_report_a_death():
    from qdc.compiler.commands.build_workers import ForkedWorker
    first = ForkedWorker(_echo_until_told_to_die, [])
    second = ForkedWorker(_echo_until_told_to_die, [first])  # must not hold first's job pipe open
    first.stdin.write("a job\n")
    assert first.stdout.readline() == "A JOB\n"
    first.stdin.close()
    assert first.wait() == 0  # would hang if `second` had inherited first's job pipe
    second.stdin.write("die\n")
    assert second.stdout.readline() == ""  # the pipe closes: run_in_workers fails that job
    assert second.wait() == 7 and second.poll() == 7
