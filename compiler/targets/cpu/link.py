"""Linking a CPU kernel's object (or its parts' objects: parallel_llvm.py) into the shared library the runtime dlopens, with LLVM's
linker (compiler/targets/lld.py) through this process's LLD server (link_server.py, ~0.3 ms a
link): ld.lld for Linux ELF, ld64.lld for macOS Mach-O. A Linux build host's own libraries are
linked against its own libgomp and libm, so that their calls bind to the same symbol versions
as with the system linker; where ld.lld or those libraries are missing, and on a macOS host,
the host's libraries are linked with the system's linker (`ld`, else the C compiler driver).
No cross toolchain or sysroot is needed for another platform of `cpu_targets` (isa_levels.py):
a kernel library needs nothing of the C runtime (no start files, no constructors), only
libgomp's and the math library's functions, which the loading host's dynamic linker resolves.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import struct
import sys
import tempfile

import llvmlite.binding as llvm

from qdc.runtime.contract.errors import QdcCompileError

from ... import timings
from .. import lld
from . import link_server
from .host_linker import LIBGOMP, LIBM, host_elf_linking
from .isa_levels import CpuPlatform

# Whether linking with `ld` itself works here (None: not tried yet). A kernel library needs
# nothing the C compiler driver adds (no C runtime start files: no constructors, no main), and
# calling `ld` directly skips the driver and collect2: about 6 ms a link instead of 18 on the
# development machine. Where it fails (no GNU-style ld, libgomp.so.1 not in its search path),
# every later link goes through `cc` (or `$CC`). `$CC` does not turn the direct link off: images
# that set it for other builds (the lent GPU host's does) paid ~15 ms per kernel through it.
_direct_ld_works: bool | None = None

# libgomp for the worker threads; the C math library for whatever else the code calls (sinf,
# and the calls LLVM lowers some intrinsics to). ld reads each library it is given in full,
# about 2.5 ms apiece, so a library no symbol of the object needs is left out.
_LIBGOMP_SYMBOLS = ("GOMP_", "omp_")
ELF_FLAGS = ["-shared", "--eh-frame-hdr", "--hash-style=gnu", "-z", "relro", "-z", "noexecstack"]


def link_shared_library(objects: list[bytes], platform: CpuPlatform, host: bool) -> bytes:
    """The library of `objects` (a kernel's one object, or its parts': parallel_llvm.py) for
    `platform`; `host`: the build host's own platform."""
    if host:
        return _link_host_elf(objects) if host_elf_linking() is not None else _link_on_host(objects)
    if platform.os == "macos":
        return _link_mach_o(objects, platform)
    return _link_elf(objects, platform)


def _undefined_symbols(objects: list[bytes]) -> set[str] | None:
    """The symbols ELF64 `objects` leave to other libraries (that none of them defines); None if
    one has no symbol table."""
    undefined, defined = set(), set()
    for one in objects:
        sections = {s.name(): s.data() for s in llvm.ObjectFileRef.from_data(one).sections()}
        symtab, strtab = sections.get(b".symtab"), sections.get(b".strtab")
        if symtab is None or strtab is None:
            return None
        for name, _info, _other, section, _value, _size in struct.iter_unpack("<IBBHQQ", symtab):
            if name:  # section 0: undefined here
                (undefined if section == 0 else defined).add(strtab[name:strtab.index(b"\0", name)].decode())
    return undefined - defined


def _needed_libraries(undefined: set[str] | None) -> list[str]:
    """Of libgomp and libm, those whose functions the object calls (both when unknown)."""
    out = []
    if undefined is None or any(name.startswith(_LIBGOMP_SYMBOLS) for name in undefined):
        out.append(LIBGOMP)
    if undefined is None or any(not name.startswith(_LIBGOMP_SYMBOLS) for name in undefined):
        out.append(LIBM)
    return out


