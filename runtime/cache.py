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

Replacing an entry (`qdc build --force`). A folder cannot be renamed over a non-empty one,
so a replacement moves the old entry aside and renames the new one in, announcing the
window with a marker file `tmp/replacing-<key>-*` that exists before the old entry leaves
and until the new one is in. Readers (`read_entry`) make that invisible:
- they read every file of an entry through one open handle on its folder, so a read sees
  one version whole, even if the folder is moved aside meanwhile;
- a read that fails because the folder was moved or deleted under it (the path no longer
  names the folder it opened) starts again;
- a read that finds no entry while a marker is present waits for the marker to go and
  starts again; one that finds neither retries once, since a replacement may have ended
  between the two looks.
So a reader sees the old entry or the new one, never none (bounded by REPLACE_WAIT_S).
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
import uuid

from . import signing, source_folder
from .contract import artifact as A
from .contract.artifact_schema import ARTIFACT_FILE_RE, check_entry_record, check_module_record
from .contract.entry_points import entry_points_problem
from .contract.errors import CacheError, ModuleNotBuiltError, SignatureError
from .module_check import entry_signature

ENTRIES, MODULES, TMP = "entries", "modules", "tmp"
META_FILE, STAMP_FILE = "meta.msgpack", "last_use"
RECORD_TIME_FIELDS = ("created", "built")  # zeroed by `qdc pack` so bundles are reproducible
MAX_RECORD_BYTES = 16 << 20   # a metadata record is far smaller: anything larger is not read
STALE_TMP_S = 600.0           # tmp/ leftovers this old belong to a killed build: later builds remove them
REPLACING = "replacing-"      # tmp/replacing-<key>-<id>: an entry is being replaced (module docstring)
REPLACE_WAIT_S = 10.0         # the longest a reader waits for replacements of one entry
_MARKER_STALE_S = 60.0        # a marker this old was left by a killed replacement: ignore it
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a FIFO in the cache must not hang a reader
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_ENTRY_HANDLES = os.open in os.supports_dir_fd  # else (Windows) entry files are read by path


def cache_error(where: str, reason: str, cls=CacheError) -> CacheError:
    """A CacheError saying which file and why; `path`/`reason` let `qdc verify` list them."""
    err = cls(f"{where}: {reason}")
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
    """A verified kernel entry: its record, rebuilt metadata and artifact bytes; `where` names
    its folder, `artifact_where` each artifact's file (kind -> path), for error messages."""

    def __init__(self, key, record, meta, artifacts, where, artifact_where):
        self.key, self.record, self.meta, self.artifacts, self.where = key, record, meta, artifacts, where
        self.artifact_where = artifact_where

    @property
    def field_refs(self) -> list:
        return self.record["field_refs"]


# ---- cache folders: usable at all? -------------------------------------------------------------

def check_cache_folder(root, what: str = "cache folder") -> str:
    """The absolute path of cache folder `root`; ValueError if it, or a folder above it, is a file."""
    path = os.path.abspath(os.path.expanduser(os.fspath(root)))
    probe = path
    while not os.path.isdir(probe):
        if os.path.lexists(probe):
            if probe == path:
                raise ValueError(f"{what} '{root}' is a file, not a folder")
            raise ValueError(f"{what} '{root}' cannot be created: '{probe}' is a file, not a folder")
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return path


def writable_problem(root: str) -> str | None:
    """Why entries cannot be written under `root` (created if absent), or None. It tries for
    real: permission bits do not stop root, and os.access does not see a read-only mount."""
    try:
        tmp = os.path.join(root, TMP)
        os.makedirs(tmp, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix="probe-", dir=tmp)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


# ---- read-only views of a cache folder or a bundle ----------------------------------------

