"""ld.lld (compiler/targets/lld.py), which turns the AMDGPU backend's relocatable object into a
loadable code object (a shared ELF). The objects are code object v5 (codegen.py), which LLD 16
and newer link."""
from __future__ import annotations

import os
import tempfile

from qdc.runtime.contract.errors import QdcCompileError

from ... import timings
from .. import lld
from ..lld import INSTALL_HINT, MIN_LLD


def find_lld() -> tuple:
    """(command, LLD major version) of the newest usable ld.lld; () when there is none."""
    return lld.find("ld.lld")


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
