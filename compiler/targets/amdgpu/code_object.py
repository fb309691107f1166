"""Reading an AMDGPU code object (a little-endian ELF64 shared object) without LLVM's tools:
its symbols (each kernel has `<name>` and its kernel descriptor `<name>.kd`), and its AMDGPU
metadata note (NT_AMDGPU_METADATA, a msgpack map holding `amdhsa.kernels` and
`amdhsa.target`). For tests, `qdc inspect` and checks; nothing here runs code."""
from __future__ import annotations

import struct

import msgpack

EM_AMDGPU = 224
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
NT_AMDGPU_METADATA = 32


class CodeObjectError(ValueError):
    pass


class CodeObject:
    """The parts of a code object's ELF that matter here: `symbols` (name -> (value, size,
    section index)), `metadata` (the decoded note) and `machine`, `flags`."""

    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise CodeObjectError("not a little-endian ELF64 file")
        (self.type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum, _) = \
            struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
        if self.machine != EM_AMDGPU:
            raise CodeObjectError(f"ELF machine {self.machine}, not AMDGPU ({EM_AMDGPU})")
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        self.symbols: dict = {}
        self.metadata: dict | None = None
        for (_, kind, _, _, offset, size, link, _, _, entsize) in sections:
            if kind in (SHT_SYMTAB, SHT_DYNSYM):
                strings = sections[link]
                for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
                    name_at, _, _, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", data, at)
                    start = strings[4] + name_at
                    name = data[start:data.index(b"\0", start)].decode()
                    self.symbols.setdefault(name, (value, sym_size, shndx))
            elif kind == SHT_NOTE:
                self._read_notes(data[offset:offset + size])

    def _read_notes(self, notes: bytes) -> None:
        at = 0
        while at + 12 <= len(notes):
            namesz, descsz, kind = struct.unpack_from("<III", notes, at)
            name = notes[at + 12:at + 12 + namesz].rstrip(b"\0")
            desc_at = at + 12 + ((namesz + 3) & ~3)
            if name == b"AMDGPU" and kind == NT_AMDGPU_METADATA:
                self.metadata = msgpack.unpackb(notes[desc_at:desc_at + descsz], raw=False, strict_map_key=False)
            at = desc_at + ((descsz + 3) & ~3)

    @property
    def kernels(self) -> list:
        """The `amdhsa.kernels` entries of the metadata note."""
        return list((self.metadata or {}).get("amdhsa.kernels", []))

    @property
    def target(self) -> str:
        """`amdhsa.target`, e.g. "amdgcn-amd-amdhsa--gfx90a:xnack-"."""
        return (self.metadata or {}).get("amdhsa.target", "")
