"""Other libraries' arrays as ndarray arguments: torch tensors and any object with `__dlpack__`
(JAX, CuPy, ...), used in place.

qdc never imports torch for this: a tensor can only exist where its program imported torch, so
`sys.modules` says whether an argument may be one. What a tensor argument becomes:

- a CPU tensor on arch cpu, or a CUDA tensor on arch cuda on the GPU the runtime uses: its own
  memory (`data_ptr()`), so kernel writes are visible in the tensor (zero-copy);
- a CPU tensor on an arch whose memory is the device's (Vulkan, Metal, ...): its numpy view,
  which the launch copies to the device and back as it does a numpy array;
- not C-contiguous (a transpose, a slice with a step): a contiguous copy (`t.contiguous()`)
  that the kernel works on, written back into the original after the launch when the kernel
  writes the parameter;
- a parameter whose gradient the kernel uses (a grad kernel): the tensor must have
  `requires_grad=True`; its `.grad` (created as zeros when None, as Quadrants does) is the
  gradient buffer that the kernel accumulates into.

A DLPack object on the host is taken as a numpy view of its memory (numpy
arrays' rules apply); one on a CUDA device through its capsule (runtime/dlpack_capsule.py).

CUDA ordering. qdc launches on a stream of its own (runtime/devices/stream.py). Binding a CUDA
tensor makes that stream wait for the work already queued on PyTorch's current stream, and once
the kernel's tasks are queued PyTorch's current stream waits for qdc's (each an event recorded
on one stream and waited for on the other, on the device: the host never blocks). Memory that
PyTorch's caching allocator hands out again after the program drops a tensor goes to work on
the stream that allocated it, which the second wait orders after the kernel.
"""
from __future__ import annotations

import sys
import weakref

import numpy as np

from . import dlpack_capsule
from .argument_checks import ArrayMismatchError, argument_name
from .contract.foreign_arrays import is_tensor, qdc_dtype_name


def describe(a) -> str:
    """How an error message names an external array: `a torch.Tensor of dtype torch.float64
    with shape (3, 4) on cpu`."""
    if is_tensor(a):
        return f"a torch.Tensor of dtype {a.dtype} with shape {tuple(a.shape)} on {a.device}"
    return f"a {type(a).__module__.split('.')[0]}.{type(a).__name__} (DLPack)"


def host_view(a) -> np.ndarray | None:
    """A numpy view of a host (CPU) external array's memory (no copy); None where its memory is
    a device's."""
    if is_tensor(a):
        if a.device.type != "cpu":
            return None
        return a.detach().numpy()
    kind, _ = a.__dlpack_device__()
    if int(kind) not in (1, 3):  # kDLCPU, kDLCUDAHost: memory the host addresses
        return None
    from .contract.types import by_name
    memory = dlpack_capsule.import_array(a)
    if memory.dtype_name is None or not memory.contiguous:  # numpy's view (and its errors)
        return np.from_dlpack(a)
    return dlpack_capsule.host_array(memory, by_name(memory.dtype_name).np_dtype)


def readable(a) -> np.ndarray:
    """The contents of an external array as numpy, for the host to read before a launch (adstack
    sizes): its host view, or a copy of a CUDA tensor (torch waits for the work that writes it)."""
    view = host_view(a)
    if view is not None:
        return view
    if is_tensor(a):
        return a.detach().cpu().numpy()
    raise TypeError(f"a {type(a).__name__} on a device: the host cannot read it to size the kernel's adstacks")


class Bound:
    """What binding an external array gives the launch: the address, shape and gradient address
    to write into the ctx, whether the launch may skip rebinding it while the same tensor at
    the same address comes again (`cacheable`), or a numpy array to bind instead (`host`)."""
    __slots__ = ("ptr", "shape", "grad_ptr", "cacheable", "host")

    def __init__(self, ptr=0, shape=(), grad_ptr=0, cacheable=False, host=None):
        self.ptr, self.shape, self.grad_ptr, self.cacheable, self.host = ptr, shape, grad_ptr, cacheable, host


