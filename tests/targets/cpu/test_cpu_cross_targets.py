"""cpu_targets (docs/api.md: Configuration, the qdc command): CPU libraries for other platforms than the build host's, from
this one machine: Linux aarch64 shared libraries linked by ld.lld, macOS arm64 dylibs linked by
ld64.lld, checked here by their structure, symbols and disassembly (tests/devices/cpu runs the
aarch64 ones under qemu-aarch64). `load` takes the host platform's library, and refuses a
module with none with ModuleNotBuiltError."""
import ctypes
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from qdc.cli.main import cli
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver.options import resolve
from qdc.compiler.targets import lld
from qdc.compiler.targets.cpu import platforms
from qdc.compiler.targets.cpu.isa_levels import PLATFORMS, parse_cpu_targets
from qdc.runtime import ModuleNotBuiltError
from qdc.runtime.cache import Cache, read_module
from qdc.runtime.contract import cpu_features
from qdc.runtime.contract.entry_points import defined_entries
from qdc.runtime.devices.cpu import device as rcpu
from qdc.runtime.loader import load

HOST = cpu_features.host_platform()
needs_lld = pytest.mark.skipif(not lld.find("ld.lld") or not lld.find("ld64.lld"),
                               reason=f"no ld.lld / ld64.lld {lld.MIN_LLD}+ ({lld.INSTALL_HINT})")

SOURCE = '''
import qdc as qd

x = qd.field(qd.f32, shape=64, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)
steps = qd.field(qd.i32, shape=())


@qd.kernel
def chain():
    for i in x:
        scaled = x[i] * 0.5
        if scaled > 0:
            for _ in range(steps[None]):
                scaled = qd.sin(scaled) * 0.9
        loss[None] += scaled


@qd.kernel
def axpy(a: qd.f32, u: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(u.shape[0]):
        w[i] = a * u[i] + w[i]
'''


def _build(tmp_path, cpu_targets, name="cross"):
    src = tmp_path / f"{name}.py"
    src.write_text(SOURCE, encoding="utf-8")
    cache = str(tmp_path / f"cache-{cpu_targets}")
    report = build_mod.build([str(src)], ["cpu"], resolve({"cpu_targets": cpu_targets}, {}), cache, jobs=1,
                             log=lambda text: None)
    assert report.ok and report.built == 3, report.errors
    return cache


def _entry(cache, kernel, module="cross"):
    return Cache(cache).lookup(read_module(Cache(cache), module, "cpu")["kernels"][kernel])


@pytest.fixture(scope="module")
def everywhere(tmp_path_factory):
    """The module built for x86_64 and aarch64 (Linux and macOS)."""
    return _build(tmp_path_factory.mktemp("everywhere"), "x86_64,aarch64")


# ---- the option ------------------------------------------------------------------------------

def test_families_and_platforms_are_parsed_in_one_order():
    everything = ("x86_64-linux", "aarch64-linux", "aarch64-macos")
    assert parse_cpu_targets("aarch64,x86_64") == parse_cpu_targets(["x86_64", "aarch64"]) == everything
    assert parse_cpu_targets(" aarch64-linux ") == ("aarch64-linux",)
    assert parse_cpu_targets(None) is None
    for bad, message in (("riscv64", "unknown CPU target 'riscv64'"), ("", "unknown CPU target ''"),
                         (3, "comma-separated or a list")):
        with pytest.raises(ValueError, match=message):
            parse_cpu_targets(bad)


def test_cli_flag_and_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cross.py").write_text(SOURCE, encoding="utf-8")
    bad = CliRunner().invoke(cli, ["build", "cross.py", "--cache", "c", "--cpu-targets", "x86_64,sparc"])
    assert bad.exit_code == 2 and "unknown CPU target 'sparc'" in bad.output
    (tmp_path / "qdc.yaml").write_text("cpu_targets: [aarch64-linux]\n", encoding="utf-8")
    ok = CliRunner().invoke(cli, ["build", "cross.py", "--cache", "c", "-j", "1"])
    assert ok.exit_code == 0, ok.output
    libraries = _entry(str(tmp_path / "c"), "axpy").meta.cpu_libraries
    assert {lib["artifact"] for lib in libraries} == {"so_aarch64"}


