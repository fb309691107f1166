"""The kernel function object (runtime/kernel_function.py), one for loaded and direct-mode
kernels: it launches directly once loaded, takes its slow path while a FwdMode or a Tape
observes calls (launching the same results), and launches directly again after them."""
import textwrap

import numpy as np
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.jit.kernel import kernel_of
from qdc.runtime import FwdMode
from qdc.runtime.loader import load

MODULE = '''
import qdc as qd

total = qd.field(qd.f32, shape=())
probe = qd.field(qd.f32, shape=(), needs_dual=True)


@qd.kernel
def accumulate(a: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.f32):
    for i in range(a.shape[0]):
        total[None] += w * a[i]
'''


def _launches_directly(function) -> bool:
    return function.__code__ is function.__qdc_launcher__.fast_code


def test_a_loaded_kernel_is_observed_by_fwdmodes_and_tapes_only_while_they_run(tmp_path, rng, session_cache_dir):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "obs.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "kernels"), "--cache", cache])
    assert result.exit_code == 0, result.output
    mod = load(cache, "obs")
    a = rng.random(40, dtype=np.float32)
    w = float(rng.uniform(0.5, 2.0))
    assert _launches_directly(mod.accumulate)  # loaded: no slow path in front of the first call
    expected = 0.0
    for observer in (FwdMode(loss=mod.probe, param=mod.probe), qd.ad.Tape()):
        with observer:
            assert not _launches_directly(mod.accumulate)
            mod.accumulate(a, w)
            expected += w * a.astype(np.float64).sum()
            assert not _launches_directly(mod.accumulate)
        mod.accumulate(a, w)
        expected += w * a.astype(np.float64).sum()
        assert _launches_directly(mod.accumulate)
    np.testing.assert_allclose(mod.total[None], expected, rtol=1e-5)


def test_compiling_inside_a_fwdmode_keeps_the_slow_path(rng, session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    seed = qd.field(qd.f32, shape=(), needs_dual=True)

    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.f32):
        for i in range(a.shape[0]):
            a[i] = w * a[i]

    a = rng.random(16, dtype=np.float32)
    with FwdMode(loss=seed, param=seed):
        scale.compile()
        assert not kernel_of(scale).launches_on_its_own()  # a call must still reach forward mode
    out = a.copy()
    scale(out, 3.0)
    assert kernel_of(scale).launches_on_its_own()
    np.testing.assert_allclose(out, 3.0 * a, rtol=1e-6)
