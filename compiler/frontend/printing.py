"""`print(...)` and `assert cond, message` in kernels: each becomes a `DebugMessage` naming a
record of the kernel's message table (runtime/contract/print_buffer.py), which holds the
literal text around the values and their format specs, so the device only writes values.

print takes scalars, vectors and matrices (printed as nested lists), strings, f-strings with
`{x}` / `{x:.3f}` placeholders, and `sep` / `end` as constant strings. Compile-time values are
formatted here. An assert is compiled only with `debug=True`; its message may be a string or
an f-string, and without one it is the asserted expression's source.
"""
from __future__ import annotations

import ast

from qdc.runtime.contract import types as T
from qdc.runtime.contract.print_buffer import MAX_VALUES

from .. import ir
from .values import is_runtime
from .vectors import VectorValue


class MessageBuilder:
    """The texts, specs and values of one message, built left to right."""

    def __init__(self):
        self.texts, self.specs, self.values = [""], [], []

    def text(self, s: str) -> None:
        self.texts[-1] += s

    def value(self, v: ir.Stmt, spec: str) -> None:
        self.values.append(v)
        self.specs.append(spec)
        self.texts.append("")


class PrintLowering:
    def is_print_call(self, node) -> bool:
        """Whether `node` calls the builtin print (a kernel's own `print` name shadows it)."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
                and self.lookup_nonlocal("print", node.func, required=False) is print
                and not any("print" in scope for scope in self.frame.scopes))

    def lower_print(self, node: ast.Call) -> None:
        options = {"sep": " ", "end": "\n"}
        for kw in node.keywords:
            if kw.arg not in options or not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)):
                self.error("print() in kernels takes only sep= and end= keywords, each a constant string", kw)
            options[kw.arg] = kw.value.value
        message = MessageBuilder()
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Starred):
                self.error("print(*...) is not supported in kernels", arg)
            if i:
                message.text(options["sep"])
            self.message_part(message, arg)
        message.text(options["end"])
        self.emit_message("print", message, node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if not self.options.debug:
            # the check is compiled away, as Quadrants does without debug, but the condition is
            # still evaluated (`assert f()` keeps f's side effects); a pure one dies in DCE
            self.visit(node.test)
            return
        cond = self.visit(node.test)
        if isinstance(cond, VectorValue):
            self.error("a vector is not a condition; use .any() or .all()", node.test)
        if not is_runtime(cond):
            if cond:
                return
            cond = self.values.const(False, T.u1)
        failed = self.emit(ir.If(self.emit(ir.Unary("not", self.values.to_bool(cond), T.u1))))
        message = MessageBuilder()
        if node.msg is None:
            message.text(f"assertion failed: {ast.unparse(node.test)}")
        self.emit_into(failed.then_block, lambda: self.assert_message(message, node))

    def index_error(self, index: ir.Stmt, size: int, node) -> None:
        """The "index" message of a run-time component index outside [0, size) (vectors.py)."""
        message = MessageBuilder()
        message.text("index ")
        message.value(index, "")
        message.text(f" is out of range for a vector/matrix dimension of size {size}")
        self.emit_message("index", message, node)

    def assert_message(self, message: MessageBuilder, node: ast.Assert) -> None:
        if node.msg is not None:
            self.message_part(message, node.msg)
        self.emit_message("assert", message, node)

    # ---- pieces ------------------------------------------------------------------------------
    def message_part(self, message: MessageBuilder, node, spec: str = "") -> None:
        """Add `node`'s text to `message`: a string, an f-string, or a value formatted by `spec`."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            message.text(node.value)
            return
        if isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant):
                    message.text(part.value)
                    continue
                if part.conversion != -1:
                    self.error("conversions (!r, !s, !a) are not supported in kernel f-strings", part)
                self.message_part(message, part.value, self.format_spec(part))
            return
        self.message_value(message, self.visit(node), spec, node)

    def format_spec(self, part: ast.FormattedValue) -> str:
        spec = part.format_spec
        if spec is None:
            return ""
        if not all(isinstance(p, ast.Constant) for p in spec.values):
            self.error("format specs in kernel f-strings must be constant (no nested {...})", spec)
        text = "".join(p.value for p in spec.values)
        try:
            format(0.0 if any(c in text for c in "eEfFgG%") else 0, text)
        except ValueError as e:
            self.error(f"format spec '{text}': {e}", spec)
        return text

    def message_value(self, message: MessageBuilder, v, spec: str, node) -> None:
        if isinstance(v, VectorValue):
            self.message_nested(message, v.shape, list(v.components), spec, node)
        elif is_runtime(v):
            message.value(v, spec)
        elif isinstance(v, (bool, int, float, str)):
            message.text(format(v, spec))
        else:
            self.error(f"print() cannot show a {type(v).__name__} in a kernel; index it to print its elements",
                       node)

    def message_nested(self, message: MessageBuilder, shape: tuple, components: list, spec: str, node) -> None:
        """A vector as `[a, b]`, a matrix as `[[a, b], [c, d]]`, as Quadrants prints them."""
        message.text("[")
        step = len(components) // shape[0]
        for i in range(shape[0]):
            if i:
                message.text(", ")
            part = components[i * step:(i + 1) * step]
            if len(shape) > 1:
                self.message_nested(message, shape[1:], part, spec, node)
            else:
                self.message_value(message, part[0], spec, node)
        message.text("]")

    def emit_message(self, kind: str, message: MessageBuilder, node) -> None:
        if len(message.values) > MAX_VALUES:
            self.error(f"{kind} of {len(message.values)} values in kernel '{self.kernel.name}': at most {MAX_VALUES} "
                       f"fit one print record; split it", node)
        src = self.frame.src
        record = [kind, message.texts, message.specs, [v.type.name for v in message.values],
                  str(src.loc(node)), (src.source_line(node) or "").rstrip("\n")]
        self.kernel.messages.append(record)
        self.emit(ir.DebugMessage(len(self.kernel.messages) - 1, message.values))
