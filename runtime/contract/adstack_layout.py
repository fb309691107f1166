"""The adstack heap layout and the overflow word: the one record codegen and runtime both read.

Heap (LLVM backends: cpu, cuda, amdgpu). One heap per runtime; thread t's slice starts at
`heap + t * stride` (GPUs interleave the slices instead: `HeapLayout.interleave`), stack s of the slice at `offset[s]` (stride and offsets are computed by
the runtime per launch, runtime/adstack_sizing.py, and reach the code as ctx words). A stack is
a `header_bytes` count (u64) followed by `capacity` entries; an entry is the primal value,
then (stacks with an adjoint) its adjoint right after it: interleaved, so a push or a pop
touches one place. Each type is stored at its own size (u1 as one byte). A stack's bytes are
rounded up to `align` so the next stack's count stays aligned.

Overflow word (one u64 per runtime; codegen writes it with an atomic unsigned max, the
runtime decodes it after the launch):

    bits 63..32  required capacity (the failing push's count + 1, saturated at 2^32 - 1)
    bits 31..16  task index in the kernel
    bits 15..0   stack index in KernelMeta.adstack["stacks"]

The unsigned max keeps the largest requirement seen, which is what the error reports. A kernel
whose task or stack indices do not fit is refused at compile time (`check_overflow_site`).
`LLVM_HEAP.record()` goes into KernelMeta.adstack["layout"] so that a runtime can tell a
kernel compiled for another layout (`check_record`).

Heaps (SPIR-V: vulkan), `SPIRV_HEAP_64` / `SPIRV_HEAP_32` (64- or 32-bit index arithmetic,
by whether the target has Int64). Two storage buffers of 4-byte elements: "adstack_float"
(f32 stacks; an entry is the primal then, stacks with an adjoint, its adjoint: interleaved)
and "adstack_int" (u32 words: i32 stacks, u1 widened to a word, and the 64-bit stacks, f64
and i64, each value two words, low then high; an f64 entry with an adjoint is four words,
primal low/high then adjoint low/high). No other element type fits (a compile error,
compiler/targets/base.py; f64/i64 only on targets with Float64/Int64). Every word of an entry
is its own element of the slice, so the interleaving below keeps the pushes of neighbouring
invocations coalesced word by word. Invocation i's slice is `stride[heap]` elements,
stack s at `offset[s]` in it, the slices interleaved element by element (`interleave`: element
r of invocation i at heap element `r * invocations + i`); a stack's count is a private variable of the shader,
not heap memory. The strides, offsets and capacities reach the shader through the
"adstack_meta" buffer, u32 words (`SPIRV_META`):

    word 0  float heap stride, in elements        word 1  int heap stride, in elements
    word 2  invocations the heaps hold (an invocation at or past it runs no iteration)
    word 3 + 2s, 4 + 2s   stack s: offset in its heap's elements, capacity in entries

The overflow word is the launch's error-slot word (runtime/device.py), encoded as above: with
Int64, one 64-bit atomic unsigned max; without, an unsigned max on each 32-bit half (then
the task/stack half may come from another failing push than the required half).
With 32-bit indices the runtime refuses, before dispatch, a launch whose
`stride * invocations` does not fit in u32 (`check_index_range`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .types import ALL_TYPES, DataType, by_name

# ---- the overflow word -------------------------------------------------------------------------
REQUIRED_SHIFT, REQUIRED_BITS = 32, 32
TASK_SHIFT, TASK_BITS = 16, 16
STACK_SHIFT, STACK_BITS = 0, 16
REQUIRED_MAX = (1 << REQUIRED_BITS) - 1
TASK_MAX = (1 << TASK_BITS) - 1
STACK_MAX = (1 << STACK_BITS) - 1


def fits_overflow_site(task: int, stack: int) -> bool:
    return 0 <= task <= TASK_MAX and 0 <= stack <= STACK_MAX


def overflow_site(task: int, stack: int) -> int:
    """The low bits of the word, a constant per push site (codegen ORs the required count in)."""
    if not fits_overflow_site(task, stack):
        raise ValueError(f"adstack overflow word: task {task} / stack {stack} beyond {TASK_MAX} / {STACK_MAX}")
    return (task << TASK_SHIFT) | (stack << STACK_SHIFT)


def encode_overflow(required: int, task: int, stack: int) -> int:
    return (min(required, REQUIRED_MAX) << REQUIRED_SHIFT) | overflow_site(task, stack)


def decode_overflow(code: int) -> tuple[int, int, int]:
    """(required, task, stack) of a nonzero overflow word."""
    return ((code >> REQUIRED_SHIFT) & REQUIRED_MAX, (code >> TASK_SHIFT) & TASK_MAX,
            (code >> STACK_SHIFT) & STACK_MAX)


# ---- the heap ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeapLayout:
    name: str
    header_bytes: int  # the count at the head of each stack
    align: int         # every stack's bytes are a multiple of this
    heaps: tuple = ("heap",)  # the heap buffers; `heap_of` says where a stack lives
    index_bits: int = 64      # width of the index arithmetic the code uses
    # 0: each thread's slice is `stride` contiguous bytes. G > 0: slices are interleaved in
    # granules of G bytes, so that the threads of a warp pushing entry j touch adjacent
    # addresses (coalesced): byte o of thread t's slice is at
    #     heap + (o // G) * (threads * G) + t * G + o % G,
    # `threads` being the slices the heap holds (the ctx word after the stacks' words). Same
    # bytes in all (threads * stride); no element straddles a granule (elements are aligned to
    # their size, stacks to `align`).
    interleave: int = 0

    def element_bytes(self, dtype: DataType | str) -> int:
        return (by_name(dtype) if isinstance(dtype, str) else dtype).nbytes

    def heap_of(self, dtype: DataType | str) -> int:
        return 0

    def adjoint_offset(self, dtype: DataType | str) -> int:
        """Bytes from an entry's primal to its adjoint (interleaved)."""
        return self.element_bytes(dtype)

    def entry_bytes(self, dtype: DataType | str, adjoint: bool) -> int:
        return self.element_bytes(dtype) * (2 if adjoint else 1)

    def stack_bytes(self, capacity: int, entry_bytes: int) -> int:
        return (capacity * entry_bytes + self.header_bytes + self.align - 1) & -self.align

    def stack_bytes_source(self, capacity: str, entry_bytes: int) -> str:
        """`stack_bytes` as Python source, for the sizing code generated per kernel."""
        return f"({capacity} * {entry_bytes} + {self.header_bytes + self.align - 1}) & {-self.align}"

    def record(self) -> dict:
        """What KernelMeta.adstack["layout"] holds (msgpack-able)."""
        record = {"heap": self.name, "header_bytes": self.header_bytes, "align": self.align,
                  "adjoint": "interleaved",
                  "element_bytes": {t.name: self.element_bytes(t) for t in ALL_TYPES},
                  "overflow": {"required": [REQUIRED_SHIFT, REQUIRED_BITS], "task": [TASK_SHIFT, TASK_BITS],
                               "stack": [STACK_SHIFT, STACK_BITS]}}
        if self.interleave:
            record["slices"] = {"interleave": self.interleave}
        return record


