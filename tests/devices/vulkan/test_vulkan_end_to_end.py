"""Vulkan end to end: numpy arguments on a device without host memory, direct mode
(`qd.init(arch=qd.vulkan)`, `qd.gpu`), host reads that synchronise, and AOT (`qdc build --arch
vulkan`, then `qdc.runtime.load(..., arch="vulkan")` in a fresh process without the compiler).
Tests that take `arch` run on every selected arch (conftest.py); the others need Vulkan and
are skipped, saying why, without a Vulkan device."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context

from conftest import vulkan_unavailable_reason

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


def _scale():
    @qd.kernel
    def scale(x: F32_1D, s: qd.f32):
        for i in range(x.shape[0]):
            x[i] = x[i] * s
    return scale


def test_a_numpy_array_is_copied_in_at_every_launch_and_back_when_written(arch):
    scale = _scale()
    a = np.ones(8, np.float32)
    scale(a, 2.0)
    np.testing.assert_array_equal(a, np.full(8, 2.0, np.float32))
    a[:] = 5.0  # the same array object: the launch skips re-validating it, not copying it in
    scale(a, 3.0)
    np.testing.assert_array_equal(a, np.full(8, 15.0, np.float32))
    b = np.arange(16, dtype=np.float32)  # larger: another device buffer
    scale(b, 0.5)
    np.testing.assert_array_equal(b, np.arange(16, dtype=np.float32) * 0.5)


def test_read_only_arrays_are_read_and_never_written(arch):
    @qd.kernel
    def shifted(x: F32_1D, y: F32_1D):
        for i in range(x.shape[0]):
            y[i] = x[i] + 1.0

    x = np.arange(8, dtype=np.float32)
    x.flags.writeable = False
    y = np.zeros(8, np.float32)
    shifted(x, y)
    np.testing.assert_array_equal(y, np.arange(8, dtype=np.float32) + 1)
    with pytest.raises(ValueError, match="kernel 'scale', argument 'x': the numpy array is read-only"):
        _scale()(x, 2.0)
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.float32))


def test_numpy_arrays_and_qd_ndarrays_alternate_in_one_parameter(arch):
    scale = _scale()
    q = qd.ndarray(qd.f32, (4,))
    q.from_numpy(np.ones(4, np.float32))
    a = np.full(4, 3.0, np.float32)
    for _ in range(2):
        scale(q, 2.0)
        scale(a, 2.0)
    np.testing.assert_array_equal(q.to_numpy(), np.full(4, 4.0, np.float32))
    np.testing.assert_array_equal(a, np.full(4, 12.0, np.float32))


def test_a_grad_kernel_takes_numpy_arrays_too(arch):
    x = qd.field(qd.f32, shape=8, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def weighted(w: F32_1D):
        for i in x:
            y[None] += w[i] * x[i] * x[i]

    w = np.arange(8, dtype=np.float32)
    x.from_numpy(np.ones(8, np.float32))
    weighted(w)
    y.grad[None] = 1.0
    weighted.grad(w)
    np.testing.assert_array_equal(x.grad.to_numpy(), 2 * w)
    assert y[None] == 28.0


def test_the_device_buffer_is_reused_while_the_array_fits(vulkan_runtime):
    scale = _scale()
    scale(np.ones(64, np.float32), 1.0)
    copies = scale.__qdc_launcher__.copies
    first = copies.buffers[0]
    scale(np.ones(32, np.float32), 1.0)
    assert copies.buffers[0] is first
    scale(np.ones(128, np.float32), 1.0)
    assert copies.buffers[0] is not first and copies.buffers[0].nbytes == 512


def test_the_cpu_launch_code_has_no_copies():
    scale = _scale()
    scale(np.ones(4, np.float32), 1.0)
    source = scale.__qdc_source__
    assert "_q_copy" not in source and scale.__qdc_launcher__.copies is None, source


def test_matches_numpy_and_the_cpu(arch, same_as_cpu):
    x0 = np.linspace(-2, 2, 1000, dtype=np.float32)

    def run():
        y = qd.field(qd.f32, shape=1000)
        total = qd.field(qd.f32, shape=())

        @qd.kernel
        def k(x: F32_1D):
            for i in range(x.shape[0]):
                y[i] = qd.sin(x[i]) * x[i]
                total[None] += x[i] * x[i]

        k(x0)
        return y.to_numpy(), total.to_numpy()

    y, total = same_as_cpu(run)
    np.testing.assert_allclose(y, np.sin(x0) * x0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(total, np.sum(x0.astype(np.float64) ** 2), rtol=1e-4)


def test_host_reads_wait_for_the_launches(vulkan_runtime):
    f = qd.field(qd.i32, shape=4096)

    @qd.kernel
    def fill(v: qd.i32):
        for i in f:
            f[i] = i * v

    for v in range(1, 6):
        fill(v)  # asynchronous: no qd.sync before the reads
    assert f[4095] == 4095 * 5
    np.testing.assert_array_equal(f.to_numpy(), np.arange(4096) * 5)


def test_qd_gpu_takes_the_first_gpu_that_works(session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    try:
        opts = qd.init(arch=qd.gpu, cache_dir=session_cache_dir)
        assert opts.arch in ("cuda", "vulkan") and context.current().arch == opts.arch
        a = np.ones(4, np.float32)
        _scale()(a, 4.0)
        np.testing.assert_array_equal(a, np.full(4, 4.0, np.float32))
    finally:
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_qd_gpu_without_a_gpu_falls_back_to_the_cpu_with_a_warning(monkeypatch, session_cache_dir):
    from qdc.compiler.jit import api
    monkeypatch.setattr(api, "GPU_ARCHES", ("metal",))  # no device for it in this build
    with pytest.warns(RuntimeWarning, match="no GPU backend works on this machine, using the CPU .metal: "):
        opts = qd.init(arch=qd.gpu, cache_dir=session_cache_dir)
    assert opts.arch == "cpu" and context.current().arch == "cpu"


def test_reinitialising_releases_the_old_device(vulkan_runtime, session_cache_dir):
    old = context.current().device
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    assert old.device is None  # closed: its driver objects and threads do not pile up


MODULE = '''
import qdc as qd

total = qd.field(qd.f32, shape=())


@qd.kernel
def scale_and_sum(x: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(x.shape[0]):
        x[i] = x[i] * s
        total[None] += x[i]
'''

RUN = '''
import sys
import numpy as np
from qdc.runtime import load

mod = load(sys.argv[1], "vkmod", arch="vulkan")
x = np.arange(100, dtype=np.float32)
mod.scale_and_sum(x, 2.0)
assert np.array_equal(x, np.arange(100, dtype=np.float32) * 2), x
assert mod.total[None] == float(np.sum(np.arange(100) * 2)), mod.total[None]
leaked = [m for m in sys.modules if m == "llvmlite" or m.startswith(("llvmlite.", "qdc.compiler"))]
assert not leaked, leaked
print("ok")
'''


def test_built_for_vulkan_then_loaded_in_a_fresh_process_without_the_compiler(tmp_path):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "vkmod.py").write_text(MODULE, encoding="utf-8")
    cache = tmp_path / "cache"
    build = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "src"), "--arch", "vulkan",
                            "--cache", str(cache)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN), str(cache)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
