"""The one list of arches qdc knows (API.md §4). The compiler's targets (compiler/targets) and
the runtime's devices (runtime/devices) each register the ones they implement."""
from __future__ import annotations

ARCHES = ("cpu", "cuda", "vulkan", "metal", "amdgpu")
