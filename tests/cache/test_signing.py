"""Signed artifacts (runtime/signing.py): `qdc keygen`, `qdc build --sign`, and loading that runs
only what a trusted key signed. Every attack is one a writer of the cache folder (or of a bundle)
can make without the private key; each is refused with a CacheError naming the entry and why,
before any native code is loaded (counted: dlopen, Vulkan shader modules)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import load, signing
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.errors import CacheError, SignatureError

from remote_util import qdc, write_project
from signing_util import (ModuleLoads, entry_folder, make_keys, read_plain_record, replace_library,
                          rewrite_record, sign_entry_as, signature_files, write_record)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def built(tmp_path_factory, keys):
    """kernels/mod0.py (k0, k1 and their gradients) and cache/, where it is built for cpu and
    vulkan, signed with the CI key."""
    root = tmp_path_factory.mktemp("signed")
    project = write_project(root / "kernels", modules=1, kernels=2)
    qdc("build", project, "--arch", "cpu,vulkan", "--cache", root / "cache", "--sign", keys.ci, "-j", 1)
    return root


@pytest.fixture
def cache(built, tmp_path):
    """A private copy of the signed cache, for a test to attack."""
    shutil.copytree(built / "cache", tmp_path / "cache")
    return str(tmp_path / "cache")


def _run_k0(mod, rng):
    xs = rng.standard_normal(16).astype(np.float32)
    mod.k0(1.5, xs)
    np.testing.assert_allclose(mod.values.to_numpy(), xs.astype(np.float64) * 1.5, rtol=1e-6, atol=1e-6)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites_one(tmp_path):
    key = tmp_path / "release"
    result = qdc("keygen", key, "--name", "release 2026")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    private = key.read_text(encoding="utf-8")
    assert private.startswith("-----BEGIN PRIVATE KEY-----")
    assert private.strip().splitlines()[1] not in result.stdout + result.stderr  # never printed
    public = (tmp_path / "release.pub").read_text(encoding="utf-8").split()
    assert public[0] == "qdc-ed25519" and public[2:] == ["release", "2026"]
    again = qdc("keygen", key, ok=False)
    assert again.exit_code == 2 and "never overwrites" in again.stderr
    assert key.read_text(encoding="utf-8") == private


def test_a_signed_build_loads_with_its_key_and_runs(cache, keys, rng, monkeypatch):
    loads = ModuleLoads(monkeypatch)
    mod = load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])
    assert loads.count > 0
    _run_k0(mod, rng)
    # the key's text, as a deployment's environment or configuration may hold it, works the same
    monkeypatch.setenv("QDC_TRUSTED_KEYS", open(keys.ci_pub, encoding="utf-8").read())
    _run_k0(load(cache, "mod0", arch="cpu"), rng)


def test_an_unsigned_entry_is_refused_before_any_native_code_is_loaded(cache, keys, arch, monkeypatch):
    folder = entry_folder(cache, "mod0", "k1", arch)
    rewrite_record(folder)  # no longer the entry the module record's signed statement vouches for
    for path in signature_files(folder):
        os.unlink(path)
    loads = ModuleLoads(monkeypatch)
    with pytest.raises(SignatureError, match="unsigned") as err:
        load(cache, "mod0", arch=arch, trusted_keys=[keys.ci_pub])
    assert folder in str(err.value) and "kernel 'k1'" in str(err.value)
    assert isinstance(err.value, CacheError) and loads.count == 0
    load(cache, "mod0", arch=arch)  # without keys, as before: nothing is checked


def test_a_recomputed_record_is_refused_whether_it_keeps_the_ci_signature_or_an_attacker_signs_it(
        cache, keys, monkeypatch):
    folder = entry_folder(cache, "mod0", "k0")
    replace_library(folder)
    load(cache, "mod0", arch="cpu")  # the attack works where nothing is trusted: the hashes match
    loads = ModuleLoads(monkeypatch)
    with pytest.raises(SignatureError, match="content altered after signing") as err:
        load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])
    assert folder in str(err.value) and "'ci'" in str(err.value)
    for path in signature_files(folder):
        os.unlink(path)
    sign_entry_as(folder, keys.attacker_key)
    with pytest.raises(SignatureError, match=f"unknown key 'attacker' \\({keys.attacker_key.public.fingerprint}"):
        load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])
    assert loads.count == 0


def test_the_module_records_signed_statement_vouches_for_its_entries_digests(cache, keys, rng, monkeypatch):
    """Loading checks one statement per module, not one signature per entry: an entry whose own
    signature is gone still loads while its digest is the one the statement signed."""
    for kernel in ("k0", "k0.grad", "k1", "k1.grad"):
        for path in signature_files(entry_folder(cache, "mod0", kernel)):
            os.unlink(path)
    verified = []
    real = signing.PublicKey.verifies
    monkeypatch.setattr(signing.PublicKey, "verifies", lambda self, *a: verified.append(1) or real(self, *a))
    _run_k0(load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub]), rng)
    assert len(verified) == 2  # the module record's signature and its statement
    assert qdc("verify", cache, "--trusted-keys", keys.ci_pub).exit_code == 0
    inspect = qdc("inspect", "mod0.k0", "--cache", cache, "--trusted-keys", keys.ci_pub).stdout
    assert "attested  in the module record: signed by 'ci'" in inspect and "signed    unsigned" in inspect
    rewrite_record(entry_folder(cache, "mod0", "k0"))
    with pytest.raises(SignatureError, match="kernel 'k0', forward, cpu\\) refused: unsigned"):
        load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])


def test_a_module_record_pointed_at_another_signed_entry_is_refused(cache, keys):
    path = os.path.join(cache, "modules", "cpu", "mod0.msgpack")
    record = read_plain_record(path, A.MODULE_RECORD)
    record["kernels"]["k0"], record["kernels"]["k1"] = record["kernels"]["k1"], record["kernels"]["k0"]
    write_record(path, A.MODULE_RECORD, record)
    with pytest.raises(SignatureError, match="record of module 'mod0' \\(cpu\\) refused: content altered"):
        load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])
    record["signed"] = [keys.attacker_key.sign(A.MODULE_RECORD, record)]
    write_record(path, A.MODULE_RECORD, record)
    with pytest.raises(SignatureError, match="unknown key 'attacker'"):
        load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub])


def test_rotation_trusts_either_key_and_revocation_refuses_what_a_key_signed(built, cache, keys, tmp_path, rng):
    result = qdc("build", built / "kernels", "--cache", cache, "--sign", keys.next, "-j", 1)
    assert "0 built, 4 cached" in result.stdout  # signed anew, not rebuilt
    assert len(signature_files(entry_folder(cache, "mod0", "k0"))) == 2
    for trusted in ([keys.ci_pub], [keys.next_pub], [keys.ci_pub, keys.next_pub]):
        _run_k0(load(cache, "mod0", arch="cpu", trusted_keys=trusted), rng)
    # a key revoked after rotation: the new key's signatures still hold
    _run_k0(load(cache, "mod0", arch="cpu", trusted_keys=[keys.ci_pub, keys.next_pub], revoked_keys=[keys.ci_pub]),
            rng)
    only_ci = str(tmp_path / "only-ci")  # as it was before the new key
    shutil.copytree(built / "cache", only_ci)
    revoked = f"@revoked {keys.ci_key.public.fingerprint}"
    with pytest.raises(SignatureError, match="signed by a revoked key 'ci'"):
        load(only_ci, "mod0", arch="cpu", trusted_keys=[keys.ci_pub, keys.next_pub, revoked])
    with pytest.raises(SignatureError, match="revoked key 'ci'"):
        load(only_ci, "mod0", arch="cpu", trusted_keys=[keys.next_pub], revoked_keys=[keys.ci_pub])


def test_a_signed_bundle_loads_and_a_bundle_of_an_unsigned_cache_is_refused(cache, keys, tmp_path, rng):
    qdc("pack", "--cache", cache, "-o", tmp_path / "signed.tgz")
    _run_k0(load(str(tmp_path / "signed.tgz"), "mod0", arch="cpu", trusted_keys=[keys.ci_pub]), rng)
    unsigned = tmp_path / "unsigned"
    write_project(tmp_path / "kernels", modules=1, kernels=2)
    qdc("build", tmp_path / "kernels", "--cache", unsigned, "-j", 1)
    qdc("pack", "--cache", unsigned, "-o", tmp_path / "unsigned.tgz")
    with pytest.raises(SignatureError, match="unsigned"):
        load(str(tmp_path / "unsigned.tgz"), "mod0", arch="cpu", trusted_keys=[keys.ci_pub])
    qdc("pack", "--cache", unsigned, "-o", tmp_path / "release.tgz", "--sign", keys.next)
    _run_k0(load(str(tmp_path / "release.tgz"), "mod0", arch="cpu", trusted_keys=[keys.next_pub]), rng)
    assert qdc("verify", tmp_path / "release.tgz", "--trusted-keys", keys.next_pub).exit_code == 0


def test_verify_reports_who_signed_each_entry_and_fails_on_an_untrusted_one(cache, keys):
    result = qdc("verify", cache, "--trusted-keys", keys.ci_pub)
    trusted = [line for line in result.stdout.splitlines() if "signed by 'ci'" in line and "trusted key" in line]
    assert len(trusted) == 8 + 2  # the entries and module records of both arches
    folder = entry_folder(cache, "mod0", "k1.grad")
    rewrite_record(folder)
    for path in signature_files(folder):
        os.unlink(path)
    result = qdc("verify", cache, "--trusted-keys", f"{keys.next_pub},{keys.ci_pub}", ok=False)
    assert result.exit_code == 1 and f"{folder}: unsigned" in result.stdout
    assert f"{folder}: refused: unsigned" in result.stderr
    sign_entry_as(folder, keys.attacker_key)
    replace_library(entry_folder(cache, "mod0", "k0"))
    result = qdc("verify", cache, ok=False)  # no keys: a signature that no longer matches is still caught
    assert result.exit_code == 1 and "does not match the content" in result.stderr
    inspect = qdc("inspect", "mod0.k1.grad", "--cache", cache, "--trusted-keys", keys.ci_pub).stdout
    assert "signed by 'attacker'" in inspect and "valid, unknown key" in inspect


def test_trusted_keys_of_qdc_yaml_are_files_relative_to_it(cache, keys, tmp_path, monkeypatch):
    shutil.copy(keys.attacker_pub, tmp_path / "deploy.pub")
    (tmp_path / "qdc.yaml").write_text("trusted_keys: [deploy.pub]\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QDC_TRUSTED_KEYS", raising=False)
    result = qdc("verify", cache, ok=False)
    assert result.exit_code == 1 and "unknown key 'ci'" in result.stderr


@qd.kernel
def _doubled(xs: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in xs:
        xs[i] = xs[i] * 2.0


def test_direct_mode_runs_only_signed_cache_entries_when_keys_are_trusted(keys, tmp_path, rng, monkeypatch):
    folder = str(tmp_path / "direct")
    xs = rng.standard_normal(8).astype(np.float32)
    monkeypatch.setenv("QDC_SIGNING_KEY", keys.ci)  # what this process stores, it signs
    qd.init(arch=qd.cpu, cache_dir=folder, trusted_keys=[keys.ci_pub])
    ys = xs.copy()
    _doubled(ys)
    np.testing.assert_allclose(ys, xs * 2)
    [entry] = [os.path.dirname(p) for p in _signatures_under(folder)]
    monkeypatch.delenv("QDC_SIGNING_KEY")
    loads = ModuleLoads(monkeypatch)
    qd.init(arch=qd.cpu, cache_dir=folder, trusted_keys=[keys.ci_pub])
    _doubled(xs.copy())
    assert loads.count == 1  # the signed entry, loaded
    replace_library(entry)
    qd.init(arch=qd.cpu, cache_dir=folder, trusted_keys=[keys.ci_pub])
    with pytest.raises(SignatureError, match="content altered") as err:
        _doubled(xs.copy())
    assert entry in str(err.value) and loads.count == 1
    other = str(tmp_path / "unsigned")  # trusted keys and no signing key: compiled, run, never stored
    qd.init(arch=qd.cpu, cache_dir=other, trusted_keys=[keys.ci_pub])
    ys = xs.copy()
    _doubled(ys)
    np.testing.assert_allclose(ys, xs * 2)
    assert not os.path.isdir(os.path.join(other, "entries"))


def _signatures_under(folder):
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.startswith("signature-")]


def test_bad_key_settings_are_clear_errors(keys, tmp_path, session_cache_dir):
    with pytest.raises(ValueError, match="is a private key: trust its public half"):
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir, trusted_keys=[keys.ci])
    with pytest.raises(ValueError, match="neither a readable key file"):
        load(str(tmp_path), "mod0", trusted_keys=[str(tmp_path / "missing.pub")])
    with pytest.raises(ValueError, match="trusted_keys is empty"):
        load(str(tmp_path), "mod0", trusted_keys=[])
    (tmp_path / "bad.pub").write_text("qdc-ed25519 AAAA ci\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.pub:1: the key is not 32 bytes"):
        load(str(tmp_path), "mod0", trusted_keys=[str(tmp_path / "bad.pub")])


WITHOUT_CRYPTOGRAPHY = textwrap.dedent("""
    import sys

    class NoCryptography:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "cryptography":
                raise ImportError("No module named 'cryptography'")

    sys.meta_path.insert(0, NoCryptography())
    from qdc.runtime import load
    cache, public_key = sys.argv[1:]
    mod = load(cache, "mod0", arch="cpu")  # no keys configured: a signed cache loads as any other
    mod.k0(2.0, __import__("numpy").ones(16, "float32"))
    assert mod.values.to_numpy()[3] == 2.0
    try:
        load(cache, "mod0", arch="cpu", trusted_keys=[public_key])
    except ImportError as e:
        print(e)
