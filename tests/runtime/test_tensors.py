"""Quadrants' tensor API: qd.tensor / qd.Vector.tensor / qd.Matrix.tensor make qdc fields or
ndarrays by backend; qd.Tensor, VectorTensor and MatrixTensor classify them; a `qd.Tensor`
kernel parameter takes either kind, checked against numpy."""
import dataclasses

import numpy as np
import pytest

import qdc as qd


@qd.kernel
def axpy_tensor(y: qd.Tensor, x: qd.Tensor, a: qd.f32):
    for i, j in y:
        y[i, j] += a * x[i, j]


@qd.kernel
def norms(v: qd.Tensor, out: qd.Tensor):
    for i in v:
        out[i] = v[i].norm()


@pytest.mark.parametrize("backend_y", [qd.Backend.FIELD, qd.Backend.NDARRAY])
@pytest.mark.parametrize("backend_x", [qd.Backend.FIELD, qd.Backend.NDARRAY])
def test_tensor_parameters_take_fields_and_ndarrays(backend_y, backend_x, arch, rng):
    qd.init(arch=arch)
    y0, x0 = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
    y = qd.tensor(qd.f32, (5, 7), backend=backend_y)
    x = qd.tensor(qd.f32, shape=(5, 7), backend=backend_x)
    y.from_numpy(y0)
    x.from_numpy(x0)
    axpy_tensor(y, x, 0.5)
    axpy_tensor(y, x, 0.5)
    np.testing.assert_allclose(y.to_numpy(), y0 + x0, rtol=1e-6, atol=1e-6)
    assert isinstance(y, qd.Field if backend_y == qd.Backend.FIELD else qd.Ndarray)


@pytest.mark.parametrize("backend", [qd.Backend.FIELD, qd.Backend.NDARRAY])
def test_vector_and_matrix_tensors(backend, arch, rng):
    qd.init(arch=arch)
    v = qd.Vector.tensor(3, qd.f32, (6,), backend=backend)
    m = qd.Matrix.tensor(2, 3, qd.f32, shape=4, backend=backend, needs_grad=True)
    out = qd.tensor(qd.f32, (6,), backend=backend)
    v0 = rng.standard_normal((6, 3)).astype(np.float32)
    v.from_numpy(v0)
    norms(v, out)
    np.testing.assert_allclose(out.to_numpy(), np.linalg.norm(v0, axis=1), rtol=1e-5)
    assert isinstance(v, qd.Tensor) and isinstance(v, qd.VectorTensor) and not isinstance(v, qd.MatrixTensor)
    assert isinstance(m, qd.MatrixTensor) and m.element_shape == (2, 3) and m.shape == (4,)
    assert m.has_grad() and not v.has_grad() and m._unwrap() is m
    assert not isinstance(out, qd.VectorTensor) and isinstance(out, qd.Tensor)
    assert not isinstance(np.zeros(3), qd.Tensor)


def test_tensor_argument_errors():
    with pytest.raises(ValueError, match="qd.Backend"):
        qd.tensor(qd.f32, (3,), backend="gpu")
    with pytest.raises(TypeError, match="unexpected keyword argument.*order"):
        qd.tensor(qd.f32, (3,), order="ji")
    with pytest.raises(TypeError, match="qd.Vector.tensor.*layout"):
        qd.Vector.tensor(3, qd.f32, (3,), layout=(0,))
    with pytest.raises(ValueError, match="not a permutation"):
        qd.tensor(qd.f32, (3, 4), layout=(0, 0))
    with pytest.raises(TypeError, match="storage order of struct members"):
        qd.tensor(qd.f32, (3, 4), layout=qd.Layout.SOA)


@qd.kernel
def stencil(a: qd.template(), out: qd.template()):
    for i, j, k in a:
        out[i, j, k] = a[i, j, k] * 2 + a[(i + 1) % a.shape[0], j, k]


