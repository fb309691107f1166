"""A large kernel's module is cut into parts that LLVM compiles in parallel threads
(compiler/targets/cpu/module_split.py, parallel_llvm.py): the cut is deterministic and complete,
the library is the same bytes whatever the number of threads, a kernel built in parts computes
what it computes built whole (numpy's result, portable too), and `qdc build -j 1` compiles on one
thread. The parts' threshold is lowered here, so that small kernels are cut."""
import platform
import re
import textwrap

import llvmlite.binding as llvm
import numpy as np
import pytest

from qdc.compiler import compile_threads
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options, resolve
from qdc.compiler.targets import lld
from qdc.compiler.targets.cpu import codegen, module_split, parallel_llvm
from qdc.compiler.targets.cpu.target import TARGET as CPU
from qdc.runtime.cache import Cache, read_module
from qdc.runtime.contract.entry_points import defined_entries
from qdc.runtime.loader import load

from remote_util import qdc

SOURCE = textwrap.dedent('''
    import qdc as qd

    F = qd.types.ndarray(dtype=qd.f32, ndim=1)


    @qd.kernel
    def stages(a: F, b: F, c: F, total: F):
        for i in range(a.shape[0]):
            b[i] = qd.sin(a[i]) * 2.0 + qd.cos(a[i] * 0.5)
        for i in range(a.shape[0]):
            c[i] = qd.exp(-b[i] * b[i]) + qd.sqrt(qd.abs(a[i]))
        for i in range(a.shape[0]):
            total[0] += c[i] * b[i]
        qd.loop_config(serialize=True)
        for i in range(1, a.shape[0]):
            c[i] = c[i] + c[i - 1] * 0.5
''')


