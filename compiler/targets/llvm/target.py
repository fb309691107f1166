"""What an LLVM-based target (cpu, cuda, amdgpu) supplies to the shared lowering.

The lowering in this folder is target-neutral: it names no math library and no threading
runtime. A target deriving from `LlvmTarget` gives it
- `math_table`: IR math op -> how to emit it, either an LLVM intrinsic every backend of the
  target lowers (`Intrinsic("llvm.sqrt")`, overloaded on the float type) or a function the
  target declares and links (`External(f32_name, f64_name)`: the CPU's C math library, CUDA's
  libdevice), or `Inline(op)`: branch-free code the lowering defines in the module itself
  (inline_math.py), which the loop vectoriser can widen. f16 math is computed in f32, so a
  table has f32 and f64 names only.
- `emit_slice_index(mb, builder)`: the IR for "this thread's adstack heap slice number" (an
  i64, emitted once per function in its entry block): the worker thread number on the CPU,
  the global invocation id on GPUs.
`PORTABLE_MATH` holds the ops every LLVM backend lowers natively; a target adds the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

from qdc.runtime.contract.adstack_layout import LLVM_HEAP

from ..base import Target

# Math ops of the IR (Unary/Binary `op`) that go through the table, with their arity. `rsqrt`
# is 1 / sqrt; `min`/`max`/copysign and conversions are LLVM operations on every backend.
MATH_ARITY = {"sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "tanh": 1, "exp": 1,
              "log": 1, "sqrt": 1, "floor": 1, "ceil": 1, "round": 1, "abs": 1, "pow": 2, "atan2": 2,
              "frem": 2}


@dataclass(frozen=True)
class Intrinsic:
    """An LLVM intrinsic overloaded on the float type: `llvm.sin` is called as `llvm.sin.f32`."""
    name: str


@dataclass(frozen=True)
class External:
    """A function the target declares and links, one name per float width."""
    f32: str
    f64: str

    def name_for(self, bits: int) -> str:
        return self.f32 if bits == 32 else self.f64


@dataclass(frozen=True)
class PerWidth:
    """One implementation for f32 and another for f64 (each an Intrinsic, External or Inline)."""
    f32: object
    f64: object

    def for_bits(self, bits: int):
        return self.f32 if bits == 32 else self.f64


@dataclass(frozen=True)
class Inline:
    """`op` as branch-free IR defined in the kernel's module and inlined (inline_math.py)."""
    op: str


# The ops inline_math.py defines (declared here, where a target's table can name them without
# importing llvmlite: option validation and cache keys import the targets).
INLINE_MATH_OPS = ("sin", "cos", "tan", "asin", "acos", "atan", "tanh", "exp", "log", "pow", "atan2")

# round is round-half-to-even (numpy, Quadrants): llvm.rint in the default rounding mode.
PORTABLE_MATH = {"sqrt": Intrinsic("llvm.sqrt"), "floor": Intrinsic("llvm.floor"), "ceil": Intrinsic("llvm.ceil"),
                 "round": Intrinsic("llvm.rint"), "abs": Intrinsic("llvm.fabs")}


class LlvmTarget(Target):
    """A target built on the shared LLVM lowering (compiler/targets/llvm/llvm_ir.py)."""
    math_table: dict = PORTABLE_MATH
    # The table for math inside a loop that carries state from one iteration to the next
    # (llvm_arith.carries_state), which no vectoriser widens; None: `math_table` everywhere.
    chain_math_table: dict | None = None
    heap_layout = LLVM_HEAP

    def emit_slice_index(self, mb, builder):
        """An i64: the number of the heap slice the calling thread owns."""
        raise NotImplementedError

    def compile(self, kernel, meta, opts) -> dict:
        artifacts = super().compile(kernel, meta, opts)
        if meta.adstack.get("stacks"):  # the layout the code was generated for, which the runtime checks
            meta.adstack["layout"] = self.heap_layout.record()
        return artifacts
