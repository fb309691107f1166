"""Signed artifacts on a shared store (runtime/remote.py with runtime/signing.py): CI builders sign
what they upload, shards sign with the CI key and merge keeping the signatures, and deployments
that trust only the CI key refuse a store poisoned by anyone else who can write to it. Every test
runs against file:// and the local S3-compatible server."""
from __future__ import annotations

import os

import numpy as np
import pytest

from qdc.runtime import load
from qdc.runtime import remote as R
from qdc.runtime.cache import Cache, META_FILE, entry_path, module_path, read_module
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.errors import SignatureError
from qdc.runtime import signing

from remote_util import needs_obstore, qdc, s3_server, store_url, write_project  # noqa: F401
from signing_util import ModuleLoads, make_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return write_project(tmp_path_factory.mktemp("signed-remote") / "kernels", modules=2, kernels=2)


def _check_k1(mod, rng, offset):
    xs = rng.standard_normal(16).astype(np.float32)
    mod.k1(0.5, xs)
    np.testing.assert_allclose(mod.values.to_numpy(), xs.astype(np.float64) * 0.5 + offset, rtol=1e-6, atol=1e-6)


def _poison(remote: R.RemoteStore, key: str, attacker: signing.SigningKey) -> None:
    """What a writer of the store without the CI key does: other library bytes under a record whose
    hashes are re-computed, re-signed with its own key, the CI's signature deleted."""
    base = entry_path(key)
    record = A.decode_record(remote.read(f"{base}/{META_FILE}"), A.ENTRY_RECORD)
    info = record["artifacts"]["so"]
    data = remote.read(f"{base}/{info['file']}") + b"\0injected"
    info.update(sha256=A.sha256(data), size=len(data))
    remote.put(f"{base}/{info['file']}", data, create=False)
    remote.put(f"{base}/{META_FILE}", A.encode_record(A.ENTRY_RECORD, record), create=False)
    for name in remote.folder_names(base):
        if name.startswith(signing.SIGNATURE_PREFIX):
            remote.delete(f"{base}/{name}")
    remote.put(f"{base}/{signing.signature_file(attacker.public.fingerprint)}",
               signing.encode_signature(attacker.sign(A.ENTRY_RECORD, record)))


@needs_obstore
def test_a_poisoned_store_is_refused_by_deployments_that_trust_the_ci_key(project, store_url, keys, tmp_path, rng,
                                                                          monkeypatch):
    qdc("build", project, "--cache", tmp_path / "ci", "--remote", store_url, "--sign", keys.ci, "-j", 1)
    _check_k1(load(store_url, "mod1", arch="cpu", local_cache=str(tmp_path / "early"), trusted_keys=[keys.ci_pub]),
              rng, 11.0)
    remote = R.RemoteStore(store_url)
    key = read_module(remote, "mod1", "cpu")["kernels"]["k1"]
    _poison(remote, key, keys.attacker_key)
    loads = ModuleLoads(monkeypatch)
    local = tmp_path / "deploy"
    with pytest.raises(SignatureError, match="unknown key 'attacker'") as err:
        load(store_url, "mod1", arch="cpu", local_cache=str(local), trusted_keys=[keys.ci_pub])
    assert remote.where(entry_path(key)) in str(err.value) and loads.count == 0
    assert not os.path.exists(Cache(local).path(entry_path(key)))
    assert not os.path.exists(Cache(local).path(module_path("mod1", "cpu")))
    # a host that fetched the module before the store was poisoned keeps running the signed copy
    _check_k1(load(store_url, "mod1", arch="cpu", local_cache=str(tmp_path / "early"), trusted_keys=[keys.ci_pub]),
              rng, 11.0)
    result = qdc("verify", "--remote", store_url, "--trusted-keys", keys.ci_pub, ok=False)
    assert result.exit_code == 1 and "unknown key 'attacker'" in result.stderr
    pulled = qdc("pull", "mod1", "--remote", store_url, "--cache", tmp_path / "pulled", "--trusted-keys", keys.ci_pub,
                 ok=False)
    assert pulled.exit_code == 1 and "unknown key 'attacker'" in pulled.stderr
    assert not os.path.exists(Cache(tmp_path / "pulled").path(entry_path(key)))