class Store:
    """Files addressed by '/'-separated relative names; `where` names one for error messages."""

    location: str

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes: FileNotFoundError if absent, CacheError if unreadable or over `max_bytes`."""
        raise NotImplementedError

    def names(self) -> list[str]:
        raise NotImplementedError

    def where(self, name: str) -> str:
        raise NotImplementedError

    def touch(self, key: str) -> None:
        """Record a use of entry `key` for LRU eviction (a no-op where nothing can be written)."""

    def open_entry(self, key: str) -> "EntryFiles":
        """The files of entry `key`, all from one version of it (FileNotFoundError if absent)."""
        return EntryFiles(self, entry_path(key))

    def folder_names(self, base: str) -> list[str]:
        """The names of the files in folder `base` (an entry's: its signatures are found so)."""
        return [n[len(base) + 1:] for n in self.names() if n.startswith(base + "/")]

    def replacing(self, key: str) -> bool:
        """Whether entry `key` is being replaced right now (a reader that missed it waits)."""
        return False

    def source_record_names(self) -> list[str]:
        """The names of the parsed-source records the store holds (runtime/source_folder.py)."""
        return [n for n in self.names() if n.startswith(source_folder.FOLDER + "/")]


class EntryFiles:
    """One entry's files by name; a bundle's come straight from its store."""

    def __init__(self, store: Store, base: str):
        self.store, self.base = store, base

    def read(self, name: str, size: int | None = None, max_bytes: int | None = None) -> bytes:
        data = self.store.read(f"{self.base}/{name}", max_bytes)
        if size is not None and len(data) != size:
            raise _size_mismatch(self.where(name), len(data), size)
        return data

    def where(self, name: str) -> str:
        return self.store.where(f"{self.base}/{name}")

    def names(self) -> list[str]:
        return self.store.folder_names(self.base)

    def unchanged(self) -> bool:
        """False if the entry was moved or deleted since it was opened (read it again)."""
        return True

    def close(self) -> None:
        pass


def _size_mismatch(where: str, actual: int, declared: int) -> CacheError:
    return cache_error(where, f"size mismatch: {actual} bytes where its record says {declared}; the artifact is "
                              f"corrupt or was modified and was not loaded (rebuild with `qdc build --force`)")


def _unreadable(where: str, e: OSError) -> CacheError:
    return cache_error(where, f"not a readable file ({e.strerror or e})")


def _read_file(where: str, open_fd, size: int | None = None, max_bytes: int | None = None) -> bytes:
    """A whole regular file opened by `open_fd()`: FileNotFoundError if absent, CacheError if a
    folder or anything else stands in its place, or its size is not `size` (checked before reading)."""
    try:
        fd = open_fd()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _unreadable(where, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise cache_error(where, "not a readable file (a folder or special file stands in its place)")
        if size is not None and st.st_size != size:
            raise _size_mismatch(where, st.st_size, size)
        if max_bytes is not None and st.st_size > max_bytes:
            raise cache_error(where, f"{st.st_size} bytes: too large to be a qdc metadata record")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        try:
            return f.read()
        except OSError as e:
            raise _unreadable(where, e) from None


class DirStore(Store):
    def __init__(self, root: str):
        self.root = self.location = os.fspath(root)

    def path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        path = self.path(name)
        return _read_file(path, lambda: os.open(path, _READ_FLAGS), max_bytes=max_bytes)

    def where(self, name: str) -> str:
        return self.path(name)

    def folder_names(self, base: str) -> list[str]:
        try:
            return os.listdir(self.path(base))
        except OSError:
            return []

    def names(self) -> list[str]:
        """Every file under entries/ and modules/, and any folder standing where a module record
        should be (so that `qdc verify` reports it)."""
        out = []
        for sub in (ENTRIES, MODULES):
            base = os.path.join(self.root, sub)
            for dirpath, dirs, files in os.walk(base):
                rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                out += [f"{rel}/{f}" for f in files]
                if sub == MODULES and rel.count("/") == 1:
                    out += [f"{rel}/{d}" for d in dirs if d.endswith(".msgpack")]
        return sorted(out)

    def source_record_names(self) -> list[str]:
        return source_folder.folder_names(self.root)

    def touch(self, key: str) -> None:
        try:
            os.utime(self.path(f"{entry_path(key)}/{STAMP_FILE}"))
        except OSError:
            pass  # a read-only deployment cache: LRU order does not matter there

    def open_entry(self, key: str) -> EntryFiles:
        if not _ENTRY_HANDLES:
            return super().open_entry(key)
        return _EntryFolder(self, entry_path(key))

    def replacing(self, key: str) -> bool:
        tmp, prefix, now = os.path.join(self.root, TMP), f"{REPLACING}{key}-", time.time()
        try:
            markers = [n for n in os.listdir(tmp) if n.startswith(prefix)]
        except OSError:
            return False
        for name in markers:
            try:
                if now - os.stat(os.path.join(tmp, name)).st_mtime < _MARKER_STALE_S:
                    return True
            except OSError:
                continue  # that replacement has just finished
        return False


class _EntryFolder(EntryFiles):
    """An entry folder opened once: every file is read through that handle, so all of them
    come from one version of the entry even if a replacement moves the folder aside meanwhile."""

    def __init__(self, store: DirStore, base: str):
        super().__init__(store, base)
        self.path = store.path(base)
        try:
            self.fd = os.open(self.path, _DIR_FLAGS)
        except FileNotFoundError:
            raise
        except NotADirectoryError:
            raise cache_error(self.path, "not a cache entry folder (a file stands in its place)") from None
        except OSError as e:
            raise _unreadable(self.path, e) from None
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def read(self, name: str, size: int | None = None, max_bytes: int | None = None) -> bytes:
        return _read_file(self.where(name), lambda: os.open(name, _READ_FLAGS, dir_fd=self.fd), size, max_bytes)

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def names(self) -> list[str]:
        try:
            return os.listdir(self.fd)
        except OSError as e:
            raise _unreadable(self.path, e) from None

    def unchanged(self) -> bool:
        try:
            if os.fstat(self.fd).st_nlink == 0:  # deleted
                return False
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def close(self) -> None:
        os.close(self.fd)


# ---- reading records and entries ------------------------------------------------------------

def decode(data: bytes, where: str, kind: str) -> dict:
    """Decode a record, turning corruption or a format mismatch into CacheError naming the file."""
    try:
        body = A.decode_record(data, kind)
        if kind == A.ENTRY_RECORD:
            check_entry_record(body)
        else:
            check_module_record(body)
    except ValueError as e:
        raise cache_error(where, str(e)) from None
    return body


def read_record(store: Store, name: str, kind: str) -> dict:
    return decode(store.read(name, MAX_RECORD_BYTES), store.where(name), kind)


def read_entry(store: Store, key: str, trust: signing.Trust | None = None, attested: str | None = None) -> Entry:
    """Read entry `key` and check every artifact's sha256, and that it defines exactly the
    entry points its record names (contract/entry_points.py), before handing any of it out;
    with `trust`, first that a trusted key signed its record (runtime/signing.py), or that its
    digest is `attested`, the one a trusted statement of its module record gives (Trust.attested).
    FileNotFoundError if it is absent; CacheError if anything fails its check (SignatureError if
    the signature does). A concurrent replacement of the entry is never seen as either (see the
    module docstring)."""
    deadline = time.monotonic() + REPLACE_WAIT_S
    retried = False
    while True:
        files = None
        try:
            files = store.open_entry(key)
            return _read_entry_files(store, key, files, trust, attested)
        except (FileNotFoundError, CacheError):
            if time.monotonic() > deadline:
                raise
            if files is not None:
                if files.unchanged():
                    raise  # a fault of the entry as it stands
                continue  # moved aside or deleted while we read it: read what is there now
            if store.replacing(key):
                _wait_for_replacement(store, key, deadline)
            elif retried:
                raise
            else:
                retried = True  # a replacement may have ended between the miss and the look for markers
        finally:
            if files is not None:
                files.close()


def _wait_for_replacement(store: Store, key: str, deadline: float) -> None:
    while store.replacing(key) and time.monotonic() < deadline:
        time.sleep(0.002)


def _read_entry_files(store: Store, key: str, files: EntryFiles, trust, attested) -> Entry:
    record = decode(files.read(META_FILE, max_bytes=MAX_RECORD_BYTES), files.where(META_FILE), A.ENTRY_RECORD)
    if record["key"] != key:
        raise cache_error(files.where(META_FILE), f"the record is for key {record['key']}, not the key of its "
                                                  f"folder (the cache was tampered with or mixed up)")
    if trust is not None and not (attested is not None and signing.entry_digest(record) == attested) \
            and trust.refusal(A.ENTRY_RECORD, record,  # first only what a trusted key may have signed
                              signing.read_entry_signatures(files, trust.signature_files())):
        check_trust(trust, A.ENTRY_RECORD, record, signing.read_entry_signatures(files), store.where(files.base),
                    f"entry {key[:12]}... (kernel '{record['meta']['name']}', {record['variant']}, {record['arch']})")
    artifacts = {}
    for kind, info in record["artifacts"].items():
        try:
            data = files.read(info["file"], size=info["size"])
        except FileNotFoundError:
            raise cache_error(files.where(info["file"]), "artifact missing from its cache entry") from None
        if A.sha256(data) != info["sha256"]:
            raise cache_error(files.where(info["file"]), "sha256 mismatch: the artifact is corrupt or was modified; "
                                                         "it was not loaded (rebuild with `qdc build --force`)")
        artifacts[kind] = data
        artifacts[kind + "_sha256"] = info["sha256"]
    try:
        meta = A.KernelMeta.from_dict(record["meta"])
    except (ValueError, TypeError) as e:
        raise cache_error(files.where(META_FILE), str(e)) from None
    for kind, info in record["artifacts"].items():
        problem = entry_points_problem(kind, artifacts[kind], meta)
        if problem is not None:
            raise cache_error(files.where(info["file"]), problem)
    store.touch(key)
    artifact_where = {kind: files.where(info["file"]) for kind, info in record["artifacts"].items()}
    return Entry(key, record, meta, artifacts, store.where(files.base), artifact_where)


def read_module(store: Store, module: str, arch: str, trust: signing.Trust | None = None) -> dict:
    """Module `module`'s record for `arch`; with `trust`, SignatureError unless a trusted key signed it."""
    name = module_path(check_module_name(module), arch)
    try:
        body = read_record(store, name, A.MODULE_RECORD)
    except FileNotFoundError:
        raise ModuleNotBuiltError(_missing_module_message(store, module, arch)) from None
    if body["module"] != module or body["arch"] != arch:
        raise cache_error(store.where(name), f"record is for module '{body['module']}' on {body['arch']}")
    if trust is not None:
        check_trust(trust, A.MODULE_RECORD, body, signing.check_signature_list(body.get("signed", [])),
                    store.where(name), f"the record of module '{module}' ({arch})")
    return body


def check_trust(trust: signing.Trust, kind: str, body: dict, signatures: list, where: str, what: str) -> None:
    """SignatureError naming `where` and `what` unless `signatures` hold a trusted one of `body`."""
    reason = trust.refusal(kind, body, signatures)
    if reason is not None:
        raise cache_error(where, f"{what} refused: {reason}; nothing of it was loaded", SignatureError)


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


# ---- the writable cache ----------------------------------------------------------------------

class Cache(DirStore):
    """A cache folder that the compiler writes and `qdc clean` prunes."""

    def __init__(self, root):
        super().__init__(os.path.abspath(os.path.expanduser(os.fspath(root))))

    def lookup(self, key: str, trust: signing.Trust | None = None) -> Entry | None:
        """The verified entry, or None on a miss. Raises CacheError if the entry is corrupt (or,
        with `trust`, not signed by a trusted key)."""
        try:
            return read_entry(self, key, trust)
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
        """Store an entry atomically. `artifacts` maps kind -> bytes; their hashes go into `body`.
        `replace`: an existing entry of `key` is replaced (readers see the old one or the new one)."""
        files, recorded = {}, {}
        for kind, data in sorted(artifacts.items()):
            name = f"kernel.{kind}"
            if not ARTIFACT_FILE_RE.match(name):
                raise ValueError(f"bad artifact kind {kind!r}")
            files[name] = data
            recorded[kind] = {"file": name, "sha256": A.sha256(data), "size": len(data)}
        body = dict(body, key=key, artifacts=recorded)
        check_entry_record(body)
        files[META_FILE] = A.encode_record(A.ENTRY_RECORD, body)
        files[STAMP_FILE] = b""
        staging = self._staging_dir(key)
        try:  # whatever fails (a full disk, say), leave nothing half-written behind
            for name, data in files.items():
                with open(os.path.join(staging, name), "wb") as f:
                    f.write(data)
            final = self.path(entry_path(key))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            if replace:
                self._swap_in(staging, final, key)
            else:
                self._rename_in(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    @staticmethod
    def _rename_in(staging: str, final: str) -> None:
        """Rename the staged entry into place; if another builder's copy got there first, keep it."""
        try:
            os.rename(staging, final)
        except OSError:
            if not os.path.isdir(final):
                raise
            shutil.rmtree(staging, ignore_errors=True)  # the same inputs, compiled by another builder

    def _swap_in(self, staging: str, final: str, key: str) -> None:
        """Replace the entry at `final` by the staged one: old aside, new in, under a marker that
        tells readers missing the entry meanwhile to wait (module docstring)."""
        marker = os.path.join(self._tmp_root(), f"{REPLACING}{key}-{uuid.uuid4().hex[:12]}")
        with open(marker, "wb"):
            pass
        aside = os.path.join(self._tmp_root(), f"evict-{uuid.uuid4().hex}")
        try:
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                aside = None
            try:
                self._rename_in(staging, final)
            except OSError:
                if aside is not None and not os.path.lexists(final):
                    os.rename(aside, final)  # put the old entry back rather than leave none
                    aside = None
                raise
        finally:
            _remove_file(marker)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def install_entry(self, key: str, files: dict) -> None:
        """Install an entry verified elsewhere (fetched from a remote): `files` maps file name ->
        bytes. Staged under tmp/, flushed to disk, then renamed in: a crash leaves it whole or absent."""
        staging = self._staging_dir(key)
        try:
            for name, data in files.items():
                _write_synced(os.path.join(staging, name), data)
            _write_synced(os.path.join(staging, STAMP_FILE), b"")
            final = self.path(entry_path(key))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            self._rename_in(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def install_record(self, name: str, data: bytes) -> None:
        """Replace the record `name` (a module's or a parsed source's, verified elsewhere) by
        `data` in one rename."""
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(self._tmp_root(), f"module-{uuid.uuid4().hex}")
        _write_synced(tmp, data)
        os.replace(tmp, path)

    def write_module(self, module: str, arch: str, body: dict, signer: signing.SigningKey | None = None,
                     signed_as: tuple = ()) -> bool:
        """Replace a module record atomically; False (nothing written) if only its time would change.
        The record remembers each kernel's signature (kernel, variant, parameters) from the entry
        it names, so that loading and `qdc verify` notice a record that names the wrong entry.
        It keeps the cryptographic signatures of the record it replaces and of the records
        `signed_as` wherever their signed content is this record's (runtime/signing.py), and
        `signer` signs it."""
        body = dict(body, module=check_module_name(module), arch=arch)
        entries = self._entry_records(body["kernels"])
        body["signatures"] = {name: entry_signature(entries[key]) for name, key in body["kernels"].items()
                              if key in entries}
        check_module_record(body)
        name = module_path(module, arch)
        try:
            old = read_record(self, name, A.MODULE_RECORD)
        except (FileNotFoundError, CacheError):
            old = None
        body = signing.sign_module(body, entries, [r for r in (old, *signed_as) if r is not None], signer)
        if old is not None and _without_times(old) == _without_times(body):
            return False
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(self._tmp_root(), f"module-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(A.encode_record(A.MODULE_RECORD, body))
        os.replace(tmp, path)
        return True

    def _entry_records(self, kernels: dict) -> dict:
        """Key -> record of the entries `kernels` names that are here and readable."""
        out = {}
        for key in kernels.values():
            try:
                out[key] = read_record(self, f"{entry_path(key)}/{META_FILE}", A.ENTRY_RECORD)
            except (FileNotFoundError, CacheError):
                continue  # a missing or bad entry is reported as such
        return out

    def sign_entry(self, key: str, signer: signing.SigningKey) -> None:
        """Sign entry `key`'s record with `signer`, unless that signature is there already."""
        record = read_record(self, f"{entry_path(key)}/{META_FILE}", A.ENTRY_RECORD)
        name = signing.signature_file(signer.public.fingerprint)
        data = signing.encode_signature(signer.sign(A.ENTRY_RECORD, record))  # Ed25519 is deterministic
        try:
            if self.read(f"{entry_path(key)}/{name}", signing.MAX_SIGNATURE_BYTES) == data:
                return
        except (FileNotFoundError, CacheError):
            pass
        self.add_signature(key, name, data)

    def add_signature(self, key: str, name: str, data: bytes) -> None:
        """Put signature file `name` into entry `key` in one rename (an entry's other files never change)."""
        if not signing.SIGNATURE_FILE_RE.match(name):
            raise ValueError(f"bad signature file name {name!r}")
        tmp = os.path.join(self._tmp_root(), f"{name}.{uuid.uuid4().hex[:12]}")
        _write_synced(tmp, data)
        try:
            os.replace(tmp, self.path(f"{entry_path(key)}/{name}"))
        except OSError:
            _remove_file(tmp)
            raise

    def evict(self, key: str) -> bool:
        """Remove an entry; it disappears in one rename, so readers never see half of it.
        False if it could not be removed (a read-only cache)."""
        final = self.path(entry_path(key))
        try:
            trash = os.path.join(self._tmp_root(), f"evict-{uuid.uuid4().hex}")
            os.rename(final, trash)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

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
        """Evict least-recently-used entries and parsed-source records (runtime/source_folder.py)
        until the total is at most `max_size` bytes (or all of them), then drop module records
        that lost an entry, source records that are refused, and leftovers of crashed builds."""
        entries, records = self.entries(), source_folder.folder_records(self.root)
        total = sum(e["size"] for e in entries) + sum(r["size"] for r in records)
        evicted = records_evicted = 0
        for item in sorted(entries + records, key=lambda e: (e["last_use"], e["path"])):
            if not everything and (max_size is None or total <= max_size):
                break
            if "key" in item and self.evict(item["key"]):
                evicted += 1
            elif "key" not in item and _remove_file(item["path"]):
                records_evicted += 1
            else:
                continue
            total -= item["size"]
        dropped = self._drop_dangling_modules(everything)
        self.sweep_tmp(max_age_s=0 if everything else STALE_TMP_S)
        records_evicted += source_folder.sweep(self.root, max_age_s=0 if everything else STALE_TMP_S)
        return {"evicted": evicted, "sources_evicted": records_evicted, "modules_dropped": dropped,
                "remaining_bytes": max(total, 0)}

    def _drop_dangling_modules(self, everything: bool) -> list[str]:
        present = {e["key"] for e in self.entries()}
        dropped = []
        for module, arch in list_modules(self):
            name = module_path(module, arch)
            try:
                keys = set(read_record(self, name, A.MODULE_RECORD)["kernels"].values())
            except (CacheError, FileNotFoundError):
                keys = {None}
            if everything or not keys <= present:
                if _remove_file(self.path(name)):
                    dropped.append(f"{module} ({arch})")
        return dropped

    def sweep_tmp(self, max_age_s: float = STALE_TMP_S) -> int:
        """Remove what crashed or killed builds left in tmp/ (staging folders, entries moved
        aside, markers) once it is `max_age_s` old; the number removed."""
        tmp = os.path.join(self.root, TMP)
        now, removed = time.time(), 0
        for name in os.listdir(tmp) if os.path.isdir(tmp) else ():
            path = os.path.join(tmp, name)
            try:
                if now - os.lstat(path).st_mtime >= max_age_s:
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
                    removed += 1
            except OSError:
                pass  # a concurrent builder finished or removed it
        return removed


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_file(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


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
