"""`qdc pack` bundles: one reproducible .tar.gz of built modules for deployment.

A bundle holds the module records and the entries they reference, under the same names as
in a cache folder, so `qdc.runtime.load` reads either through the same `Store` interface.
Reproducible: members sorted by name, fixed timestamps, owners and permissions, record
build times zeroed, gzip header time zeroed. Loading reads members into memory and never
extracts anything. It refuses the whole bundle (CacheError naming the member) when a member
name could escape the bundle, is not a regular file, appears twice, or is not declared:
records are read first (each at most MAX_RECORD_BYTES) and an artifact is decompressed only
if its entry record declares it, at exactly the size declared, so a small bundle cannot
inflate into a large amount of memory. An entry whose record is unreadable is left out; reading
it reports that record. Entries keep their signature files and module records their signatures
(runtime/signing.py): build times are not signed, so zeroing them keeps every signature valid,
and `load(bundle, ..., trusted_keys=...)` checks them as it checks a cache folder's.
The cache's parsed-source records (runtime/source_folder.py) travel too, each checked when
packed (a refused one is left out) and read as a record, so that `qdc merge DEST BUNDLE` gives a
deployment's cache whose processes parse no source.
"""
from __future__ import annotations

import gzip
import io
import os
import posixpath
import tarfile
import uuid
import zlib

from . import signing, source_folder
from .contract import source_records
from .contract import artifact as A
from .contract.artifact_schema import check_entry_record
from .cache import (ENTRIES, MAX_RECORD_BYTES, META_FILE, MODULES, RECORD_TIME_FIELDS, Cache, DirStore, Store,
                    cache_error, entry_path, list_modules, module_path, read_entry, read_module)
from .module_check import module_problems

MAX_BUNDLE_BYTES = 1 << 32


def open_store(location) -> Store:
    """A cache folder or a `qdc pack` bundle, whichever `location` is."""
    location = os.fspath(location)
    if os.path.isdir(location):
        return DirStore(location)
    if os.path.isfile(location):
        return BundleStore(location)
    raise FileNotFoundError(f"no qdc cache or bundle at '{location}' (build one with `qdc build PATH --cache "
                            f"{location}`)")


class BundleStore(Store):
    def __init__(self, path: str):
        self.location = os.fspath(path)
        self.files: dict[str, bytes] = {}
        try:
            with tarfile.open(self.location, "r:*") as tar:
                members = self._members(tar)  # reads the records too
                for name, (member, size) in self._artifacts(members).items():
                    if member.size != size:
                        raise cache_error(self.where(name), f"size mismatch: {member.size} bytes where its entry "
                                                            f"record declares {size}; the bundle is refused")
                    self.files[name] = _read_member(tar, member)
        except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile, zlib.error) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise cache_error(self.location, f"not a readable qdc bundle ({type(e).__name__}: {e})") from None

    def _members(self, tar: tarfile.TarFile) -> dict:
        """Every member by name, each checked; records are read on the way (no artifact is)."""
        members, total = {}, 0
        while (member := tar.next()) is not None:
            self._check_member(member)
            if member.name in members:
                raise cache_error(self.location, f"bundle holds '{member.name}' twice; the bundle is refused")
            limit = signing.MAX_SIGNATURE_BYTES if signing.SIGNATURE_FILE_RE.match(posixpath.basename(member.name)) \
                else source_records.MAX_RECORD_BYTES if source_records.key_of(member.name) else MAX_RECORD_BYTES
            if _is_record(member.name) and member.size > limit:
                raise cache_error(self.where(member.name), f"{member.size} bytes: too large to be a qdc metadata "
                                                           f"record; the bundle is refused")
            total += member.size
            if total > MAX_BUNDLE_BYTES:
                raise cache_error(self.location, "bundle is larger than 4 GiB; refusing to read it")
            members[member.name] = member
            if _is_record(member.name):
                self.files[member.name] = _read_member(tar, member)
        return members

    def _artifacts(self, members: dict) -> dict:
        """name -> (member, size its entry record declares) for every member that is not a record;
        a member no readable record declares is refused, unless its entry's record is unreadable
        (then the entry is left out and reading it reports the record)."""
        declared, unreadable = {}, set()
        for name in self.files:
            if not name.startswith(ENTRIES + "/") or not name.endswith("/" + META_FILE):
                continue
            base = name[:-len(META_FILE) - 1]
            try:
                body = A.decode_record(self.files[name], A.ENTRY_RECORD)
                check_entry_record(body)
            except ValueError:
                unreadable.add(base)
                continue
            for info in body["artifacts"].values():
                declared[f"{base}/{info['file']}"] = info["size"]
        out = {}
        for name, member in members.items():
            if name in self.files:
                continue
            if name in declared:
                out[name] = (member, declared[name])
            elif posixpath.dirname(name) not in unreadable:
                raise cache_error(self.where(name), "no record of the bundle declares this member; the bundle is "
                                                    "refused")
        return out

    def _check_member(self, member: tarfile.TarInfo) -> None:
        name = member.name
        parts = name.split("/")
        if (name.startswith("/") or "\\" in name or ".." in parts or "" in parts or "." in parts
                or posixpath.normpath(name) != name):
            raise cache_error(self.location, f"bundle entry '{name}' has a path that could escape the "
                                             f"bundle; the bundle is refused")
        if not member.isreg():
            raise cache_error(self.location, f"bundle entry '{name}' is not a regular file; the bundle is refused")

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        try:
            return self.files[name]
        except KeyError:
            raise FileNotFoundError(f"{self.where(name)}: not in the bundle") from None

    def names(self) -> list[str]:
        return sorted(self.files)

    def where(self, name: str) -> str:
        return f"{self.location}!{name}"