@needs_obstore
def test_signed_shards_share_a_store_and_merge_keeping_their_signatures(project, store_url, keys, tmp_path, rng,
                                                                       monkeypatch):
    for k in (1, 2):
        qdc("build", project, "--cache", tmp_path / f"shard{k}", "--shard", f"{k}/2", "--remote", store_url,
            "--sign", keys.ci, "-j", 1)
    assert qdc("verify", "--remote", store_url, "--trusted-keys", keys.ci_pub).exit_code == 0
    _check_k1(load(store_url, "mod0", arch="cpu", local_cache=str(tmp_path / "deploy"), trusted_keys=[keys.ci_pub]),
              rng, 1.0)
    merged = qdc("merge", tmp_path / "merged", tmp_path / "shard1", tmp_path / "shard2")
    assert "warning" not in merged.stderr
    assert qdc("verify", tmp_path / "merged", "--trusted-keys", keys.ci_pub).exit_code == 0
    for location, checks in ((str(tmp_path / "merged"), 3), (store_url, 6)):
        verified = []  # the module record's signature and at most each shard's statement, not each entry's signature
        real = signing.PublicKey.verifies
        with monkeypatch.context() as m:
            m.setattr(signing.PublicKey, "verifies", lambda self, *a: verified.append(1) or real(self, *a))
            _check_k1(load(location, "mod0", arch="cpu", local_cache=str(tmp_path / "deploy2"),
                           trusted_keys=[keys.ci_pub]), rng, 1.0)
        assert len(verified) <= checks, location  # from a store: checked there, then as loaded


@needs_obstore
def test_a_signing_build_never_signs_what_it_did_not_build_or_trust(project, store_url, keys, tmp_path, rng):
    """Entries an unsigned build put on the store are compiled again, not pulled and signed; the
    signatures uploaded then make the store's copies (the same bytes: builds are reproducible) loadable."""
    qdc("build", project, "--cache", tmp_path / "unsigned", "--remote", store_url, "-j", 1)
    with pytest.raises(SignatureError, match="unsigned"):
        load(store_url, "mod0", arch="cpu", local_cache=str(tmp_path / "d1"), trusted_keys=[keys.ci_pub])
    result = qdc("build", project, "--cache", tmp_path / "ci", "--remote", store_url, "--sign", keys.ci, "-j", 1)
    assert "8 built, 0 cached" in result.stdout
    _check_k1(load(store_url, "mod0", arch="cpu", local_cache=str(tmp_path / "d2"), trusted_keys=[keys.ci_pub]),
              rng, 1.0)
    again = qdc("build", project, "--cache", tmp_path / "ci2", "--remote", store_url, "--sign", keys.ci, "-j", 1)
    assert "0 built, 8 cached" in again.stdout  # signed by its own key: pulled


OFFLINE_KERNELS = '''import qdc as qd


@qd.kernel
def tripled(xs: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in xs:
        xs[i] = xs[i] * 3.0
'''


@needs_obstore
def test_an_offline_process_takes_only_signed_kernels_from_the_store(keys, tmp_path, rng, monkeypatch):
    import importlib.util

    import qdc as qd
    source = tmp_path / "offline_kernels.py"
    source.write_text(OFFLINE_KERNELS, encoding="utf-8")
    url = f"file://{tmp_path}/store"
    qdc("build", source, "--cache", tmp_path / "ci", "--remote", url, "--sign", keys.ci, "-j", 1)
    spec = importlib.util.spec_from_file_location("offline_kernels", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv(R.REMOTE_VARIABLE, url)
    xs = rng.standard_normal(32).astype(np.float32)
    qd.init(arch=qd.cpu, offline=True, cache_dir=str(tmp_path / "host1"), trusted_keys=[keys.ci_pub])
    ys = xs.copy()
    module.tripled(ys)
    np.testing.assert_allclose(ys, xs * 3, rtol=1e-6)
    remote = R.RemoteStore(url)
    _poison(remote, read_module(remote, "offline_kernels", "cpu")["kernels"]["tripled"], keys.attacker_key)
    qd.init(arch=qd.cpu, offline=True, cache_dir=str(tmp_path / "host2"), trusted_keys=[keys.ci_pub])
    with pytest.raises(SignatureError, match="unknown key 'attacker'"):
        module.tripled(xs.copy())
