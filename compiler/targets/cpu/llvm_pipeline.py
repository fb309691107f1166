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
(O1) without the vectorisers, and everything else as before (O3 with both vectorisers): the
demo kernels and DiffMPM (largest function 2,700 instructions) build the same bytes. The choice
depends on the module alone, so a kernel builds the same bytes every time; where it is not
the default it is recorded in the optimised IR (`!qdc.llvm_pipeline`, which `qdc inspect --llvm`
shows with the stored bitcode).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir as ll

LARGE_FUNCTION = 4000


@dataclass(frozen=True)
class Pipeline:
    """What LLVM's optimiser runs on one module, and why (`reason`: empty for the default)."""
    speed_level: int
    loop_vectorization: bool
    slp_vectorization: bool
    reason: str = ""

    def describe(self) -> str:
        vectorisers = [name for name, on in (("loop", self.loop_vectorization), ("SLP", self.slp_vectorization)) if on]
        text = f"O{self.speed_level}, vectorisers: {', '.join(vectorisers) or 'none'}"
        return f"{text} ({self.reason})" if self.reason else text


def largest_function(module: ll.Module) -> int:
    """The most instructions of any function of `module` that LLVM optimises (not `optnone`)."""
    return max((sum(len(block.instructions) for block in fn.blocks) for fn in module.functions
                if "optnone" not in fn.attributes), default=0)


def choose(module: ll.Module, opt_level: int) -> Pipeline:
    """The pipeline for `module` at `opt_level` (qdc's `opt_level`, LLVM's speed level)."""
    vectorise = opt_level >= 2
    largest = largest_function(module)
    if opt_level > 1 and largest > LARGE_FUNCTION:
        return Pipeline(1, False, False, f"largest function {largest} > {LARGE_FUNCTION} instructions")
    return Pipeline(opt_level, vectorise, vectorise)