@pytest.mark.parametrize("layout", [(2, 1, 0), (1, 2, 0), (0, 2, 1)])
def test_permuted_field_layouts(layout, arch, rng):
    """A field stored with its axes permuted is indexed in declared order everywhere: kernels,
    Python scope, to_numpy/from_numpy; its memory holds the axes in `layout` order."""
    qd.init(arch=arch)
    shape = (3, 4, 5)
    values = rng.standard_normal(shape).astype(np.float32)
    a = qd.tensor(qd.f32, shape, backend=qd.Backend.FIELD, layout=layout)
    out = qd.tensor(qd.f32, shape, backend=qd.Backend.FIELD, layout=layout[::-1])
    a.from_numpy(values)
    assert a.shape == shape and a.layout == layout and a.storage_shape == tuple(shape[i] for i in layout)
    stencil(a, out)
    np.testing.assert_allclose(out.to_numpy(), values * 2 + np.roll(values, -1, axis=0), rtol=1e-6)
    i, j, k = (int(rng.integers(n)) for n in shape)
    assert a[i, j, k] == values[i, j, k]
    a[i, j, k] = 7.0
    stored = np.empty(a.storage_shape, np.float32)
    stored[...] = np.transpose(a.to_numpy(), layout)
    assert stored[tuple((i, j, k)[axis] for axis in layout)] == 7.0


@qd.kernel
def scaled_sum(a: qd.Tensor, out: qd.types.ndarray(), k: qd.f32):
    for i, j, b in a:
        out[i, j, b] = a[i, j, b] * k + a.shape[0] * 100 + a.shape[2]


@qd.kernel
def typed_rows(a: qd.types.ndarray(dtype=qd.f32, ndim=2), out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = a[i, 0]


@dataclasses.dataclass(frozen=True)
class Batch:
    values: qd.Tensor
    total: qd.Tensor


@qd.kernel
def batch_sums(s: Batch):
    for i, b in s.values:
        s.total[b] += s.values[i, b]


@pytest.mark.parametrize("backend", [qd.Backend.FIELD, qd.Backend.NDARRAY])
@pytest.mark.parametrize("layout", [None, (2, 1, 0), (1, 0, 2)])
def test_array_arguments_with_a_layout(backend, layout, arch, rng):
    """Arrays stored with permuted axes passed as arguments (a qd.Tensor or dtype-less ndarray
    parameter, a dataclass member): compiled for their layout, indexed and sized in declared order."""
    qd.init(arch=arch)
    shape = (4, 3, 5)
    values = rng.standard_normal(shape).astype(np.float32)
    a = qd.tensor(qd.f32, shape, backend=backend, layout=layout)
    out = qd.tensor(qd.f32, shape, backend=qd.Backend.NDARRAY, layout=(0, 2, 1))
    a.from_numpy(values)
    scaled_sum(a, out, 3.0)
    np.testing.assert_allclose(out.to_numpy(), values * 3 + 400 + 5, rtol=1e-6)

    batch = Batch(qd.tensor(qd.f32, (6, 2), backend=backend, layout=(1, 0)),
                  qd.tensor(qd.f32, (2,), backend=backend))
    rows = rng.standard_normal((6, 2)).astype(np.float32)
    batch.values.from_numpy(rows)
    batch_sums(batch)
    np.testing.assert_allclose(batch.total.to_numpy(), rows.sum(0), rtol=1e-5)


def test_a_typed_parameter_refuses_another_layout():
    t = qd.tensor(qd.f32, (4, 3), backend=qd.Backend.NDARRAY, layout=(1, 0))
    with pytest.raises(TypeError, match=r"typed_rows.*'a'.*axes permuted.*qd.types.ndarray\(\)"):
        typed_rows(t, np.zeros(4, np.float32))


def test_identity_layout_and_member_storage_hints(rng):
    t = qd.tensor(qd.i32, (2, 3), backend=qd.Backend.FIELD, layout=(0, 1))
    assert t.layout is None and t.shape == (2, 3)
    s = qd.types.struct(a=qd.f32, v=qd.math.vec3).field(shape=4, layout=qd.Layout.SOA)
    f = qd.Vector.field(3, qd.f32, shape=4, layout=qd.Layout.AOS)
    values = rng.standard_normal((4, 3)).astype(np.float32)
    f.from_numpy(values)
    s.v.from_numpy(values)
    np.testing.assert_array_equal(f.to_numpy(), s.v.to_numpy())
