"""The CUDA driver API through `cuda-bindings` (`cuda.bindings.driver`), and nothing else.

Every binding call returns a tuple whose first item is a CUresult; `check` turns a failure
into an exception naming the call. A missing binding or driver is `CudaUnavailableError`
naming the package to install, never a raw traceback.
"""
from __future__ import annotations

from ...contract.errors import QdcError
from ..stream import StatusDriver, load_status_binding, status_name

PACKAGE = "cuda-bindings"
# Sticky errors: the context is unusable after them (every later call returns them) until
# cuDevicePrimaryCtxReset.
LOST_STATUSES = ("CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED",
                 "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
                 "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_ECC_UNCORRECTABLE")


class CudaUnavailableError(QdcError, RuntimeError):
    """No usable CUDA: the binding, the driver or a GPU is missing."""


def load_binding():
    """`cuda.bindings.driver`, initialised (cuInit); CudaUnavailableError when it cannot be."""
    def import_binding():
        from cuda.bindings import driver as cu
        return cu
    return load_status_binding(
        import_binding, CudaUnavailableError, arch="cuda", package=PACKAGE, init="cuInit",
        device_count="cuDeviceGetCount", success=lambda cu: cu.CUresult.CUDA_SUCCESS, error_name="cuGetErrorName",
        no_runtime="no NVIDIA driver found ({}); install the NVIDIA driver or use another arch",
        unusable="no usable NVIDIA GPU or driver", no_gpu="the NVIDIA driver sees no GPU")


class Driver(StatusDriver):
    """The binding, its status codes, `check` (runtime/devices/stream.py) and the stream device's calls."""
    arch = "cuda"

    def __init__(self):
        self.cu = load_binding()
        self.ok = self.cu.CUresult.CUDA_SUCCESS
        self.not_ready = self.cu.CUresult.CUDA_ERROR_NOT_READY
        self.out_of_memory = self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        self.lost = self.statuses(self.cu.CUresult, LOST_STATUSES)

    def error_name(self, err) -> str:
        return status_name(self.cu, "cuGetErrorName", err)

    def calls(self):
        """The driver calls of a stream device (runtime/devices/stream.py CALLS), by role."""
        from types import SimpleNamespace
        cu = self.cu
        flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return SimpleNamespace(
            mem_alloc=cu.cuMemAlloc, mem_free=cu.cuMemFree, memset_d8_async=cu.cuMemsetD8Async,
            memset_d16_async=cu.cuMemsetD16Async, memset_d32_async=cu.cuMemsetD32Async,
            memcpy_htod_async=cu.cuMemcpyHtoDAsync, memcpy_dtoh_async=cu.cuMemcpyDtoHAsync,
            memcpy_dtod_async=cu.cuMemcpyDtoDAsync,
            stream_synchronize=cu.cuStreamSynchronize, event_create=lambda: cu.cuEventCreate(flags),
            event_record=cu.cuEventRecord, event_query=cu.cuEventQuery, event_synchronize=cu.cuEventSynchronize,
            event_destroy=cu.cuEventDestroy, module_load_data=cu.cuModuleLoadData,
            module_get_function=cu.cuModuleGetFunction, launch_kernel=cu.cuLaunchKernel,
            host_alloc=cu.cuMemHostAlloc, host_free=cu.cuMemFreeHost, **self.graph_calls())

    def graph_calls(self) -> dict:
        """The stream device's graph calls (captured from the stream by this thread only,
        instantiated without flags); none where the binding lacks one of them."""
        cu = self.cu
        names = ("cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphLaunch", "cuGraphDestroy",
                 "cuGraphExecDestroy", "CUstreamCaptureMode")
        found = {name: getattr(cu, name, None) for name in names}
        # cuGraphInstantiate(graph, flags) since CUDA 12; cuGraphInstantiateWithFlags since 11.4
        instantiate = getattr(cu, "cuGraphInstantiateWithFlags", None) or getattr(cu, "cuGraphInstantiate", None)
        self.missing_graph_calls = [name for name, v in found.items() if v is None] + \
            ([] if instantiate is not None else ["cuGraphInstantiate"])
        if self.missing_graph_calls:
            return {}
        mode = found["CUstreamCaptureMode"].CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        return dict(begin_capture=lambda stream: found["cuStreamBeginCapture"](stream, mode),
                    end_capture=found["cuStreamEndCapture"],
                    graph_instantiate=lambda graph: instantiate(graph, 0),
                    graph_launch=found["cuGraphLaunch"], graph_destroy=found["cuGraphDestroy"],
                    graph_exec_destroy=found["cuGraphExecDestroy"])

    def attribute(self, device, name: str) -> int:
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self.check(self.cu.cuDeviceGetAttribute(attr, device), f"cuDeviceGetAttribute({name})"))
