"""torch tensors as ndarray arguments (runtime/external_arrays.py): used in place, cached while
their address stays, copied in and written back where not contiguous, refused by TypeErrors
naming kernel, parameter, expected and given."""
import dataclasses

import numpy as np
import pytest

import qdc as qd

torch = pytest.importorskip("torch")

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def scale(a: F32_1D, s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s


@qd.kernel
def bump(a: qd.types.ndarray()):  # dtype and ndim from the argument
    for i in range(a.shape[0]):
        a[i] = a[i] + 1


@qd.kernel
def copy_into(src: qd.types.ndarray(), dst: qd.types.ndarray()):
    for i in range(src.shape[0]):
        dst[i] = src[i]


@qd.kernel
def label(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        a[i, j] = i * 100 + j


@qd.kernel
def lengths(v: qd.types.ndarray(dtype=qd.math.vec3, ndim=1), out: F32_1D):
    for i in range(v.shape[0]):
        out[i] = v[i].norm()
        v[i] = v[i] * 2.0


@qd.kernel
def square(x: qd.types.ndarray(dtype=qd.f64, ndim=1), y: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(x.shape[0]):
        y[i] += x[i] * x[i]


NUMBERS = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", NUMBERS)
def test_kernel_writes_land_in_the_tensor_of_every_dtype(dtype):
    values = np.arange(1, 7).astype(dtype)
    t = torch.from_numpy(values.copy())
    address = t.data_ptr()
    bump(t)
    assert t.data_ptr() == address
    np.testing.assert_array_equal(t.numpy(), values + values.dtype.type(1))


def test_bool_tensors():
    src = torch.tensor([True, False, True, True])
    dst = torch.zeros(4, dtype=torch.bool)
    copy_into(src, dst)
    assert dst.tolist() == [True, False, True, True]


def test_a_cached_tensor_is_rebound_when_its_memory_changes(rng):
    values = rng.random(8, dtype=np.float32)
    t = torch.from_numpy(values.copy())
    scale(t, 2.0)
    scale(t, 2.0)  # the same tensor again: cached
    np.testing.assert_allclose(t.numpy(), 4 * values, rtol=1e-6)
    t.data = torch.ones(3)  # a new storage under the same tensor object
    scale(t, 3.0)
    assert t.tolist() == [3.0, 3.0, 3.0]
    t.resize_(100)  # reallocated
    t.fill_(1.0)
    scale(t, 5.0)
    assert torch.equal(t, torch.full((100,), 5.0))
    n = rng.random(4, dtype=np.float32)
    scale(n, 2.0)  # then numpy, then the tensor again
    scale(t, 0.5)
    assert torch.equal(t, torch.full((100,), 2.5))


def test_non_contiguous_tensors_are_copied_in_and_written_back():
    whole = torch.full((6, 5), -1, dtype=torch.int32)
    label(whole.t())  # a transpose: shape (5, 6)
    want = torch.from_numpy((np.indices((5, 6))[0] * 100 + np.indices((5, 6))[1]).astype(np.int32))
    assert torch.equal(whole.t(), want)
    row = torch.arange(10, dtype=torch.float32)
    scale(row[::2], 10.0)
    assert row.tolist() == [0, 1, 20, 3, 40, 5, 60, 7, 80, 9]


def test_vector_elements_are_trailing_axes(rng):
    v = torch.from_numpy(rng.random((5, 3)).astype(np.float32))
    before = v.clone()
    out = torch.zeros(5)
    lengths(v, out)
    np.testing.assert_allclose(out.numpy(), np.linalg.norm(before.numpy(), axis=1), rtol=1e-5)
    np.testing.assert_allclose(v.numpy(), 2 * before.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="(?s)'lengths'.*'v'.*element's axes"):
        lengths(torch.zeros(5, 4), out)


def test_mismatches_are_type_errors_naming_kernel_parameter_expected_and_given():
    with pytest.raises(TypeError, match=r"kernel 'scale', argument 'a': expected an ndarray of f32 with ndim=1, "
                                        r"got a torch.Tensor of dtype torch.float64"):
        scale(torch.zeros(4, dtype=torch.float64), 1.0)
    with pytest.raises(TypeError, match=r"(?s)'scale'.*'a'.*ndim=1.*ndim=2"):
        scale(torch.zeros(2, 2), 1.0)
    with pytest.raises(TypeError, match=r"(?s)'scale'.*'a'.*arch cpu take CPU tensors.*meta"):
        scale(torch.zeros(4, device="meta"), 1.0)
    with pytest.raises(TypeError, match=r"(?s)'bump'.*'a'.*unsupported dtype torch.complex64"):
        bump(torch.zeros(4, dtype=torch.complex64))
    t = torch.zeros(4)
    scale(t, 1.0)  # cached: a wrong one after it is still checked
    with pytest.raises(TypeError, match="torch.int32"):
        scale(torch.zeros(4, dtype=torch.int32), 1.0)


def test_gradients_go_to_the_tensors_grad(rng):
    x = torch.from_numpy(rng.random(6)).requires_grad_()
    y = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    square(x, y)
    np.testing.assert_allclose(y.detach().numpy(), x.detach().numpy() ** 2, rtol=1e-12)
    y.grad = torch.ones(6, dtype=torch.float64)
    square.grad(x, y)  # x.grad did not exist: made as zeros, then accumulated into
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy(), rtol=1e-12)
    square.grad(x, y)
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy(), rtol=1e-12)


@qd.kernel
def needs_its_gradient(x: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True),
                       y: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True)):
    for i in range(x.shape[0]):
        y[i] += qd.sin(x[i])


