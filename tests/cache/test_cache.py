"""The offline cache: keys, direct mode through the cache, records, atomic entries, LRU."""
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import cache_key, options as options_mod
from qdc.compiler.commands.build import build
from qdc.runtime.contract import artifact as A
from qdc.runtime.cache import Cache, entry_path
from qdc.runtime.loader import load

# A module whose kernels each depend on one thing: `uses_func` on func f, `uses_const` on
# constant C, `uses_field` on field z's declaration, `plain` on nothing but its own body.
BASE = '''
import qdc as qd

C = 3
z = qd.field(qd.f32, shape=8)
out = qd.field(qd.f32, shape=8)


@qd.func
def f(v):
    return v * 2.0


@qd.kernel
def uses_func():
    for i in out:
        out[i] = f(qd.cast(i, qd.f32))


@qd.kernel
def uses_const():
    for i in out:
        out[i] = qd.cast(i * C, qd.f32)


@qd.kernel
def uses_field():
    for i in z:
        z[i] = qd.cast(i, qd.f32) + 0.5


@qd.kernel
def plain(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = a[i] + 1.0
'''

EDITS = {  # edit name -> (old text, new text, the one kernel whose key must change)
    "func": ("return v * 2.0", "return v * 4.0", "uses_func"),
    "constant": ("C = 3", "C = 5", "uses_const"),
    "field": ("z = qd.field(qd.f32, shape=8)", "z = qd.field(qd.f32, shape=16)", "uses_field"),
    "kernel": ("a[i] + 1.0", "a[i] + 2.0", "plain"),
}
KERNELS = ("uses_func", "uses_const", "uses_field", "plain")


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for gname, v in vars(mod).items():  # as `qdc build` does
        if isinstance(v, qd.Field):
            v.set_name(gname)
    return mod


def _keys(tmp_path, source, tag, **opts):
    path = tmp_path / f"mod_{tag}.py"
    path.write_text(source, encoding="utf-8")
    mod = _import(path, f"qdc_test_keys_{tag}")
    o = options_mod.Options().update(**opts)
    return {k: cache_key.kernel_key(getattr(mod, k).fn, getattr(mod, k)._primal.params, o, "cpu").key
            for k in KERNELS}


def test_key_changes_exactly_for_the_affected_kernel(tmp_path):
    base = _keys(tmp_path, BASE, "base")
    assert len(set(base.values())) == len(KERNELS)
    # Moving code around (line numbers) and comments elsewhere change no key.
    assert _keys(tmp_path, "\n\n# a comment\n" + BASE, "moved") == base
    for name, (old, new, affected) in EDITS.items():
        keys = _keys(tmp_path, BASE.replace(old, new), name)
        changed = {k for k in KERNELS if keys[k] != base[k]}
        assert changed == {affected}, name


def test_key_covers_every_code_affecting_option(tmp_path):
    base = _keys(tmp_path, BASE, "opt_base")
    for opt in ({"opt_level": 2}, {"fast_math": True}, {"default_fp": "f64"}, {"debug": True},
                {"ad_stack_size": 8}, {"ad_stack_strict": True}):
        keys = _keys(tmp_path, BASE, "opt_" + next(iter(opt)), **opt)
        assert all(keys[k] != base[k] for k in KERNELS), opt
    # Not code-affecting: thread count and cache folder.
    assert _keys(tmp_path, BASE, "opt_threads", cpu_max_num_threads=1, cache_dir=str(tmp_path)) == base


