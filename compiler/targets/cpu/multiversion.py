"""One shared library for every ISA level of a portable build (issue 14: build time).

Only the task bodies (`<task>_chunk`, and the internal functions they call) depend on the
CPU level: the vectorisers pick vector widths from it. So the module keeps one copy of its
entry points, worker-thread bodies and numpy entry, built for the lowest level, and one copy
of each task body per level, each marked with its level's LLVM `target-cpu`/`target-features`
(LLVM optimises and emits every function for its own subtarget). The name a task entry calls
becomes a dispatcher that calls the body of the level the runtime chose at load through the
exported CPU_LEVEL_SETTER (runtime/contract/entry_points.py). One module is optimised, emitted
and linked once instead of once per level, which roughly halves a portable build's LLVM time.

The lowest level's bodies call the shared internal functions as they are; a higher level's
bodies call copies of them at that level, since LLVM inlines a function only into callers
with at least its CPU features, and a vector argument's ABI depends on them.
"""
from __future__ import annotations

import re

from llvmlite import ir as ll

from qdc.runtime.contract.entry_points import CPU_LEVEL_SETTER

from ..llvm.llvm_text import global_text, module_text
from .isa_levels import LEVEL_SENSITIVE, OPTIMISED_ALIKE_UNLESS, CpuLevel

LEVEL_VARIABLE = "qdc_cpu_level"  # internal: written only through CPU_LEVEL_SETTER


def level_symbol(name: str, level: int) -> str:
    return f"{name}.l{level}"


def multiversioned_ir(module: ll.Module, task_bodies: list[str], levels: tuple[CpuLevel, ...],
                      overrides: dict | None = None, features=None, alike: dict | None = None,
                      scalar_code: bool = False) -> str:
    """The textual IR of `module` with the functions named `task_bodies` dispatched per level
    (see the module docstring). `levels[0]` is the level the module is compiled for.
    `overrides[(body, i)]`: a function of the module that is level i's copy of `body` instead
    of `body` itself (a width-W chunk built for that level's W, cpu/widen_codegen.py); it
    leaves the module's own text. `features(name, level)`: the LLVM features of the copy of
    function `name` at `level` (default: the level's). `alike`, where given, receives
    {(body, i): j}: the bodies that level i runs level j's code of, without a copy of its own
    (`_alike_levels`). `scalar_code`: the module is scalar task code that LLVM optimises without
    the SLP vectoriser (llvm_pipeline.scalar_levels_without_slp), whose bodies the loop vectoriser
    cannot widen are alike at every level (`never_vectorised`)."""
    overrides = overrides or {}
    features = features or (lambda name, level: level.llvm_features)
    defined = {fn.name: fn for fn in module.functions if fn.blocks}
    for name in task_bodies:
        fn = defined.get(name)
        if fn is None or fn.linkage != "internal" or not isinstance(fn.return_value.type, ll.VoidType):
            raise AssertionError(f"task body {name!r} is not an internal void function of the module")
    # Worker-thread bodies (`_omp`) only hand chunks to the dispatcher: one copy, at the base level.
    shared = [name for name, fn in defined.items()
              if fn.linkage == "internal" and name not in task_bodies and not name.endswith("_omp")]
    replacements = set(overrides.values())
    for replacement in replacements:
        shared.remove(replacement)
    # Printing is most of this function's time (a wide chunk has thousands of instructions):
    # each global is printed once (llvm_text: llvmlite's text, written faster), and the module's
    # text assembled from those.
    printed = {name: global_text(value) for name, value in module.globals.items()}
    same = _alike_levels(printed, task_bodies, shared, levels, overrides, scalar_code)
    if alike is not None:
        alike.update(same)
    body = [_dispatcher(defined[name], len(levels), same) if name in task_bodies else text
            for name, text in printed.items() if name not in replacements]  # a level's chunk leaves it
    copies = []
    for i, level in enumerate(levels):
        renamed = list(task_bodies) if i == 0 else list(task_bodies) + shared
        own = [name for name in task_bodies if (name, i) not in same]
        for name in own + (renamed[len(task_bodies):] if own else []):
            source = overrides.get((name, i))
            text = printed[name] if source is None else printed[source].replace(f'@"{source}"', f'@"{name}"', 1)
            copies.append(_level_copy(defined[name], text, i, level, renamed, features(source or name, level)))
    return "\n".join([module_text(module, body), _level_variable(), *copies])


