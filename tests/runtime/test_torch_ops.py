"""qdc.torch.function: a kernel as a differentiable PyTorch op (runtime/torch_ops.py), checked by
torch.autograd.gradcheck in f64 (central differences), also for a kernel built ahead of time
and loaded in a fresh process."""
import os
import subprocess
import sys

import numpy as np
import pytest

import qdc as qd

torch = pytest.importorskip("torch")
import qdc.torch  # noqa: E402

F64_1D = qd.types.ndarray(dtype=qd.f64, ndim=1)


@qd.kernel
def relax(x: F64_1D, y: F64_1D, n: qd.i32):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(n):  # trip count known at launch: the gradient pops its values from an adstack
            v = qd.sin(v) * 0.9 + 0.1 * x[i] * v
        y[i] += v


@qd.kernel
def energy(w: qd.types.ndarray(dtype=qd.f64, ndim=2), x: F64_1D, e: qd.types.ndarray(dtype=qd.f64, ndim=1),
           index: qd.types.ndarray(dtype=qd.i32, ndim=1), scale: qd.f64):
    for i, j in qd.ndrange(w.shape[0], w.shape[1]):
        e[index[i]] += scale * w[i, j] * qd.tanh(x[j]) * x[i]


def test_gradcheck_of_a_kernel_with_a_dynamic_inner_loop(rng):
    op = qdc.torch.function(relax, inputs=("x",), outputs=("y",))
    x = torch.from_numpy(rng.random(6)).requires_grad_()
    y0 = torch.from_numpy(rng.random(6)).requires_grad_()  # the output's initial value is differentiated too
    assert torch.autograd.gradcheck(lambda x, y0: op(x, y0, 9), (x, y0))
    y = op(x, y0, 9)
    assert torch.equal(y0, y0.detach())  # the given tensor is not modified
    v = x.detach().numpy().copy()
    for _ in range(9):
        v = np.sin(v) * 0.9 + 0.1 * x.detach().numpy() * v
    np.testing.assert_allclose(y.detach().numpy(), y0.detach().numpy() + v, rtol=1e-12)


def test_gradcheck_of_a_kernel_with_several_inputs_an_index_array_and_a_scalar(rng):
    op = qdc.torch.function(energy, inputs=("w", "x"), outputs="e")
    w = torch.from_numpy(rng.random((4, 3))).requires_grad_()
    x = torch.from_numpy(rng.random(4) - 0.5).requires_grad_()
    index = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
    e0 = torch.zeros(2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda w, x: op(w, x, e0, index, 1.5), (w, x))
    e = op(w=w, x=x, e=e0, index=index, scale=1.5)  # by keyword too
    want = np.zeros(2)
    np.add.at(want, index.numpy(), 1.5 * (w.detach().numpy()[:, :3] * np.tanh(x.detach().numpy()[:3])).sum(1)
              * x.detach().numpy())
    np.testing.assert_allclose(e.detach().numpy(), want, rtol=1e-12)
    (e * torch.tensor([2.0, -1.0], dtype=torch.float64)).sum().backward()  # one node of a larger graph
    assert w.grad is not None and x.grad is not None


@qd.kernel
def relax_each(x: F64_1D, y: F64_1D, counts: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(counts[i]):  # the adstack's size is read from the tensor before the launch
            v = qd.sin(v) * 0.9 + 0.1 * x[i] * v
        y[i] += v


def test_gradcheck_with_trip_counts_from_a_tensor(rng):
    op = qdc.torch.function(relax_each, inputs=("x",), outputs=("y",))
    x = torch.from_numpy(rng.random(5)).requires_grad_()
    counts = torch.tensor([0, 1, 3, 17, 40], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda x: op(x, torch.zeros(5, dtype=torch.float64), counts), (x,))


def test_mistakes_are_named():
    with pytest.raises(ValueError, match="(?s)'relax' has no parameter 'z'.*x, y, n"):
        qdc.torch.function(relax, inputs=("z",), outputs=("y",))
    with pytest.raises(ValueError, match="both an input and an output"):
        qdc.torch.function(relax, inputs=("y",), outputs=("y",))
    with pytest.raises(ValueError, match="outputs=()"):
        qdc.torch.function(relax, inputs=("x",))
    with pytest.raises(TypeError, match="not a kernel"):
        qdc.torch.function(len, inputs=("x",), outputs=("y",))
    op = qdc.torch.function(relax, inputs=("x",), outputs=("y",))
    with pytest.raises(TypeError, match="(?s)'relax'.*'y'.*torch.Tensor, got ndarray"):
        op(torch.zeros(3, dtype=torch.float64), np.zeros(3), 2)
    with pytest.raises(TypeError, match="(?s)'relax'.*'x'.*float32"):
        op(torch.zeros(3), torch.zeros(3, dtype=torch.float64), 2)


PREBUILT = '''
import sys
import numpy as np
import torch
import qdc.torch
from qdc.runtime import load

assert "llvmlite" not in sys.modules and "qdc.compiler" not in sys.modules
mod = load(sys.argv[1], "prebuilt_relax", arch="cpu")
op = qdc.torch.function(mod.prebuilt_relax, inputs=("x",), outputs=("y",))
rng = np.random.default_rng(int(sys.argv[2]))
x = torch.from_numpy(rng.random(5)).requires_grad_()
y0 = torch.from_numpy(rng.random(5)).requires_grad_()
assert torch.autograd.gradcheck(lambda x, y0: op(x, y0, 6), (x, y0))
model = torch.nn.Linear(5, 5, dtype=torch.float64)
loss = op(model(x), torch.zeros(5, dtype=torch.float64), 6).square().sum()
loss.backward()
assert model.weight.grad is not None and torch.isfinite(model.weight.grad).all()
assert "llvmlite" not in sys.modules and "qdc.compiler" not in sys.modules
print("ok")
'''

KERNEL_SOURCE = '''
import qdc as qd


@qd.kernel
def prebuilt_relax(x: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True),
                   y: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True), n: qd.i32):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(n):
            v = qd.sin(v) * 0.9 + 0.1 * x[i] * v
        y[i] += v
'''


def test_a_prebuilt_kernel_is_a_torch_op_in_a_fresh_process(tmp_path, rng):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "prebuilt_relax.py").write_text(KERNEL_SOURCE, encoding="utf-8")
    built = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "kernels"),
                            "--cache", str(tmp_path / "cache")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    script = tmp_path / "train.py"
    script.write_text(PREBUILT, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), str(int(rng.integers(1 << 30)))],
                         capture_output=True, text=True, cwd=str(tmp_path), env=os.environ)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_import_qdc_torch_in_a_fresh_process():
    code = ("import qdc.torch, sys, qdc; assert qdc.torch is sys.modules['qdc.torch']; "
            "assert qdc.torch.function and sys.modules['torch'].__file__ != qdc.__file__; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    run = subprocess.run([sys.executable, "-c", "import qdc; print(qdc.torch.function.__module__)"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "qdc.runtime.torch_ops", run.stderr