def _direct_ld_command(o: list[str], so: str, undefined: set[str] | None) -> list | None:
    if _direct_ld_works is False or not sys.platform.startswith("linux"):
        return None
    ld = shutil.which("ld")
    if ld is None:
        return None
    return [ld, *ELF_FLAGS, "-o", so, *o, *(f"-l:{name}" for name in _needed_libraries(undefined))]


def _object_paths(folder: str, objects: list[bytes]) -> list[str]:
    """Where _run_in_folder writes `objects`: k.o, then k1.o, k2.o, ..."""
    return [os.path.join(folder, f"k{i or ''}.o") for i in range(len(objects))]


def _run_in_folder(objects: list[bytes], commands, output: str, extra_files: dict | None = None,
                   run=timings.run_tool) -> tuple[bytes | None, str]:
    """Write `objects` (_object_paths) and `extra_files` into a private folder, run
    `commands(folder)` in turn (with `run`, as timings.run_tool) until one writes `output`: (its
    bytes, "") or (None, the last one's messages)."""
    with tempfile.TemporaryDirectory(prefix="qdc-link-") as folder:
        for path, obj in zip(_object_paths(folder, objects), objects):
            with open(path, "wb") as f:
                f.write(obj)
        for name, data in (extra_files or {}).items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        messages = ""
        for command, on_done in commands(folder):
            try:
                returncode, messages = run(command)  # its CPU time counts to the link
            except FileNotFoundError:
                messages = f"'{command[0]}' not found"
                if on_done is not None:
                    on_done(False)
                continue
            if on_done is not None:
                on_done(returncode == 0)
            if returncode == 0:
                with open(os.path.join(folder, output), "rb") as f:
                    return f.read(), ""
        return None, messages


def _link_on_host(objects: list[bytes]) -> bytes:
    """With the system's linker, `ld` (else the C compiler driver, `$CC` or `cc`): the host's
    libraries where ld.lld cannot link them (host_linker.py), and the LLD server's preloaded
    library."""
    cc = os.environ.get("CC", "cc")

    def remember(worked: bool) -> None:
        global _direct_ld_works
        _direct_ld_works = worked

    def commands(folder):
        o, so = _object_paths(folder, objects), os.path.join(folder, "k.so")
        little_elf = sys.platform.startswith("linux") and sys.byteorder == "little"
        direct = _direct_ld_command(o, so, _undefined_symbols(objects) if little_elf else None)
        if direct is not None:
            yield direct, remember
        yield _driver_command(cc, o, so, sys.platform), None
    library, messages = _run_in_folder(objects, commands, "k.so")
    if library is None:
        if messages == f"'{cc}' not found":
            raise RuntimeError(f"the CPU backend needs a C compiler driver to link ('{cc}' not found; set CC)")
        raise RuntimeError(f"linking the kernel library failed:\n{messages}")
    return library


def _driver_command(cc: str, o: list[str], so: str, system: str) -> list:
    """Linking through the C compiler driver. macOS has no libgomp: its libraries leave the
    OpenMP runtime's functions to dyld, as the ones ld64.lld links (_link_mach_o)."""
    if system == "darwin":
        return [cc, "-dynamiclib", "-undefined", "dynamic_lookup", "-o", so, *o]
    return [cc, "-shared", "-o", so, *o, "-lgomp", "-lm"]


def _run_lld(command: list) -> tuple[int, str]:
    """LLD through this process's LLD server (link_server.py), which saves its start-up; the
    server's preloaded library is linked by the system's linker."""
    return link_server.run_lld(command, _link_on_host)


# A kernel library is too small for LLD's worker threads to repay starting them (~1 of a
# link's ~5 ms of CPU).
ONE_THREAD = ["--threads=1"]


def _lld(flavor: str, platform: CpuPlatform) -> list:
    found = lld.find(flavor)
    if not found:
        raise QdcCompileError(f"building CPU code for {platform.name} (cpu_targets) on this {sys.platform} machine "
                              f"links it with {flavor} {lld.MIN_LLD} or newer, which is not installed: "
                              f"{lld.INSTALL_HINT}")
    return found[0] + ONE_THREAD


