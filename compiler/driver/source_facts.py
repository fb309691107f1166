"""What parsing a definition's block found, kept beside the cache so that a warm process parses
nothing (sources.py finds the block; parsing it and reading its name chains were half of a
large program's warm start). The records' format, and why a record is refused, is
runtime/contract/source_records.py's:

    <cache>/sources/<key[:2]>/<key>.msgpack    [key, facts (msgpack), sha256 of facts]

The key is a sha256 of the block's exact lines, the definition's kind and name, the Python
version and the code that derives the facts (sources.py and this file): the facts are a pure
function of those, so a record can only be reused for the very text it was made from, and any
change to the deriving code starts afresh. A record that is refused is ignored (and made
again). The facts are trusted as the cache's unsigned entries are: where trusted keys guard the
cache, none are read or written (qd.init decides, `keep_in`). Nothing here is ever run. Reading
a record refreshes its time now and then, so `qdc clean --max-size` evicts the records no
process reads before those every process does; `qdc pack`, `merge`, `push` and `pull` carry them.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time

from qdc.runtime.contract import source_records

FOLDER = source_records.FOLDER
_TOUCH_AFTER_S = 3600.0  # a record read is marked used at most this often (clean's LRU order)

_state = {"root": None, "code": None}  # the folder in use (None: facts stay in this process)


def keep_in(folder: str | None) -> None:
    """Read and write facts under `folder` (a cache's `sources/`), or nowhere (None)."""
    _state["root"] = folder


def facts(kind: str, name: str, text: str, derive):
    """The facts of the block `text` (a `kind` definition named `name`): from the folder in use
    if a good record of them is there, else `derive()`, written there for the next process."""
    root = _state["root"]
    if root is None:
        return derive()
    key = _key(kind, name, text)
    path = os.path.join(root, key[:2], f"{key}.msgpack")
    found = _read(path, key, text.count("\n") + (not text.endswith("\n")))
    if found is not None:
        return found[0]
    value = derive()
    _write(path, key, value)
    return value


def _key(kind: str, name: str, text: str) -> str:
    if _state["code"] is None:
        h = hashlib.sha256(f"{sys.version_info[:2]}".encode())
        here = os.path.dirname(os.path.abspath(__file__))
        for f in ("sources.py", "source_facts.py"):
            with open(os.path.join(here, f), "rb") as src:
                h.update(src.read())
        _state["code"] = h.hexdigest()
    h = hashlib.sha256(f"{_state['code']}\0{kind}\0{name}\0".encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _read(path: str, key: str, line_count: int) -> tuple | None:
    """(facts,) of the record at `path`, None where there is none or it is refused."""
    try:
        data, mtime = source_records.read_file(path)
        found = (source_records.decode(data, key, line_count),)
    except (OSError, ValueError):
        return None
    if time.time() - mtime > _TOUCH_AFTER_S:
        try:
            os.utime(path)
        except OSError:
            pass  # a read-only deployment cache: its LRU order does not matter
    return found


def _write(path: str, key: str, value) -> None:
    """Write the record whole or not at all (renamed into place; a read-only cache keeps none)."""
    try:
        record = source_records.encode(key, value)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=folder, prefix=source_records.STAGING_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(record)
            os.replace(staging, path)
        except BaseException:
            os.unlink(staging)
            raise
    except (OSError, TypeError, ValueError):
        pass
