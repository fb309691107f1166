"""Parsed-source records (runtime/contract/source_records.py, runtime/source_folder.py) through the cache's tools: `qdc pack` and
`qdc merge` carry them (so a deployment's cache built from a bundle parses nothing), `qdc clean`
evicts them with the entries and drops refused ones, `qdc push`/`pull` and a remote's clean
handle them; a damaged or crafted record is refused everywhere and never used."""
from __future__ import annotations

import importlib.util
import io
import os
import tarfile
import time

import msgpack
import pytest

from qdc.compiler.driver import source_facts, sources
from qdc.runtime import source_folder
from qdc.runtime.contract import source_records
from qdc.runtime.bundle import BundleStore
from qdc.runtime import remote as R
from qdc.runtime.cache import Cache

from remote_util import needs_obstore, qdc, write_project

KEY = "ab" + "0" * 62


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A one-module project built into a cache: its kernels' parsed-source records are there."""
    base = tmp_path_factory.mktemp("source_records")
    src = write_project(base / "kernels", modules=1, kernels=3)
    qdc("build", src, "--cache", base / "built", "-j", 1)
    return base


def _names(folder) -> set:
    return set(Cache(folder).source_record_names())


def _damage(folder) -> None:
    """A record whose content fails its digest and a file misplaced among the records."""
    name = sorted(_names(folder))[0]
    path = os.path.join(folder, *name.split("/"))
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 1
    bad = os.path.join(folder, source_records.FOLDER, KEY[:2], f"{KEY}.msgpack")
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    with open(bad, "wb") as f:
        f.write(bytes(data))
    with open(os.path.join(folder, source_records.FOLDER, KEY[:2], "notes.txt"), "w", encoding="utf-8") as f:
        f.write("not a record")


