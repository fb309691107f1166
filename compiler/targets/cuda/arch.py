"""What `cuda_arch` (docs/api.md, Configuration) may be: the GPU generation PTX is generated for, as `sm_XY`.

PTX for sm_XY runs on every GPU of compute capability X.Y or newer (the driver JIT-compiles
it), so the default, sm_70, runs everywhere CUDA does today. Pure data, no llvmlite: option
validation imports it.
"""
from __future__ import annotations

import re

TRIPLE = "nvptx64-nvidia-cuda"  # the LLVM target codegen.py generates PTX with
DEFAULT_CUDA_ARCH = "sm_70"
# Compute capabilities LLVM's NVPTX backend generates code for (from sm_50 on); `a`/`f`
# variants (architecture- or family-specific features) exist from sm_90 on.
KNOWN_SM = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


def check_cuda_arch(value) -> None:
    """ValueError unless `value` is None (the default) or a known `sm_XY` name."""
    if value is None:
        return
    m = re.fullmatch(r"sm_(\d+)([af]?)", value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) not in KNOWN_SM or (m.group(2) and int(m.group(1)) < 90):
        raise ValueError(f"cuda_arch must name a GPU generation as sm_XY, one of "
                         f"{', '.join(f'sm_{n}' for n in KNOWN_SM)} (sm_90 and newer also with an 'a' or 'f' "
                         f"suffix), got {value!r}")
