"""CUDA tensors with kernels on arch cuda (runtime/external_arrays.py): in place, ordered with
PyTorch's current stream both ways, differentiable ops checked by gradcheck, DLPack both ways.
Skipped without an NVIDIA GPU and a CUDA build of torch."""
import numpy as np
import pytest

import qdc as qd
from qdc.runtime import context

torch = pytest.importorskip("torch")
import qdc.torch  # noqa: E402

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)
F64_1D = qd.types.ndarray(dtype=qd.f64, ndim=1)


@pytest.fixture
def cuda(session_cache_dir):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    try:
        qd.init(arch=qd.cuda, cache_dir=session_cache_dir)
        context.current().device  # noqa: B018
    except Exception as e:  # no driver binding, no GPU
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
        pytest.skip(f"arch cuda is not available: {e}")
    yield torch.device("cuda", int(context.current().device.device))
    qd.sync()
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


@qd.kernel
def twice(src: F32_1D, dst: F32_1D):
    for i in range(src.shape[0]):
        dst[i] = 2 * src[i]


@qd.kernel
def settle(x: F64_1D, y: F64_1D, n: qd.i32):
    for i in range(x.shape[0]):
        v = x[i]
        for _ in range(n):  # an adstack in the gradient; polynomial only (no libdevice needed)
            v = v * (0.5 - 0.25 * v) + 0.3 * x[i]
        y[i] += v


def test_cuda_tensors_are_used_in_place(cuda):
    src = torch.arange(1000, dtype=torch.float32, device=cuda)
    dst = torch.zeros(1000, device=cuda)
    address = dst.data_ptr()
    twice(src, dst)
    assert dst.data_ptr() == address
    assert torch.equal(dst, 2 * src)  # read on torch's stream: no qd.sync() in between
    twice(src[::2], dst[1::2])  # strided: copies on the device, written back in order
    assert torch.equal(dst[1::2], 2 * src[::2])


def test_launches_are_ordered_with_torchs_current_stream(cuda):
    side = torch.cuda.Stream(cuda)
    with torch.cuda.stream(side):  # a stream of torch's own that is not qdc's
        for k in range(20):
            a = torch.randn(2048, 2048, device=cuda)
            src = (a @ a).sum(1)[:1024].float()  # milliseconds of work queued before the kernel
            dst = torch.empty(1024, device=cuda)
            twice(src, dst)
            back = dst * 0.5  # torch reads what the kernel wrote, queued right after it
            assert torch.equal(back, src), k


def test_gradcheck_on_cuda(cuda, rng):
    op = qdc.torch.function(settle, inputs=("x",), outputs=("y",))
    x = torch.from_numpy(rng.random(64) * 0.5).to(cuda).requires_grad_()
    y0 = torch.from_numpy(rng.random(64)).to(cuda).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y0: op(x, y0, 12), (x, y0))


def test_dlpack_and_conversions_on_cuda(cuda, rng):
    a = qd.ndarray(qd.f32, 16)
    a.from_numpy(np.arange(16, dtype=np.float32))
    t = torch.from_dlpack(a)
    assert t.device == cuda and t.tolist() == list(range(16))
    out = a.to_torch(device=cuda)
    assert out.device == cuda and torch.equal(out, t)
    source = torch.arange(8, dtype=torch.float32, device=cuda)
    wrapped = qd.from_dlpack(source)
    doubled = qd.ndarray(qd.f32, 8)
    twice(wrapped, doubled)
    qd.sync()
    np.testing.assert_array_equal(doubled.to_numpy(), 2 * np.arange(8, dtype=np.float32))
    f = qd.field(qd.f32, shape=8)
    f.from_torch(source)
    assert torch.equal(f.to_torch(device=cuda), source)


def test_cpu_tensors_on_arch_cuda_are_copied_through_the_host(cuda):
    src, dst = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    twice(src, dst)
    assert torch.equal(dst, 2 * src)
