"""AMDGPU device (runtime/device.py's asynchronous protocol) on HIP through hip-python
(driver.py): the stream device of runtime/devices/stream.py (memory, fenced frees, ctx
uploads, launches, adstack heap sizing, shared with the CUDA device) with HIP's calls.

GPU `QDC_AMDGPU_DEVICE` (default 0) and one non-blocking stream. A kernel's module is the code
object built for this GPU's processor (artifact `hsaco_<gfx>`, gfx from its gcnArchName); a
kernel built for other processors only is refused, naming the processor to add to
`amdgpu_targets`. A buffer is never freed while a launch that may use it is in flight (the
stream device's event-fenced frees): ROCm's allocator hands freed addresses out again at once,
and a recycled address in a running kernel's context corrupts it (seed 001's lesson).
"""
from __future__ import annotations

import os

from ...contract.errors import QdcError
from ..stream import StreamDevice
from .driver import Driver

DEFAULT_BLOCK_DIM = 256
ARTIFACT_PREFIX = "hsaco_"


class UnsupportedKernelError(QdcError, ValueError):
    """A kernel has no code object for this GPU's processor."""


class AmdgpuDevice(StreamDevice):
    arch = "amdgpu"
    default_block_dim = DEFAULT_BLOCK_DIM

    def __init__(self, device_index: int | None = None, *, driver: Driver | None = None):
        d = driver if driver is not None else Driver()
        hip = self.hip = d.hip
        self.device = int(os.environ.get("QDC_AMDGPU_DEVICE", "0")) if device_index is None else device_index
        d.check(hip.hipSetDevice(self.device), f"hipSetDevice({self.device})")
        self.gfx = d.gfx(self.device)
        stream = d.check(hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking), "hipStreamCreateWithFlags")
        self._set_up_stream(d, d.calls(), stream, d.attribute(self.device, "MultiprocessorCount"),
                            d.attribute(self.device, "MaxThreadsPerMultiProcessor"),
                            d.attribute(self.device, "MaxGridDimX"))

    def __repr__(self) -> str:
        return f"AmdgpuDevice({self.gfx!r})"

    def module_image(self, artifacts: dict, meta) -> bytes:
        image = artifacts.get(ARTIFACT_PREFIX + self.gfx)
        if image is None:
            built = sorted(k[len(ARTIFACT_PREFIX):] for k in artifacts
                           if k.startswith(ARTIFACT_PREFIX) and not k.endswith("_sha256"))
            raise UnsupportedKernelError(
                f"kernel '{meta.name}' has no code object for this GPU ({self.gfx}); it was built for "
                f"{', '.join(built) or 'no AMD GPU'}: rebuild with amdgpu_targets including {self.gfx} "
                f"(qdc build --arch amdgpu --amdgpu-targets {','.join(built + [self.gfx])})")
        return bytes(image)

    def close(self) -> None:
        """Wait for the stream and release this device's stream and staging ring; a lost device
        is reset, so that the next device gets a working context."""
        if self.close_stream():
            self.hip.hipStreamDestroy(self.stream)
            if self.lost is not None:
                self.hip.hipSetDevice(self.device)
                self.hip.hipDeviceReset()
