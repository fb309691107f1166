"""The entry points an artifact defines, read from its bytes without loading or running it,
and the check that they are exactly the ones its kernel's record names (the cache runs it on
every entry it reads, so `load`, `qdc verify` and cache hits all refuse an artifact swapped
between entries, or one whose symbols were renamed, even under a re-signed record).

What each artifact kind must define (KernelMeta: `entry`, each task record's "entry"):
    a CPU library (a kind named by `cpu_libraries`)   exported functions: `entry` and every
        task's entry; besides them only `<entry>_np`, `<entry>_py` and qdc_set_cpu_level
        (the ELF .dynsym, the Mach-O symbol table: see `defined_entries`)
    "ptx"            the `.entry` of every task
    "hsaco_<gfx>"    the kernel descriptor `<entry>.kd` of every task (an ELF code object)
    "spirv_t<i>"     one OpEntryPoint, task i's entry
    "msl_t<i>"       one `kernel void` function, task i's entry
Other kinds (IR, bitcode) are never executed and define nothing checked here.
"""
from __future__ import annotations

import re
import struct

CPU_LEVEL_SETTER = "qdc_set_cpu_level"  # runtime/devices/cpu/device.py calls it in multi-level libraries
CPU_ENTRY_HELPERS = ("_np", "_py")       # `entry` with numpy binding / Python arguments (numpy_binding.py)
KERNEL_DESCRIPTOR_SUFFIX = ".kd"

_TASK_ARTIFACT = re.compile(r"^(spirv|msl)_t(\d+)$")
_PTX_ENTRY = re.compile(r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z_$%][\w$]*)", re.M)
_MSL_KERNEL = re.compile(r"\bkernel[ \t]+void[ \t]+([A-Za-z_]\w*)[ \t]*\(")


def entry_points_problem(kind: str, data: bytes, meta) -> str | None:
    """Why artifact `kind` (bytes `data`) of the kernel described by `meta` (KernelMeta) does
    not define exactly the entries the record names; None when it does or `kind` defines none."""
    expected = _expected(kind, meta)
    if expected is None:
        return None
    required, allowed, reader = expected
    try:
        found = reader(data)
    except ValueError as e:
        return f"unreadable: {e}"
    if found is None:  # a format not read here
        return None
    missing, unexpected = sorted(required - found), sorted(found - required - allowed)
    if not missing and not unexpected:
        return None
    parts = ([f"missing: {_names(missing)}"] if missing else []) \
        + ([f"unexpected: {_names(unexpected)}"] if unexpected else [])
    return (f"does not define the entries its record names for kernel '{meta.name}' ({'; '.join(parts)}): "
            f"built by an older qdc, or swapped or modified since; it was not loaded (rebuild with "
            f"`qdc build --force`)")


def _names(names: list) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _expected(kind: str, meta):
    """(required names, names also allowed, reader of the artifact's names) or None."""
    tasks = {t.entry for t in meta.tasks}
    if any(r["artifact"] == kind for r in meta.cpu_libraries):
        helpers = {meta.entry + suffix for suffix in CPU_ENTRY_HELPERS} | {CPU_LEVEL_SETTER}
        return tasks | {meta.entry}, helpers, defined_entries
    if kind == "ptx":
        return tasks, set(), ptx_entries
    if kind.startswith("hsaco_"):
        return tasks, set(), kernel_descriptors
    match = _TASK_ARTIFACT.match(kind)
    if match is None:
        return None
    index = int(match.group(2))
    required = {meta.tasks[index].entry} if index < len(meta.tasks) else {f"<task {index}: the kernel has none>"}
    return required, set(), spirv_entry_points if match.group(1) == "spirv" else msl_kernels


# ---- readers: each returns the set of names, or raises ValueError on a malformed artifact ----

