"""ld.lld, which turns the AMDGPU backend's relocatable object into a loadable code object (a
shared ELF). Taken from PATH (`ld.lld`, or `ld.lld-<N>` from Debian's lld-N packages) or from
the `ziglang` wheel (`python -m ziglang ld.lld`, LLD matching llvmlite's LLVM). The objects
are code object v5 (codegen.py), which LLD 16 and newer link; Debian 12's plain `lld` (14)
cannot."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile

from qdc.runtime.contract.errors import QdcCompileError

from ... import timings

MIN_LLD = 16
INSTALL_HINT = ("apt-get install -y lld-16 (or any lld of version 16 or newer), or pip install ziglang "
                "(its ld.lld matches llvmlite's LLVM)")


def _version(command: list) -> int | None:
    try:
        out = subprocess.run(command + ["--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=None)
def find_lld() -> tuple:
    """(command, LLD major version) of the newest usable ld.lld; () when there is none."""
    candidates = [[p] for p in sorted({shutil.which(n) for n in ["ld.lld"] + [f"ld.lld-{v}" for v in range(40, 15, -1)]}
                                      - {None})]
    try:
        import ziglang  # noqa: F401
        candidates.append([sys.executable, "-m", "ziglang", "ld.lld"])
    except ImportError:
        pass
    best = ()
    for command in candidates:
        version = _version(command)
        if version is not None and version >= MIN_LLD and (not best or version > best[1]):
            best = (command, version)
    return best


def lld_description() -> str:
    found = find_lld()
    return f"lld-{found[1]}" if found else "no-lld"


def link(obj: bytes, what: str) -> bytes:
    """The code object ld.lld links from relocatable object `obj`; QdcCompileError naming the
    package when no ld.lld is installed."""
    found = find_lld()
    if not found:
        raise QdcCompileError(f"target 'amdgpu' links its code objects with ld.lld {MIN_LLD} or newer, which is "
                              f"not installed: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="qdc-lld-") as folder:
        src, out = os.path.join(folder, "k.o"), os.path.join(folder, "k.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        returncode, output = timings.run_tool(found[0] + ["-shared", "--no-undefined", src, "-o", out])
        if returncode != 0:
            raise QdcCompileError(f"internal compiler error: ld.lld could not link the code object of {what}:\n"
                                  f"{output}")
        with open(out, "rb") as f:
            return f.read()
