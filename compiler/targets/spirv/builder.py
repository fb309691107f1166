"""A small SPIR-V binary module builder: ids, deduplicated types and constants, decorations,
capabilities and extensions on demand, functions of blocks with the structured control flow
merges, GLSL.std.450 calls. `ModuleBuilder.to_bytes()` lays the sections out in the order
SPIR-V spec §2.4 (logical layout of a module) requires.

Every instruction is kept as a list of words until the end; an id is an int.
"""
from __future__ import annotations

import struct
from contextlib import contextmanager

from .spec import (ADDRESSING_LOGICAL, ADDRESSING_PHYSICAL_STORAGE_BUFFER_64,
                   EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE, EXECUTION_MODEL_GLCOMPUTE, FUNCTION_CONTROL_NONE,
                   GENERATOR, MAGIC, MEMORY_MODEL_GLSL450, VERSION_1_5, Capability, Decoration, Op, StorageClass)


def string_words(text: str) -> list[int]:
    """A literal string (§2.2.1): UTF-8, nul-terminated, padded with nuls to whole words."""
    data = text.encode() + b"\0"
    data += b"\0" * (-len(data) % 4)
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def instruction(opcode: int, *operands) -> list[int]:
    """One instruction (§2.3): the word count and opcode, then operands (ints, or strings)."""
    words = []
    for o in operands:
        words.extend(string_words(o) if isinstance(o, str) else [int(o) & 0xFFFFFFFF])
    return [((len(words) + 1) << 16) | opcode] + words


