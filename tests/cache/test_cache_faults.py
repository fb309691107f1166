"""Cache and CLI faults a deployment or CI pipeline hits: forced rebuilds racing loads, a cache
path that is a file or read-only, records that disagree with their entries, hostile bundles,
and what `qdc build` prints."""
import contextlib
import errno
import gzip
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.driver import options as options_mod
from qdc.compiler.jit.api import direct_options
from qdc.compiler.commands.build import build
from qdc.runtime.contract import artifact as A
from qdc.runtime.cache import Cache, entry_path, module_path, read_entry
from qdc.runtime.loader import load

GRADS = '''
import qdc as qd

n = qd.field(qd.i32, shape=())
x = qd.field(qd.f32, shape=4, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def run():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.9 + 0.1
        y[None] += v


@qd.kernel
def twice(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = a[i] * 2.0
'''


def _sources(tmp_path, text=GRADS, name="grads"):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / f"{name}.py").write_text(text, encoding="utf-8")
    return str(src)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """GRADS built once (run, run.grad, twice); tests work on copies."""
    base = tmp_path_factory.mktemp("faults")
    cache = str(base / "cache")
    report = build([_sources(base)], ["cpu"], options_mod.Options(), cache, log=lambda _: None,
                   out=lambda _: None)
    assert report.ok and report.built == 3
    return cache


@pytest.fixture
def cache_copy(built, tmp_path):
    dest = str(tmp_path / "cache")
    shutil.copytree(built, dest)
    return dest


def _fake_body(name="k"):
    meta = A.KernelMeta(name, f"qdc_{name}", [A.ParamMeta("s", "scalar", "f32")], [], [], 0)
    return {"kernel": name, "variant": "forward", "arch": "cpu", "meta": meta.to_dict(), "field_refs": []}


# ---- 7: a forced rebuild never hides an entry from a concurrent reader ---------------------