def _expected(a: np.ndarray):
    a64 = a.astype(np.float64)
    b = np.sin(a64) * 2.0 + np.cos(a64 * 0.5)
    c = np.exp(-b * b) + np.sqrt(np.abs(a64))
    total = float(np.sum(c * b))
    for i in range(1, len(c)):
        c[i] = c[i] + c[i - 1] * 0.5
    return b, c, total


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of a few lines: the test kernel is cut into one per task."""
    monkeypatch.setattr(module_split, "MIN_PART_LINES", 10)


def _compiled(tmp_path, cpu_target="native", source=SOURCE):
    (tmp_path / "split_src.py").write_text(source, encoding="utf-8")
    import importlib.util
    spec = importlib.util.spec_from_file_location("split_src", tmp_path / "split_src.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    k = module.stages._primal
    return K.compile_kernel(k.fn, k.params, Options().update(cpu_target=cpu_target))


def _text(compiled, cpu_target="native"):
    """The IR text compile_kernel hands to LLVM for the host."""
    from qdc.compiler.targets.cpu.platforms import cpu_levels, host_platform
    levels = cpu_levels(cpu_target, host_platform())
    bodies = [task.task_name + "_chunk" for task in compiled.ir.tasks]
    return codegen._generated(compiled.ir, compiled.meta, False, CPU, host_platform(), levels, bodies, 3)[2]


def _defined(text: str) -> list[str]:
    return re.findall(r'^define (?!internal)[^@\n]*@"?([-\w.$]+)"?\(', text, re.M)


def test_the_cut_is_deterministic_and_complete(tmp_path, small_parts):
    text = _text(_compiled(tmp_path, "portable"), "portable")  # several levels: a shared level variable
    parts, shared = module_split.split_module(text)
    assert module_split.split_module(text) == (parts, shared)
    assert len(parts) >= 3
    entries = [name for part in parts for name in _defined(part)]
    assert sorted(entries) == sorted(_defined(text))  # every entry point in exactly one part
    assert shared == {"qdc_cpu_level"}
    owners = [part for part in parts if re.search(r'^@"qdc_cpu_level" = hidden global', part, re.M)]
    assert len(owners) == 1
    for part in parts:
        module = llvm.parse_assembly(part, context=llvm.create_context())
        module.verify()
        for name in re.findall(r'call void @"([-\w.$]+_chunk)"', part):  # a task body is beside its entry
            assert f'define internal void @"{name}"' in part


def test_a_small_module_stays_whole(tmp_path):
    assert module_split.split_module(_text(_compiled(tmp_path))) is None


def test_the_library_is_the_same_bytes_whatever_the_threads(tmp_path, small_parts, monkeypatch):
    compiled = _compiled(tmp_path)
    parts = []
    run_parts = parallel_llvm.run_parts
    monkeypatch.setattr(parallel_llvm, "run_parts", lambda work, cut, sizes: parts.append(len(cut))
                        or run_parts(work, cut, sizes))
    built = []
    for threads in (1, 3, 2):
        with compile_threads.limited_threads(threads):
            built.append(codegen.compile_kernel(compiled.ir, compiled.meta, 3, target=CPU))
    assert parts[0] >= 4 and parts == parts[:1] * 3  # a part per task, at least
    assert built[0] == built[1] == built[2]
    ll = built[0]["ll"].decode()
    assert len(re.findall(r'^define void @"?qdc_stages_t\d', ll, re.M)) == 4  # the parts linked into one module
    assert llvm.parse_bitcode(built[0]["bc"]) is not None


@pytest.mark.parametrize("cpu_target", ["native", "portable"])
def test_parts_compute_what_the_whole_module_does(tmp_path, monkeypatch, rng, cpu_target):
    (tmp_path / "split_src.py").write_text(SOURCE, encoding="utf-8")
    a = rng.standard_normal(1000 + int(rng.integers(0, 100))).astype(np.float32)
    b_want, c_want, total_want = _expected(a)
    results = []
    for lines in (10, 10 ** 9):  # in parts, then whole
        monkeypatch.setattr(module_split, "MIN_PART_LINES", lines)
        cache = str(tmp_path / f"cache-{lines}")
        report = build_mod.build([str(tmp_path / "split_src.py")], ["cpu"], resolve({"cpu_target": cpu_target}, {}),
                                 cache, jobs=1, log=lambda text: None)
        assert report.ok and report.built == 1, report.errors
        b, c, total = np.zeros_like(a), np.zeros_like(a), np.zeros(1, np.float32)
        load(cache, "split_src").stages(a, b, c, total)
        np.testing.assert_allclose(b, b_want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(c, c_want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(total[0], total_want, rtol=1e-4, atol=1e-3)
        results.append((b, c, total))
        shown = qdc("inspect", "split_src.stages", "--cache", cache, "--llvm").stdout  # the parts linked back
        assert len(re.findall(r'^define void @"?qdc_stages_t\d', shown, re.M)) == 4
    for got, whole in zip(*results):
        np.testing.assert_allclose(got, whole, rtol=1e-6, atol=1e-6)


def test_j1_compiles_on_one_thread_and_jn_shares_the_cores(tmp_path, small_parts, monkeypatch):
    (tmp_path / "split_src.py").write_text(SOURCE, encoding="utf-8")
    seen = []
    run_parts = parallel_llvm.run_parts
    monkeypatch.setattr(parallel_llvm, "run_parts", lambda work, cut, sizes: seen.append(
        parallel_llvm.compile_threads()) or run_parts(work, cut, sizes))
    monkeypatch.setattr(compile_threads, "_cores", lambda: 4)
    for jobs in (1, 2):
        report = build_mod.build([str(tmp_path / "split_src.py")], ["cpu"], resolve({}, {}),
                                 str(tmp_path / f"cache-{jobs}"), jobs=jobs, log=lambda text: None)
        assert report.ok, report.errors
    assert seen == [1, 4]  # -j 2 with one kernel to build: one process, all the cores
    assert compile_threads.threads_beside(2) == 2 and compile_threads.threads_beside(8) == 1
    assert compile_threads.compile_threads() == 4  # outside a build: the cores


@pytest.mark.skipif(not lld.find("ld.lld") or not lld.find("ld64.lld"),
                    reason=f"no ld.lld / ld64.lld {lld.MIN_LLD}+ ({lld.INSTALL_HINT})")
def test_a_cross_build_in_parts_has_the_libraries_of_a_whole_one(tmp_path, monkeypatch):
    """aarch64 Linux in parts, macOS retargeted from its linked optimised module: the same
    entry points as built whole."""
    (tmp_path / "split_src.py").write_text(SOURCE, encoding="utf-8")
    libraries, made = [], []
    retargeted = codegen.retargeted
    monkeypatch.setattr(codegen, "retargeted", lambda *args: made.append(retargeted(*args)) or made[-1])
    for lines in (10, 10 ** 9):
        monkeypatch.setattr(module_split, "MIN_PART_LINES", lines)
        cache = str(tmp_path / f"cache-{lines}")
        report = build_mod.build([str(tmp_path / "split_src.py")], ["cpu"], resolve({"cpu_targets": "aarch64"}, {}),
                                 cache, jobs=1, log=lambda text: None)
        assert report.ok and report.built == 1, report.errors
        entry = Cache(cache).lookup(read_module(Cache(cache), "split_src", "cpu")["kernels"]["stages"])
        libraries.append({name: defined_entries(data) for name, data in entry.artifacts.items()
                          if name.startswith(("so", "dylib")) and not name.endswith("sha256")})
    assert len(libraries[0]) == 2 and libraries[0] == libraries[1]
    assert len(made) == 2 and None not in made  # macOS made from Linux's module both times


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 ISA levels")
def test_assembly_of_each_level_from_the_parts(tmp_path, small_parts):
    parallel_tasks_only = SOURCE[:SOURCE.index("    qd.loop_config")]  # (a serial body's l0 copy is inlined)
    compiled = _compiled(tmp_path, "portable", parallel_tasks_only)
    with compile_threads.limited_threads(2):
        out = codegen.compile_kernel(compiled.ir, compiled.meta, 3, False, "portable", keep_assembly=True, target=CPU)
    assert "zmm" in out["asm:x86-64-v4"] and "zmm" not in out["asm:x86-64-v3"]
    for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4"):
        assert out["asm:" + level].count("stages_t0_range_chunk.l") == 1


def test_num_compile_threads_sets_direct_modes_threads(monkeypatch):
    """Quadrants' qd.init option: the threads of a kernel's parts, the cores without it."""
    import qdc as qd
    monkeypatch.setattr(compile_threads, "_cores", lambda: 6)
    try:
        qd.init(arch=qd.cpu, num_compile_threads=3)
        assert compile_threads.compile_threads() == 3
        with compile_threads.limited_threads(1):  # a build's own count comes first
            assert compile_threads.compile_threads() == 1
        with pytest.raises(ValueError, match="num_compile_threads"):
            qd.init(arch=qd.cpu, num_compile_threads=0)
        assert compile_threads.compile_threads() == 3  # a failing call changes nothing
    finally:
        qd.init(arch=qd.cpu)
    assert compile_threads.compile_threads() == 6


def test_a_parts_thread_calls_llvm_without_llvmlites_lock():
    """llvmlite serialises its calls behind one lock; a part's thread calls LLVM directly (were
    llvmlite to change how it wraps its library, the parts would take turns: this says so)."""
    from llvmlite.binding import ffi
    locked = getattr(ffi.lib, "LLVMPY_ParseAssembly")
    with compile_threads.limited_threads(2):
        seen, _ = parallel_llvm.run_parts(lambda part, times: parallel_llvm._call("LLVMPY_ParseAssembly"),
                                          ["a", "b"], [1, 1])
    assert parallel_llvm._call("LLVMPY_ParseAssembly") is locked  # any other thread: through the lock
    assert all(fn is not locked and fn is locked._cfn for fn in seen)
