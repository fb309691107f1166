"""A platform's library made from another platform's optimised IR (platforms.OPTIMISED_WITH):
macOS arm64's from Linux aarch64's armv8.2-a level, which every Apple silicon core runs.

The two aarch64 platforms generate the same IR but for the data layout (Linux's prefers 32-bit
alignment for i8 and i16 values; sizes and ABI alignments are the same, and optimised IR states
every alignment it relies on). So instead of generating, optimising and emitting a second module,
the macOS library takes Linux's optimised multi-level module with the level fixed at armv8.2-a:
the dispatch folds to that level's task bodies, every other level's code is dropped, and the
module is emitted for the M1 (instruction selection, scheduling, Mach-O).

LLVM's optimisation is not independent of the operating system: the library-call simplifier
knows the triple's C library (glibc has `exp10f`; macOS has `__exp10f` and `memset_pattern16`),
so Linux's optimised IR may call a function macOS lacks. Reuse is refused (the platform is then
optimised on its own) where the optimised module declares a function that the generated one did
not: every function it calls is then one the kernel itself calls, on every platform. What macOS
loses is only what its own optimisation would have done differently: a call simplified into one
that only Apple's C library has, and the M1's tuning of the optimiser's cost models (the
vectorisers' interleaving, unrolling); the code is that of the generic armv8.2-a CPU Linux runs.
"""
from __future__ import annotations

import re

import llvmlite.binding as llvm

from qdc.runtime.contract.entry_points import CPU_LEVEL_SETTER

from .multiversion import LEVEL_VARIABLE, function_definitions

_DECLARATION = re.compile(r'^declare [^@\n]*@"?([-\w.$]+)"?\(', re.M)
_LEVEL_COPY = re.compile(r"\.l(\d+)$")  # multiversion.level_symbol's suffix


def declared_functions(text: str) -> frozenset:
    """The functions other than LLVM's intrinsics that the module `text` declares: the ones
    it calls in other libraries."""
    return frozenset(name for name in _DECLARATION.findall(text) if not name.startswith("llvm."))


def retargeted(optimised: str, generated_calls: frozenset, level: int, tm, cpu: str) -> llvm.ModuleRef | None:
    """The module for target machine `tm` (its triple, data layout and CPU `cpu`) made from
    `optimised`, another platform's optimised multi-level module (multiversion.py), running its
    level `level`; None where optimising declared functions beyond `generated_calls` (the
    generated module's `declared_functions`)."""
    if not declared_functions(optimised) <= generated_calls:
        return None
    text = re.sub(r'^target triple = "[^"]*"', f'target triple = "{tm.triple}"', optimised, count=1, flags=re.M)
    text = re.sub(r'^target datalayout = "[^"]*"', f'target datalayout = "{tm.target_data}"', text, count=1,
                  flags=re.M)
    # The level, written only through the setter, becomes a constant: the loads of the
    # dispatch fold. (A module without task bodies optimised the variable away.)
    text = re.sub(rf'^(@"?{LEVEL_VARIABLE}"? = [^\n]*?)global i32 0\b', rf"\g<1>constant i32 {level}", text,
                  count=1, flags=re.M)
    definitions = function_definitions(text)
    if CPU_LEVEL_SETTER in definitions:
        text = text.replace(definitions.pop(CPU_LEVEL_SETTER), "", 1)
    # A level's copies name their CPU (multiversion._level_copy): they are this CPU's code now,
    # keeping the features they were optimised with.
    text = re.sub(r'"target-cpu"="[^"]*"', f'"target-cpu"="{cpu}"', text)
    module = llvm.parse_assembly(text, context=llvm.create_context())
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(0))
    fold = llvm.create_new_function_pass_manager()
    fold.add_sccp_pass()
    fold.add_simplify_cfg_pass()
    for name, definition in definitions.items():
        if f"@{LEVEL_VARIABLE}" in definition or f'@"{LEVEL_VARIABLE}"' in definition:
            fold.run(module.get_function(name), pb)
    dce = llvm.create_new_module_pass_manager()
    dce.add_global_dead_code_eliminate_pass()
    dce.run(module, pb)
    module.verify()
    for fn in module.functions:  # a level runs its own and lower levels' bodies, never a higher level's
        copy = _LEVEL_COPY.search(fn.name)
        if copy and not fn.is_declaration and int(copy.group(1)) > level:
            raise AssertionError(f"{fn.name} is left in the module of level {level}")
    if any(g.name == LEVEL_VARIABLE for g in module.global_variables):
        raise AssertionError(f"{LEVEL_VARIABLE} is left in the module of level {level}")
    return module