def test_a_gradient_parameter_needs_requires_grad():
    x, y = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="(?s)'needs_its_gradient'.*'x'.*requires_grad=True"):
        needs_its_gradient.grad(x, y)


def test_kernels_loaded_ahead_of_time_take_tensors(tmp_path):
    import subprocess
    import sys
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "tscale.py").write_text(
        "import qdc as qd\n\n\n@qd.kernel\ndef tscale(a: qd.types.ndarray(dtype=qd.f32, ndim=2), s: qd.f32):\n"
        "    for i, j in qd.ndrange(a.shape[0], a.shape[1]):\n        a[i, j] = a[i, j] * s\n", encoding="utf-8")
    built = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "kernels"),
                            "--cache", str(tmp_path / "cache")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    from qdc.runtime import load
    mod = load(str(tmp_path / "cache"), "tscale", arch="cpu")
    t = torch.ones(3, 4)
    mod.tscale(t, 3.0)
    mod.tscale(t, 2.0)
    assert torch.equal(t, torch.full((3, 4), 6.0))
    mod.tscale(t.t(), 0.5)  # non-contiguous
    assert torch.equal(t, torch.full((3, 4), 3.0))
    with pytest.raises(TypeError, match="(?s)'tscale'.*'a'.*torch.float16"):
        mod.tscale(torch.ones(3, 4, dtype=torch.float16), 1.0)


@dataclasses.dataclass(frozen=True)
class Bodies:
    pos: qd.types.ndarray(dtype=qd.f32, ndim=1)
    vel: qd.types.ndarray(dtype=qd.f32, ndim=1)
    dt: qd.f32


@qd.kernel
def advance(s: Bodies):
    for i in range(s.pos.shape[0]):
        s.pos[i] += s.vel[i] * s.dt


@qd.kernel
def triple(c: qd.template()):
    for i in range(c.values.shape[0]):
        c.values[i] *= 3


@qd.kernel
def double_rows(v: qd.types.ndarray(dtype=qd.f32, ndim=1, element_dim=1)):
    for i in range(v.shape[0]):
        v[i] = v[i] * 2.0


def test_tensors_inside_dataclasses_templates_and_with_element_dims():
    bodies = Bodies(torch.zeros(4), torch.arange(4, dtype=torch.float32), 0.5)
    advance(bodies)
    advance(bodies)
    assert bodies.pos.tolist() == [0.0, 1.0, 2.0, 3.0]

    class Config:
        def __init__(self):
            self.values = torch.ones(3, dtype=torch.int64)
    config = Config()
    triple(config)
    assert config.values.tolist() == [3, 3, 3]
    rows = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    double_rows(rows)
    assert rows.tolist() == [[0, 2], [4, 6], [8, 10]]


def test_cpu_tensors_on_every_arch(arch):
    """On a device with memory of its own (Vulkan, CUDA) a CPU tensor is copied in and out as a
    numpy array is; on the CPU it is used in place. Both write back into strided views."""
    t = torch.arange(6, dtype=torch.float32)
    scale(t, 2.0)
    scale(t, 2.0)
    assert t.tolist() == [0, 4, 8, 12, 16, 20]
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    scale(m[:, 1], 10.0)
    assert m[:, 1].tolist() == [10, 50, 90] and m[:, 0].tolist() == [0, 4, 8]
    a = qd.ndarray(qd.f32, 4)
    a.from_torch(torch.full((4,), 1.5))
    scale(a, 2.0)
    assert a.to_torch().tolist() == [3.0] * 4