def _alike_levels(printed: dict, task_bodies: list[str], shared: list[str], levels: tuple[CpuLevel, ...],
                  overrides: dict, scalar_code: bool = False) -> dict:
    """{(body, i): j}: the task bodies that level i's CPUs would optimise as level j's do
    (isa_levels.OPTIMISED_ALIKE_UNLESS; in `scalar_code`, those `never_vectorised` without
    anything LEVEL_SENSITIVE), made from the same chunk."""
    same = {}
    callees = "".join(printed[name] for name in shared)
    if scalar_code:
        sensitive = [re.compile(LEVEL_SENSITIVE[level.name]) for level in levels[1:] if level.name in LEVEL_SENSITIVE]
        for name in task_bodies:
            if not any((name, i) in overrides for i in range(len(levels))) and never_vectorised(printed[name]) \
                    and not any(pattern.search(printed[name]) or pattern.search(callees) for pattern in sensitive):
                same.update({(name, i): 0 for i in range(1, len(levels))})
    for i in range(1, len(levels)):
        unless = OPTIMISED_ALIKE_UNLESS.get(levels[i].name)
        if unless is None or re.search(unless, callees):
            continue
        for name in task_bodies:
            if (name, i) in same:
                continue
            j = same.get((name, i - 1), i - 1)
            source = overrides.get((name, i), name)
            if source == overrides.get((name, j), name) and not re.search(unless, printed[source]):
                same[(name, i)] = j
    return same


# Instructions of a task body (as generated) from which LLVM's runtime unrolling, whose count
# follows each level's scheduling model (x86-64-v2 unrolled a histogram's loop 4 times, v3 and
# v4 8 times), leaves its loop as it is at every level.
NEVER_UNROLLED = 200

_LABEL = re.compile(r'^"?([-\w.$]+)"?:', re.M)
_TARGET = re.compile(r'label %"?([-\w.$]+)"?')
_DEFINED = re.compile(r'^  %"?([-\w.$]+)"? = (\w+)(.*)$')
_VALUE = re.compile(r'%"?([-\w.$]+)"?')
_ATOMIC_POINTER = re.compile(r'^  (?:%"?[-\w.$]+"? = )?(?:atomicrmw (?:volatile )?\w+ |cmpxchg (?:weak )?(?:volatile )?)'
                             r'ptr %"?([-\w.$]+)"?', re.M)


def never_vectorised(body: str) -> bool:
    """Whether LLVM's loop vectoriser leaves the task body `body` (a function's generated IR) as
    it is at every ISA level: it has one loop (one branch back to a block on the path to it),
    and that loop updates memory with an atomic at an address computed from what the loop loads
    (a scatter, as P2G's to the grid). The loop vectoriser refuses a loop with an atomic; in the copy of the
    loop for a thread alone (unswitched on `alone`, where those updates are plain loads and
    stores) it cannot prove that two iterations do not update one element, at any vector width.
    With no SLP vectoriser (llvm_pipeline.scalar_levels_without_slp), and a body of at least
    NEVER_UNROLLED instructions, LLVM then optimises it alike at every level, as it did DiffMPM's
    P2G and G2P gradient."""
    pointers = _ATOMIC_POINTER.findall(body)
    if not pointers or "  switch " in body or body.count("\n  ") < NEVER_UNROLLED:  # a switch's targets: not read
        return False
    successors, block, definitions = {}, None, {}
    for line in body.split("\n"):
        found = _LABEL.match(line)
        if found:
            block = found.group(1)
            successors[block] = []
        elif line.startswith("  br "):
            successors[block] += _TARGET.findall(line)
        found = _DEFINED.match(line)
        if found:
            definitions[found.group(1)] = (found.group(2), _VALUE.findall(found.group(3)))
    if _back_edges(successors) != 1:
        return False
    # Varying in the loop: phis, and what the generated code keeps in stack slots (its counters,
    # its locals) read back; then what is loaded from an address that varies, and what follows.
    slots = {name for name, (op, _) in definitions.items() if op == "alloca"}
    varying = _least_fixpoint(definitions, lambda op, operands, holds: op == "phi" or any(map(holds, operands))
                              or (op == "load" and bool(operands) and operands[0] in slots))
    loaded = _least_fixpoint(definitions, lambda op, operands, holds: any(map(holds, operands))
                             or (op == "load" and any(o in varying for o in operands)))
    return any(pointer in loaded for pointer in pointers)