@functools.lru_cache(maxsize=None)
def _stub_library(triple: str, soname: str) -> bytes:
    """An empty ELF shared library named `soname` for `triple`: linked against it, a kernel
    library records that it needs `soname` (DT_NEEDED), whose functions it leaves undefined
    for the loading host's dynamic linker, without the build host having that library."""
    return _shared_stub(lld.find("ld.lld")[0] + ONE_THREAD, triple, soname)  # _link_elf found it


def _shared_stub(command: list, triple: str, soname: str, symbols=(), version_script: str = "") -> bytes:
    """An ELF shared library named `soname` for `triple`, linked by ld.lld `command`, that defines
    `symbols` as empty functions at the versions `version_script` gives them."""
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu="generic", features="", opt=0, reloc="pic")
    module = f'target triple = "{triple}"\n' + "".join(f'define void @"{symbol}"() {{\n  ret void\n}}\n'
                                                     for symbol in symbols)
    functions = machine.emit_object(llvm.parse_assembly(module))

    def commands(folder):
        scripted = ["--version-script", os.path.join(folder, "v.map")] if version_script else []
        yield [*command, "-shared", "-soname", soname, *scripted, "-o", os.path.join(folder, "s.so"),
               os.path.join(folder, "k.o")], None
    library, messages = _run_in_folder([functions], commands, "s.so",
                                       {"v.map": version_script.encode()} if version_script else None, run=_run_lld)
    if library is None:
        raise QdcCompileError(f"internal compiler error: ld.lld could not make the {soname} stub for {triple}:\n"
                              f"{messages}")
    return library


def _link_host_elf(objects: list[bytes]) -> bytes:
    """With ld.lld against stubs of the host's libgomp and libm that hold only the functions the
    object calls of them, at those libraries' default symbol versions (LLD reads libm.so.6's
    ~1,200 symbols in ~0.5 ms, as long as the rest of a link): the library records the versions
    the system's linker records (expf@GLIBC_2.27, GOMP_parallel@GOMP_4.0), where an unversioned
    reference (_stub_library's) would bind to a function's oldest version, glibc's compatibility
    wrappers, at load. An object without a symbol table is linked against the libraries."""
    command, _version, libraries = host_elf_linking()
    command = command + ONE_THREAD
    undefined = _undefined_symbols(objects)
    needed = {name: libraries[name] for name in _needed_libraries(undefined)}
    if undefined is not None:
        needed = {name: _versioned_stub(tuple(command), name, path, frozenset(undefined & _symbol_versions(path).keys()),
                                        os.getpid())
                  for name, path in needed.items()}
    return _link_elf_against(objects, command, needed, "this host's")


@functools.lru_cache(maxsize=None)
def _symbol_versions(path: str) -> dict:
    """{name: its default version, or None if unversioned} of the functions and objects that
    the ELF64 little-endian shared library at `path` defines."""
    wanted = (b".dynsym", b".dynstr", b".gnu.version", b".gnu.version_d")
    with open(path, "rb") as f:  # a section's data is read while the iterator is on it
        sections = {s.name(): s.data() for s in llvm.ObjectFileRef.from_data(f.read()).sections()
                    if s.name() in wanted}
    dynsym, dynstr = sections[b".dynsym"], sections[b".dynstr"]
    versym, verdef = sections.get(b".gnu.version"), sections.get(b".gnu.version_d", b"")

    def string(at: int) -> str:
        return dynstr[at:dynstr.index(b"\0", at)].decode()
    names, at = {}, 0  # version index -> name, from the Elf64_Verdef chain
    while at < len(verdef):
        _version, flags, index, _count, _hash, aux, following = struct.unpack_from("<HHHHIII", verdef, at)
        if not flags & 1:  # VER_FLG_BASE: the library's own name
            names[index] = string(struct.unpack_from("<I", verdef, at + aux)[0])
        if not following:
            break
        at += following
    out = {}
    for i, (name, info, _other, section, _value, _size) in enumerate(struct.iter_unpack("<IBBHQQ", dynsym)):
        index = struct.unpack_from("<H", versym, 2 * i)[0] if versym is not None else 1
        if section == 0 or not name or info >> 4 not in (1, 2) or index & 0x8000:
            continue  # undefined, local, or a version that is not the default (name@VERSION)
        out[string(name)] = names.get(index)
    return out