LLVM_HEAP = HeapLayout("llvm", header_bytes=8, align=8)
# GPUs (cuda, amdgpu): the same stacks, slices interleaved in 8-byte granules (coalesced pushes)
LLVM_HEAP_INTERLEAVED = HeapLayout("llvm", header_bytes=8, align=8, interleave=8)

# ---- SPIR-V ------------------------------------------------------------------------------------
# storable dtype -> (heap: 0 float, 1 int; bytes of one value: 4-byte words in the heap)
SPIRV_ELEMENT = {"f32": (0, 4), "i32": (1, 4), "u1": (1, 4), "f64": (1, 8), "i64": (1, 8)}
SPIRV_HEAP_NAMES = ("adstack_float", "adstack_int")


class SpirvMeta:
    """Word positions of the "adstack_meta" buffer (u32 words)."""
    FLOAT_STRIDE, INT_STRIDE, INVOCATIONS = 0, 1, 2

    @staticmethod
    def offset(stack: int) -> int:
        return 3 + 2 * stack

    @staticmethod
    def capacity(stack: int) -> int:
        return 4 + 2 * stack

    @staticmethod
    def words(stacks: int) -> int:
        return 3 + 2 * stacks


SPIRV_META = SpirvMeta()


@dataclass(frozen=True)
class SpirvHeapLayout(HeapLayout):
    def element_bytes(self, dtype: DataType | str) -> int:
        name = dtype if isinstance(dtype, str) else dtype.name
        if name not in SPIRV_ELEMENT:
            raise ValueError(f"a SPIR-V adstack cannot hold {name} (only {', '.join(SPIRV_ELEMENT)})")
        return SPIRV_ELEMENT[name][1]

    def heap_of(self, dtype: DataType | str) -> int:
        name = dtype if isinstance(dtype, str) else dtype.name
        self.element_bytes(name)
        return SPIRV_ELEMENT[name][0]

    def record(self) -> dict:
        return {"heap": self.name, "heaps": list(self.heaps), "index_bits": self.index_bits,
                "header_bytes": self.header_bytes, "align": self.align, "adjoint": "interleaved",
                "element_bytes": {name: size for name, (_, size) in SPIRV_ELEMENT.items()},
                "heap_of": {name: self.heaps[heap] for name, (heap, _) in SPIRV_ELEMENT.items()},
                "wide_values": "u32 words low then high, each its own interleaved element", "count": "private",
                "meta": {"float_stride": SpirvMeta.FLOAT_STRIDE, "int_stride": SpirvMeta.INT_STRIDE,
                         "invocations": SpirvMeta.INVOCATIONS, "stack": [3, 2]},
                "overflow": {"required": [REQUIRED_SHIFT, REQUIRED_BITS], "task": [TASK_SHIFT, TASK_BITS],
                             "stack": [STACK_SHIFT, STACK_BITS]}, "slices": {"interleave": self.interleave}}