def _is_record(name: str) -> bool:
    """Metadata records and signature files: read while the members are checked."""
    parts = name.split("/")
    return ((len(parts) == 4 and parts[0] == ENTRIES and (parts[3] == META_FILE
                                                          or signing.SIGNATURE_FILE_RE.match(parts[3])))
            or (len(parts) == 3 and parts[0] == MODULES and parts[2].endswith(".msgpack"))
            or source_records.key_of(name) is not None)


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    data = tar.extractfile(member).read(member.size)
    if len(data) != member.size:
        raise EOFError(f"member '{member.name}' is truncated")
    return data


def pack(cache: Store, out_path: str, signer: signing.SigningKey | None = None) -> dict:
    """Write every built module (and only the entries they use) into one bundle at `out_path`.
    Every entry is verified first, and every module record against its entries: a corrupt or
    inconsistent cache is not packed. Signatures travel along; `signer` signs every module
    record and entry the bundle holds too."""
    members: dict[str, bytes] = {}
    modules = list_modules(cache)
    for module, arch in modules:
        body = read_module(cache, module, arch)
        entries = {name: read_entry(cache, key) for name, key in body["kernels"].items()}
        if signer is not None:
            body = signing.sign_module(body, {e.key: e.record for e in entries.values()}, [body], signer)
        members[module_path(module, arch)] = _normalised(A.MODULE_RECORD, body)
        problems = module_problems(cache.where(module_path(module, arch)), body, entries)
        if problems:
            raise cache_error(*problems[0])
        for entry in entries.values():
            base = entry_path(entry.key)
            members[f"{base}/{META_FILE}"] = _normalised(A.ENTRY_RECORD, entry.record)
            for kind, info in entry.record["artifacts"].items():  # the bytes read_entry verified
                members[f"{base}/{info['file']}"] = entry.artifacts[kind]
            members.update(_entry_signatures(cache, entry, signer))
    sources, _ = source_folder.good_records(cache)  # a refused one is left out: its reader parses instead
    members.update(sources)
    data = _tar_gz(members)
    out_path = os.fspath(out_path)
    tmp = f"{out_path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out_path)
    return {"modules": len(modules), "files": len(members), "bytes": len(data), "sources": len(sources)}


def _entry_signatures(store: Store, entry, signer) -> dict:
    """Member name -> bytes of the signature files of `entry` (and `signer`'s)."""
    base = entry_path(entry.key)
    out = {f"{base}/{name}": data for name, data in signing.entry_signature_files(store, entry.key).items()}
    if signer is not None:
        sig = signer.sign(A.ENTRY_RECORD, entry.record)
        out[f"{base}/{signing.signature_file(signer.public.fingerprint)}"] = signing.encode_signature(sig)
    return out


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
