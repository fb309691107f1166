"""Which LLVM optimisation pipeline a CPU kernel's module gets, by the size of its largest
function (design.md, "Build time").

LLVM's time on a function grows faster than the function: the huge, branchy task bodies of a
physics engine (Genesis's collision detection: one body of 61,000 instructions; its solver's
kernels 5,000-12,000) spent most of a cold scene build in LLVM. What O3 adds there pays little:
- the loop vectoriser widens inner loops over a handful of items (a contact polygon's vertices,
  a robot's degrees of freedom) into 16 lanes x 4 interleaved plus a scalar remainder, so its
  vector bodies never run below 64 trips, yet they doubled the code to emit (collision
  detection: a 596 KB object against 342 KB, 4.4 s of emission against 2.2);
- the SLP vectoriser's time grows faster still, for objects 1% smaller;
- the O2/O3 pipeline's extra rounds (GVN, jump threading, unswitching, unrolling) cost a quarter
  to a third of the optimisation of such a function over O1's, whose code is the same size.
So a module with a function above LARGE_FUNCTION instructions is optimised at speed level 1
(O1) without the vectorisers, and those functions for size (`optsize`: fewer unrolled and
duplicated blocks: the solver's largest kernel's object at O1 without the vectorisers went
from 65 to 39 KB, its emission from 0.66 to 0.3 s), and
everything else as before (O3 with both vectorisers): the demo kernels and DiffMPM (largest
function 2,700 instructions) build the same bytes. The choice
depends on the module alone, so a kernel builds the same bytes every time; where it is not
the default it is recorded in the optimised IR (`!qdc.llvm_pipeline`, which `qdc inspect --llvm`
shows with the stored bitcode).

A portable x86-64 library (several ISA levels in one module, multiversion.py) whose tasks all
keep the scalar code (no width-W chunk, widen_codegen.py) is optimised without the SLP
vectoriser (`scalar_levels_without_slp`): each task body is optimised once per level, and in
those bodies SLP was the costliest pass (DiffMPM's G2P gradient: most of its optimisation) for
vectors that made no measurable difference to their run time; the loop vectoriser still widens
their loops at each level's width.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir as ll

LARGE_FUNCTION = 4000


@dataclass(frozen=True)
class Pipeline:
    """What LLVM's optimiser runs on one module, and why (`reason`: empty for the default);
    `for_size`: the functions it optimises for size (`optsize`), in the module's order."""
    speed_level: int
    loop_vectorization: bool
    slp_vectorization: bool
    reason: str = ""
    for_size: tuple = ()

    def describe(self) -> str:
        vectorisers = [name for name, on in (("loop", self.loop_vectorization), ("SLP", self.slp_vectorization)) if on]
        text = f"O{self.speed_level}, vectorisers: {', '.join(vectorisers) or 'none'}"
        if self.for_size:
            text += f", optsize: {len(self.for_size)} function{'s' if len(self.for_size) > 1 else ''}"
        return f"{text} ({self.reason})" if self.reason else text


def _sizes(module: ll.Module) -> list:
    """(instructions, [function names]) of each function of `module` that LLVM optimises (not
    `optnone`), a task body with the regions outlined from it (llvm/llvm_outline.py) as one: the
    pipeline is chosen by the task body as generated, so it is the same whether or not its
    regions are outlined. A function's instructions count those the lowering did not emit twice
    in a block (llvm_ir._Env.in_block), which LLVM's first passes would merge: the size this
    module's thresholds were measured with."""
    outlined = getattr(module, "outlined_regions", {})  # outlined function -> its task body
    sizes: dict = {}
    for fn in module.functions:
        if "optnone" not in fn.attributes:
            group = sizes.setdefault(outlined.get(fn.name, fn.name), [0, []])
            group[0] += sum(len(block.instructions) for block in fn.blocks) + getattr(fn, "unemitted_instructions", 0)
            group[1].append(fn.name)
    return [(size, names) for size, names in sizes.values()]


def largest_function(module: ll.Module) -> int:
    """The most instructions of any function of `module` that LLVM optimises (not `optnone`; a
    task body with its outlined regions)."""
    return max((size for size, _ in _sizes(module)), default=0)


def choose(module: ll.Module, opt_level: int, levels: int = 1, machine: str = "x86_64") -> Pipeline:
    """The pipeline for `module` at `opt_level` (qdc's `opt_level`, LLVM's speed level), a
    module of `levels` ISA levels of the `machine` family."""
    vectorise = opt_level >= 2
    large = [(size, names) for size, names in _sizes(module) if size > LARGE_FUNCTION]
    if opt_level > 1 and large:
        reason = f"largest function {max(size for size, _ in large)} > {LARGE_FUNCTION} instructions"
        return Pipeline(1, False, False, reason, tuple(name for _, names in large for name in names))
    if vectorise and scalar_levels_without_slp(module, levels, machine):
        return Pipeline(opt_level, True, False, f"{levels} ISA levels of scalar task code")
    return Pipeline(opt_level, vectorise, vectorise)


def scalar_levels_without_slp(module: ll.Module, levels: int, machine: str) -> bool:
    """Whether `module` (its tasks' lowering: codegen.generate_llvm's `widen_choices`) is a
    portable x86-64 module of scalar task code, which LLVM optimises without the SLP vectoriser
    (module docstring)."""
    choices = getattr(module, "widen_choices", {})
    return levels > 1 and machine == "x86_64" and not any(choice.max_lanes > 1 for choice in choices.values())


def mark(module: ll.Module, pipeline: Pipeline) -> None:
    """Write what `pipeline` decided into `module` (before it is printed for LLVM): its large
    functions' `optsize`, and where it is not the default, why (`!qdc.llvm_pipeline`)."""
    for name in pipeline.for_size:
        module.get_global(name).attributes.add("optsize")
    if pipeline.reason:
        module.add_named_metadata("qdc.llvm_pipeline", [pipeline.describe()])
