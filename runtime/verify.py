"""`qdc verify`: every record and artifact of a cache folder or bundle checked as loading
checks them (runtime/cache.py: format version, sha256, the entries each artifact defines),
every module record against the entries it names, every parsed-source record
(runtime/contract/source_records.py), and anything else under entries/ or modules/ reported by the path
where it is. Signatures (runtime/signing.py) are checked against
their records; with trusted keys, each entry and record must carry a trusted one, and who signed
each is reported."""
from __future__ import annotations

from .cache import (ENTRIES, MAX_RECORD_BYTES, META_FILE, MODULES, STAMP_FILE, Store, decode, entry_path,
                    list_modules, module_path, read_entry, read_module)
from .module_check import module_problems
from . import signing
from .contract import source_records
from .contract import artifact as A
from .contract.artifact_schema import KEY_RE
from .contract.errors import CacheError


def verify_store(store: Store, trust: signing.Trust | None = None,
                 states: list | None = None) -> tuple[int, list[tuple[str, str]]]:
    """Check every record and artifact, and every module record against the entries it names:
    (files checked, [(file, what is wrong)]). Anything else under entries/ or modules/ is named
    by the path where it is. A signature that does not match its record is a problem; with
    `trust`, so is a record no trusted key signed. `states` gets (entry or record, who signed
    it and whether that holds) for each signature."""
    problems: list[tuple[str, str]] = []
    entries: dict = {}  # key -> Entry, or None where the entry is bad
    names = store.names()
    signatures = _Signatures(trust, states, problems, _attested(store, trust))
    checked = _verify_entries(store, names, entries, problems, signatures)
    for name in names:
        parts = name.split("/")
        if parts[0] == MODULES and not (len(parts) == 3 and parts[2].endswith(".msgpack")):
            problems.append((store.where(name), f"not a module record (they are {module_path('<module>', '<arch>')})"))
    for module, arch in list_modules(store):
        checked += _verify_module(store, module, arch, entries, problems, signatures)
    for name in store.source_record_names():
        checked += 1
        try:
            source_records.check_record(name, store.read(name, source_records.MAX_RECORD_BYTES))
        except (CacheError, ValueError, FileNotFoundError) as e:
            problems.append((store.where(name), f"parsed-source record refused ({e}); `qdc clean` removes it"))
    return checked, problems


def _attested(store: Store, trust) -> dict:
    """Entry key -> (digest, module record) that a trusted statement of a module record gives, as
    loading takes them (signing.Trust.attested)."""
    out: dict = {}
    for module, arch in list_modules(store) if trust is not None else ():
        try:
            body = read_module(store, module, arch)
        except (CacheError, ValueError, FileNotFoundError):
            continue  # reported with the module
        where = store.where(module_path(module, arch))
        out.update({key: (digest, where) for key, digest in trust.attested(body).items()})
    return out


class _Signatures:
    """Checks the signatures of each record verified, and notes who signed it."""

    def __init__(self, trust, states, problems, attested: dict):
        self.trust, self.states, self.problems, self.attested = trust, states, problems, attested

    def check(self, kind: str, body: dict, signatures: list, where: str) -> None:
        if self.trust is None and (not signatures or not signing.available()):
            return  # nothing to check, or no cryptography to check it with (and no keys configured)
        if self.states is not None:
            self.states += [(where, line) for line in signing.describe_signatures(kind, body, signatures, self.trust)]
        digest, record = self.attested.get(body.get("key"), (None, None)) if kind == A.ENTRY_RECORD else (None, None)
        if digest is not None and digest == signing.entry_digest(body):
            if self.states is not None:
                self.states.append((where, f"its digest is in a statement signed by a trusted key in {record}"))
            return
        if self.trust is not None:
            reason = self.trust.refusal(kind, body, signatures)
            if reason is not None:
                self.problems.append((where, f"refused: {reason}"))
            return
        for sig in signatures:
            if isinstance(sig, str):
                self.problems.append((where, sig))
            elif not signing.self_consistent(kind, body, sig):
                key = signing.PublicKey(sig["public_key"], sig["name"])
                self.problems.append((where, f"the signature by {key.describe()} does not match the content (altered "
                                             f"after signing)"))


