"""cpu_target (docs/api.md, Configuration): `qdc build` makes portable CPU code, one library
with the code of every ISA level, and the loader picks the best level the host runs; a host lacking what an entry
needs gets a CacheError naming the missing features, never an illegal instruction."""
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver import cache_key
from qdc.compiler.driver import kernel as K
from qdc.compiler.targets.cpu import codegen as codegen, platforms
from qdc.compiler.targets.cpu.isa_levels import LEVELS, check_cpu_target
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.compiler.driver.options import Options, resolve
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract import cpu_features
from qdc.runtime.devices.cpu import device as rcpu
from qdc.runtime.cache import Cache, entry_path, read_module
from qdc.runtime import ModuleNotBuiltError
from qdc.runtime.loader import load

X86 = platform.machine().lower() in ("x86_64", "amd64")
needs_x86 = pytest.mark.skipif(not X86, reason="the ISA levels checked here are x86-64's")

VEC_SRC = '''
import qdc as qd

@qd.kernel
def axpy(a: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]
'''


def _build(tmp_path, cpu_target=None, name="vec"):
    src = tmp_path / f"{name}.py"
    src.write_text(VEC_SRC, encoding="utf-8")
    cache = str(tmp_path / f"cache-{cpu_target or 'default'}")
    opts = resolve({"cpu_target": cpu_target}, {})
    report = build_mod.build([str(src)], ["cpu"], opts, cache, jobs=1, log=lambda text: None)
    assert report.ok and report.built == 1, report.errors
    return cache


def _entry(cache, module="vec", kernel="axpy"):
    key = read_module(Cache(cache), module, "cpu")["kernels"][kernel]
    return Cache(cache).lookup(key)


@pytest.fixture(scope="module")
def portable_cache(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("portable"))


# ---- the option and the cache key ---------------------------------------------------------------

def test_option_values_are_checked():
    for good in ("portable", "native", "x86-64-v3", "haswell", "armv8.2-a", "neoverse-n1", None):
        check_cpu_target(good)
    with pytest.raises(ValueError, match="unknown cpu_target 'pentium9'.*portable"):
        Options().update(cpu_target="pentium9")
    with pytest.raises(ValueError, match="must be a string"):
        Options().update(cpu_target=3)


def test_defaults_direct_native_build_portable():
    assert Options().effective("cpu_target") == "native"
    assert build_mod._options_for(Options(), "cpu").cpu_target == "portable"
    assert build_mod._options_for(Options().update(cpu_target="native"), "cpu").cpu_target == "native"


def test_native_portable_and_a_cpu_name_have_different_keys():
    def key(**kw):
        k = saxpy._primal
        return cache_key.kernel_key(k.fn, k.params, Options().update(**kw), "cpu").key

    keys = {t: key(cpu_target=t) for t in ("native", "portable", "x86-64-v3")}
    assert len(set(keys.values())) == 3
    assert key() == keys["native"]  # unset means native in direct mode: the same code


