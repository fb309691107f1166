"""The CUDA driver API through `cuda-bindings` (`cuda.bindings.driver`), and nothing else.

Every binding call returns a tuple whose first item is a CUresult; `check` turns a failure
into an exception naming the call. A missing binding or driver is `CudaUnavailableError`
naming the package to install, never a raw traceback.
"""
from __future__ import annotations

from ...contract.errors import QdcError

PACKAGE = "cuda-bindings"


class CudaUnavailableError(QdcError, RuntimeError):
    """No usable CUDA: the binding, the driver or a GPU is missing."""


def load_binding():
    """`cuda.bindings.driver`, initialised (cuInit); CudaUnavailableError when it cannot be."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise CudaUnavailableError(f"arch 'cuda' needs the '{PACKAGE}' package: pip install {PACKAGE}  "
                                   f"(or pip install 'qdc[cuda]') ({e})") from None
    try:
        (err,) = cu.cuInit(0)
    except Exception as e:  # the binding raises its own error when libcuda.so is absent
        raise CudaUnavailableError(f"arch 'cuda': no NVIDIA driver found ({type(e).__name__}: {e}); install the "
                                   f"NVIDIA driver or use another arch") from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaUnavailableError(f"arch 'cuda': cuInit failed ({_name(cu, err)}): no usable NVIDIA GPU or driver")
    (err, count) = cu.cuDeviceGetCount()
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        raise CudaUnavailableError("arch 'cuda': the NVIDIA driver sees no GPU")
    return cu


def _name(cu, err) -> str:
    try:
        e, text = cu.cuGetErrorName(err)
        return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - only for the message
        return str(err)


class Driver:
    """The binding, its success code and `check`."""

    def __init__(self):
        self.cu = load_binding()
        self.ok = self.cu.CUresult.CUDA_SUCCESS

    def check(self, result, what: str):
        """The call's values after its CUresult (one value, a tuple of several, or None)."""
        err = result[0]
        if err != self.ok:
            self.fail(err, what)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def fail(self, err, what: str):
        cu = self.cu
        name = _name(cu, err)
        if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(f"cuda: {what}: out of device memory ({name})")
        raise RuntimeError(f"cuda: {what} failed ({name})")

    def attribute(self, device, name: str) -> int:
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self.check(self.cu.cuDeviceGetAttribute(attr, device), f"cuDeviceGetAttribute({name})"))