class ModuleBuilder:
    """One SPIR-V module (one compute entry point)."""

    def __init__(self):
        self.bound = 1
        self.capabilities: dict = {Capability.Shader: None}  # insertion-ordered sets
        self.extensions: dict = {}
        self._glsl: int | None = None
        self.entry_points: list = []
        self.execution_modes: list = []
        # IEEE signed zeros, infinities and NaNs kept (SignedZeroInfNanPreserve for every float
        # width the module uses): without it a driver may fold -0.0 to 0.0 or `isnan` to false
        self.preserve_ieee = True
        self.names: list = []
        self.annotations: list = []
        self.globals: list = []      # types, constants and global variables, in definition order
        self.functions: list = []    # each a list of instructions
        self.interface: list = []    # global variables the entry point uses (SPIR-V 1.4+: all of them)
        self._cache: dict = {}       # deduplication key -> id (types and constants)
        self.info: dict = {}         # type id -> ("int", bits, signed) | ("float", bits) | ("bool",) | ...

    def new_id(self) -> int:
        self.bound += 1
        return self.bound - 1

    def require(self, capability: int, extension: str | None = None) -> None:
        self.capabilities[capability] = None
        if extension:
            self.extensions[extension] = None

    def glsl(self) -> int:
        """The id of the imported GLSL.std.450 instruction set."""
        if self._glsl is None:
            self._glsl = self.new_id()
        return self._glsl

    # ---- types (deduplicated: SPIR-V forbids two identical non-aggregate types) ---------------
    def _type(self, key, opcode: int, *operands, info=None) -> int:
        tid = self._cache.get(key)
        if tid is None:
            tid = self._cache[key] = self.new_id()
            self.globals.append(instruction(opcode, tid, *operands))
            self.info[tid] = info or key
        return tid

    def void(self) -> int:
        return self._type(("void",), Op.TypeVoid)

    def bool(self) -> int:
        return self._type(("bool",), Op.TypeBool)

    def int(self, bits: int, signed: bool) -> int:
        self._width_capability(bits, {8: Capability.Int8, 16: Capability.Int16, 64: Capability.Int64})
        return self._type(("int", bits, bool(signed)), Op.TypeInt, bits, int(bool(signed)))

    def float(self, bits: int) -> int:
        self._width_capability(bits, {16: Capability.Float16, 64: Capability.Float64})
        return self._type(("float", bits), Op.TypeFloat, bits)

    def _width_capability(self, bits, table) -> None:
        if bits in table:
            self.require(table[bits])

    def vector(self, component: int, count: int) -> int:
        return self._type(("vector", component, count), Op.TypeVector, component, count)

    def pointer(self, storage: int, pointee: int) -> int:
        return self._type(("pointer", storage, pointee), Op.TypePointer, storage, pointee)

    def function_type(self, ret: int, *params: int) -> int:
        return self._type(("function", ret, params), Op.TypeFunction, ret, *params)

    def runtime_array(self, element: int, stride: int) -> int:
        key = ("runtime_array", element, stride)
        if key not in self._cache:
            tid = self._type(key, Op.TypeRuntimeArray, element)
            self.decorate(tid, Decoration.ArrayStride, stride)
        return self._cache[key]

    def buffer_block(self, element: int, stride: int) -> int:
        """`struct { element data[]; }` decorated Block: the type of a storage buffer."""
        key = ("block", element, stride)
        if key not in self._cache:
            array = self.runtime_array(element, stride)
            sid = self._type(key, Op.TypeStruct, array)
            self.decorate(sid, Decoration.Block)
            self.annotations.append(instruction(Op.MemberDecorate, sid, 0, Decoration.Offset, 0))
        return self._cache[key]

    # ---- constants -----------------------------------------------------------------------------
    def const(self, type_id: int, value) -> int:
        """A constant of a scalar type: bools, integers (wrapped to the width) and floats."""
        info = self.info[type_id]
        if info[0] == "bool":
            return self._const(("const", type_id, bool(value)), Op.ConstantTrue if value else Op.ConstantFalse,
                               type_id)
        words = self.literal_words(info, value)
        # keyed by the bits: -0.0 == 0.0 (and NaN != NaN) as Python floats, but not as constants
        return self._const(("const", type_id, tuple(words)), Op.Constant, type_id, *words)

    @staticmethod
    def literal_words(info, value) -> list[int]:
        """§2.2.1: a numeric literal in as many words as its type needs, low-order word first;
        narrower than a word: sign-extended for signed integers, zero-extended otherwise."""
        kind, bits = info[0], info[1]
        if kind == "float":
            packed, unpacked = {16: ("<e", "<H"), 32: ("<f", "<I"), 64: ("<d", "<Q")}[bits]
            raw = struct.unpack(unpacked, struct.pack(packed, value))[0]
        else:
            raw = int(value) & ((1 << bits) - 1)
            if info[2] and bits < 32 and raw >> (bits - 1):
                raw |= 0xFFFFFFFF & ~((1 << bits) - 1)
        return [raw & 0xFFFFFFFF, raw >> 32] if bits == 64 else [raw]

    def _const(self, key, opcode, type_id, *words) -> int:
        cid = self._cache.get(key)
        if cid is None:
            cid = self._cache[key] = self.new_id()
            self.globals.append(instruction(opcode, type_id, cid, *words))
        return cid

    def spec_const(self, type_id: int, default: int, spec_id: int) -> int:
        cid = self.new_id()
        self.globals.append(instruction(Op.SpecConstant, type_id, cid, default))
        self.decorate(cid, Decoration.SpecId, spec_id)
        return cid

    def spec_composite(self, type_id: int, *parts: int) -> int:
        cid = self.new_id()
        self.globals.append(instruction(Op.SpecConstantComposite, type_id, cid, *parts))
        return cid

    # ---- decorations, variables, entry point -----------------------------------------------
    def decorate(self, target: int, decoration: int, *operands) -> None:
        self.annotations.append(instruction(Op.Decorate, target, decoration, *operands))

    def name(self, target: int, text: str) -> None:
        self.names.append(instruction(Op.Name, target, text))

    def global_variable(self, pointee: int, storage: int, name: str = "") -> int:
        vid = self.new_id()
        self.globals.append(instruction(Op.Variable, self.pointer(storage, pointee), vid, storage))
        self.interface.append(vid)
        if name:
            self.name(vid, name)
        return vid

    def storage_buffer(self, element: int, stride: int, descriptor_set: int, binding: int, name: str = "") -> int:
        """A storage buffer variable viewing its memory as an array of `element`."""
        vid = self.global_variable(self.buffer_block(element, stride), StorageClass.StorageBuffer, name)
        self.decorate(vid, Decoration.DescriptorSet, descriptor_set)
        self.decorate(vid, Decoration.Binding, binding)
        return vid

    def compute_entry_point(self, function: int, name: str) -> None:
        self.entry_points.append((function, name))

    # ---- output --------------------------------------------------------------------------------
    def to_words(self) -> list[int]:
        float_widths = sorted(k[1] for k in self._cache if k[0] == "float") if self.preserve_ieee else []
        if float_widths:
            self.require(Capability.SignedZeroInfNanPreserve)
        words = [MAGIC, VERSION_1_5, GENERATOR, self.bound, 0]
        for cap in self.capabilities:
            words += instruction(Op.Capability, cap)
        for ext in self.extensions:
            words += instruction(Op.Extension, ext)
        if self._glsl is not None:
            words += instruction(Op.ExtInstImport, self._glsl, "GLSL.std.450")
        # PhysicalStorageBuffer64 once the module addresses memory through buffer device addresses
        addressing = (ADDRESSING_PHYSICAL_STORAGE_BUFFER_64 if Capability.PhysicalStorageBufferAddresses
                      in self.capabilities else ADDRESSING_LOGICAL)
        words += instruction(Op.MemoryModel, addressing, MEMORY_MODEL_GLSL450)
        for fn, name in self.entry_points:
            words += instruction(Op.EntryPoint, EXECUTION_MODEL_GLCOMPUTE, fn, name, *self.interface)
        for fn, _ in self.entry_points:
            for bits in float_widths:
                words += instruction(Op.ExecutionMode, fn, EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE, bits)
        for section in (self.execution_modes, self.names, self.annotations, self.globals):
            for inst in section:
                words += inst
        for fn in self.functions:
            for inst in fn:
                words += inst
        return words

    def to_bytes(self) -> bytes:
        words = self.to_words()
        return struct.pack(f"<{len(words)}I", *words)


