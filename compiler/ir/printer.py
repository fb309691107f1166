"""Readable text form of the IR (what `--ir` dumps and tests show)."""
from __future__ import annotations

from . import stmts as ir

_SNAKE = {}


def _op_name(s: ir.Stmt) -> str:
    cls = type(s)
    if cls not in _SNAKE:
        n = cls.__name__
        _SNAKE[cls] = "".join("_" + c.lower() if c.isupper() else c for c in n).lstrip("_")
    return _SNAKE[cls]


class Printer:
    def __init__(self):
        self.names: dict = {}
        self.lines: list[str] = []

    def name(self, s) -> str:
        if s is None:
            return "none"
        if s not in self.names:
            self.names[s] = f"%{len(self.names)}"
        return self.names[s]

    def kernel(self, k: ir.KernelIR) -> str:
        params = ", ".join(repr(p) for p in k.params)
        self.lines.append(f"kernel {k.name}({params})")
        if k.fields:
            self.lines.append("  fields " + ", ".join(
                f"{f!r}: {f.dtype}{list(f.shape)}" for f in k.fields))
        if k.num_temps:
            self.lines.append("  temps " + ", ".join(f"t{i}: {t}" for i, t in enumerate(k.temp_types)))
        self.block(k.body, 1)
        return "\n".join(self.lines) + "\n"

    def block(self, b: ir.Block, depth: int) -> None:
        for s in b.stmts:
            self.stmt(s, depth)

    def describe(self, s: ir.Stmt) -> str:
        op = _op_name(s)
        if isinstance(s, ir.Unary | ir.Binary):
            op = s.op
        elif isinstance(s, ir.AtomicRMW):
            op = f"atomic_{s.op}"
        parts = [op]
        if isinstance(s, ir.Const):
            parts.append(repr(s.value))
        elif isinstance(s, ir.GlobalPtr):
            parts.append(f"{s.target!r}[{', '.join(self.name(i) for i in s.indices)}]")
        else:
            parts += [self.name(o) for o in s.operands()]
            parts += [f"{a}={getattr(s, a)!r}" for a in s.ATTRS if a not in ("op", "value")
                      and getattr(s, a) not in ("", None)]
        text = " ".join(parts)
        if s.type is not None and not isinstance(s, ir.Alloca | ir.LocalStore | ir.GlobalStore):
            text += f" : {s.type}"
        if isinstance(s, ir.Alloca):
            text += f" : {s.type}"
        return text

    def stmt(self, s: ir.Stmt, depth: int) -> None:
        pad = "  " * depth
        if isinstance(s, ir.If):
            self.lines.append(f"{pad}if {self.name(s.cond)} {{")
            self.block(s.then_block, depth + 1)
            if s.else_block.stmts:
                self.lines.append(f"{pad}}} else {{")
                self.block(s.else_block, depth + 1)
            self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.RangeFor):
            flags = ("serial " if s.serial else "") + (f"{s.kind} " if s.kind != "range" else "")
            self.lines.append(f"{pad}for {flags}{self.name(s.index)} : {s.index.type} in "
                              f"[{self.name(s.begin)}, {self.name(s.end)}) {{")
            self.block(s.body, depth + 1)
            self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.While):
            self.lines.append(f"{pad}while {{")
            self.block(s.body, depth + 1)
            self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.Task):
            head = f"{pad}task {s.task_name or '?'} {s.kind}"
            if s.kind == "range_for":
                head += f" ({s.source_kind}{', serial' if s.serial else ''})"
            if s.prologue.stmts:
                self.lines.append(head + " prologue {")
                self.block(s.prologue, depth + 1)
                head = f"{pad}}}"
            if s.kind == "range_for":
                head += f" for {self.name(s.index)} : {s.index.type} in [{self.name(s.begin)}, {self.name(s.end)})"
            self.lines.append(head + " {")
            self.block(s.body, depth + 1)
            self.lines.append(f"{pad}}}")
        elif s.type is not None and not isinstance(s, ir.LocalStore | ir.GlobalStore):
            self.lines.append(f"{pad}{self.name(s)} = {self.describe(s)}")
        else:
            self.lines.append(f"{pad}{self.describe(s)}")


def print_kernel(k: ir.KernelIR) -> str:
    return Printer().kernel(k)


def print_block(b: ir.Block) -> str:
    p = Printer()
    p.block(b, 0)
    return "\n".join(p.lines) + "\n"