def test_platforms_have_their_own_cache_keys():
    keys = {targets: platforms.target_description("portable", parse_cpu_targets(targets))
            for targets in (None, "x86_64", "aarch64", "x86_64,aarch64", "aarch64-linux")}
    assert len(set(keys.values()) - {keys[None]}) == 3 + (HOST not in PLATFORMS)
    if HOST in PLATFORMS:  # unset: the host's platform alone, as named
        assert keys[None] == platforms.target_description("portable", (HOST,))
    assert "aarch64-unknown-linux-gnu" in keys["aarch64-linux"] and "arm64-apple-macosx" in keys["aarch64"]


def test_native_code_is_for_this_machine_only():
    other = next(p for p in PLATFORMS.values() if p.name != HOST)
    with pytest.raises(ValueError, match=f"'native' is this machine's CPU, which cannot run {other.name} code"):
        platforms.cpu_levels("native", other)
    with pytest.raises(ValueError, match="'x86-64-v3' is for x86_64 CPUs: it cannot build the aarch64-linux library"):
        platforms.cpu_levels("x86-64-v3", PLATFORMS["aarch64-linux"])


# ---- what a build for every platform holds ---------------------------------------------------

@needs_lld
def test_one_entry_holds_a_library_per_platform(everywhere):
    entry = _entry(everywhere, "chain")
    libraries = entry.meta.cpu_libraries
    by_platform = {}
    for lib in libraries:
        by_platform.setdefault((lib["machine"], lib["os"], lib["triple"], lib["artifact"]), []).append(lib["target"])
    assert by_platform == {
        ("x86_64", "linux", "x86_64-unknown-linux-gnu", "so"): ["x86-64-v2", "x86-64-v3", "x86-64-v4"],
        ("aarch64", "linux", "aarch64-unknown-linux-gnu", "so_aarch64"): ["armv8-a", "armv8.2-a", "armv8.2-a+sve"],
        ("aarch64", "macos", "arm64-apple-macosx11.0.0", "dylib_arm64"): ["apple-m1"],  # every arm64 Mac has one
    }
    assert [lib.get("level") for lib in libraries] == [0, 1, 2, 0, 1, 2, None]
    assert libraries[-1]["features"] == ["fp-armv8", "neon"]
    expected = {"qdc_chain", "qdc_chain_t0"}
    for kind in ("so", "so_aarch64", "dylib_arm64"):
        assert defined_entries(entry.artifacts[kind]) == expected | ({"qdc_set_cpu_level"} if kind[0] == "s" else set())
    assert entry.meta.tasks[0].launch.get("lanes", 0) > 1  # widened: its record holds the most lanes of any level
    assert CliRunner().invoke(cli, ["verify", everywhere]).exit_code == 0


def _elf_header(library: bytes) -> tuple:
    assert library[:4] == b"\x7fELF" and library[4] == 2 and library[5] == 1  # 64-bit little-endian
    return struct.unpack_from("<HH", library, 16)  # e_type, e_machine