def test_cli_flag(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from qdc.cli.main import cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vec.py").write_text(VEC_SRC, encoding="utf-8")
    bad = CliRunner().invoke(cli, ["build", "vec.py", "--cache", "c", "--cpu-target", "pentium9"])
    assert bad.exit_code == 2 and "unknown cpu_target 'pentium9'" in bad.output
    ok = CliRunner().invoke(cli, ["build", "vec.py", "--cache", "c", "-j", "1", "--cpu-target", "x86-64-v3"])
    assert ok.exit_code == 0, ok.output
    libs = _entry(str(tmp_path / "c")).meta.cpu_libraries
    assert [(lib["artifact"], lib["target"]) for lib in libs] == [("so", "x86-64-v3")] or not X86


@needs_x86
def test_a_cpu_of_another_architecture_is_refused():
    with pytest.raises(ValueError, match="'neoverse-n1' is for aarch64 CPUs, but this compiler generates x86_64"):
        platforms.cpu_levels("neoverse-n1")
    assert [lvl.name for lvl in platforms.cpu_levels("znver4")] == ["znver4"]
    assert platforms.cpu_levels("znver4")[0].requires == LEVELS["x86_64"][2].requires


@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def test_direct_mode_portable_runs(session_cache_dir, rng):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, cpu_target="portable")
    x, y = rng.random(100).astype(np.float32), rng.random(100).astype(np.float32)
    want = 2 * x + y
    saxpy(2.0, x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    libraries = saxpy.compile((2.0, x, y)).meta.cpu_libraries
    assert len(libraries) == 3 or not X86


# ---- what a portable build holds ----------------------------------------------------------------

@needs_x86
def test_portable_build_has_one_library_for_every_level(portable_cache):
    entry = _entry(portable_cache)
    libs = entry.meta.cpu_libraries
    assert [lib["target"] for lib in libs] == ["x86-64-v2", "x86-64-v3", "x86-64-v4"]
    assert [(lib["artifact"], lib["level"]) for lib in libs] == [("so", 0), ("so", 1), ("so", 2)]
    assert all(lib["machine"] == "x86_64" for lib in libs)
    assert {"sse4.2", "popcnt"} <= set(libs[0]["features"]) and "avx" not in libs[0]["features"]
    assert {"avx2", "fma", "bmi2"} <= set(libs[1]["features"]) and "avx512f" not in libs[1]["features"]
    assert {"avx512f", "avx512bw", "avx512vl"} <= set(libs[2]["features"])
    assert {kind for kind in entry.artifacts if kind.startswith("so")} <= {"so", "so_sha256"}


def _forced_levels():
    """The levels (indices into LEVELS) this host can run."""
    have = rcpu.host_features()
    return [i for i, level in enumerate(LEVELS.get(cpu_features.host_machine(), ())) if set(level.requires) <= have]


@needs_x86
@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_level_of_a_portable_library_computes_the_same(portable_cache, monkeypatch, rng, level):
    """The level a record names is the code that runs: each one the host supports gives numpy's
    result (the qemu test below shows a forced AVX-512 level really runs AVX-512 code)."""
    if level not in _forced_levels():
        pytest.skip("this host cannot run the level")
    monkeypatch.setattr(rcpu, "select_library", lambda libraries, kernel, *a: libraries[level])
    mod = load(portable_cache, "vec")
    for n in (0, 1, 7, 1000, 4099):
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        want = np.float32(1.5) * x + y
        mod.axpy(1.5, x, y)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@needs_x86
def test_v4_library_uses_zmm_registers(portable_cache):
    k = saxpy._primal
    compiled = K.compile_kernel(k.fn, k.params, Options().update(cpu_target="portable"))
    out = codegen.compile_kernel(compiled.ir, compiled.meta, 3, False, "portable", keep_assembly=True,
                                 target=CPU)
    assert "zmm" in out["asm:x86-64-v4"]
    assert "zmm" not in out["asm:x86-64-v3"] and "ymm" in out["asm:x86-64-v3"]
    assert "ymm" not in out["asm:x86-64-v2"]
    objdump = shutil.which("objdump")
    if objdump:  # the stored library itself, too
        entry = _entry(portable_cache)
        path = os.path.join(entry.where, "kernel.so")
        text = subprocess.run([objdump, "-d", path], capture_output=True, text=True, check=True).stdout
        assert "zmm" in text


def test_every_required_feature_can_be_detected():
    for levels in LEVELS.values():
        for level in levels:
            assert set(level.requires) <= set(cpu_features.HOST_FEATURE_SOURCES), level.name


def test_llvm_accepts_every_level(capfd):
    """The level tables name CPUs and features LLVM knows, on aarch64 too (emitted, not run)."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    triples = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}
    for machine, levels in LEVELS.items():
        target = llvm.Target.from_triple(triples[machine])
        for level in levels:
            tm = target.create_target_machine(cpu=level.llvm_cpu, features=level.llvm_features, opt=3, reloc="pic")
            mod = llvm.parse_assembly(f'target triple = "{triples[machine]}"\n'
                                      'define i32 @f(ptr %p) {\n  %o = atomicrmw add ptr %p, i32 1 monotonic\n'
                                      '  ret i32 %o\n}\n')
            assert tm.emit_object(mod)
    assert "not a recognized" not in capfd.readouterr().err


# ---- choosing a library -----------------------------------------------------------------------

def _records(machine="x86_64"):
    return [{"artifact": "so", "target": lvl.name, "machine": machine, "features": sorted(lvl.requires), "level": i}
            for i, lvl in enumerate(LEVELS[machine])]


def test_selection_picks_the_best_level_the_host_runs():
    v2, v3, v4 = (set(level.requires) for level in LEVELS["x86_64"])
    pick = lambda features: rcpu.select_library(_records(), "k", "x86_64-linux", features)["target"]  # noqa: E731
    assert pick(v4 | {"avx512vnni"}) == "x86-64-v4"
    assert pick(v3) == "x86-64-v3"
    assert pick(v4 - {"avx512bw"}) == "x86-64-v3"
    assert pick(v2 | {"avx", "avx2"}) == "x86-64-v2"
    armv82 = set(LEVELS["aarch64"][1].requires)
    assert rcpu.select_library(_records("aarch64"), "k", "aarch64-linux", armv82)["target"] == "armv8.2-a"


def test_missing_features_are_a_cache_error_naming_them():
    v2, v3, v4 = (set(level.requires) for level in LEVELS["x86_64"])
    assert v2 < v3 < v4
    only_v4 = _records()[2:]
    with pytest.raises(qd.CacheError, match=r"kernel 'k': this CPU lacks avx512bw, avx512cd, avx512dq, avx512f, "
                                            r"avx512vl, .*x86-64-v4.*--cpu-target portable"):
        rcpu.select_library(only_v4, "k", "x86_64-linux", v3)
    with pytest.raises(qd.CacheError, match="lacks popcnt, sse4.2"):
        rcpu.select_library(_records(), "k", "x86_64-linux", v2 - {"popcnt", "sse4.2"})
    with pytest.raises(ModuleNotBuiltError, match="kernel 'k' was built for the CPU targets x86_64-linux, but this "
                                                  "host is aarch64-linux: .*--cpu-targets aarch64"):
        rcpu.select_library(_records(), "k", "aarch64-linux", v4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo flags")
def test_host_detection_prefers_numpy_over_proc_cpuinfo(monkeypatch):
    """Under qemu-user /proc/cpuinfo shows the real host's flags; numpy's CPUID is the truth."""
    assert rcpu.host_features() <= set(cpu_features.HOST_FEATURE_SOURCES)
    monkeypatch.setattr(rcpu, "_numpy_cpu_features", lambda: {"AVX512F": False, "AVX2": True})
    monkeypatch.setattr(rcpu, "_os_cpu_flags", lambda: {"avx512f", "avx2", "bmi2", "atomics", "sse4_2"})
    rcpu.host_features.cache_clear()
    try:
        have = rcpu.host_features()
        assert "avx512f" not in have and {"avx2", "bmi2", "sse4.2", "lse"} <= have and "fma" not in have
    finally:
        rcpu.host_features.cache_clear()


def test_an_entry_without_library_records_is_refused_cleanly(portable_cache, tmp_path):
    """An entry written before cpu_libraries existed (same format version) is a CacheError."""
    cache = str(tmp_path / "old")
    shutil.copytree(portable_cache, cache)
    key = read_module(Cache(cache), "vec", "cpu")["kernels"]["axpy"]
    path = os.path.join(cache, *entry_path(key).split("/"), "meta.msgpack")
    body = msgpack.unpackb(msgpack.unpackb(open(path, "rb").read())[4])
    del body["meta"]["cpu_libraries"]
    open(path, "wb").write(A.encode_record(A.ENTRY_RECORD, body))
    with pytest.raises(qd.CacheError, match="written by an older qdc.*rebuild it with `qdc build`"):
        load(cache, "vec")


# ---- a real deployment on a CPU without AVX-512: qemu-x86_64 -cpu max (it stops at AVX2) -------

QEMU = shutil.which("qemu-x86_64")
QEMU_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import qdc
    from qdc.runtime import load
    from qdc.runtime.devices.cpu import device as cpu
    if sys.argv[2] == "force-best":  # what loading did before: the build's best code, unchecked
        cpu.select_library = lambda libraries, kernel, *a: libraries[-1]
    try:
        mod = load(sys.argv[1], "vec")
    except qdc.CacheError as e:
        print("CacheError:", e)
        sys.exit(0)
    x = np.arange(1000, dtype=np.float32)
    y = np.ones(1000, dtype=np.float32)
    mod.axpy(2.0, x, y)
    print("level", cpu.select_library(mod._kernels["axpy"]._entry.meta.cpu_libraries, "axpy")["target"])
    print("ok", bool(np.allclose(y, 2 * x + 1)))
''')


def _under_qemu(tmp_path, cache, mode="check"):
    script = tmp_path / "deploy.py"
    script.write_text(QEMU_SCRIPT, encoding="utf-8")
    return subprocess.run([QEMU, "-cpu", "max", sys.executable, str(script), cache, mode],
                          capture_output=True, text=True, timeout=300)


@needs_x86
@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed (apt-get install qemu-user)")
def test_deployment_on_a_cpu_without_avx512(tmp_path, portable_cache):
    if "avx512f" not in rcpu.host_features():
        pytest.skip("this host lacks AVX-512 itself: nothing for the emulator to take away")
    r = _under_qemu(tmp_path, portable_cache)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok True" in r.stdout and "level x86-64-v4" not in r.stdout, r.stdout

    only_v4 = _build(tmp_path, "x86-64-v4")
    r = _under_qemu(tmp_path, only_v4)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CacheError: kernel 'axpy': this CPU lacks avx512bw" in r.stdout, r.stdout

    r = _under_qemu(tmp_path, portable_cache, "force-best")  # without the check: an illegal instruction
    assert r.returncode in (-signal.SIGILL, 128 + signal.SIGILL), r.stdout + r.stderr


# ---- linking --------------------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.byteorder != "little", reason="reads ELF objects")
def test_libraries_are_linked_only_where_the_object_needs_them(monkeypatch):
    """ld reads every library it is given (~2.5 ms each): libm only for code that calls it."""
    import llvmlite.binding as llvm
    from qdc.compiler.targets.cpu import link
    tm = codegen._target_machine(3)
    src = (f'target triple = "{llvm.get_process_triple()}"\ndeclare float @sinf(float)\n'
           'declare void @GOMP_parallel(ptr, ptr, i32, i32)\n'
           'define float @f(float %x) {\n  %s = call float @sinf(float %x)\n  ret float %s\n}\n'
           'define void @g(ptr %p) {\n  call void @GOMP_parallel(ptr %p, ptr null, i32 0, i32 0)\n  ret void\n}\n')
    assert link._undefined_symbols([tm.emit_object(llvm.parse_assembly(src))]) == {"sinf", "GOMP_parallel"}
    monkeypatch.setattr(link, "_direct_ld_works", None)
    monkeypatch.delenv("CC", raising=False)
    if shutil.which("ld") is None:
        pytest.skip("no ld")
    libs = lambda undefined: [a for a in link._direct_ld_command(["k.o"], "k.so", undefined) if a.startswith("-l")]  # noqa: E731
    assert libs({"GOMP_parallel"}) == ["-l:libgomp.so.1"]
    assert libs({"GOMP_parallel", "expf"}) == ["-l:libgomp.so.1", "-l:libm.so.6"]
    assert libs(set()) == []
    assert libs(None) == ["-l:libgomp.so.1", "-l:libm.so.6"]  # unknown: both, as before


def test_multiversioned_module_compiles_for_every_architecture(capfd):
    """One module with a task body per level (multiversion.py) is valid for LLVM on x86-64 and
    aarch64 alike, and each level's body is emitted with that level's vector registers."""
    import llvmlite.binding as llvm
    from llvmlite import ir as ll

    from qdc.compiler.targets.cpu import multiversion
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    triples = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}
    wide = {"x86_64": ["xmm", "ymm", "zmm"], "aarch64": ["v0.4s", "v0.4s", "z0"]}
    for machine, levels in LEVELS.items():
        module = ll.Module("mv")
        module.triple = triples[machine]
        f32p = ll.PointerType(ll.FloatType())
        body = ll.Function(module, ll.FunctionType(ll.VoidType(), [f32p, ll.IntType(64)]), name="t_chunk")
        body.linkage = "internal"
        body.attributes.add("noinline")
        b = ll.IRBuilder(body.append_basic_block("entry"))
        loop, done = body.append_basic_block("loop"), body.append_basic_block("done")
        b.cbranch(b.icmp_signed(">", body.args[1], ll.Constant(ll.IntType(64), 0)), loop, done)
        b.position_at_end(loop)
        i = b.phi(ll.IntType(64))
        i.add_incoming(ll.Constant(ll.IntType(64), 0), body.blocks[0])
        p = b.gep(body.args[0], [i], inbounds=True)
        b.store(b.fmul(b.load(p), ll.Constant(ll.FloatType(), 3.0)), p)
        nxt = b.add(i, ll.Constant(ll.IntType(64), 1))
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, body.args[1]), loop, done)
        b.position_at_end(done)
        b.ret_void()
        entry = ll.Function(module, ll.FunctionType(ll.VoidType(), [f32p, ll.IntType(64)]), name="qdc_t")
        eb = ll.IRBuilder(entry.append_basic_block("entry"))
        eb.call(body, list(entry.args))
        eb.ret_void()
        alike = {}  # armv8.2-a runs armv8-a's body: it would optimise it alike
        parsed = llvm.parse_assembly(multiversion.multiversioned_ir(module, ["t_chunk"], levels, alike=alike))
        parsed.verify()
        tm = llvm.Target.from_triple(triples[machine]).create_target_machine(
            cpu=levels[0].llvm_cpu, features=levels[0].llvm_features, opt=3, reloc="pic")
        passes = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        passes.getModulePassManager().run(parsed, passes)
        assembly = tm.emit_assembly(parsed)
        assert multiversion.CPU_LEVEL_SETTER in assembly
        for i, register in enumerate(wide[machine]):
            code = multiversion.level_assembly(assembly, ["t_chunk"], i, alike)
            assert register in code and (i == 2 or wide[machine][2] not in code), (machine, i)
    assert "not a recognized" not in capfd.readouterr().err
