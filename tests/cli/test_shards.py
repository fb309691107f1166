"""Sharded builds (`qdc build --shard K/N`) and `qdc merge`: the union of the shards' caches
is the one-machine build, byte for byte once packed; an incomplete module names what it lacks."""
from __future__ import annotations

import os

import numpy as np
import pytest

from qdc.compiler.commands.build import BuildUsageError, parse_shard, shard_units
from qdc.runtime.cache import Cache, read_module
from qdc.runtime.contract.errors import CacheError
from qdc.runtime.loader import load

from remote_util import qdc, tree, write_project

ARCHES = "cpu,vulkan"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A generated project built on one machine and as 3 shards, for cpu and vulkan."""
    base = tmp_path_factory.mktemp("shards")
    src = write_project(base / "kernels", modules=2, kernels=3)
    qdc("build", src, "--arch", ARCHES, "--cache", base / "full", "-j", 1)
    for k in (1, 2, 3):
        qdc("build", src, "--arch", ARCHES, "--cache", base / f"shard{k}", "--shard", f"{k}/3", "-j", 1)
    return base


def test_shards_split_the_work_and_their_union_packs_identically(project):
    full = Cache(project / "full").entries()
    shards = [{e["key"] for e in Cache(project / f"shard{k}").entries()} for k in (1, 2, 3)]
    assert sum(map(len, shards)) == len(full) == len(set().union(*shards))  # disjoint and covering
    qdc("merge", project / "merged", *(project / f"shard{k}" for k in (1, 2, 3)))
    qdc("pack", "--cache", project / "full", "-o", project / "full.tgz")
    qdc("pack", "--cache", project / "merged", "-o", project / "merged.tgz")
    assert (project / "full.tgz").read_bytes() == (project / "merged.tgz").read_bytes()
    sources = set(Cache(project / "full").source_record_names())  # what parsing found, for processes run from it
    assert sources and set(Cache(project / "merged").source_record_names()) == sources
    assert qdc("verify", project / "merged").exit_code == 0


def test_merged_cache_runs_like_numpy(project, rng):
    qdc("merge", project / "merged_run", project / "shard1", project / "shard2", project / "shard3")
    mod = load(str(project / "merged_run"), "mod1", arch="cpu")
    xs = rng.standard_normal(16).astype(np.float32)
    a = float(rng.uniform(0.5, 2.0))
    mod.total.from_numpy(np.zeros((), np.float32))
    mod.k2(a, xs)
    expected = xs.astype(np.float64) * a + 12.0
    np.testing.assert_allclose(mod.values.to_numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(mod.total.to_numpy()), float(np.sum(expected ** 2)), rtol=1e-5)


def test_loading_one_shard_names_the_missing_kernels(project):
    cache = Cache(project / "shard1")
    present = {e["key"] for e in cache.entries()}
    body = read_module(cache, "mod0", "cpu")
    missing = sorted(k for k, key in body["kernels"].items() if key not in present)
    if not missing:
        pytest.skip("shard 1 happens to hold every kernel of mod0 on cpu")
    with pytest.raises(CacheError) as err:
        load(str(project / "shard1"), "mod0", arch="cpu")
    message = str(err.value)
    assert "incomplete" in message and all(k in message for k in missing)


def test_merge_refuses_two_different_records_of_one_module(project, tmp_path):
    other = write_project(tmp_path / "other", modules=1, kernels=2)  # mod0 with fewer kernels
    qdc("build", other, "--arch", "cpu", "--cache", tmp_path / "other_cache", "-j", 1)
    dest = tmp_path / "dest"
    result = qdc("merge", dest, project / "shard1", tmp_path / "other_cache", ok=False)
    assert result.exit_code == 1
    assert "a different record of module 'mod0' (cpu)" in result.stderr and "nothing was merged" in result.stderr
    assert not os.path.exists(dest / "modules")


def test_merge_refuses_two_different_entries_under_one_key(project, tmp_path):
    cache = Cache(project / "shard2")
    entry = cache.lookup(cache.entries()[0]["key"])
    forged = Cache(tmp_path / "forged")
    artifacts = {kind: data for kind, data in entry.artifacts.items() if not kind.endswith("_sha256")}
    forged.write_entry(entry.key, dict(entry.record, source="/elsewhere/other.py"), artifacts)
    before = tree(project / "shard2")
    result = qdc("merge", tmp_path / "dest", project / "shard2", tmp_path / "forged", ok=False)
    assert result.exit_code == 1 and "a different entry under the same key" in result.stderr
    assert tree(project / "shard2") == before


def test_shard_selection_is_stable_balanced_and_keeps_variants_together():
    units = [(f"m{m}", f"k{k}", arch) for m in range(5) for k in range(13) for arch in ("cpu", "vulkan")]
    parts = [shard_units(units, (k, 4)) for k in range(1, 5)]
    assert set().union(*parts) == set(units) and sum(map(len, parts)) == len(units)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert parts == [shard_units(list(reversed(units)), (k, 4)) for k in range(1, 5)]


@pytest.mark.parametrize("text", ["0/4", "5/4", "a/b", "3", "-1/2"])
def test_bad_shards_are_usage_errors(text, tmp_path):
    with pytest.raises(BuildUsageError, match="invalid shard"):
        parse_shard(text)
    src = write_project(tmp_path / "k", modules=1, kernels=1)
    result = qdc("build", src, "--cache", tmp_path / "c", "--shard", text, ok=False)
    assert result.exit_code == 2 and "invalid shard" in result.stderr


def test_shards_of_an_every_arch_build_merge_with_what_an_arch_cannot_express(tmp_path):
    """`--arch all` skips what a target cannot express (f64 on Metal): the shard that compiled such
    a kernel records it as skipped, the others list it by key; merged, it is skipped, and the
    union packs like the one-machine build."""
    from backend_util import need_every_arch_toolchain
    need_every_arch_toolchain()
    src = tmp_path / "wide.py"
    src.write_text("import qdc as qd\n\nx = qd.field(qd.f64, shape=8)\ny = qd.field(qd.f32, shape=8)\n\n"
                   + "".join(f"\n@qd.kernel\ndef f64_{i}():\n    for j in x:\n        x[j] = x[j] * {i + 2}.0\n\n"
                             f"\n@qd.kernel\ndef f32_{i}():\n    for j in y:\n        y[j] = y[j] + {i}.0\n"
                             for i in range(3)), encoding="utf-8")
    qdc("build", src, "--arch", "all", "--cache", tmp_path / "full", "-j", 1)
    for k in (1, 2):
        qdc("build", src, "--arch", "all", "--cache", tmp_path / f"shard{k}", "--shard", f"{k}/2", "-j", 1)
    assert qdc("merge", tmp_path / "merged", tmp_path / "shard1", tmp_path / "shard2").exit_code == 0
    merged, full = read_module(Cache(tmp_path / "merged"), "wide", "metal"), read_module(Cache(tmp_path / "full"), "wide", "metal")
    assert sorted(merged["skipped"]) == sorted(full["skipped"]) == ["f64_0", "f64_1", "f64_2"]
    assert merged["kernels"] == full["kernels"]
    assert qdc("verify", tmp_path / "merged").exit_code == 0
