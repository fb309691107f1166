"""Remote artifact stores (runtime/remote.py): builds that pull instead of compiling and push
what they compiled, deployments loading from the store, and the faults of a shared store:
tampered objects, network errors, killed uploads, concurrent shard builders, read-only access.
Every test runs against file:// and, where `moto_server` starts, a local S3-compatible server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from qdc.compiler.commands.build import build as build_modules
from qdc.compiler.driver.options import Options
from qdc.runtime import remote as R
from qdc.runtime.cache import Cache, entry_path, module_path, read_module
from qdc.runtime.contract.artifact import ENTRY_RECORD, MODULE_RECORD
from qdc.runtime.contract.errors import CacheError
from qdc.runtime.loader import load

from remote_util import (free_port, needs_obstore, qdc, run_qdc_process, s3_server, store_url, tree,  # noqa: F401
                         write_project)

@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return write_project(tmp_path_factory.mktemp("remote") / "kernels", modules=2, kernels=2)


def _build(project, cache, url, **kwargs):
    lines = []
    report = build_modules([project], ["cpu"], Options(), str(cache), jobs=1, log=lines.append,
                           out=lines.append, remote=url, **kwargs)
    return report, lines


@needs_obstore
def test_a_second_ci_run_pulls_everything_and_compiles_nothing(project, store_url, tmp_path, rng):
    first, _ = _build(project, tmp_path / "ci1", store_url)
    assert first.ok and first.built == 8
    second, _ = _build(project, tmp_path / "ci2", store_url)
    assert second.ok and second.built == 0 and second.pulled == 8
    assert tree(tmp_path / "ci2").keys() >= {k for k in tree(tmp_path / "ci1") if k.startswith("entries")}
    assert qdc("verify", "--remote", store_url).exit_code == 0
    mod = load(store_url, "mod1", arch="cpu", local_cache=str(tmp_path / "deploy"))
    xs = rng.standard_normal(16).astype(np.float32)
    a = float(rng.uniform(0.5, 2.0))
    mod.k1(a, xs)
    np.testing.assert_allclose(mod.values.to_numpy(), xs.astype(np.float64) * a + 11.0, rtol=1e-6, atol=1e-6)


@needs_obstore
def test_load_works_offline_once_fetched(project, tmp_path, monkeypatch):
    url = f"file://{tmp_path}/store"
    _build(project, tmp_path / "ci", url)
    local = str(tmp_path / "deploy")
    load(url, "mod0", arch="cpu", local_cache=local)
    obstore = pytest.importorskip("obstore")
    monkeypatch.setattr(R, "FIRST_BACKOFF_S", 0.01)

    def unreachable(*args, **kwargs):
        raise obstore.exceptions.GenericError("connection refused")
    monkeypatch.setattr(obstore, "get", unreachable)
    with pytest.warns(UserWarning, match="using the copy fetched earlier"):
        mod = load(url, "mod0", arch="cpu", local_cache=local)
    assert "k0" in repr(mod)


@needs_obstore
def test_tampered_remote_object_is_refused_naming_its_url(project, store_url, tmp_path):
    _build(project, tmp_path / "ci", store_url)
    remote = R.RemoteStore(store_url)
    body = read_module(remote, "mod0", "cpu")
    key = body["kernels"]["k1"]
    meta = R.decode(remote.read(f"{entry_path(key)}/meta.msgpack"), "", ENTRY_RECORD)
    artifact = f"{entry_path(key)}/{next(iter(meta['artifacts'].values()))['file']}"
    data = bytearray(remote.read(artifact))
    data[len(data) // 2] ^= 0xFF
    remote.put(artifact, bytes(data), create=False)
    local = tmp_path / "deploy"
    with pytest.raises(CacheError, match="sha256 mismatch") as err:
        load(store_url, "mod0", arch="cpu", local_cache=str(local))
    assert remote.where(artifact) in str(err.value)
    assert not os.path.exists(Cache(local).path(entry_path(key)))
    assert not os.path.exists(Cache(local).path(module_path("mod0", "cpu")))
    assert qdc("verify", "--remote", store_url, ok=False).exit_code == 1


@needs_obstore
def test_network_errors_are_retried_then_reported_leaving_the_cache_as_it_was(project, tmp_path, monkeypatch):
    monkeypatch.setattr(R, "FIRST_BACKOFF_S", 0.01)
    closed = f"http://127.0.0.1:{free_port()}"
    for name, value in {"AWS_ENDPOINT_URL": closed, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "x",
                        "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    local = tmp_path / "deploy"  # holds an earlier fetch of mod0, not mod1
    qdc("build", write_project(tmp_path / "earlier", modules=1, kernels=1), "--cache", local, "-j", 1)
    before = tree(local)
    with pytest.raises(R.RemoteUnreachable, match=f"after {R.RETRIES} tries") as err:
        load("s3://bucket/prefix", "mod1", arch="cpu", local_cache=str(local))
    assert "s3://bucket/prefix/modules/cpu/mod1.msgpack" in str(err.value)
    assert "y" not in str(err.value).split(":")[-1].split()  # no secret in the message
    assert tree(local) == before


SLOW_PUSH = """
import sys, time, obstore
real = obstore.put
def slow(store, path, data, **kw):
    real(store, path, data, **kw)
    print(path, flush=True)
    time.sleep(0.3)