class FunctionBuilder:
    """One function: Function-storage variables go to its first block (§2.16.1 requires it),
    every other instruction to the current block, or, inside `at_entry()`, to the first block
    ahead of its code. `terminated` says whether the current block already ended in a branch or
    return (code after a break is not emitted)."""

    def __init__(self, module: ModuleBuilder, return_type: int, name: str = ""):
        self.m = module
        self.id = module.new_id()
        self.return_type = return_type
        self.fn_type = module.function_type(return_type)
        if name:
            module.name(self.id, name)
        self.entry_label = module.new_id()
        self.variables: list = []
        self.entry_code: list = []     # what `at_entry()` emitted
        self._at_entry = False
        self.blocks: list = [[instruction(Op.Label, self.entry_label)]]
        self.terminated = False

    @property
    def current(self) -> list:
        return self.entry_code if self._at_entry else self.blocks[-1]

    @contextmanager
    def at_entry(self):
        """Emit into the first block, ahead of its code: a value computed there dominates every
        block, so one computed once (from constants, global variables and other entry values)
        serves every use wherever it is. No control flow inside."""
        outer, self._at_entry = self._at_entry, True
        try:
            yield
        finally:
            self._at_entry = outer

    def local_variable(self, pointee: int) -> int:
        vid = self.m.new_id()
        self.variables.append(instruction(Op.Variable, self.m.pointer(StorageClass.Function, pointee), vid,
                                          StorageClass.Function))
        return vid

    def emit(self, opcode: int, result_type: int, *operands) -> int:
        """An instruction with a result; returns the result id."""
        rid = self.m.new_id()
        self.current.append(instruction(opcode, result_type, rid, *operands))
        return rid

    def emit_void(self, opcode: int, *operands) -> None:
        self.current.append(instruction(opcode, *operands))

    def ext(self, result_type: int, number: int, *operands) -> int:
        """A GLSL.std.450 instruction."""
        return self.emit(Op.ExtInst, result_type, self.m.glsl(), number, *operands)

    # ---- blocks and structured control flow (§2.11) ---------------------------------------------
    def new_label(self) -> int:
        return self.m.new_id()

    def place(self, label: int) -> None:
        """Start block `label`; the previous one must have been terminated."""
        assert self.terminated, "a block ends in a branch or return"
        self.blocks.append([instruction(Op.Label, label)])
        self.terminated = False

    def _terminate(self, opcode: int, *operands) -> None:
        assert not self._at_entry, "no control flow among the entry values"
        self.emit_void(opcode, *operands)
        self.terminated = True

    def branch(self, label: int) -> None:
        self._terminate(Op.Branch, label)

    def branch_conditional(self, cond: int, true_label: int, false_label: int) -> None:
        self._terminate(Op.BranchConditional, cond, true_label, false_label)

    def selection(self, cond: int, true_label: int, false_label: int, merge: int) -> None:
        """The header of an if: OpSelectionMerge then the conditional branch."""
        from .spec import SELECTION_CONTROL_NONE
        self.emit_void(Op.SelectionMerge, merge, SELECTION_CONTROL_NONE)
        self.branch_conditional(cond, true_label, false_label)

    def loop_header(self, merge: int, continue_target: int) -> None:
        """OpLoopMerge; the header's branch follows."""
        from .spec import LOOP_CONTROL_NONE
        self.emit_void(Op.LoopMerge, merge, continue_target, LOOP_CONTROL_NONE)

    def ret(self) -> None:
        self._terminate(Op.Return)

    def unreachable(self) -> None:
        self._terminate(Op.Unreachable)

    def finish(self) -> None:
        """Append the function to its module."""
        assert self.terminated, "the last block needs a terminator"
        first, *rest = self.blocks
        body = [instruction(Op.Function, self.return_type, self.id, FUNCTION_CONTROL_NONE, self.fn_type)]
        body += [first[0]] + self.variables + self.entry_code + first[1:]
        for block in rest:
            body += block
        body.append(instruction(Op.FunctionEnd))
        self.m.functions.append(body)
