"""The textual IR of an llvmlite module: the same text as `str(module)`, written faster.

A large kernel's module has a hundred thousand instructions, and llvmlite prints each through
a chain of generic `descr` methods and `str.format` calls: Genesis's collision detection spent
a third of a second printing its module before LLVM parsed it. The instructions that make up
nearly all of a kernel's code (loads, stores, address arithmetic, arithmetic, comparisons,
casts, branches) are written here by one f-string each, exactly as llvmlite writes them
(`llvmlite/ir/instructions.py`, `descr`); every other instruction, and any instruction with
metadata, is llvmlite's own text. tests/targets/llvm/test_llvm_text.py compares the two.
"""
from __future__ import annotations

from llvmlite import ir as ll
from llvmlite.ir import instructions as li


def module_text(module: ll.Module, globals_text: list[str] | None = None) -> str:
    """`str(module)`: header, identified types, globals, metadata (llvmlite's Module.__repr__);
    `globals_text`: what stands for the globals' own text (default: each one's `global_text`)."""
    lines = [f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
             f'target datalayout = "{module.data_layout}"', ""]
    lines += [t.get_declaration() for t in module.get_identified_types().values()]
    lines += [global_text(value) for value in module.globals.values()] if globals_text is None else globals_text
    lines += module._get_metadata_lines()
    return "\n".join(lines)


def global_text(value) -> str:
    """`str(value)` of a module's global: a function definition's instructions written here."""
    if not isinstance(value, ll.Function) or not value.blocks:
        return str(value)
    buf: list[str] = []
    value.descr_prototype(buf)
    buf.append("{\n")
    for block in value.blocks:
        buf.append(f"{block._format_name()}:\n")
        buf += [f"  {instruction_text(i)}\n" for i in block.instructions]
    buf.append("}\n")
    return "".join(buf)


def instruction_text(i) -> str:
    """`str(i)` of an instruction: `%name = ` and its `descr`, without trailing white space."""
    writer = _WRITERS.get(i.__class__)
    if writer is None or i.metadata:
        return str(i)
    if i.type.__class__ is ll.VoidType:
        return writer(i)
    return f"{i.get_reference()} = {writer(i)}"


def _operation(i) -> str:  # an arithmetic or bitwise instruction (IRBuilder's binary and unary operations)
    opname = " ".join([i.opname] + i.flags) if i.flags else i.opname
    if not i.operands:
        return f"{opname} {i.type}"
    return f"{opname} {i.type} {', '.join([op.get_reference() for op in i.operands])}"


def _load(i) -> str:
    ptr = i.operands[0]
    align = "" if i.align is None else f", align {i.align}"
    return f"load {i.type}, {ptr.type} {ptr.get_reference()}{align}"


def _store(i) -> str:
    value, ptr = i.operands
    align = "" if i.align is None else f", align {i.align}"
    return f"store {value.type} {value.get_reference()}, {ptr.type} {ptr.get_reference()}{align}"


def _gep(i) -> str:
    indices = ", ".join([f"{index.type} {index.get_reference()}" for index in i.indices])
    op = "getelementptr inbounds" if i.inbounds else "getelementptr"
    return f"{op} {i.source_etype}, {i.pointer.type} {i.pointer.get_reference()}, {indices}"


def _cast(i) -> str:
    value = i.operands[0]
    return f"{i.opname} {value.type} {value.get_reference()} to {i.type}"


def _compare(i) -> str:
    lhs, rhs = i.operands
    flags = "".join(" " + flag for flag in i.flags)
    return f"{i.opname}{flags} {i.op} {lhs.type} {lhs.get_reference()}, {rhs.get_reference()}"


def _select(i) -> str:
    cond, lhs, rhs = i.operands
    return (f"select {' '.join(i.flags)} {cond.type} {cond.get_reference()}, {lhs.type} {lhs.get_reference()}, "
            f"{rhs.type} {rhs.get_reference()}")


def _branch(i) -> str:  # br, conditional or not (llvmlite's Terminator)
    return f"{i.opname} {', '.join([f'{op.type} {op.get_reference()}' for op in i.operands])}"


def _alloca(i) -> str:
    count = f", {i.operands[0].type} {i.operands[0].get_reference()}" if i.operands else ""
    align = "" if i.align is None else f", align {i.align}"
    return f"{i.opname} {i.allocated_type}{count}{align}"


# Exact classes only: a subclass (llvm_ir._SpacedAlloca) may write itself otherwise.
_WRITERS = {li.Instruction: _operation, li.LoadInstr: _load, li.StoreInstr: _store, li.GEPInstr: _gep,
            li.CastInstr: _cast, li.ICMPInstr: _compare, li.FCMPInstr: _compare, li.SelectInstr: _select,
            li.Branch: _branch, li.ConditionalBranch: _branch, li.AllocaInstr: _alloca}
