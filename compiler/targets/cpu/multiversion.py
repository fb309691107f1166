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

from llvmlite import ir as ll

from qdc.runtime.contract.entry_points import CPU_LEVEL_SETTER

from .isa_levels import CpuLevel

LEVEL_VARIABLE = "qdc_cpu_level"  # internal: written only through CPU_LEVEL_SETTER


def level_symbol(name: str, level: int) -> str:
    return f"{name}.l{level}"


def multiversioned_ir(module: ll.Module, task_bodies: list[str], levels: tuple[CpuLevel, ...],
                      overrides: dict | None = None) -> str:
    """The textual IR of `module` with the functions named `task_bodies` dispatched per level
    (see the module docstring). `levels[0]` is the level the module is compiled for.
    `overrides[(body, i)]`: a function of the module that is level i's copy of `body` instead
    of `body` itself (a width-W chunk built for that level's W, cpu/widen_codegen.py); it
    leaves the module's own text."""
    overrides = overrides or {}
    defined = {fn.name: fn for fn in module.functions if fn.blocks}
    for name in task_bodies:
        fn = defined.get(name)
        if fn is None or fn.linkage != "internal" or not isinstance(fn.return_value.type, ll.VoidType):
            raise AssertionError(f"task body {name!r} is not an internal void function of the module")
    # Worker-thread bodies (`_omp`) only hand chunks to the dispatcher: one copy, at the base level.
    shared = [name for name, fn in defined.items()
              if fn.linkage == "internal" and name not in task_bodies and not name.endswith("_omp")]
    printed = {name: str(defined[name]) for name in [*task_bodies, *shared]}
    text = str(module)
    for name in task_bodies:
        if printed[name] not in text:  # else every level would silently run the lowest one's code
            raise AssertionError(f"task body {name!r} is not printed in the module as on its own")
        text = text.replace(printed[name], _dispatcher(defined[name], len(levels)), 1)
    for replacement in set(overrides.values()):
        shared.remove(replacement)
        own = str(defined[replacement])
        if own not in text:
            raise AssertionError(f"level chunk {replacement!r} is not printed in the module as on its own")
        text = text.replace(own, "", 1)
    copies = []
    for i, level in enumerate(levels):
        renamed = list(task_bodies) if i == 0 else list(task_bodies) + shared
        for name in renamed:
            source = overrides.get((name, i))
            body = printed[name] if source is None else str(defined[source]).replace(f'@"{source}"', f'@"{name}"', 1)
            copies.append(_level_copy(defined[name], body, i, level, renamed))
    return "\n".join([text, _level_variable(), *copies])


def _level_copy(fn: ll.Function, text: str, i: int, level: CpuLevel, renamed: list[str]) -> str:
    if fn.section or fn.metadata:  # the target attributes are appended to the prototype line
        raise AssertionError(f"function {fn.name!r} has a section or metadata: cannot copy it per CPU level")
    for name in renamed:
        text = text.replace(f'@"{name}"', f'@"{level_symbol(name, i)}"')
    prototype, rest = text.split("\n", 1)
    attributes = f' "target-cpu"="{level.llvm_cpu}"'
    if level.llvm_features:
        attributes += f' "target-features"="{level.llvm_features}"'
    return prototype + attributes + "\n" + rest


def _dispatcher(fn: ll.Function, levels: int) -> str:
    passed = ", ".join(f'{arg.type} %"a{k}"' for k, arg in enumerate(fn.args))
    lines = [f'define internal void @"{fn.name}"({passed}) alwaysinline', "{", "entry:",
             f'  %"level" = load i32, ptr @"{LEVEL_VARIABLE}"',
             '  switch i32 %"level", label %"l0" [' + " ".join(f'i32 {i}, label %"l{i}"' for i in range(1, levels))
             + "]"]
    for i in range(levels):
        lines += [f"l{i}:", f'  call void @"{level_symbol(fn.name, i)}"({passed})', "  ret void"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _level_variable() -> str:
    return (f'@"{LEVEL_VARIABLE}" = internal global i32 0\n\n'
            f'define void @"{CPU_LEVEL_SETTER}"(i32 %"level")\n{{\nentry:\n'
            f'  store i32 %"level", ptr @"{LEVEL_VARIABLE}"\n  ret void\n}}\n')


def level_assembly(assembly: str, task_bodies: list[str], level: int) -> str:
    """The assembly of one level's task bodies (for tests: which registers a level uses)."""
    parts = []
    for name in task_bodies:
        symbol = level_symbol(name, level)
        start = assembly.index(f'"{symbol}":') if f'"{symbol}":' in assembly else assembly.index(f"{symbol}:")
        parts.append(assembly[start:assembly.index(".Lfunc_end", start)])
    return "\n".join(parts)
