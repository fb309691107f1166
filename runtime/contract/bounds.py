"""Debug-mode bounds checks at launch: the error words a checked kernel reports into.

A kernel compiled with `debug=True` checks every index of every global access against its
dimension. The first failing access stores `check_id * MAX_AXES + axis + 1` into word 0 of
the launcher's error buffer (compare-and-swap from 0, so the first failure wins) and the
offending index into word 1; the access itself goes to the scratch words 2-3 instead, so
memory outside a field or array is never touched. After the launch `finish` turns a
recorded failure into an IndexError naming the source location, kernel, target and index,
and clears the buffer so that the next launch starts clean.

A kernel without checks (`meta.debug_checks` empty) gets none of this: no ctx word, no hook.
"""
from __future__ import annotations

import numpy as np

# Axes per access the failure code has room for (fields and ndarrays have at most 16).
MAX_AXES = 16
# Words of the error buffer: failure code, offending index, scratch element (8 bytes, aligned).
ERROR_WORDS = 4


class BoundsChecks:
    """The error buffer of one launcher and the `finish` hook that reports from it."""

    def __init__(self, meta):
        self.meta, self.words = meta, None
        self.error = np.zeros(ERROR_WORDS, np.int64)

    def attach(self, words: np.ndarray) -> None:
        """Point the launcher's ctx (`words`) at the error buffer; its ndarray shape words
        are read back when reporting."""
        self.words = words
        words[self.meta.debug_slot] = self.error.ctypes.data

    def finish(self) -> None:
        if self.error[0]:
            code, index = int(self.error[0]), int(self.error[1])
            self.error[:] = 0
            raise IndexError(self.message(code, index))

    def message(self, code: int, index: int) -> str:
        check, axis = divmod(code - 1, MAX_AXES)
        kind, name, is_grad, extent, where = self.meta.debug_checks[check]
        if kind == "field":
            shape = tuple(extent)
        else:
            slot = self.meta.params[extent].slot
            shape = tuple(int(n) for n in self.words[slot + 1: slot + 1 + self.meta.params[extent].ndim])
        target = f"{kind} '{name}{'.grad' if is_grad else ''}'"
        on_axis = f" on axis {axis}" if len(shape) > 1 else ""
        prefix = f"{where}: " if where else ""
        return (f"{prefix}kernel '{self.meta.name}': index {index} out of range{on_axis} "
                f"for {target} of shape {shape}")

