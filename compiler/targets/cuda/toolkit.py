"""The pieces of NVIDIA's toolkit the CUDA target uses, found through installed Python packages.

- libdevice (`libdevice.10.bc`): the math library linked into every module that does math.
- ptxas: assembles PTX for a GPU; only tests and checks use it (PTX is the artifact, and the
  driver JIT-compiles it), so qdc compiles PTX on machines that have neither.

Both come with the `nvidia-cuda-nvcc` wheel (`pip install nvidia-cuda-nvcc`, or `qdc[cuda]`):
in CUDA 13 libdevice is in its dependency `nvidia-nvvm`, in CUDA 12 (`nvidia-cuda-nvcc-cu12`)
in the package itself. They are looked up in the installed distributions' file lists, never at
a hard-coded path.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile

from qdc.runtime.contract.errors import QdcCompileError

PACKAGE = "nvidia-cuda-nvcc"
# Distributions searched, in order: the CUDA 13 wheel and the one holding its libdevice, then
# the CUDA 12 wheel (which still assembles sm_70, dropped by CUDA 13's ptxas).
_DISTRIBUTIONS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-nvcc-cu12")


def _installed_file(suffix: str) -> str | None:
    """The first file of the toolkit distributions whose path ends with `suffix`."""
    import importlib.metadata as md
    for name in _DISTRIBUTIONS:
        try:
            files = md.distribution(name).files or ()
        except md.PackageNotFoundError:
            continue
        for f in files:
            if str(f).replace("\\", "/").endswith(suffix):
                path = str(f.locate())
                if os.path.isfile(path):
                    return path
    return None


@functools.lru_cache(maxsize=None)
def libdevice_path() -> str | None:
    return _installed_file("nvvm/libdevice/libdevice.10.bc")


@functools.lru_cache(maxsize=None)
def libdevice_bitcode() -> bytes:
    """libdevice's bitcode; QdcCompileError naming the package when it is not installed."""
    path = libdevice_path()
    if path is None:
        raise QdcCompileError(f"target 'cuda' needs NVIDIA's libdevice for math functions, which comes with the "
                              f"'{PACKAGE}' package: pip install {PACKAGE}  (or pip install 'qdc[cuda]')")
    with open(path, "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def libdevice_digest() -> str:
    """Enters the cache key: another libdevice may compute math differently."""
    path = libdevice_path()
    if path is None:
        return "none"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def ptxas_path() -> str | None:
    return _installed_file("bin/ptxas") or _installed_file("bin/ptxas.exe")


@functools.lru_cache(maxsize=None)
def ptxas_gpus() -> tuple:
    """The real GPU names (sm_XY) the installed ptxas assembles for, from its --help."""
    path = ptxas_path()
    if path is None:
        return ()
    text = subprocess.run([path, "--help"], capture_output=True, text=True).stdout
    allowed = text[text.find("Allowed values"):] if "Allowed values" in text else text
    return tuple(sorted(set(re.findall(r"'(sm_\d+)'", allowed)), key=sm_number))


def sm_number(name: str) -> int:
    return int(re.match(r"sm_(\d+)", name).group(1))


def assembling_gpu(ptx_target: str) -> str | None:
    """The GPU to assemble `ptx_target` PTX for: itself when ptxas knows it, else the oldest GPU
    ptxas knows that runs it (PTX for sm_XY runs on every sm_MN with MN >= XY, which is what the
    driver does when it JIT-compiles), else None."""
    gpus = ptxas_gpus()
    if ptx_target in gpus:
        return ptx_target
    newer = [g for g in gpus if sm_number(g) >= sm_number(ptx_target)]
    return newer[0] if newer else None


def assemble(ptx: bytes | str, gpu: str) -> bytes:
    """The cubin ptxas makes of `ptx` for `gpu`; RuntimeError with ptxas's messages if it fails."""
    path = ptxas_path()
    if path is None:
        raise RuntimeError(f"ptxas not found: pip install {PACKAGE}")
    if isinstance(ptx, str):
        ptx = ptx.encode()
    with tempfile.TemporaryDirectory(prefix="qdc-ptxas-") as folder:
        src, out = os.path.join(folder, "k.ptx"), os.path.join(folder, "k.cubin")
        with open(src, "wb") as f:
            f.write(ptx)
        proc = subprocess.run([path, f"-arch={gpu}", src, "-o", out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas -arch={gpu} failed:\n{proc.stderr}{proc.stdout}")
        with open(out, "rb") as f:
            return f.read()
