"""Metal through PyObjC (`pyobjc-framework-Metal`, the `metal` extra), macOS only. Anywhere
else, or without the package or a Metal GPU, `MetalUnavailableError` says which, never a raw
ImportError."""
from __future__ import annotations

import platform
import sys

from ...contract.errors import QdcError

PACKAGE = "pyobjc-framework-Metal"
STORAGE_MODE_SHARED = 0          # MTLResourceStorageModeShared << MTLResourceStorageModeShift
COMMAND_BUFFER_COMPLETED = 4     # MTLCommandBufferStatusCompleted
COMMAND_BUFFER_ERROR = 5         # MTLCommandBufferStatusError


class MetalUnavailableError(QdcError, RuntimeError):
    """No usable Metal: not macOS, no PyObjC Metal binding, or no Metal GPU."""


def load_metal(platform_name: str | None = None):
    """(the `Metal` module, the system's default MTLDevice); MetalUnavailableError when there
    is none."""
    platform_name = sys.platform if platform_name is None else platform_name
    if platform_name != "darwin":
        raise MetalUnavailableError(
            f"arch 'metal' runs only on macOS (this machine runs {platform.system() or platform_name}): use arch "
            f"'vulkan' or 'cpu' here; `qdc build --arch metal` still builds Metal kernels for a Mac")
    try:
        import Metal
    except ImportError as e:
        raise MetalUnavailableError(f"arch 'metal' needs the '{PACKAGE}' package: pip install {PACKAGE}  "
                                    f"(or pip install 'qdc[metal]') ({e})") from None
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        raise MetalUnavailableError("arch 'metal': this Mac has no Metal GPU (MTLCreateSystemDefaultDevice "
                                    "returned nil)")
    return Metal, device


def size(metal, x: int, y: int = 1, z: int = 1):
    """An MTLSize."""
    return metal.MTLSizeMake(x, y, z)
