"""The "args" words of a SPIR-V kernel: which 32-bit word of the "args" storage buffer holds what.

One definition for both sides of the ABI: the compiler's SPIR-V lowering reads a parameter at
the words given here (compiler/targets/spirv/lowering.py), and the devices that run
SPIR-V-derived code (Vulkan, Metal) pack the words from the launcher's ctx words by the same
list (runtime/devices/spirv_abi.py, ArgsPlan). Being in the contract, it is covered by every
cache key: a change to the layout rebuilds every kernel instead of mixing layouts.

In parameter order (vector and matrix parameters are scalar parameters by then, one per
element):
- a scalar: one word, its value in the low 32 bits (an i8 or i16 sign-extended to 32 bits);
  a 64-bit scalar (i64, u64, f64) two words, low then high;
- an ndarray: one word per dimension, its extent, read as an i32 (the launcher refuses an
  array past 2**31 - 1 elements at bind: runtime/contract/extents.py);
then, for a kernel that draws random numbers, the random state: the seed and the launch
counter, 64 bits each, as four words (low then high of each).
"""
from __future__ import annotations

from typing import NamedTuple

# The SPIR-V specialization constant holding the iterations one dispatch of a serial range-for
# runs (0, the default: all of them). A device that stops long-running invocations (lavapipe
# stops one after 65,535 loop iterations) sets it and dispatches one workgroup per chunk, the
# chunk's number in WorkgroupId.x and 1 in WorkgroupId.y for the last (vkCmdDispatchBase).
SERIAL_CHUNK_SPEC_ID = 3
# A task whose bounds its prologue reads from device memory (its launch record's "grid_temp":
# T) can compute its own grid: a pipeline with GRID_BLOCK_SPEC_ID = B > 0 (the workgroup size
# of the task's own pipeline; 0, the default, runs the task) runs only the prologue, and its
# invocation 0 writes the VkDispatchIndirectCommand (min(ceil(n / B), GRID_CAP_SPEC_ID), 1, 1)
# of the task's n iterations into kernel temporaries T and T + 1 (three u32 words from byte
# 8*T), which the device's vkCmdDispatchIndirect of the task's pipeline reads.
GRID_BLOCK_SPEC_ID = 4
GRID_CAP_SPEC_ID = 5
GRID_TEMPS = 2  # the kernel temporaries a task's grid takes (three u32 words)
WIDE_TYPES = frozenset({"i64", "u64", "f64"})  # scalars that take two words
SIGN_EXTENDED_BITS = {"i8": 8, "i16": 16}        # scalars stored sign-extended to 32 bits
RANDOM_WORDS = 4                                 # seed, launch counter: two words each

VALUE = "value"    # a scalar's value (its low 32 bits)
HIGH = "high"      # the high 32 bits of a 64-bit scalar
EXTENT = "extent"  # an ndarray's extent along dimension `index`
RANDOM = "random"  # word `index` (0..3) of the random state


class ArgWord(NamedTuple):
    """One word of "args": what it holds (`source`), of which parameter (None: the random state),
    and which dimension or random word (`index`; 0 otherwise)."""
    source: str
    param: int | None
    index: int = 0


class ArgsLayout:
    """The "args" words of a kernel with parameters `params` (anything with `kind`, `dtype` (a
    DataType or its name) and `ndim`: the compiler's ir.Param, the artifact's ParamMeta) and, if
    `random`, the random state."""

    def __init__(self, params, random: bool = False):
        self.words: list[ArgWord] = []
        self.first: list[int] = []  # the first word of each parameter
        for i, p in enumerate(params):
            self.first.append(len(self.words))
            if p.kind == "ndarray":
                self.words += [ArgWord(EXTENT, i, d) for d in range(p.ndim)]
                continue
            self.words.append(ArgWord(VALUE, i))
            if dtype_name(p.dtype) in WIDE_TYPES:
                self.words.append(ArgWord(HIGH, i))
        self.random_first = len(self.words)  # where the random state's words begin (when it has them)
        if random:
            self.words += [ArgWord(RANDOM, None, k) for k in range(RANDOM_WORDS)]


def dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype.name


def arg_words(params) -> list[int]:
    """The first word of each parameter, then where the random state's words begin."""
    layout = ArgsLayout(params)
    return layout.first + [layout.random_first]