def _verify_entries(store: Store, names: list, entries: dict, problems: list, signatures: _Signatures) -> int:
    checked = 0
    folders: dict = {}  # "<shard>/<name>" -> the names of the files in it
    for name in names:
        parts = name.split("/")
        if parts[0] != ENTRIES:
            continue
        if len(parts) < 4:  # a file where a shard or entry folder belongs
            problems.append((store.where(name), "not a cache entry folder"))
        else:
            folders.setdefault(f"{parts[1]}/{parts[2]}", set()).add("/".join(parts[3:]))
    for folder, files in sorted(folders.items()):
        shard, key = folder.split("/")
        where = store.where(f"{ENTRIES}/{folder}")
        if not KEY_RE.match(key):
            problems.append((where, "not a cache entry name"))
        elif shard != key[:2]:
            entries.setdefault(key, None)  # present, though not where readers look
            problems.append((where, f"a cache entry outside its folder {entry_path(key)}, where it is never read"))
        else:
            checked += _verify_entry(store, key, files, entries, problems, signatures)
    return checked


def _verify_entry(store: Store, key: str, files: set, entries: dict, problems: list, signatures: _Signatures) -> int:
    base = entry_path(key)
    entries[key] = None  # present, not (yet) good
    try:
        entries[key] = entry = read_entry(store, key)
    except FileNotFoundError:
        problems.append((store.where(f"{base}/{META_FILE}"), "entry has no metadata record"))
        return 0
    except CacheError as e:
        problems.extend(_corrupt_artifacts(store, key) or [(e.path, e.reason)])
        return 0
    handle = store.open_entry(key)
    try:
        signed = signing.read_entry_signatures(handle)
    finally:
        handle.close()
    signatures.check(A.ENTRY_RECORD, entry.record, signed, store.where(base))
    recorded = {META_FILE, STAMP_FILE} | {info["file"] for info in entry.record["artifacts"].values()}
    recorded |= {n for n in files if n.startswith(signing.SIGNATURE_PREFIX)}  # checked just above
    for name in sorted(files - recorded):
        problems.append((store.where(f"{base}/{name}"), "not a file of its cache entry (the entry's record names "
                                                        "no such artifact)"))
    return 1 + len(entry.record["artifacts"])


def _corrupt_artifacts(store: Store, key: str) -> list:
    """Each artifact of entry `key` whose sha256 is not its record's, named (loading stops at the
    first); [] where the record itself cannot be read."""
    files = None
    try:
        files = store.open_entry(key)
        record = decode(files.read(META_FILE, max_bytes=MAX_RECORD_BYTES), files.where(META_FILE), A.ENTRY_RECORD)
        bad = []
        for info in record["artifacts"].values():
            try:
                data = files.read(info["file"], size=info["size"])
            except FileNotFoundError:
                bad.append((files.where(info["file"]), "artifact missing from its cache entry"))
                continue
            if A.sha256(data) != info["sha256"]:
                bad.append((files.where(info["file"]), "sha256 mismatch: the artifact is corrupt or was modified"))
        return bad
    except (FileNotFoundError, CacheError, KeyError, TypeError):
        return []
    finally:
        if files is not None:
            files.close()


def _verify_module(store: Store, module: str, arch: str, entries: dict, problems: list,
                   signatures: _Signatures) -> int:
    where = store.where(module_path(module, arch))
    try:
        body = read_module(store, module, arch)
    except CacheError as e:
        problems.append((e.path, e.reason))
        return 0
    except (ValueError, FileNotFoundError) as e:
        problems.append((where, str(e)))
        return 0
    named = {}
    for kernel, key in body["kernels"].items():
        if entries.get(key) is not None:
            named[kernel] = entries[key]
        elif key not in entries:  # (a bad entry is reported once, as itself)
            problems.append((where, f"kernel '{kernel}' refers to entry {key[:12]}..., which is missing "
                                    f"(evicted?): rebuild the module"))
    problems += module_problems(where, body, named)
    signatures.check(A.MODULE_RECORD, body, signing.check_signature_list(body.get("signed", [])), where)
    return 1
