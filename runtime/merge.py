"""`qdc merge DEST SRC...`: the union of caches (the shards of one build, say) in one folder.

Everything is read and checked before anything is written: every entry is verified as
loading verifies it, two different entries under one key or two different records of one
module and arch (build times aside) are refused naming both files. Entries are installed
whole; each module record is written last, its kernel signatures taken from the merged
entries, so the union of a sharded build's caches packs byte-identically to a one-machine build.

Signatures (runtime/signing.py) are kept: every signature file of an entry in any source, and a
module record's signatures wherever the merged record's signed content is that of a source's
(shards of one build write the same record, so their CI key's signature holds for the union).
A merged record that matches no source's is signed by `signer` if one is given, else written
unsigned and reported.

Parsed-source records (runtime/source_folder.py) are carried too: each good one a source holds
and DEST lacks is installed; one that is refused is left out and counted (it is only a saving:
the process that would have read it parses the source instead).
"""
from __future__ import annotations

from . import signing, source_folder
from .cache import (ENTRIES, META_FILE, RECORD_TIME_FIELDS, Cache, Store, cache_error, entry_path, list_modules,
                    module_path, read_entry, read_module)

# A shard's record knows only its own entries' parameters; cryptographic signatures are kept apart.
_NOT_COMPARED = RECORD_TIME_FIELDS + ("signatures", "signed", "attested")


def entry_keys(store: Store) -> list[str]:
    """Keys of the entries that have a record in `store`."""
    keys = []
    for name in store.names():
        parts = name.split("/")
        if len(parts) == 4 and parts[0] == ENTRIES and parts[3] == META_FILE:
            keys.append(parts[2])
    return keys


def merge(dest: Cache, sources: list[Store], signer: signing.SigningKey | None = None) -> dict:
    """Union `sources` into `dest`: {"entries": installed, "modules": records written, "unsigned":
    merged records left unsigned though a source's was signed}."""
    entries, records = {}, {}  # key -> (store, Entry); (module, arch) -> (store, body)
    signature_files, originals = {}, {}  # key -> {file name: bytes}; (module, arch) -> every source's record
    for store in [dest, *sources]:
        for key in entry_keys(store):
            entry = read_entry(store, key)
            if key in entries:
                _check_same_entry(entries[key], (store, entry))
            else:
                entries[key] = (store, entry)
            for name, data in signing.entry_signature_files(store, key).items():
                signature_files.setdefault(key, {}).setdefault(name, data)
        for module, arch in list_modules(store):
            body = read_module(store, module, arch)
            originals.setdefault((module, arch), []).append(body)
            if (module, arch) in records:
                body = _combined_record(records[(module, arch)], (store, body), module, arch)
            records[(module, arch)] = (store, body)
    installed = 0
    for key, (store, entry) in sorted(entries.items()):
        base = entry_path(key)
        if store is dest:
            present = set(dest.folder_names(base))
            for name, data in sorted(signature_files.get(key, {}).items()):
                if name not in present:
                    dest.add_signature(key, name, data)
            continue
        files = {META_FILE: store.read(f"{base}/{META_FILE}"), **signature_files.get(key, {})}
        files.update({info["file"]: entry.artifacts[kind] for kind, info in entry.record["artifacts"].items()})
        dest.install_entry(key, files)
        installed += 1
    written, unsigned = 0, []
    for (module, arch), (_, body) in sorted(records.items()):
        body = {k: v for k, v in body.items() if k not in ("signatures", "signed", "attested")}
        written += dest.write_module(module, arch, body, signer, signed_as=tuple(originals[(module, arch)]))
        if any(r.get("signed") for r in originals[(module, arch)]) and \
                not read_module(dest, module, arch).get("signed"):
            unsigned.append(f"{module} ({arch})")
    carried, refused = carry_source_records(dest, sources)
    return {"entries": installed, "modules": written, "unsigned": unsigned, "sources": carried,
            "sources_refused": refused}


def carry_source_records(dest: Cache, sources: list[Store]) -> tuple[int, int]:
    """Install into `dest` each good parsed-source record of `sources` it lacks: (records
    installed, records refused and left out)."""
    present, carried, refused = set(dest.source_record_names()), 0, 0
    for store in sources:
        good, bad = source_folder.good_records(store, skip=present)
        for name, data in sorted(good.items()):
            dest.install_record(name, data)
        present |= set(good)
        carried, refused = carried + len(good), refused + bad
    return carried, refused


def _check_same_entry(first, second) -> None:
    (store_a, a), (store_b, b) = first, second
    if _comparable(a.record, RECORD_TIME_FIELDS) != _comparable(b.record, RECORD_TIME_FIELDS):
        where = store_b.where(f"{entry_path(a.key)}/{META_FILE}")
        raise cache_error(where, f"a different entry under the same key is in {store_a.where(entry_path(a.key))} "
                                 f"(the caches were not built by the same compiler and options): nothing was merged")


def _combined_record(first, second, module: str, arch: str) -> dict:
    """The record of two shards' records of one module and arch. They agree but for what a shard
    cannot know: a kernel variant another shard found the arch cannot express is, in this
    shard's record, listed by key (`--arch all`); the one that compiled it lists it as skipped,
    and skipped it is. Anything else that differs is refused."""
    (store_a, a), (store_b, b) = first, second
    skipped = {**a.get("skipped", {}), **b.get("skipped", {})}
    kernels = {}
    for name in dict.fromkeys([*a["kernels"], *b["kernels"]]):  # the records' own order
        if name in skipped:
            continue
        keys = {r["kernels"][name] for r in (a, b) if name in r["kernels"]}
        if len(keys) == 1:
            kernels[name] = keys.pop()
    ignored = _NOT_COMPARED + ("kernels", "skipped")
    names = [{*r["kernels"], *r.get("skipped", {})} for r in (a, b)]
    same_kernels = names[0] == names[1] and len(kernels) == len(names[0] - set(skipped))
    if _comparable(a, ignored) != _comparable(b, ignored) or not same_kernels or \
            any(a.get("skipped", {}).get(k, r) != r for k, r in b.get("skipped", {}).items()):
        name = module_path(module, arch)
        raise cache_error(store_b.where(name), f"a different record of module '{module}' ({arch}) is in "
                                               f"{store_a.where(name)} (built from other sources or options): "
                                               f"nothing was merged")
    newer = b if b.get("built", 0) > a.get("built", 0) else a
    combined = {**newer, "kernels": kernels}
    if skipped:
        combined["skipped"] = dict(sorted(skipped.items()))
    return combined


def _comparable(body: dict, ignored) -> dict:
    return {k: v for k, v in body.items() if k not in ignored}
