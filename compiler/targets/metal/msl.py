"""spirv-cross, which translates each task's SPIR-V module into Metal Shading Language.

Found on PATH (Debian/Ubuntu: `apt-get install -y spirv-cross`; macOS: `brew install
spirv-cross`; there is no PyPI wheel). Options: MSL 3.0 (float atomics, macOS 13 / iOS 16);
`--msl-decoration-binding`, so a buffer's `[[buffer(N)]]` index is its SPIR-V binding N, the
task record's binding number (qdc uses no push constants, which that option would collide with
binding 0). spirv-cross keeps the module's entry point name, except that it removes a double
underscore (reserved in C++, so in MSL): `metal_entry` spells task entries without one, and
the Metal target names the SPIR-V entry point (and the task record's entry) that way.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile

from qdc.runtime.contract.entry_points import msl_kernels
from qdc.runtime.contract.errors import QdcCompileError

MSL_VERSION = 20100  # MMmmpp
INSTALL_HINT = "apt-get install -y spirv-cross (Debian/Ubuntu) or brew install spirv-cross (macOS)"


@functools.lru_cache(maxsize=None)
def spirv_cross_path() -> str | None:
    return shutil.which("spirv-cross")


@functools.lru_cache(maxsize=None)
def spirv_cross_version() -> str:
    """The installed spirv-cross's version (from its package), for the cache key."""
    path = spirv_cross_path()
    if path is None:
        return "none"
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "spirv-cross"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or f"{os.path.getsize(path)}b"


def metal_entry(entry: str) -> str:
    """`entry` without a double underscore, which spirv-cross would remove: every underscore
    followed by another becomes "_0" (so `qdc__k_t0` -> `qdc_0_k_t0`); the tasks of a kernel,
    which differ in their `_t<i>` suffix, keep distinct names."""
    return re.sub(r"_(?=_)", "_0", entry)


def translate(module: bytes, entry: str, what: str) -> str:
    """The MSL source of SPIR-V `module`, whose compute entry point `entry` (a `metal_entry`
    name) becomes the one kernel function of that name."""
    exe = spirv_cross_path()
    if exe is None:
        raise QdcCompileError(f"target 'metal' translates SPIR-V to Metal Shading Language with spirv-cross, which "
                              f"is not installed: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="qdc-msl-") as folder:
        src = os.path.join(folder, "task.spv")
        with open(src, "wb") as f:
            f.write(module)
        proc = subprocess.run([exe, src, "--msl", "--msl-version", str(MSL_VERSION), "--msl-decoration-binding"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise QdcCompileError(f"internal compiler error: spirv-cross could not translate {what} to MSL: "
                              f"{proc.stderr.strip() or proc.stdout.strip()}")
    kernels = msl_kernels(proc.stdout.encode())
    if kernels != {entry}:
        raise QdcCompileError(f"internal compiler error: spirv-cross translated {what} to the MSL kernel functions "
                              f"{sorted(kernels)}, not '{entry}'")
    return proc.stdout
