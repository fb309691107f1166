"""A large CPU kernel module cut into parts that LLVM parses, optimises and emits each on its
own, in parallel threads (parallel_llvm.py), as Taichi and Quadrants compile a kernel's offloaded
tasks (design.md, "Build time").

A part is a set of the module's entry points (its externally visible functions: task entries, the
fused entry, the numpy entry, the CPU level setter) with every internal function they call, at
any depth: LLVM inlines and specialises within a part exactly as it did within the module, and
an internal function two parts call is copied into both. What one part calls of another is an
entry point, declared there; a mutable internal global that several parts use is defined in one
(hidden, so that it stays out of the library's exports) and declared in the others, an internal
constant is copied. The cut depends on the module's text alone, never on the number of threads:
entry points are dealt largest first to the lightest part, the number of parts from the module's
size, so a kernel builds the same bytes however many threads compile it.

The regions outlined from a huge task body (llvm/llvm_outline.py: `<chunk>.outlined<N>` and
their ISA levels' copies) are dealt like entry points, so that LLVM's work on one task body is
spread over parts too: one is defined (hidden, as a shared global variable) in the part it is
dealt to and declared in the parts that call it, and its internal callees go with it.
"""
from __future__ import annotations

import re

from ..llvm.llvm_outline import INFIX as OUTLINED_INFIX
from .multiversion import function_definitions

# The fewest lines of IR of a part (an `optnone` function counts a tenth): a module of fewer than
# twice this stays whole. A part costs ~3 ms of CPU of its own (a target machine, the shared
# declarations parsed again, its optimised module linked back into one for the "ll" and "bc"
# artifacts: Genesis's small modules cut at a tenth of this took 51-55 ms instead of 38, 78
# instead of 60), against 100 ms and more of LLVM's work on 1,500 lines; the demo kernels
# (30-100 ms each) stay whole.
MIN_PART_LINES = 1500
MAX_PARTS = 8

_REFERENCE = re.compile(r'@"?([-\w.$]+)"?')
_GLOBAL = re.compile(r'@"?([-\w.$]+)"? = ')
_LINKAGE = re.compile(r'^(@"?[-\w.$]+"? = )(internal |private )?')
_OUTLINED = re.compile(re.escape(OUTLINED_INFIX) + r"\d+(\.l\d+)?$")


class _Module:
    """The top-level entities of a module's text: header lines, function definitions in order,
    global variables, and what every part shares (types, declarations, attribute groups,
    numbered metadata); named metadata, which goes to the first part."""

    def __init__(self, text: str):
        self.definitions = function_definitions(text)
        rest = text
        for definition in self.definitions.values():
            rest = rest.replace(definition, "", 1)
        self.shared, self.named_metadata, self.globals = [], [], {}
        self.understood = True
        for line in rest.split("\n"):
            found = _GLOBAL.match(line)
            if found:
                self.globals[found.group(1)] = line
            elif re.match(r"!\d", line):
                self.shared.append(line)
            elif line.startswith("!"):
                self.named_metadata.append(line)
            elif line.startswith(("; ModuleID", "target ", "source_filename", "%", "declare ", "attributes #")) \
                    or not line.strip():
                self.shared.append(line)
            else:
                self.understood = False  # something this cut does not know how to share: not cut
        self.internal = {name for name, definition in self.definitions.items()
                         if re.match(r"define (internal|private) ", definition)}
        # outlined regions: internal, but dealt as entry points are (module docstring)
        self.outlined = {name for name in self.internal if _OUTLINED.search(name)}
        self.internal -= self.outlined
        self.references = {name: set(_REFERENCE.findall(definition)) - {name}
                           for name, definition in self.definitions.items()}


