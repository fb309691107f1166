"""The launch path: `@qd.kernel` returns a plain function that becomes its own launcher once
compiled, falls back to the slow path after `qd.init` and under a Tape, specialises its array
test to numpy arrays or qd.ndarrays, and the same for kernels of a loaded module."""
import inspect
import textwrap
import types

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.runtime.loader import load

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def blend(out: F32_1D, a: F32_1D, w: qd.f32, k: qd.i32):
    """out = w * a + k"""
    for i in range(out.shape[0]):
        out[i] = w * a[i] + k


@qd.kernel
def label(a: qd.types.ndarray(dtype=qd.i32, ndim=2)):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        a[i, j] = i * 100 + j


def label_reference(shape):
    i, j = np.indices(shape)
    return (i * 100 + j).astype(np.int32)


def test_a_kernel_is_a_plain_function_with_the_kernels_signature(rng):
    assert type(blend) is types.FunctionType
    assert list(inspect.signature(blend).parameters) == ["out", "a", "w", "k"]
    assert blend.__name__ == "blend" and blend.__doc__ == "out = w * a + k"
    assert [p.name for p in blend._primal.params] == ["out", "a", "w", "k"]
    a, out = rng.random(37, dtype=np.float32), np.zeros(37, np.float32)
    blend(out, a, 0.5, 3)
    np.testing.assert_allclose(out, np.float32(0.5) * a + 3, rtol=1e-6)
    with pytest.raises(TypeError, match=r"blend\(\) missing 1 required positional argument: 'k'"):
        blend(out, a, 0.5)
    with pytest.raises(TypeError, match=r"blend\(\) takes 4 positional arguments but 5 were given"):
        blend(out, a, 0.5, 3, 4)


def test_the_function_launches_on_its_own_until_qd_init(rng, session_cache_dir):
    @qd.kernel
    def shift(a: F32_1D, s: qd.f32):
        for i in range(a.shape[0]):
            a[i] += s

    assert not shift._primal.launches_on_its_own()  # not compiled yet
    a = rng.random(16, dtype=np.float32)
    want = a + np.float32(1.5)
    shift(a, 1.5)
    assert shift._primal.launches_on_its_own()
    np.testing.assert_allclose(a, want, rtol=1e-6)
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    assert not shift._primal.launches_on_its_own()
    shift(a, -4.0)  # the same array object: the new runtime binds it again
    np.testing.assert_allclose(a, want - 4, rtol=1e-6)
    assert shift._primal.launches_on_its_own()


def test_a_tape_records_kernels_that_already_launch_on_their_own(rng):
    x = qd.field(qd.f64, shape=8, needs_grad=True)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def cube_sum(p: qd.f64):
        for i in x:
            loss[None] += p * x[i] ** 3

    xs = rng.uniform(-1, 1, 8)
    x.from_numpy(xs)
    cube_sum(2.0)  # compiled and launching on its own before the Tape
    assert cube_sum._primal.launches_on_its_own()
    with qd.ad.Tape(loss=loss):
        cube_sum(2.0)
        assert not cube_sum._primal.launches_on_its_own()
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * 3 * xs ** 2, rtol=1e-12)  # recorded, differentiated
    before = loss[None]
    cube_sum(1.0)  # after the Tape: launched, not recorded
    np.testing.assert_allclose(loss[None], before + (xs ** 3).sum(), rtol=1e-12)
    assert cube_sum._primal.launches_on_its_own()


def test_switching_between_numpy_and_qd_ndarray_keeps_every_check(rng):
    a = np.zeros((3, 5), np.int32)
    label(a)
    d = qd.ndarray(qd.i32, (4, 2))
    label(d)
    np.testing.assert_array_equal(d.to_numpy(), label_reference((4, 2)))
    a.shape = (5, 3)  # in place, while the cached array is the qd.ndarray
    label(a)
    np.testing.assert_array_equal(a, label_reference((5, 3)))
    a.shape = (15, 1)  # in place again, now that the cached array is `a` itself
    label(a)
    np.testing.assert_array_equal(a, label_reference((15, 1)))
    label(d)
    with pytest.raises(TypeError, match="(?s)'label'.*'a'.*float32"):
        label(np.zeros((2, 2), np.float32))
    strided = np.zeros((4, 4), np.int32)
    label(strided[:, ::2])  # a copy, written back
    np.testing.assert_array_equal(strided[:, ::2], label_reference((4, 2)))
    np.testing.assert_array_equal(strided[:, 1::2], 0)
    with pytest.raises(ValueError, match="(?s)'label'.*'a'.*ndim=3"):
        label(qd.ndarray(qd.i32, (2, 2, 2)))


def test_read_only_and_empty_numpy_arrays(rng):
    a = rng.random(20, dtype=np.float32)
    a.flags.writeable = False  # no writable buffer to take the pointer from
    out = np.zeros(20, np.float32)
    blend(out, a, 2.0, -1)
    np.testing.assert_allclose(out, np.float32(2) * a - 1, rtol=1e-6)
    empty = np.zeros(0, np.float32)
    blend(empty, empty, 2.0, -1)  # nothing to do, nothing touched
    blend(out, a, 0.25, 7)
    np.testing.assert_allclose(out, np.float32(0.25) * a + 7, rtol=1e-6)


def test_templated_kernels_launch_through_their_dispatch(rng):
    @qd.kernel
    def double(a: qd.types.ndarray()):
        for i in range(a.shape[0]):
            a[i] = a[i] * 2

    for dtype in (np.float64, np.int32, np.float64):
        a = (rng.random(11) * 100).astype(dtype)
        want = a * 2
        double(a)
        np.testing.assert_array_equal(a, want)
    assert double._primal.launches_on_its_own()  # one lookup on the array's dtype and rank
    with pytest.raises(TypeError, match=r"double\(\) missing 1 required positional argument: 'a'"):
        double()


MODULE = '''
import qdc as qd

total = qd.field(qd.f32, shape=())


@qd.kernel
def accumulate(a: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.f32):
    for i in range(a.shape[0]):
        total[None] += w * a[i]
'''


def test_loaded_kernels_are_plain_functions_too(tmp_path, rng, session_cache_dir):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "acc.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    cache = str(tmp_path / "cache")
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "kernels"), "--cache", cache])
    assert result.exit_code == 0, result.output
    mod = load(cache, "acc")
    assert type(mod.accumulate) is types.FunctionType
    a = rng.random(50, dtype=np.float32)
    mod.accumulate(a, 2.0)
    np.testing.assert_allclose(mod.total[None], 2 * a.sum(), rtol=1e-5)
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)  # fields re-materialise, zeroed
    mod.accumulate(a, -1.0)
    np.testing.assert_allclose(mod.total[None], -a.sum(), rtol=1e-5)
    with pytest.raises(TypeError, match=r"accumulate\(\) missing 1 required positional argument: 'w'"):
        mod.accumulate(a)
    with pytest.raises(qd.QdcError, match="no reverse-mode variant"):
        mod.accumulate.grad(a, 1.0)