def bind(meta, index: int, a, device, after: list, needs_grad: bool, refuse_grad: bool, writes: bool) -> Bound:
    """Check external array `a` for ndarray parameter `index` and bind it (see the module
    docstring); appends to `after` what must run once the launch is queued (write-backs,
    stream joins). Raises TypeError/ValueError naming kernel and parameter."""
    p = meta.params[index]
    if not is_tensor(a):
        return _bind_dlpack(meta, index, a, device)
    shape = tuple(a.shape)
    if qdc_dtype_name(a) != p.dtype:
        raise TypeError(_mismatch(meta, index, a))
    if len(shape) != p.ndim:
        raise ArrayMismatchError(_mismatch(meta, index, a, f" (ndim={len(shape)})"))
    if p.element_shape and shape[p.ndim - len(p.element_shape):] != tuple(p.element_shape):
        raise ArrayMismatchError(_mismatch(meta, index, a))
    if needs_grad and not a.requires_grad:
        raise ValueError(f"{argument_name(meta, index)}: the kernel uses this array's gradient: pass a tensor with "
                         f"requires_grad=True (its .grad receives the gradient), got {describe(a)}")
    if refuse_grad and a.requires_grad and a.is_leaf:
        raise ValueError(f"{argument_name(meta, index)}: this gradient kernel was compiled without a gradient for "
                         f"'{p.name}' (built ahead of time with needs_grad=None), so the tensor's .grad would stay "
                         f"zero; annotate it needs_grad=True (and rebuild), or pass a tensor without requires_grad")
    if not (device.arch == "cpu" and a.is_cpu or _tensor_on_device(meta, index, a, device)):
        return Bound(host=a.detach().numpy())  # a CPU tensor on a device with its own memory: copied as numpy is
    data = a
    contiguous = a.is_contiguous()
    if not contiguous:
        data = a.detach().contiguous()
        # the copy lives until the launch is queued (on CUDA its memory is reused only after the kernel: see above)
        after.append((lambda: a.detach().copy_(data)) if writes else (lambda: data))
    grad_ptr = 0
    if needs_grad:
        grad = a.grad
        if grad is None:
            torch = sys.modules["torch"]
            grad = a.grad = torch.zeros_like(a, memory_format=torch.contiguous_format)
        if not grad.is_contiguous() or grad.dtype != a.dtype or grad.device != a.device:
            raise ValueError(f"{argument_name(meta, index)}: the tensor's .grad must be a C-contiguous tensor of its "
                             f"dtype on its device")
        grad_ptr = grad.data_ptr()
    if device.arch == "cuda":
        _order_with_torch(device, after)
    # the launch code rebinds a cached tensor whose address changed (resize_, set_, .data =)
    return Bound(data.data_ptr(), shape, grad_ptr, cacheable=contiguous and not needs_grad and device.arch == "cpu")


def _wanted(p) -> str:
    want = f"an ndarray of {p.dtype} with ndim={p.ndim}"
    if p.element_shape:
        want += f" ending in the element's axes {tuple(p.element_shape)}"
    return want


def _mismatch(meta, index: int, a, detail: str = "") -> str:
    return f"{argument_name(meta, index)}: expected {_wanted(meta.params[index])}, got {describe(a)}{detail}"


def _tensor_on_device(meta, index: int, a, device) -> bool:
    """Whether tensor `a`'s memory is `device`'s (else it is a CPU tensor that the launch copies
    through the host); a tensor on another device is refused."""
    where, given = argument_name(meta, index), describe(a)
    kind = a.device.type
    if device.arch == "cpu":
        if kind != "cpu":
            raise ArrayMismatchError(f"{where}: kernels on arch cpu take CPU tensors, got {given} "
                                     f"(pass t.cpu(), or qd.init(arch=qd.cuda) for CUDA tensors)")
        return True
    if device.arch == "cuda" and kind == "cuda":
        ordinal = cuda_ordinal(device)
        if a.device.index != ordinal:
            raise ArrayMismatchError(f"{where}: the runtime uses cuda:{ordinal}, got {given}")
        return True
    if kind == "cpu":
        return False
    raise ArrayMismatchError(f"{where}: kernels on arch {device.arch} take CPU tensors"
                             f"{' or CUDA ones' if device.arch == 'cuda' else ''}, got {given}")


def cuda_ordinal(device) -> int:
    """The ordinal of the GPU a CUDA device runs on (as torch numbers them: both follow
    CUDA_VISIBLE_DEVICES)."""
    return int(device.device)


def _bind_dlpack(meta, index: int, a, device) -> Bound:
    view = host_view(a)
    if view is not None:  # host memory: bound as the numpy array it is (numpy's rules, copies included)
        return Bound(host=view)
    where = argument_name(meta, index)
    p = meta.params[index]
    memory = dlpack_capsule.import_array(a, stream=qdc_stream(device) if device.arch == "cuda" else None)
    if device.arch != "cuda" or memory.device != ("cuda", cuda_ordinal(device)):
        raise ArrayMismatchError(f"{where}: kernels on arch {device.arch} cannot use an array on "
                                 f"{memory.device[0]}:{memory.device[1]}")
    if memory.dtype_name != p.dtype or len(memory.shape) != p.ndim:
        raise ArrayMismatchError(f"{where}: expected {_wanted(p)}, got a DLPack array of "
                                 f"{memory.dtype_name} with shape {memory.shape}")
    if not memory.contiguous:
        raise ValueError(f"{where}: the DLPack array is not C-contiguous, and a copy of it on the device could "
                         f"not be written back: pass a contiguous array")
    return Bound(memory.ptr, memory.shape, 0, host=None)


# ---- CUDA: ordering with PyTorch's current stream -----------------------------------------------

def qdc_stream(device) -> int:
    return int(device.stream)


_TORCH_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> torch's view of its stream


def _order_with_torch(device, after: list) -> None:
    """Make qdc's stream wait for PyTorch's current stream now, and PyTorch's current stream
    wait for qdc's once the launch is queued (first in `after`, before any write-back of a copy
    that torch queues; once per launch however many tensors)."""
    torch = sys.modules["torch"]
    ours = _TORCH_STREAMS.get(device)
    if ours is None:
        ours = _TORCH_STREAMS[device] = torch.cuda.ExternalStream(qdc_stream(device),
                                                                  device=torch.device("cuda", cuda_ordinal(device)))
    theirs = torch.cuda.current_stream(ours.device)
    if not any(getattr(f, "joins_torch", False) for f in after):
        ours.wait_stream(theirs)

        def join():
            theirs.wait_stream(ours)
        join.joins_torch = True
        after.insert(0, join)
