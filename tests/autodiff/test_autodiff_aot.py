"""Ahead of time: `qdc build` also builds the reverse-mode variant, and a loaded module runs it
(adstack heap and overflow check included) without the compiler."""
import subprocess
import sys
import textwrap

KERNEL_MODULE = """
import qdc as qd

x = qd.field(qd.f32, shape=64, needs_grad=True)
n = qd.field(qd.f32, shape=())  # a float bound is outside the SizeExpr grammar: default_ad_stack_size
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(int(n[None])):
            v = qd.sin(v) * 0.95 + 0.01
        y[None] += v
"""

RUN = """
import sys
import numpy as np
import qdc
from qdc.runtime import adstack, load

mod = load(sys.argv[1], "adk", arch="cpu")
xs = np.random.default_rng(1).random(64, dtype=np.float32)
mod.x.from_numpy(xs)
mod.n[None] = 10
mod.chain()
mod.y.grad[None] = 1.0
mod.chain.grad()
v, d = xs.astype(np.float64), np.ones(64)
for _ in range(10):
    d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
assert np.allclose(mod.x.grad.to_numpy(), d, rtol=1e-4), "wrong gradient"
assert adstack.adstack_heap_bytes() > 0
mod.n[None] = 300  # past default_ad_stack_size = 256
try:
    mod.chain.grad()
except qdc.AdStackOverflowError as e:
    assert e.kernel == "chain" and e.allocated == 256 and e.required == 301, str(e)
else:
    raise AssertionError("no overflow error")
assert not any(m.startswith("qdc.compiler") or m == "llvmlite" for m in sys.modules), "compiler imported"
print("ok")
"""


def test_built_grad_variant_runs_from_a_loaded_module(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "adk.py").write_text(textwrap.dedent(KERNEL_MODULE), encoding="utf-8")
    cache = tmp_path / "cache"
    build = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "kernels"), "--cache",
                            str(cache)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "2 built" in build.stdout + build.stderr  # the forward kernel and its reverse-mode variant
    assert "trip count is only known at run time" in build.stderr
    run = subprocess.run([sys.executable, "-c", RUN, str(cache)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
