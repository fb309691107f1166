"""Shared parts of the per-backend tests (test_<arch>_device.py, test_<arch>_target.py): the
device protocol's memory promises, a saxpy kernel compiled for an arch without its device, a
package made missing, and `qdc build` / `qdc inspect` of the repository's example kernels."""
import builtins
import ctypes
import os

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_zeroed_ranged_copies(dev):
    """A new allocation of `dev` reads as zeros, a copy reaches exactly its byte range (one
    element read back from the middle), a copy past the end is refused. Returns the allocation."""
    a = dev.allocate(1000)
    out = np.full(1000, 7, np.uint8)
    dev.copy_to_host(a, out)
    assert not out.any()
    dev.copy_to_device(a, np.arange(10, dtype=np.float32), offset=40)
    one = np.zeros(1, np.float32)
    dev.copy_to_host(a, one, offset=40 + 4 * 3)
    assert one[0] == 3.0
    with pytest.raises(ValueError, match="does not fit"):
        dev.copy_to_host(a, np.zeros(2, np.float32), offset=996)
    return a


@qd.kernel
def saxpy(a: qd.f32, xs: qd.types.ndarray(qd.f32, ndim=1), ys: qd.types.ndarray(qd.f32, ndim=1)):
    for i in xs:
        ys[i] = a * xs[i] + ys[i]


def compile_saxpy(arch: str, variant: str = "forward", **options):
    """saxpy compiled for `arch` (the compiler alone: no device of `arch` is needed)."""
    qd.init(arch=qd.cpu)
    k = saxpy._primal
    return K.compile_kernel(k.fn, k.params, Options(arch=arch, **options), arch=arch, variant=variant)


def saxpy_ctx(dev, meta, n: int, a: float = 2.5):
    """Arrays xs and ys of `n` f32 on `dev`, and the ctx words of saxpy(a, xs, ys) as the
    launcher writes them (a scalar in its word's low bytes; an ndarray's address, then its
    extent): (ctx, xs, ys)."""
    xs, ys = dev.allocate(4 * n), dev.allocate(4 * n)
    ctx = (ctypes.c_uint64 * max(meta.ctx_words, 1))()
    scalar, x, y = meta.params
    ctx[scalar.slot] = int(np.float32(a).view(np.uint32))
    ctx[x.slot], ctx[x.slot + 1] = xs.ptr, n
    ctx[y.slot], ctx[y.slot + 1] = ys.ptr, n
    return ctx, xs, ys


def hide_package(monkeypatch, name: str) -> None:
    """Importing `name` or a module inside it fails as when the package is not installed."""
    real = builtins.__import__

    def without(module, *args, **kwargs):
        if module == name or module.startswith(name + "."):
            raise ImportError(f"No module named '{name}'")
        return real(module, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without)


def build_kernels(cache: str, arch: str, *options: str, files=("saxpy.py",)):
    """`qdc build` of kernels/<files> for `arch` into `cache`: the click result."""
    paths = [os.path.join(ROOT, "kernels", f) for f in files]
    return CliRunner().invoke(cli, ["build", *paths, "--arch", arch, *options, "--cache", cache, "-j", "1"])


def build_and_list(tmp_path, arch: str, listing: str, *options: str) -> tuple[str, str]:
    """Build kernels/saxpy.py and kernels/regression.py for `arch` (no device needed), then
    `qdc inspect --<listing>` saxpy and mean_squared_error's gradient: the two listings."""
    cache = str(tmp_path / "cache")
    built = build_kernels(cache, arch, *options, files=("saxpy.py", "regression.py"))
    assert built.exit_code == 0, built.output
    listings = []
    for name in ("saxpy.saxpy", "regression.mean_squared_error.grad"):
        shown = CliRunner().invoke(cli, ["inspect", name, "--arch", arch, f"--{listing}", "--cache", cache])
        assert shown.exit_code == 0, shown.output
        listings.append(shown.output)
    return listings[0], listings[1]


def refused_build_option(tmp_path, arch: str, *options: str) -> str:
    """`qdc build` of kernels/saxpy.py with a bad option exits with status 2: its output."""
    refused = build_kernels(str(tmp_path / "cache"), arch, *options)
    assert refused.exit_code == 2, refused.output
    return refused.output


def need_every_arch_toolchain() -> None:
    """Skip, saying why, where `qdc build --arch all` cannot build every arch: Metal needs
    spirv-cross, AMDGPU ld.lld 16+ (system packages `make test` installs; a GPU host may lack them)."""
    from qdc.compiler.targets.amdgpu import linker
    from qdc.compiler.targets.metal import msl
    if msl.spirv_cross_path() is None:
        pytest.skip(f"spirv-cross not installed ({msl.INSTALL_HINT}): no Metal build")
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ ({linker.INSTALL_HINT}): no AMDGPU build")