obstore.put = slow
from qdc.cli.main import main
main(sys.argv[1:])
"""


@needs_obstore
def test_an_upload_killed_midway_leaves_no_record_naming_a_missing_entry(project, store_url, tmp_path):
    qdc("build", project, "--cache", tmp_path / "ci", "-j", 1)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PUSH, "push", "--cache", str(tmp_path / "ci"),
                             "--remote", store_url], stdout=subprocess.PIPE, text=True)
    for _ in range(5):  # some artifacts and records uploaded, not all
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    remote = R.RemoteStore(store_url)
    records = [n for n in remote.names() if n.startswith("modules/")]
    for name in records:
        body = R.decode(remote.read(name), name, MODULE_RECORD)
        for key in body["kernels"].values():
            assert remote.exists(f"{entry_path(key)}/meta.msgpack")
    qdc("push", "--cache", tmp_path / "ci", "--remote", store_url)  # a later push completes the store
    assert qdc("verify", "--remote", store_url).exit_code == 0


@needs_obstore
def test_four_shard_builders_at_once_leave_the_store_consistent(project, store_url, tmp_path):
    procs = [run_qdc_process(["build", project, "--cache", tmp_path / f"shard{k}", "--shard", f"{k}/4",
                              "--remote", store_url, "-j", 1]) for k in range(1, 5)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert qdc("verify", "--remote", store_url).exit_code == 0
    qdc("build", project, "--cache", tmp_path / "full", "-j", 1)
    qdc("pack", "--cache", tmp_path / "full", "-o", tmp_path / "full.tgz")
    qdc("pack", "--remote", store_url, "-o", tmp_path / "remote.tgz")
    assert (tmp_path / "full.tgz").read_bytes() == (tmp_path / "remote.tgz").read_bytes()


@needs_obstore
def test_a_read_only_remote_still_serves_reads_with_one_warning(project, store_url, tmp_path, monkeypatch):
    _build(project, tmp_path / "writer", store_url)
    obstore = pytest.importorskip("obstore")

    def refuse(*args, **kwargs):
        raise obstore.exceptions.PermissionDeniedError("access denied")
    monkeypatch.setattr(obstore, "put", refuse)
    other = write_project(tmp_path / "more", modules=3, kernels=2)  # mod2 is new: its upload is refused
    report, lines = _build(other, tmp_path / "reader", store_url)
    assert report.ok and report.pulled == 8 and report.built == 4
    warnings = [line for line in lines if "read-only" in line]
    assert len(warnings) == 1 and "warning" in warnings[0]


@needs_obstore
def test_clean_remote_older_than_expires_old_objects_only(project, tmp_path):
    url = f"file://{tmp_path}/store"
    _build(project, tmp_path / "ci", url)
    old = time.time() - 40 * 86400
    for dirpath, _dirs, files in os.walk(tmp_path / "store"):
        for f in files:
            if "mod1" not in f:
                os.utime(os.path.join(dirpath, f), (old, old))
    result = qdc("clean", "--remote", url, "--older-than", "30d")
    assert "deleted 4 entries, 1 module record and " in result.stdout
    assert qdc("verify", "--remote", url).exit_code == 0
    load(url, "mod1", arch="cpu", local_cache=str(tmp_path / "deploy"))


def test_a_remote_url_without_obstore_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(ImportError, match=r"qdc\[remote\]"):
        load("s3://bucket/prefix", "mod0", arch="cpu", local_cache=str(tmp_path))
    result = qdc("ls", "--remote", "s3://bucket/prefix", ok=False)
    assert result.exit_code == 2 and "qdc[remote]" in result.stderr


@needs_obstore
def test_the_remote_of_qdc_yaml_serves_build_push_and_pull(project, tmp_path, monkeypatch):
    store = tmp_path / "store"
    (tmp_path / "qdc.yaml").write_text(f"remote: file://{store}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(R.REMOTE_VARIABLE, raising=False)
    qdc("build", project, "--cache", tmp_path / "ci", "-j", 1)
    assert (store / module_path("mod0", "cpu")).is_file()
    result = qdc("pull", "mod0", "mod1", "--cache", tmp_path / "pulled")
    assert "2 modules (cpu), 8 entries and " in result.stdout
    assert qdc("verify", tmp_path / "pulled").exit_code == 0
    assert "0 entries, 0 module records" not in qdc("push", "--cache", tmp_path / "pulled").stdout


@needs_obstore
def test_a_failed_upload_fails_the_build_and_keeps_the_local_cache(project, tmp_path, monkeypatch):
    """CI must notice an upload that did not happen: the build exits non-zero, its local cache
    complete."""
    def broken(*args, **kwargs):
        raise R.CacheError("the store answered 500")
    monkeypatch.setattr(R, "push_entry", broken)
    result = qdc("build", project, "--arch", "cpu", "--cache", tmp_path / "cache", "--remote",
                 f"file://{tmp_path}/store", "-j", 1, ok=False)
    assert result.exit_code == 1 and "uploading to" in result.stdout + result.stderr
    assert Cache(tmp_path / "cache").entries()
