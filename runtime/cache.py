"""The offline cache on disk: content-addressed kernel entries plus per-module records.

    <root>/entries/<key[:2]>/<key>/meta.msgpack    entry record (artifact.ENTRY_RECORD)
                                  kernel.<kind>    artifacts (kernel.so, kernel.bc, kernel.ir, ...)
                                  last_use         empty stamp whose mtime drives LRU eviction
    <root>/modules/<arch>/<module>.msgpack         module record: fields and kernel -> key
    <root>/tmp/                                    where entries are assembled before renaming

An entry is assembled under tmp/ and renamed into place in one step, so readers see a whole
entry or none, and concurrent writers of one key never tear it (the loser of the rename
drops its copy: both compiled the same inputs). Module records are replaced with
os.replace. Nothing here imports the compiler; the compiler writes through `Cache`.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid

from . import artifact as A
from .errors import CacheError

ENTRIES, MODULES, TMP = "entries", "modules", "tmp"
META_FILE, STAMP_FILE = "meta.msgpack", "last_use"
RECORD_TIME_FIELDS = ("created", "built")  # zeroed by `qdc pack` so bundles are reproducible


def cache_error(where: str, reason: str) -> CacheError:
    """A CacheError saying which file and why; `path`/`reason` let `qdc verify` list them."""
    err = CacheError(f"{where}: {reason}")
    err.path, err.reason = where, reason
    return err


def entry_path(key: str) -> str:
    return f"{ENTRIES}/{key[:2]}/{key}"


def module_path(module: str, arch: str) -> str:
    return f"{MODULES}/{arch}/{module}.msgpack"


def check_module_name(module) -> str:
    if not isinstance(module, str) or not module or module.startswith(".") \
            or not all(c.isalnum() or c in "_-." for c in module):
        raise ValueError(f"invalid module name {module!r}: use the kernel file's stem, e.g. 'saxpy'")
    return module


class Entry:
    """A verified kernel entry: its record, rebuilt metadata and artifact bytes."""

    def __init__(self, key, record, meta, artifacts, where):
        self.key, self.record, self.meta, self.artifacts, self.where = key, record, meta, artifacts, where

    @property
    def field_refs(self) -> list:
        return self.record["field_refs"]


# ---- read-only views of a cache folder or a bundle ----------------------------------------

class Store:
    """Files addressed by '/'-separated relative names; `where` names one for error messages."""

    location: str

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def names(self) -> list[str]:
        raise NotImplementedError

    def where(self, name: str) -> str:
        raise NotImplementedError

    def touch(self, key: str) -> None:
        """Record a use of entry `key` for LRU eviction (a no-op where nothing can be written)."""


class DirStore(Store):
    def __init__(self, root: str):
        self.root = self.location = os.fspath(root)

    def path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def read(self, name: str) -> bytes:
        with open(self.path(name), "rb") as f:
            return f.read()

    def where(self, name: str) -> str:
        return self.path(name)

    def names(self) -> list[str]:
        out = []
        for sub in (ENTRIES, MODULES):
            base = os.path.join(self.root, sub)
            for dirpath, _dirs, files in os.walk(base):
                rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                out += [f"{rel}/{f}" for f in files]
        return sorted(out)

    def touch(self, key: str) -> None:
        try:
            os.utime(self.path(f"{entry_path(key)}/{STAMP_FILE}"))
        except OSError:
            pass  # a read-only deployment cache: LRU order does not matter there


def open_store(location) -> Store:
    """A cache folder or a `qdc pack` bundle, whichever `location` is."""
    location = os.fspath(location)
    if os.path.isdir(location):
        return DirStore(location)
    if os.path.isfile(location):
        from .bundle import BundleStore
        return BundleStore(location)
    raise FileNotFoundError(f"no qdc cache or bundle at '{location}' (build one with `qdc build PATH --cache "
                            f"{location}`)")


# ---- reading records and entries ------------------------------------------------------------

def read_record(store: Store, name: str, kind: str) -> dict:
    """Decode a record, turning corruption or a format mismatch into CacheError naming the file."""
    data = store.read(name)
    try:
        body = A.decode_record(data, kind)
        if kind == A.ENTRY_RECORD:
            A.check_entry_record(body)
        else:
            A.check_module_record(body)
    except ValueError as e:
        raise cache_error(store.where(name), str(e)) from None
    return body


def read_entry(store: Store, key: str) -> Entry:
    """Read entry `key` and check every artifact's sha256 before handing any of it out.
    FileNotFoundError if it is absent; CacheError if anything fails its check."""
    base = entry_path(key)
    record = read_record(store, f"{base}/{META_FILE}", A.ENTRY_RECORD)
    if record["key"] != key:
        raise cache_error(store.where(f"{base}/{META_FILE}"), f"the record is for key {record['key'][:12]}…, "
                          f"not {key[:12]}… (the cache was tampered with or mixed up)")
    artifacts = {}
    for kind, info in record["artifacts"].items():
        name = f"{base}/{info['file']}"
        try:
            data = store.read(name)
        except FileNotFoundError:
            raise cache_error(store.where(name), "artifact missing from its cache entry") from None
        if len(data) != info["size"] or A.sha256(data) != info["sha256"]:
            raise cache_error(store.where(name), "sha256 mismatch: the artifact is corrupt or was modified; "
                                                 "it was not loaded (rebuild with `qdc build --force`)")
        artifacts[kind] = data
        artifacts[kind + "_sha256"] = info["sha256"]
    try:
        meta = A.KernelMeta.from_dict(record["meta"])
    except (ValueError, TypeError) as e:
        raise cache_error(store.where(f"{base}/{META_FILE}"), str(e)) from None
    store.touch(key)
    return Entry(key, record, meta, artifacts, store.where(base))


def read_module(store: Store, module: str, arch: str) -> dict:
    name = module_path(check_module_name(module), arch)
    try:
        body = read_record(store, name, A.MODULE_RECORD)
    except FileNotFoundError:
        raise FileNotFoundError(_missing_module_message(store, module, arch)) from None
    if body["module"] != module or body["arch"] != arch:
        raise cache_error(store.where(name), f"record is for module '{body['module']}' on {body['arch']}")
    return body


def list_modules(store: Store) -> list[tuple[str, str]]:
    """(module, arch) of every module record, sorted."""
    out = []
    for n in store.names():
        parts = n.split("/")
        if len(parts) == 3 and parts[0] == MODULES and parts[2].endswith(".msgpack"):
            out.append((parts[2][:-len(".msgpack")], parts[1]))
    return sorted(out)


def _missing_module_message(store: Store, module: str, arch: str) -> str:
    built = list_modules(store)
    arches = sorted(a for m, a in built if m == module)
    if arches:
        return (f"module '{module}' was not built for arch '{arch}' in {store.location} (built for: "
                f"{', '.join(arches)}); run `qdc build --arch {arch}`")
    names = sorted({m for m, _ in built})
    have = f"available: {', '.join(names)}" if names else "it holds no built modules"
    return f"module '{module}' not found in {store.location} ({have}); build it with `qdc build`"


# ---- checking a whole cache or bundle --------------------------------------------------------

def verify_store(store: Store) -> tuple[int, list[tuple[str, str]]]:
    """Check every record and artifact: (files checked, [(file, what is wrong)])."""
    problems: list[tuple[str, str]] = []
    checked = 0
    names = store.names()
    entry_keys = sorted({n.split("/")[2] for n in names if n.startswith(ENTRIES + "/") and n.count("/") == 3})
    for key in entry_keys:
        base = entry_path(key)
        if not A.KEY_RE.match(key):
            problems.append((store.where(base), "not a cache entry name"))
            continue
        try:
            entry = read_entry(store, key)
            checked += 1 + len(entry.record["artifacts"])
        except FileNotFoundError:
            problems.append((store.where(f"{base}/{META_FILE}"), "entry has no metadata record"))
        except CacheError as e:
            problems.append((e.path, e.reason))
    keys = set(entry_keys)
    for module, arch in list_modules(store):
        name = module_path(module, arch)
        try:
            body = read_module(store, module, arch)
        except CacheError as e:
            problems.append((e.path, e.reason))
            continue
        except ValueError as e:
            problems.append((store.where(name), str(e)))
            continue
        checked += 1
        for kernel, key in body["kernels"].items():
            if key not in keys:
                problems.append((store.where(name), f"kernel '{kernel}' refers to entry {key[:12]}…, which is "
                                                    f"missing (evicted?): rebuild the module"))
    return checked, problems


# ---- the writable cache ----------------------------------------------------------------------

class Cache(DirStore):
    """A cache folder that the compiler writes and `qdc clean` prunes."""

    def __init__(self, root):
        super().__init__(os.path.abspath(os.path.expanduser(os.fspath(root))))

    def lookup(self, key: str) -> Entry | None:
        """The verified entry, or None on a miss. Raises CacheError if the entry is corrupt."""
        try:
            return read_entry(self, key)
        except FileNotFoundError:
            return None

    def has_entry(self, key: str) -> bool:
        """A cheap hit test for builds: the entry's record is present, whole and current."""
        try:
            read_record(self, f"{entry_path(key)}/{META_FILE}", A.ENTRY_RECORD)
        except (FileNotFoundError, CacheError):
            return False
        self.touch(key)
        return True

    def write_entry(self, key: str, body: dict, artifacts: dict, replace: bool = False) -> None:
        """Store an entry atomically. `artifacts` maps kind -> bytes; their hashes go into `body`."""
        files, recorded = {}, {}
        for kind, data in sorted(artifacts.items()):
            name = f"kernel.{kind}"
            if not A.ARTIFACT_FILE_RE.match(name):
                raise ValueError(f"bad artifact kind {kind!r}")
            files[name] = data
            recorded[kind] = {"file": name, "sha256": A.sha256(data), "size": len(data)}
        body = dict(body, key=key, artifacts=recorded)
        A.check_entry_record(body)
        files[META_FILE] = A.encode_record(A.ENTRY_RECORD, body)
        files[STAMP_FILE] = b""
        staging = self._staging_dir(key)
        try:
            for name, data in files.items():
                with open(os.path.join(staging, name), "wb") as f:
                    f.write(data)
        except OSError:  # e.g. a full disk: leave nothing half-written behind
            shutil.rmtree(staging, ignore_errors=True)
            raise
        final = self.path(entry_path(key))
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if replace:
            self.evict(key)
        try:
            os.rename(staging, final)
        except OSError:
            if not os.path.isdir(final):
                shutil.rmtree(staging, ignore_errors=True)
                raise
            shutil.rmtree(staging, ignore_errors=True)  # another builder stored the same entry first

    def write_module(self, module: str, arch: str, body: dict) -> bool:
        """Replace a module record atomically; False (nothing written) if only its time would change."""
        body = dict(body, module=check_module_name(module), arch=arch)
        A.check_module_record(body)
        name = module_path(module, arch)
        try:
            old = read_record(self, name, A.MODULE_RECORD)
            if _without_times(old) == _without_times(body):
                return False
        except (FileNotFoundError, CacheError):
            pass
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(self._tmp_root(), f"module-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(A.encode_record(A.MODULE_RECORD, body))
        os.replace(tmp, path)
        return True

    def evict(self, key: str) -> None:
        """Remove an entry; it disappears in one rename, so readers never see half of it."""
        final = self.path(entry_path(key))
        trash = os.path.join(self._tmp_root(), f"evict-{uuid.uuid4().hex}")
        try:
            os.rename(final, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _tmp_root(self) -> str:
        path = os.path.join(self.root, TMP)
        os.makedirs(path, exist_ok=True)
        return path

    def _staging_dir(self, key: str) -> str:
        path = os.path.join(self._tmp_root(), f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
        return path

    # ---- listing and eviction ----------------------------------------------------------------
    def entries(self) -> list[dict]:
        """Every entry folder: key, bytes on disk, last use (stamp mtime), oldest use first."""
        out = []
        base = os.path.join(self.root, ENTRIES)
        for shard in sorted(os.listdir(base)) if os.path.isdir(base) else ():
            shard_dir = os.path.join(base, shard)
            for key in sorted(os.listdir(shard_dir)) if os.path.isdir(shard_dir) else ():
                path = os.path.join(shard_dir, key)
                out.append({"key": key, "path": path, "size": _tree_size(path), "last_use": _last_use(path)})
        return sorted(out, key=lambda e: (e["last_use"], e["key"]))

    def clean(self, max_size: int | None = None, everything: bool = False) -> dict:
        """Evict least-recently-used entries until the total is at most `max_size` bytes (or all
        of them), then drop module records that lost an entry and leftovers of crashed builds."""
        entries = self.entries()
        total = sum(e["size"] for e in entries)
        evicted = 0
        for e in entries:
            if not everything and (max_size is None or total <= max_size):
                break
            self.evict(e["key"])
            total -= e["size"]
            evicted += 1
        dropped = self._drop_dangling_modules(everything)
        self._sweep_tmp(max_age_s=0 if everything else 3600)
        return {"evicted": evicted, "modules_dropped": dropped, "remaining_bytes": max(total, 0)}

    def _drop_dangling_modules(self, everything: bool) -> list[str]:
        present = {e["key"] for e in self.entries()}
        dropped = []
        for module, arch in list_modules(self):
            name = module_path(module, arch)
            try:
                keys = set(read_record(self, name, A.MODULE_RECORD)["kernels"].values())
            except CacheError:
                keys = {None}
            if everything or not keys <= present:
                os.unlink(self.path(name))
                dropped.append(f"{module} ({arch})")
        return dropped

    def _sweep_tmp(self, max_age_s: float) -> None:
        tmp = os.path.join(self.root, TMP)
        now = time.time()
        for name in os.listdir(tmp) if os.path.isdir(tmp) else ():
            path = os.path.join(tmp, name)
            try:
                if now - os.lstat(path).st_mtime >= max_age_s:
                    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
            except OSError:
                pass  # a concurrent builder finished or removed it


def _without_times(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in RECORD_TIME_FIELDS}


def _tree_size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _last_use(entry_dir: str) -> float:
    for name in (STAMP_FILE, META_FILE):
        try:
            return os.stat(os.path.join(entry_dir, name)).st_mtime
        except OSError:
            continue
    return 0.0


def parse_size(text: str) -> int:
    """'500M', '2G', '10k', '123' (bytes) -> bytes; ValueError with the accepted forms."""
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    mult = units.get(s[-1:], 1)
    number = s[:-1] if s[-1:] in units else s
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"invalid size {text!r}: use bytes or a number with K, M, G or T (e.g. 500M)") from None
    if value < 0:
        raise ValueError(f"invalid size {text!r}: must not be negative")
    return int(value * mult)
