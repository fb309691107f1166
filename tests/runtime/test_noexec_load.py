"""Kernel libraries load without an executable temp folder: from an
in-memory file where the system has one, else from the temp folder, whose failure on a noexec
mount is a clear error naming the folder and the fix."""
import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import qdc as qd
from qdc.runtime.devices.cpu import device as rcpu

HAS_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def _library(tmp_path, value: int) -> bytes:
    """A shared library exporting `int which(void)` that returns `value`."""
    src, so = tmp_path / f"which{value}.c", tmp_path / f"which{value}.so"
    src.write_text(f"int which(void) {{ return {value}; }}\n", encoding="utf-8")
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so.read_bytes()


def _which(lib) -> int:
    fn = lib.which
    fn.restype = ctypes.c_int
    return fn()


def _load_all(tmp_path, values):
    # Each library becomes garbage once loaded: the next one may get the same descriptor number.
    return [_which(rcpu.load_verified_library(_library(tmp_path, v), f"{v:064x}")) for v in values]


@pytest.mark.skipif(not HAS_MEMFD, reason="no memfd_create here")
def test_libraries_loaded_in_turn_stay_distinct(tmp_path, monkeypatch):
    """glibc hands back the library already loaded under a path it has seen: a descriptor number
    reused for the next library must not give the previous one."""
    fds, memfd_create = [], os.memfd_create
    monkeypatch.setattr(os, "memfd_create", lambda *a: fds.append(memfd_create(*a)) or fds[-1])
    assert _load_all(tmp_path, [11, 12, 13]) == [11, 12, 13]
    assert len(set(fds)) < len(fds)  # the hazard was there: a number came back


@pytest.mark.skipif(not HAS_MEMFD, reason="no memfd_create here")
def test_loads_with_no_temp_folder_at_all(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "does-not-exist"))
    assert _load_all(tmp_path, [21, 22]) == [21, 22]


def test_noexec_temp_folder_error_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    """Where no in-memory file can be used, a noexec temp folder is explained, not a raw OSError."""
    lib = _library(tmp_path, 31)
    folder = tmp_path / "tmp"
    folder.mkdir()

    def dlopen_on_noexec(path, mode=0):
        raise OSError(f"{path}: failed to map segment from shared object")

    monkeypatch.setattr(rcpu, "_memfd_with", lambda data, digest: None)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(rcpu, "_is_noexec", lambda path: True)
    monkeypatch.setattr(ctypes, "PyDLL", dlopen_on_noexec)
    with pytest.raises(rcpu.LibraryLoadError, match=f"temp folder {folder} is on a filesystem mounted noexec.*"
                                                    f"set TMPDIR to a folder on an exec-mounted") as e:
        rcpu.load_verified_library(lib, "1" * 64)
    assert isinstance(e.value, OSError) and isinstance(e.value, qd.QdcError)
    assert os.listdir(folder) == []  # the temp file was removed


@contextlib.contextmanager
def _noexec_mount():
    """A noexec tmpfs, in a folder of its own (not under pytest's tmp_path, which a concurrent
    pytest session may prune)."""
    path = tempfile.mkdtemp(prefix="qdc-noexec-")
    mount, umount = shutil.which("mount"), shutil.which("umount")
    if not (mount and umount) or subprocess.run([mount, "-t", "tmpfs", "-o", "noexec,size=32m", "tmpfs", str(path)],
                                                capture_output=True).returncode != 0:
        os.rmdir(path)
        pytest.skip("cannot mount a noexec tmpfs here (needs root)")
    try:
        yield path
    finally:  # lazily: glibc keeps a page of a library it failed to map there until the process ends
        r = subprocess.run([umount, "-l", path], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        os.rmdir(path)


@qd.kernel
def double(x: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        x[i] = 2 * x[i]


@pytest.mark.skipif(not HAS_MEMFD, reason="no memfd_create here")
def test_kernels_run_with_tmpdir_on_a_noexec_mount(tmp_path, monkeypatch, session_cache_dir):
    lib = _library(tmp_path, 41)
    with _noexec_mount() as folder:
        monkeypatch.setenv("TMPDIR", folder)
        monkeypatch.setattr(tempfile, "tempdir", folder)
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)  # a new device: its libraries are loaded afresh
        x = np.arange(5, dtype=np.float32)
        double(x)
        np.testing.assert_array_equal(x, 2 * np.arange(5, dtype=np.float32))

        monkeypatch.setattr(rcpu, "_memfd_with", lambda data, digest: None)  # as on a system without memfd
        with pytest.raises(rcpu.LibraryLoadError, match=f"temp folder {folder} is on a filesystem mounted noexec"):
            rcpu.load_verified_library(lib, "4" * 64)
        monkeypatch.undo()
