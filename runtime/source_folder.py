"""The `sources/` folder of a cache, where the compiler keeps what parsing kernels' sources found
(the records' format: runtime/contract/source_records.py): the good records of any store (what
`qdc pack`, `merge`, `push` and `pull` carry), and a cache folder's records for `qdc clean`.
"""
from __future__ import annotations

import os
import time

from .contract.errors import CacheError
from .contract.source_records import FOLDER, MAX_RECORD_BYTES, STAGING_PREFIX, check_record, read_file


def good_records(store, skip=frozenset()) -> tuple[dict, int]:
    """({name: bytes} of every good record `store` (a runtime.cache.Store) holds but those named
    in `skip`, the number of records refused and left out)."""
    good, refused = {}, 0
    for name in store.source_record_names():
        if name in skip:
            continue
        try:
            data = store.read(name, MAX_RECORD_BYTES)
            check_record(name, data)
        except (CacheError, ValueError, FileNotFoundError):
            refused += 1
            continue
        good[name] = data
    return good, refused


# ---- in a cache folder ------------------------------------------------------------------------

def folder_names(root: str) -> list[str]:
    """The store names of the records under cache folder `root` (good or not; not staging files)."""
    out = []
    for dirpath, _dirs, files in os.walk(os.path.join(root, FOLDER)):
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        out += [f"{rel}/{f}" for f in files if not f.startswith(STAGING_PREFIX)]
    return sorted(out)


def folder_records(root: str) -> list[dict]:
    """Every record under cache folder `root`: name, path, size, last use (mtime)."""
    out = []
    for name in folder_names(root):
        path = os.path.join(root, *name.split("/"))
        try:
            st = os.lstat(path)
        except OSError:
            continue  # removed meanwhile
        out.append({"name": name, "path": path, "size": st.st_size, "last_use": st.st_mtime})
    return out


def sweep(root: str, max_age_s: float) -> int:
    """Remove, under cache folder `root`, what no process can use: records that are refused or
    misplaced, and what a killed writer left (staging files `max_age_s` old); the number removed."""
    now, removed = time.time(), 0
    base = os.path.join(root, FOLDER)
    for dirpath, _dirs, files in os.walk(base):
        for f in files:
            path = os.path.join(dirpath, f)
            name = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                if f.startswith(STAGING_PREFIX):
                    drop = now - os.lstat(path).st_mtime >= max_age_s
                else:
                    check_record(name, read_file(path)[0])
                    drop = False
            except ValueError:
                drop = True
            except OSError:
                continue
            if drop and _unlink(path):
                removed += 1
    return removed


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
