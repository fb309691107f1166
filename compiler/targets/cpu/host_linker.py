"""Which linker makes the build host's own CPU kernel libraries (link.py): on a 64-bit
little-endian Linux host, ld.lld through the LLD server, linked against the host's own libgomp
and libm; elsewhere, or where either is missing, the system's linker. Apart from link.py, for
the cache key (platforms.py), which an offline process computes without loading LLVM.
"""
from __future__ import annotations

import functools
import os
import struct
import sys

from .. import lld

LIBGOMP, LIBM = "libgomp.so.1", "libm.so.6"

# Where a Linux host's libgomp and libm are looked for: beside the C library this process runs
# with (the dynamic linker's choice), then the usual folders (`ld`'s search path).
_LIBRARY_FOLDERS = ("/lib/{multiarch}", "/usr/lib/{multiarch}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def _host_library(soname: str) -> str | None:
    """The path of the host's ELF shared library `soname`; None if not found."""
    folders = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            folders += [os.path.dirname(line.split()[-1]) for line in f
                        if line.rstrip().endswith(("/libc.so.6", "/libm.so.6"))]
    except OSError:
        pass
    multiarch = getattr(sys.implementation, "_multiarch", "")
    folders += [folder.format(multiarch=multiarch) for folder in _LIBRARY_FOLDERS if multiarch or "{" not in folder]
    for folder in dict.fromkeys(folders):
        path = os.path.join(folder, soname)
        try:
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":  # not a linker script
                    return path
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def host_elf_linking() -> tuple[list, int, dict] | None:
    """(ld.lld command, its LLD version, {soname: path} of the host's libgomp and libm) where
    this Linux host's own libraries are linked with ld.lld; None where the system's linker
    links them (no ld.lld, a library not found, not a 64-bit little-endian Linux host)."""
    if not sys.platform.startswith("linux") or sys.byteorder != "little" or struct.calcsize("P") != 8:
        return None
    found = lld.find("ld.lld")
    libraries = {name: _host_library(name) for name in (LIBGOMP, LIBM)}
    if not found or None in libraries.values():
        return None
    return found[0], found[1], libraries


def host_linker() -> str:
    """Which linker makes the build host's own libraries, for the cache key: "lld-N", or ""
    for the system's (its bytes differ)."""
    linking = host_elf_linking()
    return f"lld-{linking[1]}" if linking is not None else ""