def _back_edges(successors: dict) -> int:
    """The branches to a block on the path that reached them, in a depth-first walk of the
    control flow graph `successors` ({block: its successors}) from its first block: one per loop."""
    entry = next(iter(successors), None)
    count, state = 0, {entry: 1}  # 1: on the walk's path, 2: done
    stack = [(entry, iter(successors.get(entry, ())))]
    while stack:
        block, following = stack[-1]
        target = next(following, None)
        if target is None:
            state[block] = 2
            stack.pop()
        elif state.get(target) == 1:
            count += 1
        elif target not in state:
            state[target] = 1
            stack.append((target, iter(successors.get(target, ()))))
    return count


def _least_fixpoint(definitions: dict, rule) -> set:
    """The values of `definitions` ({name: (opcode, operand names)}) for which
    `rule(opcode, operands, holds)` is true, `holds(name)` telling whether it is for another value
    (the least such set: values on a cycle through phis only where something outside the cycle
    makes them so). Passes in the text's order until nothing changes: definitions mostly come
    before their uses, so a loop's phis take one pass more."""
    found: set = set()
    changed = True
    while changed:
        changed = False
        for name, (op, operands) in definitions.items():
            if name not in found and rule(op, operands, found.__contains__):
                found.add(name)
                changed = True
    return found


def _level_copy(fn: ll.Function, text: str, i: int, level: CpuLevel, renamed: list[str], features: str) -> str:
    if fn.section or fn.metadata:  # the target attributes are appended to the prototype line
        raise AssertionError(f"function {fn.name!r} has a section or metadata: cannot copy it per CPU level")
    for name in renamed:
        text = text.replace(f'@"{name}"', f'@"{level_symbol(name, i)}"')
    prototype, rest = text.split("\n", 1)
    attributes = f' "target-cpu"="{level.llvm_cpu}"'
    if features:
        attributes += f' "target-features"="{features}"'
    return prototype + attributes + "\n" + rest


def with_features(text: str, functions, features: str) -> str:
    """The module `text` with the definitions of `functions` compiled with the LLVM `features`
    (instead of the target machine's)."""
    for name in functions:
        start = text.index(f'define internal void @"{name}"(')
        end = text.index("\n", start)
        text = text[:end] + f' "target-features"="{features}"' + text[end:]
    return text