def _kernel_functions(project):
    spec = importlib.util.spec_from_file_location("source_records_mod0", os.path.join(project, "kernels", "mod0.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [getattr(module, name).fn for name in sorted(vars(module)) if name.startswith("k")]


def test_records_are_refused_unless_they_are_exactly_facts():
    good = [3, 1, [["qd", "kernel"], ["xs"]], ["a", None]]
    assert source_records.decode(source_records.encode(KEY, good), KEY, line_count=3) == good
    assert source_records.decode(source_records.encode(KEY, None), KEY) is None
    crafted = [[3, 1, [["os.system('x')"]], []], [3, 1, [[]], []], [3, 4, [], []], [0, 1, [], []],
               [True, 1, [], []], [3, 1, [], [1]], [3, 1, {"a": 1}, []], [3, 1, [], []] * 2,
               msgpack.ExtType(1, b"x"), "text"]
    for facts in crafted:
        with pytest.raises(ValueError):
            source_records.decode(source_records.encode(KEY, facts), KEY)
    with pytest.raises(ValueError, match="lie outside"):
        source_records.decode(source_records.encode(KEY, good), KEY, line_count=2)
    with pytest.raises(ValueError, match="another source"):
        source_records.decode(source_records.encode(KEY, good), "cd" + KEY[2:])
    for data in (b"", b"\xc1", msgpack.packb([KEY, b"\x93", "0" * 64]), b"\x00" * (source_records.MAX_RECORD_BYTES + 1)):
        with pytest.raises(ValueError):
            source_records.decode(data, KEY)
    assert source_records.key_of(source_records.record_name(KEY)) == KEY
    assert source_records.key_of(f"sources/cd/{KEY}.msgpack") is None
    assert source_records.key_of(f"sources/ab/../{KEY}.msgpack") is None


def test_a_crafted_record_is_parsed_over_never_used(tmp_path, monkeypatch):
    write_project(tmp_path / "kernels", modules=1, kernels=1)
    monkeypatch.setitem(source_facts._state, "root", str(tmp_path / "facts"))
    fn = _kernel_functions(tmp_path)[0]
    sources._SOURCES.pop(fn, None)
    want = sources.function_source(fn)
    record, = (tmp_path / "facts").rglob("*.msgpack")
    key = record.stem
    for facts in ([2, 1, [["os.system('x')"]], []], [10 ** 6, 1, [], []]):  # not a name; past the block
        record.write_bytes(source_records.encode(key, facts))
        sources._SOURCES.pop(fn, None)
        got = sources.function_source(fn)
        assert (got.text, got.chains, got.grad_bases) == (want.text, want.chains, want.grad_bases)


def test_pack_and_merge_carry_good_records_so_the_deployment_parses_nothing(built, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    qdc("merge", cache, built / "built")
    good = _names(cache)
    assert good and good == _names(built / "built")
    _damage(cache)
    out = qdc("pack", "--cache", cache, "-o", tmp_path / "kernels.tgz").stdout
    assert f"{len(good)} parsed-source records" in out
    with tarfile.open(tmp_path / "kernels.tgz") as tar:
        assert {n for n in tar.getnames() if n.startswith("sources/")} == good
    assert set(BundleStore(str(tmp_path / "kernels.tgz")).source_record_names()) == good
    result = qdc("merge", tmp_path / "deploy", tmp_path / "kernels.tgz")
    assert f"{len(good)} parsed-source records merged" in result.stdout
    assert _names(tmp_path / "deploy") == good

    monkeypatch.setitem(source_facts._state, "root", str(tmp_path / "deploy" / source_records.FOLDER))
    monkeypatch.setattr(sources, "_parse_block", lambda *a: pytest.fail("parsed a source the bundle carried"))
    for fn in _kernel_functions(built):
        sources._SOURCES.pop(fn, None)
        assert sources.function_source(fn).chains


def test_merge_leaves_a_refused_record_out_and_says_so(built, tmp_path):
    source = tmp_path / "source"
    qdc("merge", source, built / "built")
    _damage(source)
    verify = qdc("verify", source, ok=False)
    assert verify.exit_code == 1 and verify.output.count("parsed-source record refused") == 2
    result = qdc("merge", tmp_path / "dest", source)
    assert "2 parsed-source records refused" in result.stderr
    assert _names(tmp_path / "dest") == _names(built / "built") - {source_records.record_name(KEY)}
    assert not (tmp_path / "dest" / source_records.FOLDER / KEY[:2] / "notes.txt").exists()


def test_a_bundle_member_posing_as_a_record_is_refused(built, tmp_path):
    qdc("pack", "--cache", built / "built", "-o", tmp_path / "good.tgz")
    with tarfile.open(tmp_path / "good.tgz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    members["sources/ab/payload.so"] = b"\x7fELF"
    with tarfile.open(tmp_path / "bad.tgz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    result = qdc("merge", tmp_path / "dest", tmp_path / "bad.tgz", ok=False)
    assert result.exit_code != 0 and "sources/ab/payload.so" in result.output + result.stderr


def test_clean_evicts_records_with_entries_oldest_use_first(built, tmp_path):
    cache = tmp_path / "cache"
    qdc("merge", cache, built / "built")
    _damage(cache)
    stale = cache / source_records.FOLDER / KEY[:2] / f"{source_records.STAGING_PREFIX}killed"
    stale.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    names = sorted(_names(cache) - {source_records.record_name(KEY), f"sources/{KEY[:2]}/notes.txt"})
    result = qdc("clean", "--cache", cache, "--max-size", "10G")
    assert "evicted 0 entries and 3 parsed-source records" in result.stdout  # the refused, the misplaced, the stale
    assert sorted(_names(cache)) == names and not stale.exists()

    unused = cache / names[0]
    os.utime(unused, (old - 3600, old - 3600))  # older than every entry's last use
    total = sum(e["size"] for e in Cache(cache).entries()) + sum(
        r["size"] for r in source_folder.folder_records(str(cache)))
    result = qdc("clean", "--cache", cache, "--max-size", total - 1)
    assert "evicted 0 entries and 1 parsed-source record" in result.stdout and not unused.exists()
    assert qdc("clean", "--cache", cache, "--all").exit_code == 0
    assert _names(cache) == set() and Cache(cache).entries() == []


def test_reading_a_record_marks_it_used(tmp_path, monkeypatch):
    monkeypatch.setitem(source_facts._state, "root", str(tmp_path / "facts"))
    write_project(tmp_path / "kernels", modules=1, kernels=1)
    fn = _kernel_functions(tmp_path)[0]
    sources._SOURCES.pop(fn, None)
    sources.function_source(fn)
    record, = (tmp_path / "facts").rglob("*.msgpack")
    old = time.time() - 86400
    os.utime(record, (old, old))
    sources._SOURCES.pop(fn, None)
    sources.function_source(fn)
    assert record.stat().st_mtime > old + 3600


@needs_obstore
def test_push_pull_and_a_remote_clean_carry_records(built, tmp_path):
    url = f"file://{tmp_path}/store"
    good = _names(built / "built")
    assert f"{len(good)} parsed-source records ->" in qdc("push", "--cache", built / "built", "--remote", url).stdout
    store = tmp_path / "store"
    assert {str(p.relative_to(store)) for p in (store / source_records.FOLDER).rglob("*.msgpack")} == good
    damaged = store / sorted(good)[0]
    damaged.write_bytes(damaged.read_bytes()[:-2])
    result = qdc("pull", "--cache", tmp_path / "pulled", "--remote", url)
    assert f"{len(good) - 1} parsed-source records fetched" in result.stdout
    assert _names(tmp_path / "pulled") == good - {sorted(good)[0]}
    old = time.time() - 40 * 86400
    for path in (store / source_records.FOLDER).rglob("*.msgpack"):
        os.utime(path, (old, old))
    result = qdc("clean", "--remote", url, "--older-than", "30d")
    assert f"{len(good)} parsed-source records from" in result.stdout
    assert not list((store / source_records.FOLDER).rglob("*.msgpack"))


@needs_obstore
def test_a_build_pushing_to_a_store_uploads_its_records(built, tmp_path):
    url = f"file://{tmp_path}/store"
    cache = tmp_path / "cache"
    qdc("merge", cache, built / "built")
    qdc("build", built / "kernels", "--cache", cache, "--remote", url, "-j", 1)
    assert set(R.RemoteStore(url).source_record_names()) == _names(cache) != set()