@functools.lru_cache(maxsize=None)
def _versioned_stub(command: tuple, soname: str, path: str, symbols: frozenset, process: int) -> str:
    """The path of a shared library named `soname` defining `symbols` (empty functions) at the
    versions the library at `path` gives them, made once per `process` (a build worker makes
    its own) into a folder of the process's, so that a link does not write it again."""
    versions, by_version = _symbol_versions(path), {}
    for symbol in sorted(symbols):
        by_version.setdefault(versions[symbol], []).append(symbol)
    script = "".join(f"{version} {{ global: {'; '.join(names)}; }};\n"
                     for version, names in sorted(by_version.items()) if version is not None)
    library = _shared_stub(list(command), llvm.get_process_triple(), soname, sorted(symbols), script)
    handle, stub = tempfile.mkstemp(prefix=soname + "-", dir=_stub_folder(process))
    with os.fdopen(handle, "wb") as f:
        f.write(library)
    return stub


_stub_folders: dict = {}  # process id -> the folder of its stubs


def _stub_folder(process: int) -> str:
    if process not in _stub_folders:
        _stub_folders[process] = tempfile.mkdtemp(prefix="qdc-stubs-")
    return _stub_folders[process]


def remove_stubs() -> None:
    """Remove this process's stubs (at its exit; a forked build worker, which leaves by
    os._exit, calls it itself)."""
    folder = _stub_folders.pop(os.getpid(), None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


atexit.register(remove_stubs)


def _link_elf(objects: list[bytes], platform: CpuPlatform) -> bytes:
    command = _lld("ld.lld", platform)
    needed = _needed_libraries(_undefined_symbols(objects))
    return _link_elf_against(objects, command, {name: _stub_library(platform.triple, name) for name in needed},
                             f"the {platform.name}")


def _link_elf_against(objects: list[bytes], command: list, libraries: dict, whose: str) -> bytes:
    """The ELF library of `objects` linked by ld.lld `command` against `libraries` (soname -> the
    host's library's path, or a stub's bytes, written beside the object), in that order."""
    stubs = {name: data for name, data in libraries.items() if isinstance(data, bytes)}

    def commands(folder):
        paths = [os.path.join(folder, name) if name in stubs else path for name, path in libraries.items()]
        yield command + [*ELF_FLAGS, "-o", os.path.join(folder, "k.so"), *_object_paths(folder, objects), *paths], None
    library, messages = _run_in_folder(objects, commands, "k.so", stubs, run=_run_lld)
    if library is None:
        raise QdcCompileError(f"internal compiler error: ld.lld could not link {whose} kernel library:\n{messages}")
    return library


# A macOS kernel library leaves the math library's functions (libSystem, in every process) and
# the OpenMP runtime's (libomp, which the runtime loads first: runtime/devices/cpu/device.py)
# to dyld's flat lookup among the images already loaded: no SDK is needed to build it.
MACOS_VERSION = "11.0"


def _link_mach_o(objects: list[bytes], platform: CpuPlatform) -> bytes:
    command = _lld("ld64.lld", platform)
    arch = platform.triple.split("-")[0]
    library, messages = _run_in_folder(
        objects, lambda folder: [(command + ["-arch", arch, "-dylib", "-platform_version", "macos", MACOS_VERSION,
                                             MACOS_VERSION, "-undefined", "dynamic_lookup", "-install_name",
                                             "@rpath/qdc_kernel.dylib", "-o", os.path.join(folder, "k.dylib"),
                                             *_object_paths(folder, objects)], None)],
        "k.dylib", run=_run_lld)
    if library is None:
        raise QdcCompileError(f"internal compiler error: ld64.lld could not link the {platform.name} kernel "
                              f"library:\n{messages}")
    return library
