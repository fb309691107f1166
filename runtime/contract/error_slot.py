"""The words of one launch's error slot in device memory (runtime/device.py hands each launch
in flight its own): generated code stores into them, the runtime reads them at sync and raises
naming the kernel. A kernel finds its slot's words through its ctx words (KernelMeta's
adstack_slot + 2 and debug_slot, runtime/contract/artifact.py)."""

OVERFLOW_WORD = 0       # adstack overflow code (runtime/contract/adstack_layout.py's encoding), 0 when none
BOUNDS_WORD = 1         # first of the bounds-check words (runtime/contract/bounds.py, ERROR_WORDS of them)
ERROR_SLOT_WORDS = 8    # 64 bytes: a slot per cache line
