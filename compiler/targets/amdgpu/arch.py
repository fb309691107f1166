"""What `amdgpu_targets` (docs/api.md, Configuration) may be: the gfx processors a code object is built for,
one code object each. Pure data, no llvmlite: option validation imports it."""
from __future__ import annotations

import re

TRIPLE = "amdgcn-amd-amdhsa"  # the LLVM target codegen.py generates code objects with
CODE_OBJECT_VERSION = 500  # of the HSA code objects (their ABI version, in the module flags)
DEFAULT_AMDGPU_TARGETS = ("gfx90a", "gfx942", "gfx1100")
# Processors of LLVM's AMDGPU backend that HIP runs on (GCN5 / CDNA / RDNA2-4).
KNOWN_GFX = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx90c", "gfx940", "gfx941", "gfx942", "gfx950",
             "gfx1010", "gfx1011", "gfx1012", "gfx1030", "gfx1031", "gfx1032", "gfx1034", "gfx1035", "gfx1036",
             "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1200", "gfx1201")


def parse_amdgpu_targets(value) -> tuple:
    """The gfx names of `value` (None: the default; a comma-separated string or a sequence),
    deduplicated in order; ValueError naming an unknown one."""
    if value is None:
        return DEFAULT_AMDGPU_TARGETS
    names = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ValueError(f"amdgpu_targets must be gfx names, comma-separated or a list, got {value!r}")
    out = []
    for name in (n.strip() for n in names):
        if not re.fullmatch(r"gfx[0-9a-f]+", name) or name not in KNOWN_GFX:
            raise ValueError(f"amdgpu_targets: unknown AMD GPU {name!r} (known: {', '.join(KNOWN_GFX)})")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("amdgpu_targets names no GPU")
    return tuple(out)


def check_amdgpu_targets(value) -> None:
    parse_amdgpu_targets(value)
