"""The LLD server (compiler/targets/cpu/link_server.py): the CPU libraries of other platforms are
linked by one LLD process per build process, link after link, into the same bytes as LLD started
anew; LLD's messages reach the error; after a fatal error the next link is as good; a server that
dies is replaced by running LLD directly."""
import os
import signal
import sys

import llvmlite.binding as llvm
import pytest

from qdc.compiler import timings
from qdc.compiler.targets import lld
from qdc.compiler.targets.cpu import link, link_server
from qdc.compiler.targets.cpu.isa_levels import PLATFORMS
from qdc.runtime.contract.errors import QdcCompileError

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the LLD server runs on Linux build hosts"),
    pytest.mark.skipif(not lld.find("ld.lld") or not lld.find("ld64.lld"),
                       reason=f"no ld.lld / ld64.lld {lld.MIN_LLD}+ ({lld.INSTALL_HINT})"),
]

KERNEL = '''
declare float @sinf(float)
declare void @GOMP_barrier()
define float @k(float %x) {
  call void @GOMP_barrier()
  %s = call float @sinf(float %x)
  ret float %s
}
'''


def _object(triple: str) -> bytes:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu="generic", features="", opt=0, reloc="pic")
    return machine.emit_object(llvm.parse_assembly(f'target triple = "{triple}"\n' + KERNEL))


def _servers() -> dict:
    return {key: server for key, server in link_server._servers.items() if key[0] == os.getpid()}


@pytest.fixture
def fresh_servers():
    link_server.close_servers()
    yield
    link_server.close_servers()


def _direct(obj: bytes, platform) -> bytes:
    """The library LLD started for this link alone makes."""
    real = link_server.run_lld
    link_server.run_lld = lambda command, link_on_host: timings.run_tool(command)
    try:
        return link.link_shared_library([obj], platform, host=False)
    finally:
        link_server.run_lld = real


def test_one_server_links_both_platforms_as_lld_started_anew(fresh_servers):
    elf, mach_o = PLATFORMS["aarch64-linux"], PLATFORMS["aarch64-macos"]
    elf_object, mach_o_object = _object(elf.triple), _object(mach_o.triple)
    served = [link.link_shared_library([elf_object], elf, host=False) for _ in range(3)]
    dylib = link.link_shared_library([mach_o_object], mach_o, host=False)
    servers = _servers()
    assert len(servers) == 1 and None not in servers.values(), servers  # ld.lld and ld64.lld: one LLD
    (server,) = servers.values()
    assert server.proc.poll() is None
    assert served[0] == served[1] == served[2] == _direct(elf_object, elf)
    assert served[0][:4] == b"\x7fELF" and b"libgomp.so.1" in served[0]
    assert dylib[:4] == b"\xcf\xfa\xed\xfe" and b"_sinf" in dylib
    assert dylib == _direct(mach_o_object, mach_o)  # its UUID and code signature hash the contents
    link_server.close_servers()
    assert server.proc.returncode == 0 and not _servers()


def test_the_links_cpu_time_counts_to_the_phase(fresh_servers, monkeypatch):
    elf = PLATFORMS["aarch64-linux"]
    obj = _object(elf.triple)
    link.link_shared_library([obj], elf, host=False)
    counted = []
    monkeypatch.setattr(timings, "count_tool_cpu", counted.append)
    link.link_shared_library([obj], elf, host=False)
    assert len(counted) == 1 and 0 < counted[0] < 5, counted  # the link's own, from LLD's rusage


def test_lld_messages_reach_the_error(fresh_servers):
    x86_object = _object("x86_64-unknown-linux-gnu")  # linked with the aarch64 stub libraries
    with pytest.raises(QdcCompileError, match="(?s)ld.lld could not link.*incompatible"):
        link.link_shared_library([x86_object], PLATFORMS["aarch64-linux"], host=False)
    assert None not in _servers().values()  # a failed link is LLD's answer, not the server's end


def test_links_after_a_fatal_error_are_as_lld_started_anew(fresh_servers, tmp_path):
    elf, mach_o = PLATFORMS["aarch64-linux"], PLATFORMS["aarch64-macos"]
    elf_object, mach_o_object = _object(elf.triple), _object(mach_o.triple)
    before = link.link_shared_library([elf_object], elf, host=False)
    broken = tmp_path / "broken.o"  # an ELF header LLD gives up on (a fatal error, not an error)
    broken.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x01\x00\xb7\x00" + b"\xff" * 60)
    returncode, messages = link_server.run_lld(lld.find("ld.lld")[0] + ["-shared", "-o", str(tmp_path / "out.so"),
                                                                        str(broken)], link._link_on_host)
    assert returncode == 1 and "e_shentsize" in messages
    assert link.link_shared_library([elf_object], elf, host=False) == before == _direct(elf_object, elf)
    dylib = link.link_shared_library([mach_o_object], mach_o, host=False)
    assert dylib[:4] == b"\xcf\xfa\xed\xfe" and b"_sinf" in dylib
    assert None not in _servers().values() and len(_servers()) == 1  # served, not LLD run directly


def test_a_server_that_ends_is_replaced_by_lld_itself(fresh_servers):
    elf = PLATFORMS["aarch64-linux"]
    obj = _object(elf.triple)
    first = link.link_shared_library([obj], elf, host=False)
    (server,) = _servers().values()
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    assert link.link_shared_library([obj], elf, host=False) == first
    assert list(_servers().values()) == [None]  # not started again in this process


def test_an_lld_without_its_library_entry_forks_per_link(fresh_servers, monkeypatch):
    elf = PLATFORMS["aarch64-linux"]
    obj = _object(elf.triple)
    name = "_ZN3lld11safeLldMainEiPPKcRN4llvm11raw_ostreamES5_"
    assert name in link_server._SHIM_IR
    monkeypatch.setattr(link_server, "_SHIM_IR", link_server._SHIM_IR.replace(name, name.replace("safe", "lost")))
    link_server._shim.cache_clear()
    try:
        served = [link.link_shared_library([obj], elf, host=False) for _ in range(2)]
        assert None not in _servers().values() and len(_servers()) == 1
    finally:
        link_server._shim.cache_clear()
    assert served[0] == served[1] == _direct(obj, elf)
