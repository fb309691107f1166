"""A cached CPU tensor is watched by the kernel library's Python entry (runtime/tensor_watch.py):
the launch passes the tensor itself and the entry asks torch's C shim where its data is. Every
way of replacing the storage under the same tensor object is seen: the kernel's writes land in
the new storage and never in the old one, whichever way the launch goes (the entry, the code it
refuses to, a Tape's launches)."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import tensor_watch

torch = pytest.importorskip("torch")


@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s


def _replace_with_set(t, rng):
    t.set_(torch.from_numpy(rng.random(6, dtype=np.float32)))


def _replace_with_offset_storage(t, rng):
    storage = torch.from_numpy(rng.random(20, dtype=np.float32)).untyped_storage()
    t.set_(storage, 5, (9,))  # the same kind of storage, another address and an offset into it


def _replace_by_growing(t, rng):
    t.resize_(1 << 14)  # reallocated
    t.copy_(torch.from_numpy(rng.random(1 << 14, dtype=np.float32)))


def _replace_data(t, rng):
    t.data = torch.from_numpy(rng.random(11, dtype=np.float32))


REPLACEMENTS = [_replace_with_set, _replace_with_offset_storage, _replace_by_growing, _replace_data]


def _launcher():
    return scale.__qdc_launcher__


def _scaled(t, s):
    return (t.numpy().astype(np.float64) * np.float32(s)).astype(np.float32)


@pytest.mark.parametrize("replace", REPLACEMENTS, ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("observed", [False, True], ids=["launched", "under_a_tape"])
def test_a_replaced_storage_is_written_never_the_old_one(rng, replace, observed):
    t = torch.from_numpy(rng.random(8, dtype=np.float32)).clone()  # its own storage: resizable
    for _ in range(3):
        scale(t, 2.0)  # bound, cached, then watched since it came again
    if tensor_watch.data_pointer_function():
        assert _launcher().kinds[0] == "watched" and _launcher().path.name == "python_entry"
    old = t.detach()  # another tensor on the old storage: it must stay as it is (resize_ moves that
    before = old.clone()  # storage's own memory: the old memory is gone, `old` follows it)
    replace(t, rng)
    want = _scaled(t, 3.0)
    if observed:  # a Tape's launches go through the generic launch code
        with qd.ad.Tape(loss=None):
            scale(t, 3.0)
    else:
        scale(t, 3.0)
    np.testing.assert_array_equal(t.numpy(), want)
    if replace is not _replace_by_growing:
        assert torch.equal(old, before)
    want = _scaled(t, 0.5)
    scale(t, 0.5)  # watched again, at its new address
    np.testing.assert_array_equal(t.numpy(), want)


def test_a_numpy_view_of_the_tensor_in_between(rng):
    """A numpy array over the tensor's memory, shorter: the entry binds it (same address, other
    shape), and the tensor that comes next is bound again with its own shape."""
    t = torch.from_numpy(rng.random(10, dtype=np.float32))
    scale(t, 2.0)
    scale(t, 2.0)
    want = t.numpy().copy()
    view = t.numpy()[:3]
    scale(view, 10.0)
    want[:3] *= np.float32(10.0)
    np.testing.assert_array_equal(t.numpy(), want)
    scale(t, 0.5)
    np.testing.assert_array_equal(t.numpy(), want * np.float32(0.5))


def test_alternating_tensors_subclasses_and_other_arrays(rng):
    class Tagged(torch.Tensor):  # may answer data_ptr() itself: checked in Python, never watched
        pass

    a = torch.from_numpy(rng.random(5, dtype=np.float32))
    b = torch.from_numpy(rng.random(7, dtype=np.float32))
    tagged = torch.from_numpy(rng.random(4, dtype=np.float32)).as_subclass(Tagged)
    n = rng.random(6, dtype=np.float32)
    arrays = [a, b, tagged, n, a, a, tagged, tagged, b, n, a]
    want = {id(x): (x.numpy() if isinstance(x, torch.Tensor) else x).copy() for x in (a, b, tagged, n)}
    for k, x in enumerate(arrays):
        s = 1.0 + k / 8
        scale(x, s)
        want[id(x)] = want[id(x)] * np.float32(s)
        got = x.detach().numpy() if isinstance(x, torch.Tensor) else x
        np.testing.assert_array_equal(got, want[id(x)])
        if x is tagged:
            assert _launcher().kinds[0] == "tensor"
    for x in (a, b, tagged):
        np.testing.assert_array_equal(x.detach().numpy(), want[id(x)])


def test_the_shim_answers_as_data_ptr_on_this_torch():
    """Where torch has the C shim (2.2 and later), the runtime uses it; what it checked first is
    what the launches rely on."""
    if not hasattr(torch._C, "_aoti"):
        pytest.skip("this torch has no C shim: cached tensors are checked in Python")
    assert tensor_watch.data_pointer_function() != 0
    t = torch.arange(4, dtype=torch.float32)
    assert tensor_watch.watchable(t) and tensor_watch.watchable(torch.nn.Parameter(t))
    assert not tensor_watch.watchable(t.as_subclass(type("Sub", (torch.Tensor,), {})))