""")


def test_without_cryptography_the_runtime_runs_and_keys_name_what_to_install(cache, keys):
    out = subprocess.run([sys.executable, "-c", WITHOUT_CRYPTOGRAPHY, cache, keys.ci_pub], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'qdc[sign]'" in out.stdout and "qdc-runtime[sign]" in out.stdout


def test_signing_covers_the_whole_record(keys):
    """Every field of an entry record but its build time is signed: changing any one is caught."""
    record = {"key": "0" * 64, "variant": "forward", "arch": "cpu", "created": 1.0, "compiler": "qdc 1",
              "options": {"opt_level": 3}, "meta": {"name": "k", "params": [["a", "scalar", "f32"]]},
              "artifacts": {"so": {"file": "kernel.so", "sha256": "a" * 64, "size": 10}}}
    sig = keys.ci_key.sign(A.ENTRY_RECORD, record)
    trust = signing.Trust([keys.ci_key.public], set())
    assert trust.refusal(A.ENTRY_RECORD, dict(record, created=2.0), [sig]) is None
    changed = [dict(record, arch="cuda"), dict(record, options={"opt_level": 2}),
               dict(record, artifacts={"so": {"file": "kernel.so", "sha256": "b" * 64, "size": 10}}),
               dict(record, meta={"name": "k", "params": []}), dict(record, key="1" * 64)]
    for body in changed:
        assert "content altered" in trust.refusal(A.ENTRY_RECORD, body, [sig])
    assert "content altered" in trust.refusal(A.MODULE_RECORD, record, [sig])  # the kind is signed too


def test_a_trusted_keys_text_lists_keys_comments_and_revocations(keys, tmp_path):
    ci, nxt = keys.ci_key.public, keys.next_key.public
    text = f"# deployment keys\n{ci.text()}, {nxt.text()}\n@revoked {keys.attacker_key.public.fingerprint}\n"
    trust = signing.trust_from(text)
    assert set(trust.trusted) == {ci.fingerprint, nxt.fingerprint}
    assert trust.revoked == {keys.attacker_key.public.fingerprint}
    (tmp_path / "keys.pub").write_text(text, encoding="utf-8")
    assert signing.trust_from(str(tmp_path / "keys.pub")).trusted.keys() == trust.trusted.keys()
    with pytest.raises(ValueError, match="keys.pub:3: not a qdc public key"):
        (tmp_path / "keys.pub").write_text(text.replace("@revoked", "revoked"), encoding="utf-8")
        signing.trust_from(str(tmp_path / "keys.pub"))


def test_merge_keeps_the_signatures_of_either_source_and_signs_with_a_key_when_asked(built, cache, keys, tmp_path,
                                                                                     rng):
    unsigned = tmp_path / "unsigned"
    qdc("build", built / "kernels", "--cache", unsigned, "-j", 1)  # the same build, not signed
    qdc("merge", tmp_path / "union", unsigned, cache)
    _run_k0(load(str(tmp_path / "union"), "mod0", arch="cpu", trusted_keys=[keys.ci_pub]), rng)
    assert len(signature_files(entry_folder(str(tmp_path / "union"), "mod0", "k1.grad"))) == 1
    with pytest.raises(SignatureError, match="unsigned"):
        qdc("merge", tmp_path / "release", unsigned)
        load(str(tmp_path / "release"), "mod0", arch="cpu", trusted_keys=[keys.next_pub])
    qdc("merge", tmp_path / "release", unsigned, "--sign", keys.next)
    _run_k0(load(str(tmp_path / "release"), "mod0", arch="cpu", trusted_keys=[keys.next_pub]), rng)
