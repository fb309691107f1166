"""Fields' and ndarrays' `.to_torch(device=None, copy=True)` and `.from_torch(t)`, as in
Quadrants: copies between a field or ndarray and a torch tensor, or (`copy=False`) a tensor
sharing the array's memory."""
from __future__ import annotations

import sys

from . import context, dlpack_capsule


def to_torch(array, device=None, copy=True):
    """A copy of a field's or ndarray's contents as a new tensor on `device` (default: the CPU);
    on arch cuda, a CUDA tensor is copied on the device (through DLPack), never through the host.
    `copy=False` (Quadrants'): a tensor over the array's own memory instead, shaped and indexed
    in declared order (a permuted view of an array with a layout), on the runtime's device; a
    ValueError where none can be made (another device asked for, memory of a GPU arch other than
    cuda). `copy=None`: such a tensor where it can be made, else a copy. A shared tensor sees
    later launches' writes once they completed (`qd.sync()` on a GPU) and lives no longer than
    the array's memory (until the next `qd.init`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811  (the caller asked for a tensor)
    if copy is not True:
        shared = _shared_tensor(array, device, torch)
        if shared is not None:
            return shared
        if copy is False:
            raise ValueError(f"{array._what()}: to_torch(copy=False) cannot share the memory of an array on "
                             f"arch {context.current().arch} with a tensor on {device or 'the CPU'}; "
                             f"use to_torch(copy=None) to copy where sharing is impossible")
    target = torch.device(device) if device is not None else torch.device("cpu")
    if target.type == "cuda" and context.current().arch == "cuda":
        return torch.from_dlpack(dlpack_capsule.export(array)).clone().to(target)
    return torch.from_numpy(array.to_numpy()).to(target)


def _shared_tensor(array, device, torch):
    """A tensor over the array's memory on the requested device, or None where none can be."""
    arch = context.current().arch
    target = None if device is None else torch.device(device)
    if arch == "cuda" and (target is None or target.type == "cuda"):
        stored = torch.from_dlpack(dlpack_capsule.export(array))
        if array.layout is None:
            return stored
        inverse = [array.layout.index(a) for a in range(len(array.shape))]
        return stored.permute(*inverse, *range(len(array.shape), stored.dim()))
    if target is not None and target.type != "cpu":
        return None
    view = array._synced_view()
    return None if view is None else torch.from_numpy(array._canonical(view))


def from_torch(array, tensor) -> None:
    """Overwrite a field's or ndarray's contents with `tensor`'s (same shape, as from_numpy)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{array._what()}: from_torch takes a torch.Tensor, got {type(tensor).__name__}")
    array.from_numpy(tensor.detach().cpu().numpy())