def split_module(text: str) -> tuple[list[str], set] | None:
    """(the parts' texts, the internal globals they share, hidden now): the module
    `text` cut into parts (see the module docstring); None where it stays whole (too small, one
    entry point, or something it cannot share)."""
    if text.count("\n") < 2 * MIN_PART_LINES:
        return None
    module = _Module(text)
    if not module.understood:
        return None
    kept_alive = set()  # what `llvm.used` and `llvm.compiler.used` keep: in every part
    for name, line in module.globals.items():
        referenced = set(_REFERENCE.findall(line.split("=", 1)[1]))
        if name in ("llvm.used", "llvm.compiler.used"):
            kept_alive |= referenced
        elif referenced:
            return None  # an initializer that refers to a symbol: not cut
    roots = [name for name in module.definitions if name not in module.internal]
    groups = [_closure(module, [root]) for root in roots]
    reached = set().union(*groups) if groups else set()
    unreached = [name for name in module.definitions if name not in reached]
    if unreached and groups:
        groups[0] = groups[0] | _closure(module, unreached)
    lines = {name: _weight(definition) for name, definition in module.definitions.items()}
    sizes = [sum(lines[name] for name in group) for group in groups]
    count = min(len(groups), MAX_PARTS, sum(sizes) // MIN_PART_LINES)
    if count < 2:
        return None
    parts = _balanced(sizes, count)
    if len(parts) < 2:
        return None
    every = _closure(module, sorted(kept_alive & module.internal))
    members = [set().union(*(groups[g] for g in part)) | every for part in parts]
    uses = [_uses(module, m) for m in members]
    shared_internal = {name for name, line in module.globals.items()
                       if _LINKAGE.match(line).group(2) and not _constant(line) and sum(name in u for u in uses) > 1}
    return ([_part_text(module, members, uses, shared_internal, p) for p in range(len(parts))],
            shared_internal | module.outlined)


def _weight(definition: str) -> int:
    """A function's share of LLVM's work: its lines, a tenth of them for an `optnone` one (the
    numpy entry: not optimised, and emitted by the fast instruction selector, it took 11 ms of
    Genesis's collision detection's 2.9 s for 3,700 of its 63,000 lines)."""
    lines = definition.count("\n")
    return lines // 10 if " optnone" in definition[:definition.find("\n")] else lines


def _closure(module: _Module, names) -> set:
    """`names` with the internal functions they call, at any depth."""
    found, todo = set(names), list(names)
    while todo:
        for callee in module.references.get(todo.pop(), ()):
            if callee in module.internal and callee not in found:
                found.add(callee)
                todo.append(callee)
    return found


def _balanced(sizes: list[int], count: int) -> list[list[int]]:
    """The groups (indices into `sizes`) dealt into at most `count` parts, largest first, each to
    the part with the fewest lines so far (ties: the lower index), a group of less than half a
    part's lines never to an empty part (it would not repay its costs); then the parts in the
    order of their first group and each part's groups in module order."""
    parts, loads = [[] for _ in range(count)], [0] * count
    for g in sorted(range(len(sizes)), key=lambda g: (-sizes[g], g)):
        small = sizes[g] < MIN_PART_LINES // 2
        lightest = min((p for p in range(count) if parts[p] or not small or p == 0),
                       key=lambda p: (loads[p], p))
        parts[lightest].append(g)
        loads[lightest] += sizes[g]
    return sorted((sorted(part) for part in parts if part), key=lambda part: part[0])


def _part_text(module: _Module, members: list[set], uses: list[set], shared_internal: set, p: int) -> str:
    out = list(module.shared)
    for name, line in module.globals.items():
        if name in ("llvm.used", "llvm.compiler.used"):
            out.append(line)
        elif name in uses[p] or (p == 0 and not any(name in u for u in uses)):
            owner = next((q for q, u in enumerate(uses) if name in u), 0)
            out.append(_global_in_part(line, p, owner, name in shared_internal))
    for name, definition in module.definitions.items():
        if name in members[p]:
            out.append(_hidden(definition) if name in module.outlined else definition)
        elif name in uses[p] and name not in module.internal:
            out.append(_declaration(_hidden(definition) if name in module.outlined else definition))
    if p == 0:
        out += module.named_metadata
    return "\n".join(out) + "\n"


def _uses(module: _Module, names: set) -> set:
    """What the functions `names` refer to, and themselves."""
    used = set(names)
    for name in names:
        used |= module.references[name]
    return used


def _global_in_part(line: str, p: int, owner: int, shared_internal: bool) -> str:
    """A global variable's line in part `p`: a constant internal to the module is copied into each
    part that reads it; any other is defined by the first part that uses it (`owner`) and
    declared by the others; an internal one that several parts use is hidden instead."""
    linkage = _LINKAGE.match(line).group(2)
    if linkage and _constant(line):
        return line
    if p == owner:
        return _LINKAGE.sub(lambda m: m.group(1) + "hidden ", line, count=1) if shared_internal else line
    return _external_global(line, hidden=bool(linkage))


def _constant(line: str) -> bool:
    return re.search(r"\bconstant\b", line.split("=", 1)[1].split('"')[0]) is not None


def _external_global(line: str, hidden: bool) -> str:
    """The declaration of the global variable defined by `line`."""
    head, rest = line.split(" = ", 1)
    found = re.search(r"\b(global|constant) ", rest)
    kind, value = found.group(1), rest[found.end():]
    return f"{head} = external {'hidden ' if hidden else ''}{kind} {_leading_type(value)}"


def _leading_type(text: str) -> str:
    """The type at the start of `text` (a global's `TYPE INITIALIZER`): up to the first space
    outside brackets."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "[{<(":
            depth += 1
        elif ch in "]}>)":
            depth -= 1
        elif ch == " " and depth == 0:
            return text[:i]
    return text


def _hidden(definition: str) -> str:
    """The internal function `definition` made a hidden one, which other parts may call."""
    return re.sub(r"^define (internal|private) ", "define hidden ", definition, count=1)


def _declaration(definition: str) -> str:
    """`declare` of the function `definition` defines: its prototype up to its parameters'
    closing parenthesis (without its body and its function attributes)."""
    line = definition.split("\n", 1)[0]
    start = line.index("(", line.index("@"))
    depth = 0
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return "declare" + line[len("define"):i + 1]
    raise AssertionError(f"no parameter list in {line!r}")
