"""The SPIR-V kernel ABI's host side, shared by the devices that run SPIR-V-derived code
(vulkan/, metal/): the "args" words (laid out as contract/spirv_args.py says), which ctx word
gives each binding's buffer, the "adstack_meta" words, and the 2-D grid
(compiler/targets/vulkan/target.py has the ABI)."""
from __future__ import annotations

import sys

import numpy as np

from ..contract import adstack_layout
from ..contract.error_slot import BOUNDS_WORD, OVERFLOW_WORD
from ..contract.spirv_args import EXTENT, HIGH, RANDOM, SIGN_EXTENDED_BITS, VALUE, ArgsLayout

# Adstack resources (adstack_layout's SPIR-V record): the heaps' addresses are the ctx words
# adstack_slot + 0 / + 1 (runtime/adstack_sizing.py writes them); "adstack_meta" is written per
# launch, from the ctx words.
HEAP_WORDS = {"adstack_float": 0, "adstack_int": 1}
# Where the low and high 32 bits of a 64-bit ctx word lie when it is seen as two 32-bit words.
LOW_HALF, HIGH_HALF = (0, 1) if sys.byteorder == "little" else (1, 0)


class ArgsPlan:
    """How the "args" words (their layout: contract/spirv_args.py, which the compiler reads them
    by) come from the launcher's ctx words, which hold each scalar in its word's low bytes, zero
    above, each ndarray's shape after its pointer, and the random state's two 64-bit words at
    the kernel's random slot."""

    def __init__(self, meta):
        layout = ArgsLayout(meta.params, meta.random_slot is not None)
        # Each args word is one 32-bit half of a ctx word, so packing is one gather from the ctx seen as 32-bit words; only 8/16-bit signed
        # scalars are sign-extended after it.
        gather, self.narrow = [], []
        for position, word in enumerate(layout.words):
            if word.source == RANDOM:
                slot, high = meta.random_slot + word.index // 2, word.index % 2
            else:
                p = meta.params[word.param]
                slot = p.slot + 1 + word.index if word.source == EXTENT else p.slot
                high = word.source == HIGH
                if word.source == VALUE and p.dtype in SIGN_EXTENDED_BITS:
                    self.narrow.append((position, SIGN_EXTENDED_BITS[p.dtype]))
            gather.append(2 * slot + (HIGH_HALF if high else LOW_HALF))
        self.gather = np.array(gather, np.intp)
        self.nbytes = max(4 * len(self.gather), 4)

    def pack(self, ctx: np.ndarray) -> np.ndarray:
        """The args words (np.uint32) for the ctx words `ctx` (np.uint64)."""
        out = np.empty(len(self.gather), np.uint32)
        self.pack_into(ctx, out)
        return out

    def pack_into(self, ctx: np.ndarray, out: np.ndarray) -> None:
        """Write the args words for the ctx words `ctx` into `out` (np.uint32, one per word)."""
        np.take(ctx.view(np.uint32), self.gather, out=out)
        for position, nbits in self.narrow:
            v = int(out[position]) & ((1 << nbits) - 1)
            out[position] = (v - (1 << nbits)) & 0xFFFFFFFF if v >> (nbits - 1) else v


def resolve_binding_word(meta, resource: str, index: int):
    """(ctx word, byte adjustment) whose value is the device address a binding refers to; None for
    the device-owned "args" and adstack buffers that have no ctx word of their own."""
    if resource == "field":
        return meta.field_slot0 + index, 0
    if resource == "ndarray":
        return meta.params[index].slot, 0
    if resource == "ndarray_grad":
        p = meta.params[index]
        return p.slot + 1 + p.ndim, 0
    if resource == "temps":
        return meta.temps_slot, 0
    if resource == "print":
        return meta.print_slot, 0
    if resource == "errors":  # the slot's start, from whichever error word pointer the kernel has
        if meta.debug_slot is not None:
            return meta.debug_slot, -8 * BOUNDS_WORD
        if meta.adstack_slot is not None:
            return meta.adstack_slot + 2, -8 * OVERFLOW_WORD
        return None
    return None


def dispatch_grid(groups: int, max_count: tuple) -> tuple:
    """(x, y) workgroups covering `groups`: 1-D up to maxComputeWorkGroupCount[0], then 2-D
    (the shader folds y into its invocation id); beyond x*y the grid-stride loop covers the rest."""
    if groups <= max_count[0]:
        return groups, 1
    x = max_count[0]
    return x, min(-(-groups // x), max_count[1])


_META_PLANS: dict = {}  # id(meta) -> (meta, slot, per stack (heap, entry bytes), invocations word)


def _meta_plan(meta):
    plan = _META_PLANS.get(id(meta))
    if plan is None or plan[0] is not meta:
        heap_layout = adstack_layout.layout_of_record(meta.adstack.get("layout"), meta.name)
        stacks = [(heap_layout.heap_of(r["dtype"]), heap_layout.entry_bytes(r["dtype"], r["adjoint"]))
                  for r in meta.adstack.get("stacks") or []]
        plan = _META_PLANS[id(meta)] = (meta, meta.adstack_slot, stacks, meta.adstack_threads_slot)
    return plan


def adstack_meta_words(meta, ctx, what: str) -> np.ndarray:
    """The "adstack_meta" u32 words (adstack_layout.SPIRV_META) of a launch, from the ctx words
    the adstack sizing wrote: per heap the stride (the largest offset + size of its stacks), the
    invocations the heaps hold, per stack its offset (elements) and capacity."""
    _, slot, stacks, invocations_word = _meta_plan(meta)
    words = [0, 0, int(ctx[invocations_word])]
    for s, (heap, entry) in enumerate(stacks):
        offset, capacity = int(ctx[slot + 3 + 2 * s]), int(ctx[slot + 4 + 2 * s])
        words[heap] = max(words[heap], (offset + capacity * entry) // 4)
        words += [offset // 4, capacity]
    if max(words) > 0xFFFFFFFF:
        raise ValueError(f"{what}: its adstack layout ({words[:3]}...) does not fit the 32-bit words of "
                         f"adstack_meta: lower the adstack capacity (qd.init(ad_stack_size=N))")
    return np.array(words, np.uint32)