@needs_lld
def test_linux_aarch64_library_is_a_shared_object_needing_libgomp(everywhere):
    """A parallel range of unknown length calls libgomp: its library needs it, from the host."""
    library = _entry(everywhere, "axpy").artifacts["so_aarch64"]
    assert _elf_header(library) == (3, 183)  # ET_DYN, EM_AARCH64
    readelf = shutil.which("llvm-readelf") or shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf")
    path = os.path.join(_entry(everywhere, "axpy").where, "kernel.so_aarch64")
    dynamic = subprocess.run([readelf, "-d", path], capture_output=True, text=True, check=True).stdout
    needed = {line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
    assert "libgomp.so.1" in needed and needed <= {"libgomp.so.1", "libm.so.6"}, dynamic


MACH_O_ARM64, MH_DYLIB, LC_ID_DYLIB, LC_BUILD_VERSION, PLATFORM_MACOS = 0x0100000C, 6, 0xD, 0x32, 1


@needs_lld
def test_macos_library_is_an_arm64_dylib(everywhere):
    library = _entry(everywhere, "chain").artifacts["dylib_arm64"]
    magic, cputype, _, filetype, ncmds, _ = struct.unpack_from("<IiiIII", library, 0)
    assert (magic, cputype, filetype) == (0xFEEDFACF, MACH_O_ARM64, MH_DYLIB)
    commands, at = {}, 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", library, at)
        commands[cmd] = library[at:at + size]
        at += size
    assert b"@rpath/qdc_kernel.dylib" in commands[LC_ID_DYLIB]
    platform, minos = struct.unpack_from("<II", commands[LC_BUILD_VERSION], 8)
    assert platform == PLATFORM_MACOS and minos == 11 << 16


def _objdump():
    found = [shutil.which(n) for n in ["llvm-objdump"] + [f"llvm-objdump-{v}" for v in range(40, 13, -1)]]
    return next((p for p in found if p), None)


@needs_lld
@pytest.mark.parametrize("kind", ["so_aarch64", "dylib_arm64"])
def test_disassembly_has_each_levels_code(everywhere, kind):
    """The levels' task bodies are in the library: NEON code at every level, SVE instructions
    only in the SVE level's (Linux; macOS has one level, for Apple silicon). armv8.2-a runs
    armv8-a's body, which it would optimise alike (isa_levels.OPTIMISED_ALIKE_UNLESS)."""
    objdump = _objdump()
    if objdump is None:
        pytest.skip("no llvm-objdump (apt-get install llvm)")
    path = os.path.join(_entry(everywhere, "chain").where, f"kernel.{kind}")
    text = subprocess.run([objdump, "-d", "--mattr=+sve,+fullfp16,+dotprod,+lse,+rdm", path], capture_output=True,
                          text=True, check=True).stdout
    bodies = {}  # level -> its task body's disassembly (a one-level library has one, unnumbered)
    for block in text.split("\n\n"):
        found = re.search(r"<_?chain_t0\w*_chunk(\.l(\d))?>:", block)
        if found:
            bodies[int(found.group(2) or 0)] = block
    levels = [0, 2] if kind == "so_aarch64" else [0]
    assert sorted(bodies) == levels, text[:2000]
    sve = r"\bz\d+\.|\bptrue\b|\bwhilelo\b"
    for i in levels:
        assert ".4s" in bodies[i]  # 4 f32 lanes of a NEON register
        assert bool(re.search(sve, bodies[i])) == (i == 2), bodies[i]  # SVE only at the SVE level


# ---- loading -----------------------------------------------------------------------------------

@needs_lld
def test_the_host_platforms_library_runs(everywhere, rng):
    if HOST not in ("x86_64-linux", "aarch64-linux"):
        pytest.skip(f"no library of this build is for {HOST}")
    mod = load(everywhere, "cross")
    u, w = rng.random(1000).astype(np.float32), rng.random(1000).astype(np.float32)
    want = np.float32(3) * u + w
    mod.axpy(3.0, u, w)
    np.testing.assert_allclose(w, want, rtol=1e-6)


@needs_lld
def test_a_module_without_the_hosts_platform_is_not_built_for_it(tmp_path):
    others = ",".join(name for name in PLATFORMS if name != HOST)
    cache = _build(tmp_path, others)
    with pytest.raises(ModuleNotBuiltError) as e:
        load(cache, "cross")
    built = ", ".join(name for name in PLATFORMS if name != HOST)
    assert f"was built for the CPU targets {built}, but this host is {HOST}" in str(e.value)
    assert f"--cpu-targets {HOST.split('-')[0]}" in str(e.value)


def test_aarch64_features_come_from_hwcap(monkeypatch):
    """On Linux aarch64 AT_HWCAP is the truth (qemu sets it for the CPU it emulates), whatever
    numpy or /proc/cpuinfo (the real host's under qemu-user) say."""
    bits = cpu_features.AARCH64_HWCAP_BITS
    monkeypatch.setattr(rcpu, "_aarch64_hwcap", lambda: sum(1 << bits[f] for f in ("fp-armv8", "neon", "crc", "lse")))
    monkeypatch.setattr(rcpu, "_numpy_cpu_features", lambda: {"ASIMDDP": True, "SVE": True})
    monkeypatch.setattr(rcpu, "_os_cpu_flags", lambda: {"asimdrdm", "sve"})
    rcpu.host_features.cache_clear()
    try:
        assert {f for f in rcpu.host_features() if f in bits} == {"fp-armv8", "neon", "crc", "lse"}
    finally:
        rcpu.host_features.cache_clear()


def test_macos_loads_libomp_globally_before_kernels(monkeypatch):
    loaded = []

    def cdll(path, mode=0):
        if path == rcpu.LIBOMP_PATHS[0]:
            raise OSError(f"{path}: not found")
        loaded.append((path, mode))
    monkeypatch.setattr(rcpu.ctypes, "CDLL", cdll)
    assert rcpu.load_libomp() == rcpu.LIBOMP_PATHS[1]
    assert loaded == [(rcpu.LIBOMP_PATHS[1], ctypes.RTLD_GLOBAL)]
    monkeypatch.setattr(rcpu.ctypes, "CDLL", lambda path, mode=0: (_ for _ in ()).throw(OSError(path)))
    assert rcpu.load_libomp() is None


def test_a_mac_links_its_own_libraries_as_the_cross_linked_ones():
    """No libgomp on macOS: the OpenMP runtime's functions are left to dyld there too."""
    from qdc.compiler.targets.cpu import link
    assert link._driver_command("cc", ["k.o"], "k.so", "darwin") == ["cc", "-dynamiclib", "-undefined",
                                                                   "dynamic_lookup", "-o", "k.so", "k.o"]
    assert link._driver_command("cc", ["k.o"], "k.so", "linux")[-2:] == ["-lgomp", "-lm"]


@needs_lld
def test_the_cross_build_is_the_same_bytes_whatever_the_jobs(everywhere, tmp_path, monkeypatch):
    """Every platform's libraries, linked by one LLD process link after link, are the same bytes
    whether one process builds every variant (`everywhere`: -j1) or a worker, with an LLD process
    of its own, shares them."""
    monkeypatch.setattr(build_mod, "MIN_JOBS_FOR_WORKERS", 2)  # a worker for the 3 variants
    src = tmp_path / "cross.py"
    src.write_text(SOURCE, encoding="utf-8")
    cache = tmp_path / "j2"
    report = build_mod.build([str(src)], ["cpu"], resolve({"cpu_targets": "x86_64,aarch64"}, {}), str(cache), jobs=2,
                             log=lambda text: None)
    assert report.ok and report.built == 3, report.errors

    def entries(folder):
        folder = Path(folder)
        return {str(path.relative_to(folder)): path.read_bytes() for path in sorted((folder / "entries").rglob("*"))
                if path.is_file() and path.name != "meta.msgpack"}  # meta holds a date
    built = entries(cache)
    assert any(name.endswith("kernel.dylib_arm64") for name in built), sorted(built)
    assert built == entries(everywhere)


# ---- the width-W lowering's gathers ------------------------------------------------------------

GATHERS = '''
import qdc as qd
nd = qd.types.ndarray(dtype=qd.f32, ndim=1)
grid = qd.types.ndarray(dtype=qd.f32, ndim=2)

@qd.kernel
def gather(pos: nd, g: grid, out: nd):
    for p in range(pos.shape[0]):  # a G2P: cells computed from positions, no inner loop
        base = qd.cast(pos[p] * 16.0 - 0.5, qd.i32)
        out[p] = g[base, p % 4] * pos[p] + g[base + 1, 0]
'''


def test_fixed_length_gathers_are_vector_instructions_only_on_x86():
    """SVE's gather and scatter instructions take SVE registers, which LLVM uses for a width-W
    chunk's fixed-length vectors only where the vector length is known to be 256 bits or more:
    a portable SVE library gathers and scatters lane by lane, as NEON does."""
    from qdc.compiler.targets.cpu.isa_levels import LEVELS
    from qdc.compiler.targets.cpu.widen_codegen import has_gathers, has_scatters
    assert [has_gathers(level) for level in LEVELS["x86_64"]] == [False, True, True]
    assert [has_scatters(level) for level in LEVELS["x86_64"]] == [False, False, True]
    assert not any(has_gathers(level) or has_scatters(level) for level in LEVELS["aarch64"])


@needs_lld
def test_a_task_that_only_gathers_keeps_the_scalar_code_on_aarch64(tmp_path):
    src = tmp_path / "gathers.py"
    src.write_text(GATHERS, encoding="utf-8")
    launches = {}
    for targets in ("aarch64-linux", "x86_64,aarch64-linux"):
        cache = str(tmp_path / targets)
        report = build_mod.build([str(src)], ["cpu"], resolve({"cpu_targets": targets}, {}), cache, jobs=1,
                                 log=lambda text: None)
        assert report.ok, report.errors
        entry = Cache(cache).lookup(read_module(Cache(cache), "gathers", "cpu")["kernels"]["gather"])
        launches[targets] = entry.meta.tasks[0].launch
    assert "no gather instructions" in launches["aarch64-linux"].get("scalar", ""), launches
    assert launches["x86_64,aarch64-linux"].get("lanes", 1) > 1, launches  # x86-64-v3 and v4 gather
