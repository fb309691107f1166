"""Cache keys identify every captured object by what it is (docs/api.md, Writing kernels): kernels that differ
only in a captured function, module or value never share an entry, in one process or across
processes; what the key cannot identify is compiled without the cache. Also: the test suite
never touches the user's ~/.cache/qdc (QDC_CACHE_DIR, and the session check in conftest.py)."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import cache_key, options as options_mod
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of
from conftest import TESTS_DIR

x = qd.field(qd.f32, shape=())
y = qd.field(qd.f32, shape=())


def _kernel_capturing(op):
    @qd.kernel
    def apply():
        y[None] = op(x[None])
    return apply


def _key(kernel) -> str:
    k = kernel_of(kernel)
    return cache_key.kernel_key(k.fn, k.params, direct_options(), "cpu").key


@pytest.mark.parametrize("module, names", [(qd, ("sin", "cos", "exp")), (math, ("sin", "cos", "exp"))])
def test_kernels_differing_only_in_a_captured_function_compute_each_their_own(module, names):
    x[None] = 0.5
    for name in names:  # each kernel compiled after the previous one stored its entry
        op = getattr(module, name)
        _kernel_capturing(op)()
        assert y[None] == pytest.approx(float(getattr(np, name)(np.float32(0.5))), rel=1e-6), name


def _two_on_one_line():
    return [lambda v: v * 2.0, lambda v: v * 3.0]


def _helper_scaled_by(c):
    def helper(v):
        return v * c
    return helper


@pytest.mark.parametrize("first, second", [
    (qd.sin, qd.cos), (math.sin, math.cos), (np.sin, np.cos), (qd.sin, math.sin),
    (math, np), (abs, round), (np.float32, np.float64), (qd.f32, qd.f64),
    (*_two_on_one_line(),), (_helper_scaled_by(2.0), _helper_scaled_by(3.0)),
    ((1, 2), (1, 3)), ([1.0] * 300 + [2.0], [1.0] * 300 + [3.0]),  # longer than the old 256 limit
    ([[[[[1]]]]], [[[[[2]]]]]),  # deeper than the old depth limit of 4
    ({"n": 1}, {"n": 2}), (np.arange(4), np.arange(1, 5)), (range(3), range(4)),
    (qd.types.ndarray(qd.f32, 1), qd.types.ndarray(qd.f32, 2)),
], ids=lambda v: type(v).__name__)
def test_every_kind_of_captured_object_enters_the_key_by_what_it_is(first, second):
    assert _key(_kernel_capturing(first)) != _key(_kernel_capturing(second))
    assert _key(_kernel_capturing(first)) == _key(_kernel_capturing(first))  # and deterministically


def test_attribute_chains_key_the_value_they_reach_not_their_base():
    class Config:
        n = 3

    cfg = Config()  # an object the key cannot identify: only `cfg.n` matters

    @qd.kernel
    def scaled():
        y[None] = x[None] * cfg.n

    before = _key(scaled)
    cfg.n = 4
    assert _key(scaled) != before


shadowed = object()  # a global that a kernel's own local shadows: the key cannot tell it is unused


def test_an_unidentifiable_object_makes_the_kernel_compiled_but_not_cached(session_cache_dir, monkeypatch, capfd):
    @qd.kernel
    def local_wins():
        shadowed = 2.5
        y[None] = shadowed

    with pytest.raises(cache_key.UncacheableKernel, match="shadowed"):
        _key(local_wins)
    monkeypatch.setenv("QDC_LOG", "cache")
    entries = set(_listing(session_cache_dir))
    local_wins()
    assert y[None] == 2.5
    assert set(_listing(session_cache_dir)) == entries  # nothing stored
    assert "kernel 'local_wins' (forward) is compiled but not cached" in capfd.readouterr().err


def _listing(folder):
    return [os.path.join(r, f) for r, _, files in os.walk(folder) for f in files]


OP_SCRIPT = """
import sys
import numpy as np
import qdc as qd

qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
op = getattr(qd, sys.argv[2])
x = qd.field(qd.f32, shape=4)
y = qd.field(qd.f32, shape=4)


@qd.kernel
def apply():
    for i in x:
        y[i] = op(x[i])


xs = np.array([0.1, 0.5, 1.0, 2.0], np.float32)
x.from_numpy(xs)
apply()
np.testing.assert_allclose(y.to_numpy(), getattr(np, sys.argv[2])(xs), rtol=1e-6)
print("ok")
"""


def test_processes_sharing_a_cache_each_get_their_own_op(tmp_path):
    script = tmp_path / "op_kernel.py"  # the same file: same source, same line numbers
    script.write_text(OP_SCRIPT, encoding="utf-8")
    cache = str(tmp_path / "shared-cache")
    for name in ("sin", "cos", "sin"):  # the second sin is a cache hit of the first
        r = subprocess.run([sys.executable, str(script), cache, name], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "ok", (name, r.stderr[-2000:])


# ---- the suite keeps to its own cache --------------------------------------------------------

def test_init_without_cache_dir_uses_the_session_cache(session_cache_dir):
    assert os.environ["QDC_CACHE_DIR"] == session_cache_dir
    qd.init(arch=qd.cpu)
    assert direct_options().resolved_cache_dir == session_cache_dir
    assert options_mod.Options(cache_dir="elsewhere").resolved_cache_dir == "elsewhere"


GUARDED_TEST = """
import os


def test_writes_the_user_cache():
    os.makedirs(os.path.expanduser("~/.cache/qdc/written-by-a-test"))
"""


def test_a_session_that_writes_the_user_cache_fails(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(open(os.path.join(TESTS_DIR, "conftest.py"), encoding="utf-8").read(), encoding="utf-8")
    (suite / "test_guarded.py").write_text(textwrap.dedent(GUARDED_TEST), encoding="utf-8")
    env = {**os.environ, "HOME": str(tmp_path / "home")}  # never the real home
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=str(suite))
    assert r.returncode != 0, r.stdout[-2000:]
    assert "1 passed, 1 error" in r.stdout and "changed the user's cache" in r.stdout, r.stdout[-2000:]