def _dispatcher(fn: ll.Function, levels: int, same: dict) -> str:
    passed = ", ".join(f'{arg.type} %"a{k}"' for k, arg in enumerate(fn.args))
    lines = [f'define internal void @"{fn.name}"({passed}) alwaysinline', "{", "entry:",
             f'  %"level" = load i32, ptr @"{LEVEL_VARIABLE}"',
             '  switch i32 %"level", label %"l0" [' + " ".join(f'i32 {i}, label %"l{i}"' for i in range(1, levels))
             + "]"]
    for i in range(levels):
        lines += [f"l{i}:", f'  call void @"{level_symbol(fn.name, same.get((fn.name, i), i))}"({passed})', "  ret void"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _level_variable() -> str:
    return (f'@"{LEVEL_VARIABLE}" = internal global i32 0\n\n'
            f'define void @"{CPU_LEVEL_SETTER}"(i32 %"level")\n{{\nentry:\n'
            f'  store i32 %"level", ptr @"{LEVEL_VARIABLE}"\n  ret void\n}}\n')


_DEFINED_NAME = re.compile(r'define [^\n]*?@"?([-\w.$]+)"?\(')


def function_definitions(text: str) -> dict:
    """{function name: its definition}, from the `define` line to the line of its closing brace,
    in the module `text`. Found with str.find: a lazy regular expression over a whole module
    (one attempt per character) was most of the time of the equal levels' search."""
    definitions = {}
    start = 0 if text.startswith("define ") else text.find("\ndefine ") + 1 or -1
    while start >= 0:
        end = text.find("\n}", start)
        end = len(text) if end < 0 else end + 2
        if text.startswith("\n", end):
            end += 1
        definitions[_DEFINED_NAME.match(text, start).group(1)] = text[start:end]
        start = text.find("\ndefine ", end - 1) + 1 or -1
    return definitions


def equal_levels(optimised: str, task_bodies: list[str], levels: tuple[CpuLevel, ...],
                 alike: dict | None = None) -> dict:
    """{(body, i): j}: task body `body` of level i is, once optimised, the same code as that of
    the lower level j (LLVM's vectorisers found nothing to do differently there, as in a
    serial or a lane-by-lane task): level i may run level j's, which is valid on its CPUs, and
    is not emitted again. Bodies with what a level between compiles differently from equal IR
    (isa_levels.LEVEL_SENSITIVE) are kept. `alike`: those known before optimisation
    (multiversioned_ir), which the result includes."""
    definitions = function_definitions(optimised)
    sensitive = [re.compile(LEVEL_SENSITIVE[level.name]) if level.name in LEVEL_SENSITIVE else None
                 for level in levels]
    same = dict(alike or {})
    for name in task_bodies:
        for i in range(1, len(levels)):
            if (name, i) in same:
                continue
            j = same.get((name, i - 1), i - 1)
            mine, lower = definitions.get(level_symbol(name, i)), definitions.get(level_symbol(name, j))
            # Cheapest test first: most bodies differ (other vector widths), in their line count too.
            if mine is None or lower is None or mine.count("\n") != lower.count("\n"):
                continue
            if _comparable(mine) == _comparable(lower) and not any(s is None or s.search(mine)
                                                                   for s in sensitive[j + 1:i + 1]):
                same[(name, i)] = j
    return same


def _comparable(definition: str) -> str:
    """A function's body, without its prototype (attributes differ per level) and with metadata
    and attribute group numbers left out."""
    body = definition.split("\n", 1)[1]
    return re.sub(r"[!#]\d+", "", body)


def without_equal_levels(optimised: str, same: dict) -> str:
    """`optimised` with each body of `same` removed and its callers calling the lower level's."""
    definitions = function_definitions(optimised)
    for (name, i), j in same.items():
        removed = definitions.get(level_symbol(name, i))
        if removed is None:  # never made (equal_levels' `alike`)
            continue
        optimised = optimised.replace(removed, "", 1)
        optimised = re.sub(rf'@"?{re.escape(level_symbol(name, i))}"?(?=[(\s,)])',
                           f'@"{level_symbol(name, j)}"', optimised)
    return optimised


def level_assembly(assembly: str, task_bodies: list[str], level: int, same: dict | None = None) -> str:
    """The assembly of one level's task bodies (for tests: which registers a level uses); a body
    that runs a lower level's code (`equal_levels`) gives that level's."""
    parts = []
    for name in task_bodies:
        symbol = level_symbol(name, (same or {}).get((name, level), level))
        start = assembly.index(f'"{symbol}":') if f'"{symbol}":' in assembly else assembly.index(f"{symbol}:")
        parts.append(assembly[start:assembly.index(".Lfunc_end", start)])
    return "\n".join(parts)
