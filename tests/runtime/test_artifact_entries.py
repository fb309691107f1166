"""Artifacts are tied to the entries their records name: each SPIR-V module's entry point is
its task's entry, and `qdc verify`, `load` and cache reads refuse an artifact that does not
define exactly the entries its record names (swapped between entries, a renamed symbol, a
module built when every entry point was "main"), even when the record was re-signed after
the change, naming the file. A CPU library that fails to load names its cache file, and
`qdc verify` names whatever stray files and folders the cache holds by where they are."""
import os
import re
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.driver import options as options_mod
from qdc.compiler.commands.build import build
from qdc.compiler.targets.amdgpu import linker
from qdc.compiler.targets.metal import msl
from qdc.compiler.targets.spirv import tools
from qdc.runtime.cache import entry_path, module_path
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract import entry_points as E
from qdc.runtime.devices.cpu.device import LibraryLoadError
from qdc.runtime.loader import load

MODULE = "entries_demo"
SOURCE = '''
import qdc as qd

x = qd.field(qd.f32, shape=16, needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def energy():
    for i in x:
        loss[None] += x[i] * x[i] * 0.5 + x[i]
'''
# The entries every arch's build of SOURCE names (the Metal target spells them the same: no "__")
FORWARD_TASK, GRAD_TASK = "qdc_energy_t0", "qdc_energy_grad_t0"