def spirv_entry_points(data: bytes) -> set:
    """The names of a SPIR-V module's OpEntryPoint instructions."""
    if len(data) % 4 or len(data) < 20:
        raise ValueError("not a SPIR-V module (its size is not a whole number of words)")
    order = "<" if data[:4] == b"\x03\x02\x23\x07" else ">" if data[:4] == b"\x07\x23\x02\x03" else None
    if order is None:
        raise ValueError("not a SPIR-V module (bad magic number)")
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    names, at = set(), 5
    while at < len(words):
        count, opcode = words[at] >> 16, words[at] & 0xFFFF
        if count == 0 or at + count > len(words):
            raise ValueError(f"malformed SPIR-V instruction at word {at}")
        if opcode == _OP_FUNCTION:  # entry points precede every function (the logical layout)
            break
        if opcode == _OP_ENTRY_POINT and count > 3:
            literal = struct.pack(f"{order}{count - 3}I", *words[at + 3:at + count])
            names.add(literal.split(b"\0", 1)[0].decode("utf-8", "replace"))
        at += count
    return names


_OP_ENTRY_POINT, _OP_FUNCTION = 15, 54


def ptx_entries(data: bytes) -> set:
    """The `.entry` kernels of PTX source."""
    return set(_PTX_ENTRY.findall(data.decode("utf-8", "replace")))


def msl_kernels(data: bytes) -> set:
    """The `kernel void NAME(` functions of Metal Shading Language source."""
    return set(_MSL_KERNEL.findall(data.decode("utf-8", "replace")))


def kernel_descriptors(data: bytes) -> set:
    """The kernels of an AMDGPU code object: its defined `<entry>.kd` symbols, suffix removed."""
    return {name[:-len(KERNEL_DESCRIPTOR_SUFFIX)] for name, is_function in elf_dynamic_symbols(data)
            if name.endswith(KERNEL_DESCRIPTOR_SUFFIX) and not is_function}


def defined_entries(data: bytes) -> set | None:
    """The functions a shared library exports: an ELF file's dynamic symbol table's defined
    global functions, a 64-bit Mach-O library's external symbols defined in its sections (the
    C names, without Mach-O's leading underscore); None for a universal (fat) Mach-O file,
    which is not read here (a missing entry is then refused by dlopen's lookup when the kernel
    is loaded)."""
    if data[:4] == _MACH_O_64:
        return mach_o_exports(data)
    if data[:4] in _MACH_O_MAGICS:
        return None
    return {name for name, is_function in elf_dynamic_symbols(data) if is_function}