def test_rebuild_compiles_exactly_the_affected_kernels(tmp_path, rng):
    src = tmp_path / "kmod"
    src.mkdir()
    path = src / "deps.py"
    path.write_text(BASE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    opts = options_mod.Options()
    first = build([str(src)], ["cpu"], opts, cache, log=lambda _: None)
    assert (first.built, first.cached, first.failed) == (4, 0, 0)
    again = build([str(src)], ["cpu"], opts, cache, log=lambda _: None)
    assert (again.built, again.cached) == (0, 4)
    text = BASE
    for name, (old, new, _affected) in EDITS.items():
        text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
        r = build([str(src)], ["cpu"], opts, cache, log=lambda _: None)
        assert (r.built, r.cached, r.failed) == (1, 3, 0), name
    # The rebuilt module really runs the edited code (f now multiplies by 4, C is 5, z has 16).
    mod = load(cache, "deps")
    mod.uses_func()
    np.testing.assert_allclose(mod.out.to_numpy(), np.arange(8) * 4.0)
    mod.uses_const()
    np.testing.assert_allclose(mod.out.to_numpy(), np.arange(8) * 5.0)
    mod.uses_field()
    np.testing.assert_allclose(mod.z.to_numpy(), np.arange(16) + 0.5)
    a = rng.random(10).astype(np.float32)
    want = a + 2.0
    mod.plain(a)
    np.testing.assert_allclose(a, want)
    r = build([str(src)], ["cpu"], opts.update(opt_level=1), cache, log=lambda _: None)
    assert (r.built, r.cached) == (4, 0)


def _direct_kernel(scale):
    x = qd.field(qd.f32, shape=64)

    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in x:
            x[i] = a[i] * scale

    return x, fill


def test_direct_mode_compiles_through_the_cache(tmp_path, rng):
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    x, fill = _direct_kernel(1.5)
    a = rng.random(64).astype(np.float32)
    fill(a)
    assert not fill.compile((a,)).from_cache
    np.testing.assert_allclose(x.to_numpy(), a * np.float32(1.5), rtol=1e-6)
    assert len(Cache(str(tmp_path)).entries()) == 1

    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))  # a new runtime: the kernel is obtained again
    b = rng.random(64).astype(np.float32)
    fill(b)
    assert fill.compile((b,)).from_cache
    np.testing.assert_allclose(x.to_numpy(), b * np.float32(1.5), rtol=1e-6)

    x2, fill2 = _direct_kernel(2.5)  # another captured constant: another entry
    fill2(b)
    assert not fill2.compile((b,)).from_cache
    np.testing.assert_allclose(x2.to_numpy(), b * np.float32(2.5), rtol=1e-6)
    assert len(Cache(str(tmp_path)).entries()) == 2


SCRIPT = '''
import sys
import numpy as np
import qdc as qd
qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
extra = [qd.field(qd.f32, shape=2) for _ in range(int(sys.argv[2]))]  # shifts field creation ids
y = qd.field(qd.f64, shape=32)

@qd.kernel
def square(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    for i in y:
        y[i] = a[i] * a[i]

a = np.linspace(-2, 3, 32)
square(a)
assert np.allclose(y.to_numpy(), a * a)
print("from_cache", square.compile((a,)).from_cache)
'''


