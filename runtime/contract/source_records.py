"""Parsed-source records: what parsing a definition a kernel reaches found (its extent and the
names it reads), kept in a cache so that a process run from that cache parses no Python source
(the compiler reads and writes them: compiler/driver/source_facts.py; the cache's tools carry
them: runtime/source_folder.py). Here is their format, shared by both:

    <root>/sources/<key[:2]>/<key>.msgpack    msgpack [key, facts (msgpack bytes), sha256 of facts]

The key is a sha256 of the definition's exact lines, its kind and name, the Python version and
the code that derives the facts, so a record is reused only for the text it was made from. The
facts are data and nothing else: None (the lines are not one such definition) or [last line,
definition line, name chains, `.grad` bases], line numbers within the block, chains lists of
identifiers, bases identifiers or None. A record that is too large, does not decode, does not
match its key or digest, or holds anything else is refused (`decode` raises ValueError): the
compiler then parses the source, the tools leave the record out. Nothing in a record is run.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat

import msgpack


FOLDER = "sources"
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes to a few kilobytes
STAGING_PREFIX = ".staging-"  # a record being written (renamed into place when whole)
_NAME = re.compile(rf"^{FOLDER}/([0-9a-f]{{2}})/([0-9a-f]{{64}})\.msgpack$")


def record_name(key: str) -> str:
    """The record's name in a store (a path relative to the cache folder, `/`-separated)."""
    return f"{FOLDER}/{key[:2]}/{key}.msgpack"


def key_of(name: str) -> str | None:
    """The key a store name is the record of, None where it names no record."""
    match = _NAME.match(name)
    return match.group(2) if match and match.group(2).startswith(match.group(1)) else None


def encode(key: str, facts) -> bytes:
    payload = msgpack.packb(facts, use_bin_type=True)
    return msgpack.packb([key, payload, hashlib.sha256(payload).hexdigest()], use_bin_type=True)


def decode(data: bytes, key: str, line_count: int | None = None):
    """The facts of record `data` stored under `key`; ValueError saying why it is refused.
    `line_count`: the number of lines of the block the facts must lie within, where known."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"{len(data)} bytes: too large for a parsed-source record")
    try:
        record = msgpack.unpackb(data, raw=False)
        stored_key, payload, digest = record
        if stored_key != key:
            raise ValueError("the record is of another source than its name says")
        if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != digest:
            raise ValueError("its content does not match its sha256")
        facts = msgpack.unpackb(payload, raw=False)
    except (TypeError, msgpack.UnpackException) as e:  # msgpack's errors derive from ValueError too
        raise ValueError(f"not a parsed-source record ({type(e).__name__})") from None
    problem = facts_problem(facts, line_count)
    if problem:
        raise ValueError(problem)
    return facts


def facts_problem(facts, line_count: int | None = None) -> str | None:
    """What is wrong with `facts` (None where nothing is)."""
    if facts is None:
        return None
    if not (isinstance(facts, list) and len(facts) == 4):
        return "facts are not [last line, definition line, name chains, .grad bases]"
    stop, line, chains, grad_bases = facts
    if not (_is_int(stop) and _is_int(line) and 1 <= line <= stop
            and (line_count is None or stop <= line_count)):
        return "its line numbers lie outside the block"
    if not (isinstance(chains, list) and all(isinstance(c, list) and c and all(_is_name(n) for n in c)
                                             for c in chains)):
        return "its name chains are not lists of identifiers"
    if not (isinstance(grad_bases, list) and all(b is None or _is_name(b) for b in grad_bases)):
        return "its .grad bases are not identifiers"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_name(value) -> bool:
    return isinstance(value, str) and value.isidentifier()


def check_record(name: str, data: bytes):
    """The facts of the record stored as `name`; ValueError where it is no good record."""
    key = key_of(name)
    if key is None:
        raise ValueError(f"not a parsed-source record (they are {record_name('<sha256>')})")
    return decode(data, key)


def read_file(path: str) -> tuple[bytes, float]:
    """(bytes, mtime) of the record file at `path`; ValueError where it is no regular file (a
    FIFO or device must not hang a reader) or too large, OSError where it cannot be read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    return data, st.st_mtime
