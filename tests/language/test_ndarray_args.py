"""Ndarray parameters (docs/api.md): `needs_grad=None` follows the argument (a qd.ndarray with a
gradient gets it, in the kernel's specialisation and cache key), and read-only numpy arrays
(flags.writeable False, read-only memmaps) are accepted where the kernel only reads them and
refused, with nothing written, where it writes them; in direct mode and in a loaded module."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import options as options_mod
from qdc.compiler.commands.build import build
from qdc.runtime.contract import artifact as A
from qdc.runtime.loader import load

loss = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def sum_sin_x(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):  # needs_grad follows the argument
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def sum_sin_x_any(a: qd.types.ndarray()):  # dtype, ndim and needs_grad from the argument
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def sum_sin_x_no_grad(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=False)):
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def scale_into(out: qd.types.ndarray(dtype=qd.f64, ndim=1), a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = a[i] * 2.0


@qd.kernel
def clear_grad(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):  # uses .grad: the forward follows too
    for i in range(a.shape[0]):
        a.grad[i] = 0.0


def _points(n=7):
    return np.linspace(0.1, 1.3, n)


def _analytic(xs):
    return np.cos(xs) * xs + np.sin(xs)


def _central_differences(xs, h=1e-6):
    f = lambda v: np.sum(np.sin(v) * v)  # noqa: E731
    return np.array([(f(xs + h * e) - f(xs - h * e)) / (2 * h) for e in np.eye(len(xs))])


def _grad_of(kernel, xs):
    a = qd.ndarray(qd.f64, (len(xs),), needs_grad=True)
    a.from_numpy(xs)
    loss[None] = 0.0
    kernel(a)
    loss.grad[None] = 1.0
    kernel.grad(a)
    return a, a.grad.to_numpy()


# ---- needs_grad=None follows the argument -----------------------------------------------------

@pytest.mark.parametrize("kernel", [sum_sin_x, sum_sin_x_any])
def test_an_unannotated_ndarray_gets_the_gradient_of_a_needs_grad_argument(kernel):
    xs = _points()
    a, grad = _grad_of(kernel, xs)
    assert loss[None] == pytest.approx(np.sum(np.sin(xs) * xs), rel=1e-12)
    np.testing.assert_allclose(grad, _analytic(xs), rtol=1e-12)
    np.testing.assert_allclose(grad, _central_differences(xs), rtol=1e-6)


def test_a_gradient_that_cannot_follow_a_keyword_argument_is_refused_not_zero():
    a, _ = _grad_of(sum_sin_x, _points())
    with pytest.raises(ValueError, match="(?s)'sum_sin_x'.*'a'.*pass it positionally"):
        sum_sin_x.grad(a=a)  # kernel.grad sees only positional arguments to specialise on
    sum_sin_x(a=a)  # the forward variant needs no gradient


def test_explicit_needs_grad_false_keeps_no_gradient():
    _, grad = _grad_of(sum_sin_x_no_grad, _points())
    np.testing.assert_array_equal(grad, np.zeros(7))


def test_arguments_with_and_without_a_gradient_share_the_kernel_but_not_its_grad_variant():
    xs = _points()
    plain = xs.copy()
    sum_sin_x(plain)  # a numpy array: no gradient anywhere, the grad variant runs without one
    loss.grad[None] = 1.0
    sum_sin_x.grad(plain)
    _, grad = _grad_of(sum_sin_x, xs)
    np.testing.assert_allclose(grad, _analytic(xs), rtol=1e-12)
    kernel = sum_sin_x._primal
    assert kernel.compile((plain,)).deps.key == kernel.compile((qd.ndarray(qd.f64, (3,), needs_grad=True),)).deps.key
    with_grad = kernel.compile((qd.ndarray(qd.f64, (3,), needs_grad=True),), variant="grad")
    without = kernel.compile((plain,), variant="grad")
    assert with_grad.deps.key != without.deps.key
    assert [p.needs_grad for p in with_grad.meta.params] == [True]
    assert [p.needs_grad for p in without.meta.params] == [False]
    # The forward variant does not depend on the gradient: it still launches on its own.
    sum_sin_x(xs)
    assert kernel.launches_on_its_own()


def test_a_kernel_using_the_grad_of_an_unannotated_ndarray_follows_in_forward_too():
    a = qd.ndarray(qd.f64, (4,), needs_grad=True)
    a.grad.from_numpy(np.arange(4.0))
    clear_grad(a)
    np.testing.assert_array_equal(a.grad.to_numpy(), np.zeros(4))
    with pytest.raises(qd.QdcCompileError, match="has no .grad"):
        clear_grad(np.zeros(4))


@qd.kernel
def sum_sin_x_needs_grad(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True)):
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def clear_grad_annotated(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True)):
    for i in range(a.shape[0]):
        a.grad[i] = 0.0


def test_a_forward_kernel_using_a_gradient_refuses_arrays_without_one():
    with pytest.raises(TypeError, match="(?s)'clear_grad_annotated'.*'a'.*gradient"):
        clear_grad_annotated(np.zeros(4))  # used to write through a null gradient pointer
    with pytest.raises(ValueError, match="(?s)'clear_grad_annotated'.*'a'.*needs_grad=True"):
        clear_grad_annotated(qd.ndarray(qd.f64, (4,)))
    sum_sin_x_needs_grad(np.zeros(4))  # its forward code never touches the gradient: any array
    forward = sum_sin_x_needs_grad._primal.compile((np.zeros(4),))
    assert [p.needs_grad for p in forward.meta.params] == [False]  # so it has no gradient word


# ---- read-only arrays -----------------------------------------------------------------------

def _read_only(values):
    a = np.array(values, np.float64)
    a.flags.writeable = False
    return a


def test_read_only_array_is_accepted_where_only_read_and_refused_where_written():
    a = _read_only(_points())
    out = np.zeros(7)
    scale_into(out, a)
    np.testing.assert_array_equal(out, a * 2)
    untouched = np.full(7, -1.0)
    read_only_out = _read_only(np.full(7, 5.0))
    with pytest.raises(ValueError, match="(?s)'scale_into'.*'out'.*read-only"):
        scale_into(read_only_out, untouched)
    np.testing.assert_array_equal(read_only_out, np.full(7, 5.0))


def test_an_array_made_read_only_after_it_was_bound_is_refused():
    out, a = np.zeros(7), _points()
    scale_into(out, a)
    out.flags.writeable = False  # the same object the launcher cached
    with pytest.raises(ValueError, match="(?s)'scale_into'.*'out'.*read-only"):
        scale_into(out, a + 1)
    np.testing.assert_array_equal(out, a * 2)
    out.flags.writeable = True
    scale_into(out, a + 1)
    np.testing.assert_array_equal(out, (a + 1) * 2)


def test_read_only_memmap_is_read_and_never_written(tmp_path):
    path = tmp_path / "data.bin"
    _points().tofile(path)
    mm = np.memmap(path, dtype=np.float64, mode="r", shape=(7,))
    out = np.zeros(7)
    scale_into(out, mm)
    np.testing.assert_array_equal(out, _points() * 2)
    with pytest.raises(ValueError, match="(?s)'scale_into'.*'out'.*read-only"):
        scale_into(mm, out)  # would crash the process writing a PROT_READ mapping
    np.testing.assert_array_equal(np.fromfile(path), _points())


weight = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def weighted_sum_sin_x(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=False)):
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i] * weight[None]


def test_grad_kernel_reads_a_read_only_primal(rng):
    values = rng.uniform(-2.0, 2.0, 9)
    xs = _read_only(values)
    weight[None] = rng.uniform(0.5, 2.0)
    loss[None] = 0.0
    weighted_sum_sin_x(xs)
    weight.grad[None] = 0.0
    loss.grad[None] = 1.0
    weighted_sum_sin_x.grad(xs)  # the grad kernel reads the primal, writes only gradients
    # d(weight * sum(sin(x) x)) / d weight: right only if the grad kernel read every x
    assert weight.grad[None] == pytest.approx(np.sum(np.sin(values) * values), rel=1e-12, abs=1e-12)
    np.testing.assert_array_equal(xs, values)


def test_metadata_records_which_ndarrays_a_kernel_writes():
    out, a = np.zeros(3), np.zeros(3)
    forward = scale_into._primal.compile((out, a))
    assert [(p.name, p.writes) for p in forward.meta.params] == [("out", True), ("a", False)]
    grad = sum_sin_x._primal.compile((qd.ndarray(qd.f64, (3,), needs_grad=True),), variant="grad")
    assert [p.writes for p in grad.meta.params] == [False]  # only a.grad
    d = forward.meta.to_dict()
    assert [p.writes for p in A.KernelMeta.from_dict(d).params] == [True, False]
    d["params"] = [p[:5] for p in d["params"]]  # written before the field existed: assume it writes
    assert [p.writes for p in A.KernelMeta.from_dict(d).params] == [True, True]


# ---- ahead of time --------------------------------------------------------------------------

AOT_MODULE = '''
import qdc as qd

loss = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def sum_sin_x(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def sum_sin_x_grad(a: qd.types.ndarray(dtype=qd.f64, ndim=1, needs_grad=True)):
    for i in range(a.shape[0]):
        loss[None] += qd.sin(a[i]) * a[i]


@qd.kernel
def scale_into(out: qd.types.ndarray(dtype=qd.f64, ndim=1), a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = a[i] * 2.0
'''


@pytest.fixture(scope="module")
def aot_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("ndarray_aot")
    (root / "src").mkdir()
    (root / "src" / "ndmod.py").write_text(AOT_MODULE, encoding="utf-8")
    report = build([str(root / "src")], ["cpu"], options_mod.Options(), str(root / "cache"), log=lambda _: None,
                   out=lambda _: None)
    assert report.ok, report.errors
    return str(root / "cache")


def test_loaded_module_refuses_read_only_arrays_it_writes(aot_module, tmp_path):
    mod = load(aot_module, "ndmod")
    out = np.zeros(7)
    mod.scale_into(out, _read_only(_points()))
    np.testing.assert_array_equal(out, _points() * 2)
    path = tmp_path / "data.bin"
    _points().tofile(path)
    mm = np.memmap(path, dtype=np.float64, mode="r", shape=(7,))
    mod.scale_into(out, mm)
    with pytest.raises(ValueError, match="(?s)'scale_into'.*'out'.*read-only"):
        mod.scale_into(mm, out)
    np.testing.assert_array_equal(np.fromfile(path), _points())


def test_loaded_module_gradients_of_ndarrays(aot_module):
    mod = load(aot_module, "ndmod")
    xs = _points()
    a = qd.ndarray(qd.f64, (7,), needs_grad=True)
    a.from_numpy(xs)
    mod.sum_sin_x_grad(a)
    mod.loss.grad[None] = 1.0
    mod.sum_sin_x_grad.grad(a)  # annotated needs_grad=True: built with the gradient
    np.testing.assert_allclose(a.grad.to_numpy(), _analytic(xs), rtol=1e-12)
    mod.sum_sin_x.grad(xs)  # unannotated: built without one, which a numpy array does not need
    with pytest.raises(ValueError, match="(?s)'sum_sin_x'.*'a'.*without a gradient for 'a'"):
        mod.sum_sin_x.grad(a)  # rather than leave its gradient silently zero
