"""HIP through `hip-python` (`hip.hip`), and nothing else. The binding imports without ROCm
and dlopens libamdhip64.so at its first call: a missing binding, runtime or GPU is
`AmdgpuUnavailableError` saying which, never a raw traceback. Every call returns a tuple
whose first item is a hipError_t; `check` (runtime/devices/stream.py's StatusDriver) turns a
failure into an exception naming the call."""
from __future__ import annotations

from types import SimpleNamespace

from ...contract.errors import QdcError
from ..stream import StatusDriver, load_status_binding, status_name

PACKAGE = "hip-python"
# Sticky errors: the device is unusable after them until hipDeviceReset.
LOST_STATUSES = ("hipErrorLaunchTimeOut", "hipErrorIllegalAddress", "hipErrorLaunchFailure", "hipErrorAssert")


class AmdgpuUnavailableError(QdcError, RuntimeError):
    """No usable HIP: the binding, the ROCm runtime or an AMD GPU is missing."""


def load_binding():
    """`hip.hip`, initialised (hipInit); AmdgpuUnavailableError when it cannot be."""
    def import_binding():
        from hip import hip
        return hip
    return load_status_binding(
        import_binding, AmdgpuUnavailableError, arch="amdgpu", package=PACKAGE, init="hipInit",
        device_count="hipGetDeviceCount", success=lambda hip: hip.hipError_t.hipSuccess, error_name="hipGetErrorName",
        no_runtime="no ROCm HIP runtime found ({}); install ROCm (libamdhip64.so) or use another arch",
        unusable="no usable AMD GPU", no_gpu="the HIP runtime sees no GPU")


def base_gfx(arch_name) -> str:
    """"gfx90a" of a gcnArchName such as "gfx90a:sramecc+:xnack-"."""
    if isinstance(arch_name, bytes):
        arch_name = arch_name.split(b"\0", 1)[0].decode(errors="replace")
    return str(arch_name).split(":", 1)[0].strip()


class Driver(StatusDriver):
    """The binding, its status codes, `check` (runtime/devices/stream.py) and the stream device's calls."""
    arch = "amdgpu"

    def __init__(self, hip=None):
        self.hip = hip if hip is not None else load_binding()
        self.ok = self.hip.hipError_t.hipSuccess
        self.not_ready = self.hip.hipError_t.hipErrorNotReady
        self.out_of_memory = self.hip.hipError_t.hipErrorOutOfMemory
        self.lost = self.statuses(self.hip.hipError_t, LOST_STATUSES)

    def error_name(self, err) -> str:
        return status_name(self.hip, "hipGetErrorName", err)

    def calls(self):
        """The driver calls of a stream device (runtime/devices/stream.py CALLS), by role."""
        h = self.hip
        return SimpleNamespace(
            mem_alloc=h.hipMalloc, mem_free=h.hipFree, memset_d8_async=h.hipMemsetD8Async,
            memset_d16_async=h.hipMemsetD16Async, memset_d32_async=h.hipMemsetD32Async,
            memcpy_htod_async=h.hipMemcpyHtoDAsync, memcpy_dtoh_async=h.hipMemcpyDtoHAsync,
            memcpy_dtod_async=h.hipMemcpyDtoDAsync,
            stream_synchronize=h.hipStreamSynchronize,
            event_create=lambda: h.hipEventCreateWithFlags(h.hipEventDisableTiming), event_record=h.hipEventRecord,
            event_query=h.hipEventQuery, event_synchronize=h.hipEventSynchronize, event_destroy=h.hipEventDestroy,
            module_load_data=h.hipModuleLoadData, module_get_function=h.hipModuleGetFunction,
            launch_kernel=h.hipModuleLaunchKernel, host_alloc=h.hipHostMalloc, host_free=h.hipHostFree)

    def attribute(self, device: int, name: str) -> int:
        attr = getattr(self.hip.hipDeviceAttribute_t, f"hipDeviceAttribute{name}")
        return int(self.check(self.hip.hipDeviceGetAttribute(attr, device), f"hipDeviceGetAttribute({name})"))

    def gfx(self, device: int) -> str:
        """The device's processor, e.g. "gfx90a"."""
        props = self.hip.hipDeviceProp_t()
        self.check(self.hip.hipGetDeviceProperties(props, device), "hipGetDeviceProperties")
        return base_gfx(props.gcnArchName)