_MACH_O_64 = b"\xcf\xfa\xed\xfe"  # MH_MAGIC_64, little-endian (arm64, x86_64)
_MACH_O_MAGICS = (b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe")

# ---- Mach-O ------------------------------------------------------------------------------------

_LC_SYMTAB, _LC_SEGMENT_64 = 0x2, 0x19
_N_STAB, _N_PEXT, _N_TYPE, _N_EXT, _N_SECT = 0xE0, 0x10, 0x0E, 0x01, 0x0E
_S_ATTR_INSTRUCTIONS = 0x80000400  # S_ATTR_PURE_INSTRUCTIONS | S_ATTR_SOME_INSTRUCTIONS


def mach_o_exports(data: bytes) -> set:
    """The external functions a little-endian 64-bit Mach-O file defines (symbols of its
    LC_SYMTAB in a section of instructions), leading underscore removed. ValueError if it is
    malformed."""
    try:
        ncmds, sizeofcmds = struct.unpack_from("<II", data, 16)
        at, end = 32, 32 + sizeofcmds
        if end > len(data) or ncmds > MAX_SYMBOLS:
            raise ValueError("malformed Mach-O file (load commands past its end)")
        code_sections, symbols, ordinal = set(), [], 0
        for _ in range(ncmds):
            cmd, size = struct.unpack_from("<II", data, at)
            if size < 8 or at + size > end:
                raise ValueError("malformed Mach-O file (load command size)")
            if cmd == _LC_SEGMENT_64:
                for k in range(struct.unpack_from("<I", data, at + 64)[0]):  # section_64 records, numbered from 1
                    ordinal += 1
                    if struct.unpack_from("<I", data, at + 72 + 80 * k + 64)[0] & _S_ATTR_INSTRUCTIONS:
                        code_sections.add(ordinal)
            elif cmd == _LC_SYMTAB:
                symbols.append(struct.unpack_from("<IIII", data, at + 8))
            at += size
        names = set()
        for symoff, nsyms, stroff, strsize in symbols:
            if nsyms > MAX_SYMBOLS or symoff + 16 * nsyms > len(data) or stroff + strsize > len(data):
                raise ValueError("malformed Mach-O file (symbol table past its end)")
            for strx, kind, section, _desc, _value in struct.iter_unpack("<IBBHQ", data[symoff:symoff + 16 * nsyms]):
                if kind & (_N_STAB | _N_PEXT) or not kind & _N_EXT or kind & _N_TYPE != _N_SECT \
                        or section not in code_sections:
                    continue
                if strx >= strsize:
                    raise ValueError("malformed Mach-O file (symbol name out of its string table)")
                name = data[stroff + strx:data.index(b"\0", stroff + strx, stroff + strsize)]
                names.add(name.decode("utf-8", "replace").removeprefix("_"))
        return names
    except (struct.error, IndexError, OverflowError) as e:
        raise ValueError(f"malformed Mach-O file ({e})") from None


# ---- ELF ---------------------------------------------------------------------------------------

_SHT_DYNSYM = 11
_STB_GLOBAL, _STB_WEAK = 1, 2
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SHN_UNDEF = 0
_STV_HIDDEN, _STV_INTERNAL = 2, 1
MAX_SYMBOLS = 1 << 20  # far more than any kernel library: a larger table is a corrupt one


def elf_dynamic_symbols(data: bytes) -> list[tuple[str, bool]]:
    """(name, is a function) of every symbol an ELF file (32 or 64 bit, either byte order)
    defines and exports in its dynamic symbol table (.dynsym). ValueError if it is not a
    readable ELF file or has no .dynsym."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        return _dynamic_symbols(data, wide, order)
    except (struct.error, IndexError, OverflowError) as e:
        raise ValueError(f"malformed ELF file ({e})") from None


def _dynamic_symbols(data: bytes, wide: bool, order: str) -> list:
    header = struct.unpack_from(order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"), data, 16)
    shoff, shentsize, shnum = header[5], header[10], header[11]
    section_format = order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
    if shentsize < struct.calcsize(section_format):
        raise ValueError("malformed ELF file (section header size)")
    if shoff + shnum * shentsize > len(data):
        raise ValueError("malformed ELF file (section headers past its end)")
    sections = [struct.unpack_from(section_format, data, shoff + i * shentsize) for i in range(shnum)]
    symbol_format = order + ("IBBHQQ" if wide else "IIIBBH")
    out = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNSYM:
            continue
        if entsize < struct.calcsize(symbol_format) or size // entsize > MAX_SYMBOLS or link >= len(sections):
            raise ValueError("malformed ELF file (dynamic symbol table)")
        strings_at, strings_size = sections[link][4], sections[link][5]
        if offset + size > len(data) or strings_at + strings_size > len(data):
            raise ValueError("malformed ELF file (dynamic symbols past its end)")
        for at in range(offset + entsize, offset + size - entsize + 1, entsize):  # entry 0 is the null symbol
            fields = struct.unpack_from(symbol_format, data, at)
            name_at, info, other, shndx = (fields[0], fields[1], fields[2], fields[3]) if wide \
                else (fields[0], fields[3], fields[4], fields[5])
            binding, visibility = info >> 4, other & 3
            if shndx == _SHN_UNDEF or binding not in (_STB_GLOBAL, _STB_WEAK) \
                    or visibility in (_STV_HIDDEN, _STV_INTERNAL):
                continue
            if name_at >= strings_size:
                raise ValueError("malformed ELF file (symbol name out of its string table)")
            start = strings_at + name_at
            end = data.index(b"\0", start, strings_at + strings_size)
            out.append((data[start:end].decode("utf-8", "replace"), info & 0xF in (_STT_FUNC, _STT_GNU_IFUNC)))
        return out
    raise ValueError("the ELF file has no dynamic symbol table")
