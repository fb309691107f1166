"""`qdc pack` bundles: one reproducible .tar.gz of built modules for deployment.

A bundle holds the module records and the entries they reference, under the same names as
in a cache folder, so `qdc.runtime.load` reads either through the same `Store` interface.
Reproducible: members sorted by name, fixed timestamps, owners and permissions, record
build times zeroed, gzip header time zeroed. Loading reads members into memory and never
extracts anything; a member whose name could escape the bundle is refused all the same.
"""
from __future__ import annotations

import gzip
import io
import os
import posixpath
import tarfile
import uuid

from . import artifact as A
from .cache import (META_FILE, RECORD_TIME_FIELDS, Cache, Store, cache_error, entry_path, list_modules,
                    module_path, read_entry, read_module)

MAX_BUNDLE_BYTES = 1 << 32


class BundleStore(Store):
    def __init__(self, path: str):
        self.location = os.fspath(path)
        self.files: dict[str, bytes] = {}
        try:
            with tarfile.open(self.location, "r:*") as tar:
                total = 0
                for member in tar.getmembers():
                    self._check_member(member)
                    total += member.size
                    if total > MAX_BUNDLE_BYTES:
                        raise cache_error(self.location, "bundle is larger than 4 GiB; refusing to read it")
                    self.files[member.name] = tar.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise cache_error(self.location, f"not a readable qdc bundle ({type(e).__name__}: {e})") from None

    def _check_member(self, member: tarfile.TarInfo) -> None:
        name = member.name
        parts = name.split("/")
        if (name.startswith("/") or "\\" in name or ".." in parts or "" in parts or "." in parts
                or posixpath.normpath(name) != name):
            raise cache_error(self.location, f"bundle entry '{name}' has a path that could escape the "
                                             f"bundle; the bundle is refused")
        if not member.isreg():
            raise cache_error(self.location, f"bundle entry '{name}' is not a regular file; the bundle is refused")

    def read(self, name: str) -> bytes:
        try:
            return self.files[name]
        except KeyError:
            raise FileNotFoundError(f"{self.where(name)}: not in the bundle") from None

    def names(self) -> list[str]:
        return sorted(self.files)

    def where(self, name: str) -> str:
        return f"{self.location}!{name}"


def pack(cache: Cache, out_path: str) -> dict:
    """Write every built module (and only the entries they use) into one bundle at `out_path`.
    Every entry is verified first: a corrupt cache is not packed."""
    members: dict[str, bytes] = {}
    modules = list_modules(cache)
    for module, arch in modules:
        body = read_module(cache, module, arch)
        members[module_path(module, arch)] = _normalised(A.MODULE_RECORD, body)
        for key in body["kernels"].values():
            entry = read_entry(cache, key)
            base = entry_path(key)
            members[f"{base}/{META_FILE}"] = _normalised(A.ENTRY_RECORD, entry.record)
            for kind, info in entry.record["artifacts"].items():  # the bytes read_entry verified
                members[f"{base}/{info['file']}"] = entry.artifacts[kind]
    data = _tar_gz(members)
    out_path = os.fspath(out_path)
    tmp = f"{out_path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out_path)
    return {"modules": len(modules), "files": len(members), "bytes": len(data)}


def _normalised(kind: str, body: dict) -> bytes:
    return A.encode_record(kind, {k: (0 if k in RECORD_TIME_FIELDS else v) for k, v in body.items()})


def _tar_gz(members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(members):
            data = members[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
