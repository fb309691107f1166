"""The adstack heap layout and the overflow word: the one record codegen and runtime both read.

Heap (LLVM backends: cpu, cuda, amdgpu). One heap per runtime; thread t's slice starts at
`heap + t * stride`, stack s of the slice at `offset[s]` (stride and offsets are computed by
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

    def element_bytes(self, dtype: DataType | str) -> int:
        return (by_name(dtype) if isinstance(dtype, str) else dtype).nbytes

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
        return {"heap": self.name, "header_bytes": self.header_bytes, "align": self.align,
                "adjoint": "interleaved",
                "element_bytes": {t.name: self.element_bytes(t) for t in ALL_TYPES},
                "overflow": {"required": [REQUIRED_SHIFT, REQUIRED_BITS], "task": [TASK_SHIFT, TASK_BITS],
                             "stack": [STACK_SHIFT, STACK_BITS]}}


LLVM_HEAP = HeapLayout("llvm", header_bytes=8, align=8)


def check_record(record, kernel: str) -> None:
    """ValueError if a kernel's recorded layout is not the one this runtime lays out (entries
    written before the record existed have none, and were compiled for LLVM_HEAP)."""
    if record and record != LLVM_HEAP.record():
        raise ValueError(f"kernel '{kernel}' was compiled for another adstack heap layout ({record}); this "
                         f"runtime lays out {LLVM_HEAP.record()}. Recompile it with this version of qdc")
