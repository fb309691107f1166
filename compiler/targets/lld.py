"""LLVM's linker, for the objects no system linker of the build host can link: AMDGPU code
objects (ld.lld), and CPU libraries for another platform than the host's (ld.lld for ELF,
ld64.lld for Mach-O; compiler/targets/cpu/link.py). Taken from PATH (`ld.lld`, or `ld.lld-<N>`
from Debian's lld-N packages) or from the `ziglang` wheel (`python -m ziglang ld.lld`, LLD
matching llvmlite's LLVM). AMDGPU code objects are version 5, which LLD 16 and newer link;
Debian 12's plain `lld` (14) cannot."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys

MIN_LLD = 16
INSTALL_HINT = ("apt-get install -y lld-16 (or any lld of version 16 or newer), or pip install ziglang "
                "(its ld.lld matches llvmlite's LLVM)")


def _version(command: list) -> int | None:
    named = _version_by_name(command)
    if named is not None:
        return named
    try:
        out = subprocess.run(command + ["--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else None


def _version_by_name(command: list) -> int | None:
    """The major version that Debian's and Ubuntu's LLVM packages name their linker by
    (`ld.lld-16`, or a link into `/usr/lib/llvm-16/`): running `--version` costs ~25 ms of CPU
    (LLD loads libLLVM), which every process whose cache key names the linker would pay."""
    if len(command) != 1:
        return None
    m = re.search(r"\.lld-(\d+)$", command[0]) or re.search(r"/llvm-(\d+)/bin/[^/]+$", os.path.realpath(command[0]))
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=None)
def find(flavor: str = "ld.lld") -> tuple:
    """(command, LLD major version) of the newest usable linker of `flavor` ("ld.lld": ELF,
    "ld64.lld": Mach-O); () when there is none."""
    names = [flavor] + [f"{flavor}-{v}" for v in range(40, MIN_LLD - 1, -1)]
    candidates = [[p] for p in sorted({shutil.which(n) for n in names} - {None})]
    try:
        import ziglang  # noqa: F401
        candidates.append([sys.executable, "-m", "ziglang", flavor])
    except ImportError:
        pass
    best = ()
    for command in candidates:
        version = _version(command)
        if version is not None and version >= MIN_LLD and (not best or version > best[1]):
            best = (command, version)
    return best
