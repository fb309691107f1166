"""The build host's own Linux libraries linked by ld.lld through the LLD server
(compiler/targets/cpu/link.py, `_link_host_elf`): the same dynamic facts as the system linker's
library (the libraries needed, glibc's and libgomp's symbol versions, relro, the unwind table's
index, a stack that is not executable, the GNU hash table, no text relocations), the same results
when loaded, libgomp's parallel region on several threads, the same bytes link after link, and a
cache key that names the linker."""
import ctypes
import math
import shutil
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

from qdc.compiler.targets.cpu import host_linker, link, platforms
from qdc.compiler.targets.cpu.platforms import host_platform

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="links Linux ELF libraries"),
    pytest.mark.skipif(host_linker.host_elf_linking() is None, reason="no ld.lld, or no libgomp.so.1 / libm.so.6 found"),
    pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("ld") is None, reason="compares with ld's"),
]

KERNEL = '''
declare float @expf(float)
declare float @sinf(float)
declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
declare ptr @memcpy(ptr, ptr, i64)
@ran = global [16 x i32] zeroinitializer
define float @f(float %x) {
  %s = call float @sinf(float %x)
  %e = call float @expf(float %s)
  ret float %e
}
define internal void @body(ptr %unused) {
  %t = call i32 @omp_get_thread_num()
  %p = getelementptr [16 x i32], ptr @ran, i32 0, i32 %t
  store i32 1, ptr %p
  ret void
}
define void @g(i32 %threads) {
  call void @GOMP_parallel(ptr @body, ptr null, i32 %threads, i32 0)
  ret void
}
define void @copy(ptr %to, ptr %from) {
  %r = call ptr @memcpy(ptr %to, ptr %from, i64 16)
  ret void
}
'''
ONLY_C_LIBRARY = '''
declare ptr @memcpy(ptr, ptr, i64)
define void @copy(ptr %to, ptr %from) {
  %r = call ptr @memcpy(ptr %to, ptr %from, i64 16)
  ret void
}
'''
ONLY_MATH = '''
declare float @sinf(float)
define float @f(float %x) {
  %s = call float @sinf(float %x)
  ret float %s
}
'''


def _object(body: str) -> bytes:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(opt=2, reloc="pic")
    return machine.emit_object(llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"\n' + body))


def _dynamic_facts(path) -> dict:
    out = subprocess.run(["readelf", "-dlW", "--dyn-syms", str(path)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    segments = {line.split()[0]: line.split()[-2] for line in lines
                if line.strip().startswith(("GNU_STACK", "GNU_RELRO", "GNU_EH_FRAME"))}
    return {"needed": [line.split("[")[1].rstrip("]") for line in lines if "(NEEDED)" in line],
            "undefined": sorted(line.split()[7] for line in lines if len(line.split()) > 7 and line.split()[6] == "UND"),
            "segments": segments,  # name -> flags
            "gnu_hash": any("(GNU_HASH)" in line for line in lines),
            "sysv_hash": any("(HASH)" in line for line in lines),
            "text_relocations": any("TEXTREL" in line for line in lines)}


def _both(tmp_path, body: str):
    obj = _object(body)
    (tmp_path / "lld.so").write_bytes(link.link_shared_library([obj], host_platform(), host=True))
    (tmp_path / "ld.so").write_bytes(link._link_on_host([obj]))
    return tmp_path / "lld.so", tmp_path / "ld.so"


def test_the_library_has_the_system_linkers_dynamic_facts(tmp_path):
    with_lld, with_ld = _both(tmp_path, KERNEL)
    facts = _dynamic_facts(with_lld)
    assert facts == _dynamic_facts(with_ld)
    assert facts["needed"] == ["libgomp.so.1", "libm.so.6"]
    assert "expf@GLIBC_2.27" in facts["undefined"]  # not left unversioned (the oldest, a wrapper, at load)
    assert "GOMP_parallel@GOMP_4.0" in facts["undefined"]
    assert "memcpy" in facts["undefined"]  # the C library's, whose version the loading process gives
    assert facts["segments"] == {"GNU_EH_FRAME": "R", "GNU_STACK": "RW", "GNU_RELRO": "R"}
    assert facts["gnu_hash"] and not facts["sysv_hash"] and not facts["text_relocations"]


def test_only_the_libraries_the_code_calls_are_needed(tmp_path):
    with_lld, with_ld = _both(tmp_path, ONLY_MATH)
    assert _dynamic_facts(with_lld)["needed"] == _dynamic_facts(with_ld)["needed"] == ["libm.so.6"]
    with_lld, with_ld = _both(tmp_path, ONLY_C_LIBRARY)  # libm as with ld, though none of its functions
    assert _dynamic_facts(with_lld) == _dynamic_facts(with_ld)


def test_the_library_computes_as_the_system_linkers_and_runs_libgomp_threads(tmp_path):
    for path in _both(tmp_path, KERNEL):
        library = ctypes.CDLL(str(path))
        library.f.restype, library.f.argtypes = ctypes.c_float, [ctypes.c_float]
        for x in (-3.0, 0.25, 0.7, 10.5):
            assert library.f(x) == pytest.approx(math.exp(math.sin(x)), rel=1e-6)
        library.g(4)
        assert list((ctypes.c_int * 16).in_dll(library, "ran"))[:5] == [1, 1, 1, 1, 0]


def test_links_of_one_object_are_the_same_bytes():
    obj = _object(KERNEL)
    first = link.link_shared_library([obj], host_platform(), host=True)
    link.link_server.close_servers()  # a fresh server links as the first
    assert link.link_shared_library([obj], host_platform(), host=True) == first
    assert link.link_shared_library([obj], host_platform(), host=True) == first


def test_the_cache_key_names_the_linker(monkeypatch):
    for cpu_target in ("native", "portable"):
        assert platforms.target_description.__wrapped__(cpu_target).endswith(f"/lld-{host_linker.host_elf_linking()[1]}")
    monkeypatch.setattr(host_linker, "host_elf_linking", lambda: None)  # the system linker's libraries: keys as before
    assert "lld" not in platforms.target_description.__wrapped__("native")
    assert "lld" not in platforms.target_description.__wrapped__("portable")
