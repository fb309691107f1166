"""Remote artifact stores: the cache layout (runtime/cache.py) on an object store.

    s3://bucket/prefix  gs://bucket/prefix  az://account/container/prefix
    http(s)://host/prefix  file:///folder  memory:///

A remote holds the same files as a cache folder under its prefix (entries/<kk>/<key>/...,
modules/<arch>/<module>.msgpack), reached through obstore (the optional extra `remote`).
Entries are immutable: every file is written create-if-absent, artifacts before the entry's
record, so an entry whose record exists is whole, and an interrupted upload leaves at most
artifacts that no record names. A module record is written only once every entry it names is
on the remote. Anything downloaded is verified as loading verifies (sha256, sizes, entry
points, and with trusted keys the signatures: runtime/signing.py) before it is installed,
atomically, into a local cache. An entry's signature files travel with it, uploaded after its
record (each create-if-absent, so a later CI run can sign an entry already on the store).
Credentials come from each cloud's standard environment; they are never printed or stored.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import time
import warnings

from . import signing, source_folder
from .cache import (ENTRIES, META_FILE, MODULES, Cache, Store, cache_error, decode, entry_path,
                    module_path, read_entry, read_module)
from .contract import artifact as A
from .contract.errors import CacheError
from .merge import carry_source_records

REMOTE_SCHEMES = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "http://", "https://", "file://",
                  "memory://")
REMOTE_VARIABLE = "QDC_REMOTE"               # the remote of `qdc` commands given no --remote
LOCAL_CACHE_VARIABLE = "QDC_REMOTE_CACHE"    # where `load` keeps what it fetched from a remote
RETRIES, FIRST_BACKOFF_S = 4, 0.2            # network errors: tries, and the first wait (doubling)
EXTRA_HINT = "remote artifact stores need the optional extra: pip install 'qdc[remote]' (the obstore package)"


class RemoteWriteRefused(CacheError):
    """The remote refused a write (read-only credentials): reads still work."""


class RemoteUnreachable(CacheError):
    """A remote operation still failed after every retry (a network error)."""


def is_remote(location) -> bool:
    return isinstance(location, str) and location.lower().startswith(REMOTE_SCHEMES)


def _obstore():
    try:
        import obstore
    except ImportError:
        raise ImportError(EXTRA_HINT) from None
    return obstore


def default_local_cache(url: str) -> str:
    """The read-through cache of remote `url`: $QDC_REMOTE_CACHE, else the user cache folder,
    one folder per remote (module records of two remotes must not mix)."""
    base = os.environ.get(LOCAL_CACHE_VARIABLE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "qdc", "remote")
    return os.path.join(base, hashlib.sha256(url.encode()).hexdigest()[:16])


class RemoteStore(Store):
    """A remote's files, read and written with retries; `where` names a file by its URL."""

    def __init__(self, url: str, retries: int | None = None, backoff_s: float | None = None):
        obstore = _obstore()
        from obstore.store import from_url
        self.url = self.location = url.rstrip("/")
        self.retries = max(1, RETRIES if retries is None else retries)
        self.backoff_s = FIRST_BACKOFF_S if backoff_s is None else backoff_s
        self.read_only = False
        self._obs = obstore
        # qdc retries itself (below) so that every error names the object and the tries made
        kwargs = {"retry_config": {"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=30)}}
        if url.lower().startswith("file://"):
            path = url[len("file://"):]
            os.makedirs(path, exist_ok=True)  # LocalStore needs its folder; an S3 bucket exists already
            kwargs = {}
        try:
            self.store = from_url(url, **kwargs)
        except Exception as e:  # noqa: BLE001 (obstore's configuration errors have no common base)
            raise CacheError(f"{self.url}: not a usable remote store: {e}") from None

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _call(self, what: str, name: str, fn):
        """fn() with retries and doubling waits on network errors; FileNotFoundError if absent,
        RemoteWriteRefused if refused, CacheError naming the URL once the tries are spent."""
        E = self._obs.exceptions
        error = None
        for attempt in range(self.retries):
            try:
                return fn()
            except (FileNotFoundError, E.NotFoundError):
                raise FileNotFoundError(self.where(name)) from None
            except E.AlreadyExistsError:
                raise
            except (E.PermissionDeniedError, E.UnauthenticatedError) as e:
                raise RemoteWriteRefused(f"{self.where(name)}: {what} refused by the remote ({type(e).__name__})") \
                    from None
            except Exception as e:  # noqa: BLE001 (network errors: obstore's GenericError, OSError, ...)
                error = e
            if attempt + 1 < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        err = RemoteUnreachable(f"{self.where(name)}: {what} failed after {self.retries} tries: {first_line}")
        err.path, err.reason = self.where(name), f"{what} failed after {self.retries} tries: {first_line}"
        raise err

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        data = bytes(self._call("download", name, lambda: self._obs.get(self.store, name).bytes()))
        if max_bytes is not None and len(data) > max_bytes:
            raise cache_error(self.where(name), f"{len(data)} bytes: too large to be a qdc metadata record")
        return data

    def exists(self, name: str) -> bool:
        try:
            self._call("look-up", name, lambda: self._obs.head(self.store, name))
            return True
        except FileNotFoundError:
            return False

    def listing(self, prefixes=(ENTRIES, MODULES)) -> list[dict]:
        """Every object under entries/ and modules/ (or `prefixes`): {"path", "size",
        "last_modified" (epoch s)}."""
        out = []
        for prefix in prefixes:
            for batch in self._call("listing", prefix, lambda p=prefix: list(self._obs.list(self.store, prefix=p))):
                out += [{"path": o["path"], "size": o["size"], "last_modified": o["last_modified"].timestamp()}
                        for o in batch]
        return sorted(out, key=lambda o: o["path"])

    def names(self) -> list[str]:
        return [o["path"] for o in self.listing()]

    def source_record_names(self) -> list[str]:
        return [o["path"] for o in self.listing((source_folder.FOLDER + "/",))]

    def folder_names(self, base: str) -> list[str]:
        batches = self._call("listing", base, lambda: list(self._obs.list(self.store, prefix=base + "/")))
        return [o["path"][len(base) + 1:] for batch in batches for o in batch]

    def put(self, name: str, data: bytes, create: bool = True) -> bool:
        """Write `data`; with `create`, only if absent (False if it exists: nothing written)."""
        mode = "create" if create else "overwrite"
        try:
            self._call("upload", name, lambda: self._obs.put(self.store, name, data, mode=mode))
            return True
        except self._obs.exceptions.AlreadyExistsError:
            return False

    def delete(self, name: str) -> None:
        try:
            self._call("delete", name, lambda: self._obs.delete(self.store, name))
        except FileNotFoundError:
            pass


class _Downloaded(Store):
    """Files fetched from a remote, held in memory until verified; named by their URLs."""

    def __init__(self, remote: RemoteStore):
        self.remote, self.files, self.location = remote, {}, remote.location
        self.listed: dict = {}  # folder -> its file names

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        if name not in self.files:
            self.files[name] = self.remote.read(name, max_bytes)
        return self.files[name]

    def where(self, name: str) -> str:
        return self.remote.where(name)

    def names(self) -> list[str]:
        return self.remote.names()  # only to say which modules there are, when one is missing

    def source_record_names(self) -> list[str]:
        return self.remote.source_record_names()

    def folder_names(self, base: str) -> list[str]:
        if base not in self.listed:
            self.listed[base] = self.remote.folder_names(base)
        return self.listed[base]


# ---- between a remote and a local cache -------------------------------------------------------

def fetch_entry(remote: RemoteStore, cache: Cache, key: str, trust: signing.Trust | None = None,
                attested: str | None = None) -> bool:
    """Download entry `key` with its signatures, verify it whole (with `trust`, its signature
    too, or its `attested` digest), and install it into `cache` in one rename; an entry `cache` holds already only gains
    the signatures it lacks. False if the remote has no such entry; CacheError (naming the URL)
    if it fails its checks, and then nothing is installed."""
    downloaded = _Downloaded(remote)
    try:
        read_entry(downloaded, key, trust, attested)  # sha256, sizes, entry points: before anything reaches the disk
    except FileNotFoundError:
        return False
    base = entry_path(key)
    signatures = [n for n in downloaded.folder_names(base) if signing.SIGNATURE_FILE_RE.match(n)]
    for name in signatures[:signing.MAX_SIGNATURES]:
        downloaded.read(f"{base}/{name}", signing.MAX_SIGNATURE_BYTES)
    files = {name[len(base) + 1:]: data for name, data in downloaded.files.items()}
    if not os.path.isdir(cache.path(base)):
        cache.install_entry(key, files)
        return True
    present = set(cache.folder_names(base))
    for name, data in files.items():
        if signing.SIGNATURE_FILE_RE.match(name) and name not in present:
            cache.add_signature(key, name, data)
    return True


def push_entry(remote: RemoteStore, cache: Cache, key: str) -> None:
    """Upload local entry `key` (verified first): artifacts, then its record, each create-if-absent.
    An artifact already there with other bytes is one that no record names yet (an upload killed
    before its record): it is replaced."""
    entry = read_entry(cache, key)
    base = entry_path(key)
    if not remote.exists(f"{base}/{META_FILE}"):
        for kind, info in sorted(entry.record["artifacts"].items()):
            name, data = f"{base}/{info['file']}", entry.artifacts[kind]
            if not remote.put(name, data) and A.sha256(remote.read(name)) != info["sha256"]:
                remote.put(name, data, create=False)
        remote.put(f"{base}/{META_FILE}", cache.read(f"{base}/{META_FILE}"))
    for name in sorted(n for n in cache.folder_names(base) if signing.SIGNATURE_FILE_RE.match(n)):
        data = cache.read(f"{base}/{name}", signing.MAX_SIGNATURE_BYTES)
        if not remote.put(f"{base}/{name}", data) and remote.read(f"{base}/{name}") != data:
            remote.put(f"{base}/{name}", data, create=False)  # the same key signs the same record alike


def push_module(remote: RemoteStore, cache: Cache, module: str, arch: str) -> list[str]:
    """Upload a local module record once every entry it names is on the remote; the kernels whose
    entries are not there yet (nothing written then). Entries the local cache lacks (another
    shard's) are fetched first and the record rewritten with their signatures, so that the record
    uploaded is the whole one; it keeps the signed statements of the record already there that
    still hold (another shard's: runtime/signing.py). A record already there is replaced only if
    it differs in more than its build time."""
    body = read_module(cache, module, arch)
    missing = [k for k, key in sorted(body["kernels"].items()) if not remote.exists(f"{entry_path(key)}/{META_FILE}")]
    if missing:
        return missing
    absent = [key for key in body["kernels"].values() if not cache.has_entry(key)]
    for key in absent:
        fetch_entry(remote, cache, key)
    name = module_path(module, arch)
    theirs = _remote_record(remote, name)
    if absent or theirs:
        cache.write_module(module, arch, body, signed_as=(theirs,) if theirs else ())  # every kernel's parameters
        body = read_module(cache, module, arch)
    data = cache.read(name)
    if theirs is None:
        if remote.put(name, data):
            return []
        theirs = _remote_record(remote, name)  # another shard's, written meanwhile
    if not (theirs and _timeless(theirs) == _timeless(body)):
        remote.put(name, data, create=False)
    return []


def _remote_record(remote: RemoteStore, name: str) -> dict | None:
    """The remote's module record `name`; None if absent, {} if damaged (the good one replaces it)."""
    try:
        return decode(remote.read(name), remote.where(name), A.MODULE_RECORD)
    except FileNotFoundError:
        return None
    except CacheError:
        return {}


def pull_module(remote: RemoteStore, cache: Cache, module: str, arch: str, trust: signing.Trust | None = None) -> int:
    """Fetch a module record and every entry it names that `cache` lacks (with `trust`: lacks
    signed by a trusted key), all verified, the record installed last; the number of entries
    fetched. CacheError naming the first kernel whose entry is on neither side."""
    downloaded = _Downloaded(remote)
    body = read_module(downloaded, module, arch, trust)
    attested = trust.attested(body) if trust is not None else {}
    fetched = 0
    for kernel, key in sorted(body["kernels"].items()):
        if cache.has_entry(key) and (trust is None or _trusted_here(cache, key, trust, attested.get(key))):
            continue
        if not fetch_entry(remote, cache, key, trust, attested.get(key)):
            raise cache_error(remote.where(module_path(module, arch)),
                              f"kernel '{kernel}' refers to entry {key[:12]}..., which the remote does not hold "
                              f"(a shard of the build has not pushed it yet?)")
        fetched += 1
    name = module_path(module, arch)
    cache.install_record(name, downloaded.files[name])
    return fetched


def _trusted_here(cache: Cache, key: str, trust: signing.Trust, attested: str | None) -> bool:
    try:
        read_entry(cache, key, trust, attested)
        return True
    except (CacheError, FileNotFoundError):
        return False  # fetched before the store was signed, say: the store's signatures are fetched


def push_all(remote: RemoteStore, cache: Cache, log=None) -> dict:
    """Upload every entry of `cache`, then every module record whose entries are all there.
    A remote that refuses writes is reported once through `log` (a warning by default)."""
    from .cache import list_modules
    stats = {"entries": 0, "modules": 0, "incomplete": [], "sources": 0}
    try:
        for e in cache.entries():
            push_entry(remote, cache, e["key"])
            stats["entries"] += 1
        for module, arch in list_modules(cache):
            missing = push_module(remote, cache, module, arch)
            if missing:
                stats["incomplete"].append(f"{module} ({arch}): {', '.join(missing)}")
            else:
                stats["modules"] += 1
        stats["sources"] = push_source_records(remote, cache)
    except RemoteWriteRefused as e:
        refused(remote, e, log)
    return stats


def push_source_records(remote: RemoteStore, cache: Cache) -> int:
    """Upload each good parsed-source record of `cache` the remote lacks (runtime/source_folder.py;
    content-addressed: one already there is the same); the number uploaded."""
    good, _ = source_folder.good_records(cache, skip=set(remote.source_record_names()))
    return sum(remote.put(name, data) for name, data in sorted(good.items()))


def pull_source_records(remote: RemoteStore, cache: Cache) -> tuple[int, int]:
    """Fetch each good parsed-source record of the remote `cache` lacks: (fetched, refused)."""
    return carry_source_records(cache, [remote])


def refused(remote: RemoteStore, error: RemoteWriteRefused, log=None) -> None:
    """Note once that `remote` refuses writes; reads go on."""
    if remote.read_only:
        return
    remote.read_only = True
    message = f"{error}: the remote is used read-only (nothing more is uploaded)"
    if log is None:
        warnings.warn(message, stacklevel=3)
    else:
        log(f"qdc: warning: {message}")


def _timeless(body: dict) -> dict:
    from .cache import RECORD_TIME_FIELDS
    return {k: v for k, v in body.items() if k not in RECORD_TIME_FIELDS}


def clean_remote(remote: RemoteStore, older_than_s: float, now: float | None = None) -> dict:
    """Delete module records and entries not written for `older_than_s` seconds, except entries a
    remaining module record names (records first, so none is left naming a deleted entry), and
    parsed-source records not written for as long."""
    now = time.time() if now is None else now
    objects = remote.listing()
    cutoff = now - older_than_s
    records = [o for o in objects if o["path"].startswith(f"{MODULES}/")]
    kept_keys, dropped = set(), 0
    for o in records:
        if o["last_modified"] < cutoff:
            remote.delete(o["path"])
            dropped += 1
        else:
            try:
                kept_keys |= set(decode(remote.read(o["path"]), remote.where(o["path"]),
                                        A.MODULE_RECORD)["kernels"].values())
            except (CacheError, FileNotFoundError):
                continue
    folders: dict = {}
    for o in objects:
        parts = o["path"].split("/")
        if parts[0] == ENTRIES and len(parts) >= 4:
            folders.setdefault(parts[2], []).append(o)
    evicted = 0
    for key, files in sorted(folders.items()):
        if key in kept_keys or max(f["last_modified"] for f in files) >= cutoff:
            continue
        meta = [f for f in files if f["path"].endswith(f"/{META_FILE}")]
        for f in meta + [f for f in files if f not in meta]:  # the record first: the entry vanishes at once
            remote.delete(f["path"])
        evicted += 1
    old_sources = [o["path"] for o in remote.listing((source_folder.FOLDER + "/",)) if o["last_modified"] < cutoff]
    for name in old_sources:  # each is only a saving: a process lacking one parses that source
        remote.delete(name)
    return {"modules_dropped": dropped, "evicted": evicted, "sources_evicted": len(old_sources)}


def read_through(url: str, module: str, arch: str, local: str | None = None,
                 trust: signing.Trust | None = None) -> str:
    """The local cache folder holding module `module` for `arch` from remote `url`, fetched and
    verified (with `trust`, signatures too) into it if absent; works offline once fetched (a
    remote that cannot be reached then is only warned about)."""
    remote = RemoteStore(url)
    cache = Cache(local or default_local_cache(remote.url))
    try:
        pull_module(remote, cache, module, arch, trust)
    except RemoteUnreachable as e:
        if not _have_module(cache, module, arch):
            raise
        warnings.warn(f"{e}; using the copy fetched earlier into {cache.root}", stacklevel=3)
    return cache.root


def _have_module(cache: Cache, module: str, arch: str) -> bool:
    try:
        body = read_module(cache, module, arch)
    except (CacheError, FileNotFoundError):
        return False
    return all(cache.has_entry(key) for key in body["kernels"].values())

