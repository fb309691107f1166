"""Fields' and ndarrays' `.to_torch(device=None)` and `.from_torch(t)`, as in Quadrants: copies
between a field or ndarray and a torch tensor."""
from __future__ import annotations

import sys

from . import context, dlpack_capsule


def to_torch(array, device=None):
    """A copy of a field's or ndarray's contents as a new tensor on `device` (default: the CPU);
    on arch cuda, a CUDA tensor is copied on the device (through DLPack), never through the host."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811  (the caller asked for a tensor)
    target = torch.device(device) if device is not None else torch.device("cpu")
    if target.type == "cuda" and context.current().arch == "cuda":
        return torch.from_dlpack(dlpack_capsule.export(array)).clone().to(target)
    return torch.from_numpy(array.to_numpy()).to(target)


def from_torch(array, tensor) -> None:
    """Overwrite a field's or ndarray's contents with `tensor`'s (same shape, as from_numpy)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{array._what()}: from_torch takes a torch.Tensor, got {type(tensor).__name__}")
    array.from_numpy(tensor.detach().cpu().numpy())
