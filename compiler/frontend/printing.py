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
import re
import string

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
        if _is_str_format(node):  # "x = {} y = {:.3f}".format(x, y)
            self.formatted_parts(message, node)
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):  # "x = %d, y = %.3f" % (x, y)
            self.percent_parts(message, node)
            return
        self.message_value(message, self.visit(node), spec, node)

    def formatted_parts(self, message: MessageBuilder, node: ast.Call) -> None:
        """`str.format` of a constant string: its fields by position (auto-numbered or
        explicit) or by keyword, each with its spec, as an f-string would have them."""
        keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
        automatic = 0
        try:
            pieces = list(string.Formatter().parse(node.func.value.value))
        except ValueError as e:
            self.error(f"format string: {e}", node.func.value)
        for literal, name, spec, conversion in pieces:
            message.text(literal)
            if name is None:
                continue
            if conversion is not None:
                self.error("conversions (!r, !s, !a) are not supported in kernel format strings", node)
            if name == "":
                if automatic is None:
                    self.error("format string: cannot switch from manual field numbering to automatic", node)
                name, automatic = str(automatic), automatic + 1
            elif name.isdigit():
                if automatic:
                    self.error("format string: cannot switch from automatic field numbering to manual", node)
                automatic = None
            if name.isdigit() and int(name) < len(node.args):
                argument = node.args[int(name)]
            elif name in keywords:
                argument = keywords[name]
            else:
                self.error(f"format string field '{{{name}}}' has no argument", node)
            self.message_part(message, argument, self.checked_spec(spec or "", node))

    def percent_parts(self, message: MessageBuilder, node: ast.BinOp) -> None:
        """printf-style `%` of a constant string: %d %i %u %f %e %g %x %o %s (flags, width and
        precision as in C, which Python's format specs spell alike), %%."""
        values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        text, at, used = node.left.value, 0, 0
        for m in _PERCENT.finditer(text):
            message.text(text[at:m.start()])
            at = m.end()
            flags, conversion = m.group(1), m.group(2)
            if conversion == "%":
                message.text("%")
                continue
            if used == len(values):
                self.error("not enough values for the % format string", node)
            spec = flags + {"i": "d", "u": "d", "s": ""}.get(conversion, conversion)
            self.message_part(message, values[used], self.checked_spec(spec, node))
            used += 1
        message.text(text[at:])
        if used != len(values):
            self.error("more values than the % format string takes", node)

    def format_spec(self, part: ast.FormattedValue) -> str:
        spec = part.format_spec
        if spec is None:
            return ""
        if not all(isinstance(p, ast.Constant) for p in spec.values):
            self.error("format specs in kernel f-strings must be constant (no nested {...})", spec)
        return self.checked_spec("".join(p.value for p in spec.values), spec)

    def checked_spec(self, text: str, node) -> str:
        try:
            format(0.0 if any(c in text for c in "eEfFgG%") else 0, text)
        except ValueError as e:
            self.error(f"format spec '{text}': {e}", node)
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


_PERCENT = re.compile(r"%([-+ #0]*\d*(?:\.\d+)?)([diufFeEgGxXos%])")


def _is_str_format(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
        and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)