SPIRV_HEAP_64 = SpirvHeapLayout("spirv", header_bytes=0, align=4, heaps=SPIRV_HEAP_NAMES, index_bits=64, interleave=4)
SPIRV_HEAP_32 = SpirvHeapLayout("spirv", header_bytes=0, align=4, heaps=SPIRV_HEAP_NAMES, index_bits=32, interleave=4)
U32_INDEX_LIMIT = 1 << 32  # elements a heap may span with 32-bit indices (tests lower it)


def spirv_heap(int64: bool) -> SpirvHeapLayout:
    return SPIRV_HEAP_64 if int64 else SPIRV_HEAP_32


def layout_of_record(record, kernel: str) -> HeapLayout:
    """The layout a kernel's code was generated for (entries written before the record existed
    have none, and were compiled for LLVM_HEAP); ValueError for one this runtime cannot lay out."""
    if not record:
        return LLVM_HEAP
    for known in (LLVM_HEAP, LLVM_HEAP_INTERLEAVED, SPIRV_HEAP_64, SPIRV_HEAP_32):
        if record == known.record():
            return known
    raise ValueError(f"kernel '{kernel}' was compiled for another adstack heap layout ({record}); this "
                     f"runtime lays out {LLVM_HEAP.record()} (or a SPIR-V layout). Recompile it with this "
                     f"version of qdc")


def check_record(record, kernel: str) -> None:
    """ValueError if a kernel's recorded layout is not one this runtime lays out."""
    layout_of_record(record, kernel)