def test_forced_replacement_is_never_seen_as_a_missing_entry(tmp_path, rng):
    key = "ef" * 32
    payloads = [rng.bytes(50_000), rng.bytes(60_000)]
    Cache(str(tmp_path)).write_entry(key, _fake_body(), {"so": payloads[0], "bc": b"x"})
    stop, failures, reads, writes = threading.Event(), [], [0], [0]

    def force_rebuilds():
        cache = Cache(str(tmp_path))
        while not stop.is_set():
            cache.write_entry(key, _fake_body(), {"so": payloads[writes[0] % 2], "bc": b"x"}, replace=True)
            writes[0] += 1

    def load_in_a_loop():
        store = Cache(str(tmp_path))
        while not stop.is_set():
            try:
                entry = read_entry(store, key)
                assert entry.artifacts["so"] in payloads  # one whole version, never a mix
                reads[0] += 1
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))

    threads = [threading.Thread(target=force_rebuilds), threading.Thread(target=load_in_a_loop)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while (reads[0] < 2000 or writes[0] < 300) and time.monotonic() < deadline and not failures:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert failures == [], (len(failures), failures[:3], reads, writes)
    assert reads[0] >= 500 and writes[0] >= 100
    assert os.listdir(tmp_path / "tmp") == []  # nothing left aside


LOADER = '''
import os, sys, time
from qdc.runtime import load
cache, stop = sys.argv[1], sys.argv[2]
loads = failed = 0
deadline = time.monotonic() + 60
while not os.path.exists(stop) and time.monotonic() < deadline:
    try:
        mod = load(cache, "grads")
        mod.n[None] = 3
        mod.run()
    except Exception as e:
        failed += 1
        print("FAILED", repr(e), flush=True)
    loads += 1
print("loads", loads, "failed", failed)
'''


def test_qdc_build_force_while_another_process_loads(cache_copy, tmp_path):
    script, stop = tmp_path / "loader.py", tmp_path / "stop"
    script.write_text(LOADER, encoding="utf-8")
    loader = subprocess.Popen([sys.executable, str(script), cache_copy, str(stop)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    src = _sources(tmp_path)
    for _ in range(2):
        report = build([src], ["cpu"], options_mod.Options(), cache_copy, force=True, log=lambda _: None,
                       out=lambda _: None)
        assert report.built == 3
    stop.touch()
    out, err = loader.communicate(timeout=120)
    assert loader.returncode == 0 and "failed 0" in out, out + err
    assert int(out.split()[1]) >= 10, out  # the loads overlapped the rebuilds


# ---- 8: a cache path that is a file, or a read-only cache --------------------------------------

def test_cache_that_is_a_file_is_a_usage_error(tmp_path):
    src = _sources(tmp_path)
    not_a_folder = tmp_path / "cache.txt"
    not_a_folder.write_text("hello", encoding="utf-8")
    runner = CliRunner()
    for args in (["build", src, "--cache", str(not_a_folder)],
                 ["build", src, "--cache", str(not_a_folder / "below")],
                 ["clean", "--all", "--cache", str(not_a_folder)],
                 ["pack", "--cache", str(not_a_folder), "-o", str(tmp_path / "b.tar.gz")]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert "is a file, not a folder" in r.output and "Traceback" not in r.output, r.output
    assert not_a_folder.read_text(encoding="utf-8") == "hello"

    previous = direct_options()
    with pytest.raises(ValueError, match="cache_dir .*is a file, not a folder"):
        qd.init(arch=qd.cpu, cache_dir=str(not_a_folder))
    assert direct_options() is previous  # the failing init left the runtime as it was


def _deny(path):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))


def _simulate_read_only(monkeypatch, folder):
    """Every write under `folder` fails with EROFS (for root without mount rights)."""
    root = os.path.realpath(folder)

    def under(p):
        return isinstance(p, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(p)).startswith(root)

    def guard(fn, nargs=1):
        def wrapped(*args, **kwargs):
            if any(under(a) for a in args[:nargs]):
                _deny(args[0])
            return fn(*args, **kwargs)
        return wrapped

    real_open, real_os_open = open, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def os_open(path, flags, *args, **kwargs):
        if flags & writes and kwargs.get("dir_fd") is None and under(path):
            _deny(path)
        return real_os_open(path, flags, *args, **kwargs)

    def builtin_open(path, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and under(path):
            _deny(path)
        return real_open(path, mode, *args, **kwargs)

    for name in ("mkdir", "unlink", "rmdir", "utime"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, guard(getattr(os, name), 2))
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr("builtins.open", builtin_open)


@contextlib.contextmanager
def read_only(folder, monkeypatch):
    """`folder` made read-only for real where possible: permission bits (not root), a read-only
    bind mount (root with mount rights), else simulated."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        try:
            yield
        finally:
            os.chmod(folder, 0o755)
        return
    mounted = subprocess.run(["mount", "--bind", folder, folder], capture_output=True).returncode == 0
    if mounted and subprocess.run(["mount", "-o", "remount,ro,bind", folder], capture_output=True).returncode:
        subprocess.run(["umount", folder], capture_output=True)
        mounted = False
    if not mounted:
        _simulate_read_only(monkeypatch, folder)
    try:
        yield
    finally:
        monkeypatch.undo()
        if mounted:
            subprocess.run(["umount", folder], check=True)


def test_read_only_cache_is_a_usage_error_for_build(cache_copy, tmp_path, monkeypatch):
    src = _sources(tmp_path, GRADS.replace("* 2.0", "* 3.0"))  # `twice` is not in the cache
    with read_only(cache_copy, monkeypatch):
        r = CliRunner().invoke(cli, ["build", src, "--cache", cache_copy, "-j", "1"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "not writable" in r.output and cache_copy in r.output, r.output
    assert "cannot follow" not in r.output and "Traceback" not in r.output


def test_read_only_cache_in_direct_mode_warns_at_init_and_still_hits(cache_copy, monkeypatch, rng):
    from qdc.compiler.jit import offline_cache
    monkeypatch.setattr(offline_cache, "_UNWRITABLE", set())
    with read_only(cache_copy, monkeypatch):
        with pytest.warns(UserWarning, match="not writable.*compiled on every run"):
            qd.init(arch=qd.cpu, cache_dir=cache_copy)
        a = qd.field(qd.f32, shape=8)

        @qd.kernel
        def fill(s: qd.f32):
            for i in a:
                a[i] = s * i

        with warnings_as_errors():  # no second warning, no failed write
            fill(2.0)
        assert not fill.compile().from_cache
        np.testing.assert_allclose(a.to_numpy(), 2.0 * np.arange(8))
        assert len(Cache(cache_copy).entries()) == 3  # nothing was written


@contextlib.contextmanager
def warnings_as_errors():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_a_write_failure_during_build_is_reported_as_such(cache_copy, tmp_path, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Cache, "write_entry", full_disk)
    errors = []
    report = build([_sources(tmp_path, GRADS.replace("* 2.0", "* 5.0"))], ["cpu"], options_mod.Options(),
                   cache_copy, log=errors.append, out=lambda _: None)
    assert report.failed == 1
    text = "\n".join(errors)
    assert "No space left on device" in text and "cannot follow" not in text, text


# ---- 10: records that disagree with their entries, hostile bundles -----------------------------

def _rewrite_module(cache, change):
    path = os.path.join(cache, *module_path("grads", "cpu").split("/"))
    body = A.decode_record(open(path, "rb").read(), A.MODULE_RECORD)
    change(body)
    with open(path, "wb") as f:
        f.write(A.encode_record(A.MODULE_RECORD, body))  # checksum recomputed: only the content is wrong
    return path


def _verify(cache):
    r = CliRunner().invoke(cli, ["verify", "--cache", cache])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r


def test_swapped_forward_and_grad_keys_are_refused(cache_copy):
    def swap(body):
        k = body["kernels"]
        k["run"], k["run.grad"] = k["run.grad"], k["run"]

    path = _rewrite_module(cache_copy, swap)
    with pytest.raises(qd.CacheError, match="variant") as e:
        load(cache_copy, "grads")
    assert path in str(e.value)
    r = _verify(cache_copy)
    assert r.exit_code == 1 and path in r.output and "variant" in r.output


def test_a_module_record_naming_another_kernels_entry_is_refused(cache_copy):
    def point_twice_at_run(body):
        body["kernels"]["twice"] = body["kernels"]["run"]

    path = _rewrite_module(cache_copy, point_twice_at_run)
    with pytest.raises(qd.CacheError, match="'twice'.*kernel 'run'") as e:
        load(cache_copy, "grads")
    assert path in str(e.value)
    assert _verify(cache_copy).exit_code == 1


def test_module_fields_that_disagree_with_their_entries_fail_verify(cache_copy):
    def resize_x(body):
        body["fields"] = [[n, d, [8] if n == "x" else s, g] for n, d, s, g in body["fields"]]

    path = _rewrite_module(cache_copy, resize_x)
    r = _verify(cache_copy)
    assert r.exit_code == 1 and path in r.output and "'x'" in r.output, r.output
    with pytest.raises(qd.CacheError, match="'x'"):
        load(cache_copy, "grads")

    def drop_needs_grad(body):
        body["fields"] = [[n, d, [4] if n == "x" else s, False] for n, d, s, g in body["fields"]]
    _rewrite_module(cache_copy, drop_needs_grad)
    r = _verify(cache_copy)
    assert r.exit_code == 1 and "needs_grad" in r.output, r.output


def test_an_entry_file_replaced_by_a_folder_fails_verify_and_load_cleanly(cache_copy):
    record = A.decode_record(open(os.path.join(cache_copy, *module_path("grads", "cpu").split("/")), "rb").read(),
                             A.MODULE_RECORD)
    entry_dir = os.path.join(cache_copy, *entry_path(record["kernels"]["twice"]).split("/"))
    for victim in ("kernel.so", "meta.msgpack"):
        path = os.path.join(entry_dir, victim)
        backup = open(path, "rb").read()
        os.unlink(path)
        os.mkdir(path)
        r = _verify(cache_copy)
        assert r.exit_code == 1 and path in r.output, r.output
        with pytest.raises(qd.CacheError) as e:
            load(cache_copy, "grads")
        assert path in str(e.value)
        os.rmdir(path)
        open(path, "wb").write(backup)
    module_file = os.path.join(cache_copy, *module_path("grads", "cpu").split("/"))
    os.unlink(module_file)
    os.mkdir(module_file)
    with pytest.raises(qd.CacheError, match="not a readable file"):
        load(cache_copy, "grads")


def _pack(cache, tmp_path):
    out = str(tmp_path / "good.tar.gz")
    assert CliRunner().invoke(cli, ["pack", "--cache", cache, "-o", out]).exit_code == 0
    with tarfile.open(out) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _write_bundle(path, members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue(), compresslevel=9))
    return str(path)


def test_a_bundle_with_duplicate_members_is_refused(built, tmp_path):
    members = _pack(built, tmp_path)
    so = next((n, d) for n, d in members if n.endswith("kernel.so"))
    bad = _write_bundle(tmp_path / "dup.tar.gz", members + [(so[0], b"\x7fELF not the same")])
    with pytest.raises(qd.CacheError, match="twice") as e:
        load(bad, "grads")
    assert bad in str(e.value)
    r = _verify(bad)
    assert r.exit_code == 1 and "twice" in r.output


def test_a_gzip_bomb_is_refused_without_inflating_it_into_memory(built, tmp_path):
    members = _pack(built, tmp_path)
    name = next(n for n, _ in members if n.endswith("kernel.so"))
    bomb = [(n, bytes(64 << 20) if n == name else d) for n, d in members]
    bad = _write_bundle(tmp_path / "bomb.tar.gz", bomb)
    assert os.path.getsize(bad) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(qd.CacheError, match="size") as e:
            load(bad, "grads")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert name in str(e.value)
    assert peak < 8 << 20, peak


def test_a_bundle_member_nothing_declares_is_refused(built, tmp_path):
    members = _pack(built, tmp_path)
    bad = _write_bundle(tmp_path / "extra.tar.gz", members + [("entries/zz/extra.bin", b"?" * 100)])
    with pytest.raises(qd.CacheError, match="extra.bin"):
        load(bad, "grads")


# ---- 12: what `qdc build` prints ---------------------------------------------------------------

def test_build_names_each_kernel_and_counts_gradients(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _sources(tmp_path)
    r = CliRunner().invoke(cli, ["build", src, "--cache", "c", "-j", "1"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    for name in ("grads.run ", "grads.run.grad ", "grads.twice "):
        assert sum(name in line and "built" in line for line in lines) == 1, (name, r.stdout)
    assert "2 kernels + 1 gradient in 1 module" in lines[-1], r.stdout
    assert "3 built, 0 cached, 0 failed" in lines[-1]

    r = CliRunner().invoke(cli, ["build", src, "--cache", "c", "-j", "1"])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1, r.stdout  # only the summary
    assert "0 built, 3 cached" in r.stdout
    r = CliRunner().invoke(cli, ["build", src, "--cache", "c", "-j", "1", "-v"])
    assert sum("cached" in line and "grads." in line for line in r.stdout.splitlines()) == 3, r.stdout


def test_build_summary_uses_singulars(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _sources(tmp_path, "import qdc as qd\n\n@qd.kernel\ndef one(a: qd.f32):\n    pass\n", name="single")
    r = CliRunner().invoke(cli, ["build", src, "--cache", "c", "-j", "1"])
    assert r.exit_code == 0, r.output
    assert "1 kernel in 1 module" in r.stdout and "gradient" not in r.stdout, r.stdout


def test_a_later_build_removes_stale_staging_folders(cache_copy, tmp_path):
    tmp = os.path.join(cache_copy, "tmp")
    os.makedirs(tmp, exist_ok=True)
    stale, fresh = os.path.join(tmp, "ab" * 32 + ".999.dead"), os.path.join(tmp, "cd" * 32 + ".998.live")
    for path in (stale, fresh):
        os.mkdir(path)
        open(os.path.join(path, "kernel.so"), "wb").write(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    build([_sources(tmp_path)], ["cpu"], options_mod.Options(), cache_copy, log=lambda _: None, out=lambda _: None)
    assert not os.path.exists(stale) and os.path.exists(fresh)


def test_overflow_in_a_loaded_module_advises_qdc_build(tmp_path):
    cache = str(tmp_path / "cache")
    opts = options_mod.Options().update(ad_stack_size=2)
    assert build([_sources(tmp_path)], ["cpu"], opts, cache, log=lambda _: None, out=lambda _: None).ok
    mod = load(cache, "grads")
    mod.n[None] = 6
    mod.run()
    mod.y.grad[None] = 1.0
    with pytest.raises(qd.AdStackOverflowError, match=r"rebuild it with `qdc build --ad-stack-size 7`") as e:
        mod.run.grad()
    assert "qd.init" not in str(e.value)


def test_a_module_never_built_is_a_cache_error_and_a_missing_file(tmp_path):
    """A module whose build failed (so no record) or was never built: both kinds of catcher see it."""
    import qdc
    from qdc.runtime import load
    from qdc.runtime.cache import DirStore
    (tmp_path / "cache").mkdir()
    DirStore(str(tmp_path / "cache"))
    for kind in (qdc.CacheError, FileNotFoundError):
        with pytest.raises(kind, match="module 'nosuch' not found"):
            load(str(tmp_path / "cache"), "nosuch")


def test_an_error_without_a_source_location_prints_none():
    from qdc.runtime.contract.errors import QdcCompileError
    assert str(QdcCompileError("spirv-cross is not installed")) == "error: spirv-cross is not installed"
    assert str(QdcCompileError("bad", "k.py", 3, 5)) == "k.py:3:5: error: bad"


def test_verify_names_every_corrupt_artifact_of_one_entry(cache_copy):
    entries = os.path.join(cache_copy, "entries")
    for root, _dirs, files in os.walk(entries):
        artifacts = sorted(f for f in files if f not in ("meta.msgpack", "last_use") and not f.startswith("."))
        if len(artifacts) >= 2:
            break
    else:
        pytest.skip("no entry with two artifacts")
    victims = [os.path.join(root, f) for f in artifacts[:2]]
    for path in victims:
        with open(path, "r+b") as f:
            byte = f.read(1)
            f.seek(0)
            f.write(bytes([byte[0] ^ 0xFF]))
    r = _verify(cache_copy)
    assert r.exit_code == 1
    for path in victims:  # loading stops at the first; verify names each
        assert path in r.output and "sha256 mismatch" in r.output, r.output