def test_direct_mode_hits_from_a_fresh_process(tmp_path):
    script = tmp_path / "direct.py"
    script.write_text(SCRIPT, encoding="utf-8")
    cache = str(tmp_path / "c")
    runs = [subprocess.run([sys.executable, str(script), cache, str(n)], capture_output=True, text=True)
            for n in (0, 3)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert "from_cache False" in runs[0].stdout and "from_cache True" in runs[1].stdout


def test_corrupt_direct_mode_entry_is_discarded_and_recompiled(tmp_path, rng):
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    x, fill = _direct_kernel(3.0)
    a = rng.random(64).astype(np.float32)
    fill(a)
    (entry,) = Cache(str(tmp_path)).entries()
    so = os.path.join(entry["path"], "kernel.so")
    data = bytearray(open(so, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(so, "wb").write(bytes(data))
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="corrupt cache entry"):
        fill(a)
    assert not fill.compile((a,)).from_cache
    np.testing.assert_allclose(x.to_numpy(), a * np.float32(3.0), rtol=1e-6)
    assert Cache(str(tmp_path)).lookup(entry["key"]) is not None  # rewritten, and it verifies


# ---- records and entries without compiling ---------------------------------------------------

def _fake_entry_body(name="k"):
    meta = A.KernelMeta(name, f"qdc_{name}", [A.ParamMeta("s", "scalar", "f32")], [], [], 0)
    return {"kernel": name, "variant": "forward", "arch": "cpu", "meta": meta.to_dict(), "field_refs": []}


def test_every_flipped_byte_of_a_record_is_detected():
    data = A.encode_record(A.ENTRY_RECORD, dict(_fake_entry_body(), key="0" * 64, artifacts={}))
    assert A.decode_record(data, A.ENTRY_RECORD)["kernel"] == "k"
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(A.RecordError):
            A.decode_record(bytes(bad), A.ENTRY_RECORD)


def test_concurrent_writers_of_one_key_leave_one_whole_entry(tmp_path, rng):
    cache = Cache(str(tmp_path))
    key = "ab" * 32
    payload = rng.bytes(200_000)
    errors = []

    def writer():
        try:
            Cache(str(tmp_path)).write_entry(key, _fake_entry_body(), {"so": payload, "bc": payload[:100]})
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    entry = cache.lookup(key)
    assert entry.artifacts["so"] == payload
    assert sorted(os.listdir(tmp_path / "tmp")) == []  # losers cleaned up after themselves


def test_a_failed_write_leaves_nothing_behind(tmp_path, rng, monkeypatch):
    """A write that fails midway (a full disk, say) raises, stores no entry and leaves no staging folder."""
    cache = Cache(str(tmp_path))
    key = "cd" * 32
    real_open, written = open, []

    def failing_open(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).startswith(str(tmp_path / "tmp")):
            written.append(path)
            if len(written) == 2:
                raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(OSError, match="No space"):
        cache.write_entry(key, _fake_entry_body(), {"so": rng.bytes(1000), "bc": rng.bytes(100)})
    monkeypatch.undo()
    assert len(written) == 2 and cache.lookup(key) is None
    assert os.listdir(tmp_path / "tmp") == []


def test_clean_evicts_least_recently_used_first(tmp_path, rng):
    cache = Cache(str(tmp_path))
    keys = [f"{i:02x}" * 32 for i in range(5)]
    for age, key in enumerate(keys):
        cache.write_entry(key, _fake_entry_body(), {"so": rng.bytes(10_000)})
        stamp = os.path.join(cache.path(entry_path(key)), "last_use")
        os.utime(stamp, (1_000_000 + age, 1_000_000 + age))  # keys[0] is the least recently used
    cache.touch(keys[0])  # ... until it is used now
    cache.write_module("m", "cpu", {"fields": [], "kernels": {"k": keys[1]}})
    cache.write_module("n", "cpu", {"fields": [], "kernels": {"k": keys[4]}})
    size = cache.entries()[0]["size"]
    stats = cache.clean(max_size=3 * size)
    left = {e["key"] for e in cache.entries()}
    assert left == {keys[0], keys[3], keys[4]}
    assert stats["evicted"] == 2 and stats["modules_dropped"] == ["m (cpu)"]
    assert os.path.exists(cache.path("modules/cpu/n.msgpack"))
    cache.clean(everything=True)
    assert cache.entries() == [] and not os.path.exists(cache.path("modules/cpu/n.msgpack"))


def test_module_record_is_not_rewritten_when_only_its_time_would_change(tmp_path):
    cache = Cache(str(tmp_path))
    body = {"fields": [["x", "f32", [4], False]], "kernels": {"k": "cd" * 32}, "built": 1.0}
    assert cache.write_module("m", "cpu", body)
    assert not cache.write_module("m", "cpu", dict(body, built=2.0))
    assert cache.write_module("m", "cpu", dict(body, fields=[["x", "f32", [8], False]]))


@pytest.mark.parametrize("text,want", [("500M", 500 << 20), ("2g", 2 << 30), ("10KiB", 10 << 10),
                                       ("123", 123), ("1.5K", 1536)])
def test_parse_size(text, want):
    from qdc.runtime.cache import parse_size
    assert parse_size(text) == want


def test_uncacheable_source_still_reports_the_front_end_error(tmp_path):
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    namespace = {"qd": qd}
    exec(textwrap.dedent("""
        @qd.kernel
        def k():
            pass
    """), namespace)
    with pytest.raises(qd.QdcCompileError, match="cannot read the source"):
        namespace["k"]()


def test_compile_warnings_are_replayed_on_a_cache_hit(tmp_path, rng, monkeypatch):
    from qdc.compiler.driver import kernel as kernel_mod
    original = kernel_mod.compile_kernel

    def warning_compile(fn, *args, **kwargs):
        compiled = original(fn, *args, **kwargs)
        import warnings
        warnings.warn(f"kernel '{fn.__name__}': a sizing fallback", RuntimeWarning)
        return compiled

    monkeypatch.setattr(kernel_mod, "compile_kernel", warning_compile)
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    x, fill = _direct_kernel(0.25)
    a = rng.random(64).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="'fill': a sizing fallback"):
        fill(a)
    monkeypatch.setattr(kernel_mod, "compile_kernel", original)
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="'fill': a sizing fallback"):
        fill(a)
    assert fill.compile((a,)).from_cache
    np.testing.assert_allclose(x.to_numpy(), a * np.float32(0.25), rtol=1e-6)
