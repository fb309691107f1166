"""Readable, MLIR-like text form of the IR (what `--ir` dumps and tests show).

    %3 = add %1 %2 : f32
    global_store %7 %3
    for %4 : i32 in [%0, %2) {
      ...
    }

Values are numbered in program order; nested blocks are indented; a task shows its kind,
its prologue (which computes the range), its per-chunk blocks if any, and its range.
"""
from __future__ import annotations

import numpy as np

from . import stmts as ir
from .local_arrays import COMPONENT_ACCESSES, ArrayLoad, ArrayStore, LocalArray


def _const_text(s) -> str:
    """The shortest text that round-trips in the constant's own type (`0.95`, not 0.949999988...)."""
    if s.type is not None and s.type.is_float and s.type.bits < 64:
        return repr(float(str(s.type.np_dtype.type(s.value)))) if np.isfinite(s.value) else repr(s.value)
    return repr(s.value)

_SNAKE: dict = {}
_NO_RESULT = (ir.LocalStore, ir.GlobalStore, ir.TempStore, ir.LocalAccumulate)


class _Form:
    """How `describe` writes the statements of one class, worked out once per class (a large
    kernel prints tens of thousands of statements)."""

    def __init__(self, cls: type):
        self.op = _op_name_of(cls)
        self.op_prefix = None  # the class's `op` attribute after this prefix is its name
        for base, prefix in _OP_PREFIXES:
            if issubclass(cls, base):
                self.op_prefix = prefix
                break
        self.args = next((kind for base, kind in _ARG_KINDS if issubclass(cls, base)), "operands")
        self.reassoc = issubclass(cls, ir.LocalAccumulate)
        self.no_result = issubclass(cls, _NO_RESULT)


_OP_PREFIXES = ((ir.Unary, ""), (ir.Binary, ""), (ir.AtomicRMW, "atomic_"), (ir.LocalAccumulate, "accumulate_"),
                (ir.LocalAtomic, "local_atomic_"), (ir.TempAtomic, "temp_atomic_"))
_ARG_KINDS = ((ir.Const, "const"), (ir.ArgLoad, "arg"), (ir.NdarrayShape, "shape"), (ir.Alloca, "alloca"),
              (ir.GlobalPtr, "global"), (ir.TempLoad, "temp"), (ir.TempStore, "temp"), (ir.TempAtomic, "temp"),
              (COMPONENT_ACCESSES, "components"), ((ArrayLoad, ArrayStore), "element"), (LocalArray, "array"))
_FORMS: dict = {}


def _op_name_of(cls: type) -> str:
    if cls not in _SNAKE:
        n = cls.__name__
        _SNAKE[cls] = "".join("_" + c.lower() if c.isupper() else c for c in n).lstrip("_")
    return _SNAKE[cls]