def _toolchain_missing(arch: str) -> str | None:
    if arch == "metal" and msl.spirv_cross_path() is None:
        return f"spirv-cross not installed ({msl.INSTALL_HINT})"
    if arch == "amdgpu" and not linker.find_lld():
        return f"no ld.lld {linker.MIN_LLD}+ to link code objects ({linker.INSTALL_HINT})"
    return None


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """arch -> a cache holding SOURCE built for it (built on first use; tests work on copies)."""
    base = tmp_path_factory.mktemp("entries")
    (base / "src").mkdir()
    (base / "src" / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    caches = {}

    def built(arch: str) -> str:
        missing = _toolchain_missing(arch)
        if missing:
            pytest.skip(f"{arch}: {missing}")
        if arch not in caches:
            cache = str(base / f"cache-{arch}")
            report = build([str(base / "src")], [arch], options_mod.Options(), cache, log=lambda _: None,
                           out=lambda _: None)
            assert report.ok and report.built == 2, arch
            caches[arch] = cache
        return caches[arch]
    return built


@pytest.fixture
def cache_of(builds, tmp_path):
    """`cache_of(arch)`: a private copy of the arch's build."""
    def copy(arch: str) -> str:
        dest = str(tmp_path / f"cache-{arch}")
        shutil.copytree(builds(arch), dest)
        return dest
    return copy


def _entry_dir(cache: str, arch: str, kernel: str) -> str:
    path = os.path.join(cache, *module_path(MODULE, arch).split("/"))
    record = A.decode_record(open(path, "rb").read(), A.MODULE_RECORD)
    return os.path.join(cache, *entry_path(record["kernels"][kernel]).split("/"))


def _read_entry_record(entry_dir: str) -> dict:
    return A.decode_record(open(os.path.join(entry_dir, "meta.msgpack"), "rb").read(), A.ENTRY_RECORD)


def _replace_and_resign(entry_dir: str, kind: str, data: bytes) -> str:
    """Put `data` in place of artifact `kind` and re-sign the entry record for it, as one who
    can write the cache could: the sha256 and size checks then pass. Returns the artifact's path."""
    record = _read_entry_record(entry_dir)
    info = record["artifacts"][kind]
    path = os.path.join(entry_dir, info["file"])
    with open(path, "wb") as f:
        f.write(data)
    info["sha256"], info["size"] = A.sha256(data), len(data)
    with open(os.path.join(entry_dir, "meta.msgpack"), "wb") as f:
        f.write(A.encode_record(A.ENTRY_RECORD, record))
    return path


def _artifact(entry_dir: str, kind: str) -> bytes:
    return open(os.path.join(entry_dir, _read_entry_record(entry_dir)["artifacts"][kind]["file"]), "rb").read()


def _verify(cache: str):
    r = CliRunner().invoke(cli, ["verify", "--cache", cache])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r


def _assert_refused(cache: str, arch: str, path: str, *reasons: str) -> None:
    """`qdc verify` and `load` both refuse the cache, naming the file `path` and each reason."""
    r = _verify(cache)
    assert r.exit_code == 1 and f"{path}: " in r.output, r.output
    for reason in reasons:
        assert reason in r.output, r.output
    with pytest.raises(qd.CacheError) as e:
        load(cache, MODULE, arch=arch)
    assert path in str(e.value) and all(reason in str(e.value) for reason in reasons), str(e.value)


# ---- the untampered build --------------------------------------------------------------------

def test_the_untampered_cache_verifies_and_runs(arch, builds, rng):
    cache = builds(arch)
    r = _verify(cache)
    assert r.exit_code == 0, r.output
    mod = load(cache, MODULE, arch=arch)
    xs = rng.uniform(0.5, 1.5, 16).astype(np.float32)  # every term positive: no cancellation
    mod.x.from_numpy(xs)
    mod.loss[None] = 0.0
    mod.energy()
    x64 = xs.astype(np.float64)
    np.testing.assert_allclose(mod.loss[None], (x64 * x64 * 0.5 + x64).sum(), rtol=1e-5)
    mod.loss.grad[None] = 1.0
    mod.energy.grad()
    np.testing.assert_allclose(mod.x.grad.to_numpy(), x64 + 1.0, rtol=1e-6)


@pytest.mark.parametrize("target", ["vulkan", "metal"])
def test_each_spirv_module_names_its_task_entry_and_validates(builds, target):
    cache = builds(target)
    for kernel, task_entry in (("energy", FORWARD_TASK), ("energy.grad", GRAD_TASK)):
        entry_dir = _entry_dir(cache, target, kernel)
        record = _read_entry_record(entry_dir)
        assert [t["entry"] for t in record["meta"]["tasks"]] == [task_entry]
        module = _artifact(entry_dir, "spirv_t0")
        assert E.spirv_entry_points(module) == {task_entry}
        if tools.have_validator():
            assert tools.validate(module) is None
        if target == "metal":
            assert E.msl_kernels(_artifact(entry_dir, "msl_t0")) == {task_entry}


# ---- tampering -------------------------------------------------------------------------------

def _amdgpu_kind(cache: str) -> str:
    return sorted(k for k in _read_entry_record(_entry_dir(cache, "amdgpu", "energy"))["artifacts"]
                  if k.startswith("hsaco_"))[0]


@pytest.mark.parametrize("target,kind", [("cpu", "so"), ("vulkan", "spirv_t0"), ("metal", "msl_t0"),
                                         ("metal", "spirv_t0"), ("cuda", "ptx"), ("amdgpu", "hsaco")])
def test_an_artifact_swapped_between_entries_is_refused(cache_of, target, kind):
    cache = cache_of(target)
    kind = _amdgpu_kind(cache) if target == "amdgpu" else kind
    forward, grad = _entry_dir(cache, target, "energy"), _entry_dir(cache, target, "energy.grad")
    path = _replace_and_resign(forward, kind, _artifact(grad, kind))
    _assert_refused(cache, target, path, "missing: ", f"'{FORWARD_TASK}'", "unexpected: ",
                    f"'{GRAD_TASK}'")


def test_a_renamed_cpu_symbol_is_refused(cache_of):
    cache = cache_of("cpu")
    forward = _entry_dir(cache, "cpu", "energy")
    library = _artifact(forward, "so")
    renamed = FORWARD_TASK.replace("_t0", "_x0")
    assert library.count(FORWARD_TASK.encode() + b"\0") >= 1
    path = _replace_and_resign(forward, "so", library.replace(FORWARD_TASK.encode() + b"\0", renamed.encode() + b"\0"))
    _assert_refused(cache, "cpu", path, f"missing: '{FORWARD_TASK}'", f"unexpected: '{renamed}'")


def _rename_spirv_entry_point(module: bytes, name: str) -> bytes:
    """`module` with its one OpEntryPoint named `name` (the instruction's length adjusted)."""
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    at = 5
    while words[at] & 0xFFFF != 15:  # OpEntryPoint
        at += words[at] >> 16
    count = words[at] >> 16
    old_name = struct.pack(f"<{count - 3}I", *words[at + 3:at + count])
    name_words = len(old_name.split(b"\0", 1)[0]) // 4 + 1
    interface = words[at + 3 + name_words:at + count]
    literal = name.encode() + b"\0" * (4 - len(name) % 4)
    new = list(struct.unpack(f"<{len(literal) // 4}I", literal))
    instruction = [((3 + len(new) + len(interface)) << 16) | 15, words[at + 1], words[at + 2], *new, *interface]
    words[at:at + count] = instruction
    return struct.pack(f"<{len(words)}I", *words)


def test_a_spirv_module_whose_entry_point_is_main_is_refused_with_a_rebuild_hint(cache_of):
    """As every module was named before entry points followed their tasks."""
    cache = cache_of("vulkan")
    forward = _entry_dir(cache, "vulkan", "energy")
    old_style = _rename_spirv_entry_point(_artifact(forward, "spirv_t0"), "main")
    assert E.spirv_entry_points(old_style) == {"main"}
    if tools.have_validator():
        assert tools.validate(old_style) is None
    path = _replace_and_resign(forward, "spirv_t0", old_style)
    _assert_refused(cache, "vulkan", path, f"missing: '{FORWARD_TASK}'; unexpected: 'main'", "qdc build --force")


def test_the_vulkan_device_never_creates_a_pipeline_of_an_entry_point_the_module_lacks(builds):
    """Artifacts handed to the device directly (not read from a cache) are checked there too."""
    from conftest import vulkan_unavailable_reason
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device ({vulkan_unavailable_reason()})")
    from qdc.runtime.devices.vulkan.device import VulkanDevice
    from qdc.runtime.devices.vulkan.kernels import UnsupportedKernelError
    forward = _entry_dir(builds("vulkan"), "vulkan", "energy")
    meta = A.KernelMeta.from_dict(_read_entry_record(forward)["meta"])
    module = _rename_spirv_entry_point(_artifact(forward, "spirv_t0"), "main")
    device = VulkanDevice()
    try:
        with pytest.raises(UnsupportedKernelError, match=f"kernel 'energy'.*no entry point '{FORWARD_TASK}'"):
            device.load_kernel({"spirv_t0": module}, meta)
    finally:
        device.close()


def test_a_cpu_library_that_fails_to_load_names_the_cache_file(cache_of):
    cache = cache_of("cpu")
    forward = _entry_dir(cache, "cpu", "energy")
    library = bytearray(_artifact(forward, "so"))
    machine = struct.unpack_from("<H", library, 18)[0]
    struct.pack_into("<H", library, 18, 183 if machine != 183 else 62)  # aarch64 code on x86_64, or the reverse
    path = _replace_and_resign(forward, "so", bytes(library))
    assert _verify(cache).exit_code == 0  # its symbols are the record's: only loading finds it unusable
    with pytest.raises(LibraryLoadError) as e:
        load(cache, MODULE, arch="cpu")
    message = str(e.value)
    assert message.startswith(f"{path}: kernel 'energy': cannot load a kernel library"), message
    assert "/proc/self/fd" not in message and not re.search(r"qdc-\w+\.so", message), message


def test_malformed_artifacts_are_reported_never_raised(cache_of, rng):
    """Truncated or corrupted libraries and modules: a reason, never an exception of the reader."""
    cache = cache_of("cpu")
    meta = A.KernelMeta.from_dict(_read_entry_record(_entry_dir(cache, "cpu", "energy"))["meta"])
    library = _artifact(_entry_dir(cache, "cpu", "energy"), "so")
    vulkan = cache_of("vulkan")
    vulkan_meta = A.KernelMeta.from_dict(_read_entry_record(_entry_dir(vulkan, "vulkan", "energy"))["meta"])
    module = _artifact(_entry_dir(vulkan, "vulkan", "energy"), "spirv_t0")
    assert E.entry_points_problem("so", library, meta) is None
    assert E.entry_points_problem("spirv_t0", module, vulkan_meta) is None
    for kind, data, kernel in (("so", library, meta), ("spirv_t0", module, vulkan_meta)):
        for _ in range(150):
            broken = bytearray(data[:int(rng.integers(0, len(data) + 1))])
            for at in rng.integers(0, max(len(broken), 1), int(rng.integers(0, 8))):
                if at < len(broken):
                    broken[at] = int(rng.integers(0, 256))
            problem = E.entry_points_problem(kind, bytes(broken), kernel)
            assert problem is None or isinstance(problem, str)
    assert E.entry_points_problem("so", library[:100], meta).startswith("unreadable")


# ---- stray files and folders ---------------------------------------------------------------------

def test_verify_names_stray_entries_by_the_path_where_they_are(cache_of):
    cache = cache_of("cpu")
    forward, grad = _entry_dir(cache, "cpu", "energy"), _entry_dir(cache, "cpu", "energy.grad")
    misplaced = os.path.join(cache, "entries", "zz", os.path.basename(forward))
    os.makedirs(os.path.dirname(misplaced))
    shutil.move(forward, misplaced)
    extra = os.path.join(grad, "kernel.extra")
    open(extra, "wb").write(b"x")
    not_a_key = os.path.join(cache, "entries", "ab", "notakey")
    os.makedirs(not_a_key)
    open(os.path.join(not_a_key, "meta.msgpack"), "wb").write(b"")
    stray_record = os.path.join(cache, "modules", "cpu", "nested", "old.msgpack")
    os.makedirs(os.path.dirname(stray_record))
    open(stray_record, "wb").write(b"")
    r = _verify(cache)
    assert r.exit_code == 1, r.output
    for path, reason in ((misplaced, "a cache entry outside its folder"), (extra, "not a file of its cache entry"),
                         (not_a_key, "not a cache entry name"), (stray_record, "not a module record")):
        assert f"{path}: {reason}" in r.output, r.output


# ---- entry names on Metal -----------------------------------------------------------------------

def test_metal_entries_never_hold_a_double_underscore():
    assert msl.metal_entry("qdc_a__b_t0") == "qdc_a_0_b_t0"
    assert msl.metal_entry("qdc__private___x_grad_t1") == "qdc_0_private_0_0_x_grad_t1"
    assert msl.metal_entry(FORWARD_TASK) == FORWARD_TASK


def test_metal_kernel_names_with_double_underscores_keep_their_entry(tmp_path):
    if _toolchain_missing("metal"):
        pytest.skip(_toolchain_missing("metal"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "odd_names.py").write_text(
        "import qdc as qd\n\nx = qd.field(qd.f32, shape=4)\n\n\n"
        "@qd.kernel\ndef _fill__all(s: qd.f32):\n    for i in x:\n        x[i] = s\n", encoding="utf-8")
    cache = str(tmp_path / "cache")
    report = build([str(tmp_path / "src")], ["metal"], options_mod.Options(), cache, log=lambda _: None,
                   out=lambda _: None)
    assert report.ok
    path = os.path.join(cache, *module_path("odd_names", "metal").split("/"))
    key = A.decode_record(open(path, "rb").read(), A.MODULE_RECORD)["kernels"]["_fill__all"]
    entry_dir = os.path.join(cache, *entry_path(key).split("/"))
    (task,) = _read_entry_record(entry_dir)["meta"]["tasks"]
    assert "__" not in task["entry"]
    assert E.msl_kernels(_artifact(entry_dir, "msl_t0")) == {task["entry"]}
    assert _verify(cache).exit_code == 0