class Printer:
    def __init__(self, kernel: ir.KernelIR | None = None):
        self.k = kernel
        self.names: dict = {}
        self.lines: list[str] = []
        self.const_texts: dict = {}  # (type, value's repr) -> _const_text: numpy's rounding once per constant

    def name(self, s) -> str:
        if s is None:
            return "none"
        got = self.names.get(s)
        if got is None:
            got = self.names[s] = f"%{len(self.names)}"
        return got

    def kernel(self, k: ir.KernelIR) -> str:
        params = ", ".join(repr(p) for p in k.params)
        self.lines.append(f"kernel {k.name}({params})")
        if k.fields:
            self.lines.append("  fields " + ", ".join(f"{f!r}: {f.dtype}{list(f.shape)}" for f in k.fields))
        if k.num_temps:
            self.lines.append("  temps " + ", ".join(f"t{i}: {t}" for i, t in enumerate(k.temp_types)))
        self.block(k.body, 1)
        return "\n".join(self.lines) + "\n"

    def block(self, b: ir.Block, depth: int) -> None:
        for s in b.stmts:
            self.stmt(s, depth)

    def nested(self, head: str, b: ir.Block, depth: int, tail: str = "}") -> None:
        pad = "  " * depth
        self.lines.append(f"{pad}{head} {{")
        self.block(b, depth + 1)
        self.lines.append(pad + tail)

    # -- one statement --------------------------------------------------------------------
    def stmt(self, s: ir.Stmt, depth: int) -> None:
        pad = "  " * depth
        if not s.BLOCKS:
            form = _FORMS.get(s.__class__) or _FORMS.setdefault(s.__class__, _Form(s.__class__))
            if s.type is not None and not form.no_result:
                self.lines.append(f"{pad}{self.name(s)} = {self.describe(s)}")
            else:
                self.lines.append(f"{pad}{self.describe(s)}")
        elif isinstance(s, ir.If):
            tail = "} else {" if s.else_block.stmts else "}"
            self.nested(f"if {self.name(s.cond)}", s.then_block, depth, tail)
            if s.else_block.stmts:
                self.block(s.else_block, depth + 1)
                self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.RangeFor):
            flags = ("serial " if s.serial else "") + (f"{s.kind} " if s.kind != "range" else "")
            self.nested(f"for {flags}{self.name(s.index)} : {s.index.type} in "
                        f"[{self.name(s.begin)}, {self.name(s.end)})", s.body, depth)
        elif isinstance(s, ir.While):
            self.nested("while", s.body, depth)
        elif isinstance(s, ir.Task):
            self.task(s, depth)
        elif s.type is not None and not isinstance(s, _NO_RESULT):
            self.lines.append(f"{pad}{self.name(s)} = {self.describe(s)}")
        else:
            self.lines.append(f"{pad}{self.describe(s)}")

    def task(self, t: ir.Task, depth: int) -> None:
        pad = "  " * depth
        if t.kind == "serial":
            self.nested(f"task {t.task_name or '?'} serial", t.body, depth)
            return
        kind = t.source_kind + (", serial" if t.serial else "") + (f", block_dim={t.block_dim}" if t.block_dim else "")
        self.lines.append(f"{pad}task {t.task_name or '?'} range_for({kind}) {{")
        inner = depth + 1
        if t.prologue.stmts:
            self.nested("prologue", t.prologue, inner)
        if t.chunk_init.stmts:
            self.nested("chunk_init", t.chunk_init, inner)
        loop = f"for {self.name(t.index)} : {t.index.type} in [{self.name(t.begin)}, {self.name(t.end)})"
        if t.axis_index:  # the row coordinates of the index and the extents of its inner dimensions
            loop += (f" rows ({', '.join(self.name(c) for c in t.axis_index)}) "
                     f"extents (*, {', '.join(self.name(a) for a in t.axes)})")
        self.nested(loop, t.body, inner)
        if t.chunk_final.stmts:
            self.nested("chunk_final", t.chunk_final, inner)
        self.lines.append(f"{pad}}}")

    def describe(self, s: ir.Stmt) -> str:
        form = _FORMS.get(s.__class__) or _FORMS.setdefault(s.__class__, _Form(s.__class__))
        op = form.op if form.op_prefix is None else form.op_prefix + s.op
        kind = form.args
        if kind == "operands":
            args = [self.name(o) for o in s.operands()]
            args += [f"{a}={getattr(s, a)!r}" for a in s.ATTRS if a != "op" and getattr(s, a) not in ("", None)]
        elif kind == "const":
            key = (s.type, repr(s.value))
            text = self.const_texts.get(key)
            if text is None:
                text = self.const_texts[key] = _const_text(s)
            args = [text]
        elif kind == "arg":
            args = [self.param_name(s.arg_index)]
        elif kind == "shape":
            args = [f"{self.param_name(s.arg_index)}.shape[{s.dim}]"]
        elif kind == "alloca":
            args = [repr(s.var_name) if s.var_name else ""]
        elif kind in ("components", "element"):  # component_load [%1, %2, %3, %4] at %7; array_store %9[%7] = %8
            where = f"[{', '.join(self.name(v) for v in s.components)}] at " if kind == "components" else \
                self.name(s.array)
            args = [f"{where}{self.name(s.index)}" if kind == "components" else f"{where}[{self.name(s.index)}]"]
            if s.type is None:
                args.append(f"= {self.name(s.value)}")
        elif kind == "array":  # local_array 'v'[5]
            args = [f"{s.var_name!r}[{s.length}]" if s.var_name else f"[{s.length}]"]
        elif kind == "global":
            args = [f"{self.target_name(s.target)}[{', '.join(self.name(i) for i in s.indices)}]"]
        else:  # a temporary's
            args = [f"t{s.slot}"] + [self.name(o) for o in s.operands()]
        text = " ".join([op] + [a for a in args if a])
        if form.reassoc:
            text += " reassoc"
        elif s.type is not None and not form.no_result:
            text += f" : {s.type}"
        return text

    def param_name(self, i: int) -> str:
        if self.k is not None and 0 <= i < len(self.k.params):
            return self.k.params[i].name
        return f"arg{i}"

    def target_name(self, target) -> str:
        if isinstance(target, (ir.FieldRef, ir.SharedRef)):
            return repr(target)
        return self.param_name(target.arg_index) + (".grad" if target.is_grad else "")


def print_kernel(k: ir.KernelIR) -> str:
    return Printer(k).kernel(k)


def print_block(b: ir.Block) -> str:
    p = Printer()
    p.block(b, 0)
    return "\n".join(p.lines) + "\n"
