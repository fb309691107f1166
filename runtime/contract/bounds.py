"""Debug-mode bounds checks at launch: the error words a checked kernel reports into.

A kernel compiled with `debug=True` checks every index of every global access against its
dimension. The first failing access stores `check_id * MAX_AXES + axis + 1` into word 0 of
the launch's error buffer (ERROR_WORDS words of its error slot in device memory,
runtime/device.py) (compare-and-swap from 0, so the first failure wins) and the
offending index into word 1; the access itself goes to the scratch words 2-3 instead, so
memory outside a field or array is never touched. After the launch `finish` turns a
recorded failure into an IndexError naming the source location, kernel, target and index,
and clears the buffer so that the next launch starts clean; an asynchronous launch's buffer
is read at sync instead (`report`).

A kernel without checks (`meta.debug_checks` empty) gets none of this: no ctx word, no hook.
"""
from __future__ import annotations

import numpy as np

from .error_slot import BOUNDS_WORD

# Axes per access the failure code has room for (fields and ndarrays have at most 16).
MAX_AXES = 16
# Words of the error buffer: failure code, offending index, scratch element (8 bytes, aligned).
ERROR_WORDS = 4


class BoundsChecks:
    """The error buffer of one launcher and the `finish` hook that reports from it."""

    def __init__(self, meta):
        self.meta, self.words = meta, None
        self.error = None

    def attach(self, words: np.ndarray, error: np.ndarray | None, address: int) -> None:
        """Point the launcher's ctx (`words`) at its error buffer in device memory (`address`;
        `error`: its host view, None on devices without host memory, which report through
        `report`); the ndarray shape words are read back when reporting."""
        self.words, self.error = words, error
        words[self.meta.debug_slot] = address

    def finish(self) -> None:
        if self.error[0]:
            code, index = int(self.error[0]), int(self.error[1].astype(np.int64))
            self.error[:] = 0
            raise IndexError(self.message(code, index))

    def report(self, words: np.ndarray, ctx_words: np.ndarray):
        """The IndexError of an error slot's words (BOUNDS_WORD on), or None;
        `ctx_words` is the launch's ctx as it was launched."""
        code = int(words[BOUNDS_WORD])
        if not code:
            return None
        index = int(words[BOUNDS_WORD + 1:BOUNDS_WORD + 2].astype(np.int64)[0])
        return IndexError(self.message(code, index, ctx_words))

    def message(self, code: int, index: int, ctx_words=None) -> str:
        check, axis = divmod(code - 1, MAX_AXES)
        kind, name, is_grad, extent, where = self.meta.debug_checks[check]
        if kind == "field":
            shape = tuple(extent)
        else:
            slot = self.meta.params[extent].slot
            words = self.words if ctx_words is None else ctx_words
            shape = tuple(int(n) for n in words[slot + 1: slot + 1 + self.meta.params[extent].ndim])
        target = f"{kind} '{name}{'.grad' if is_grad else ''}'"
        on_axis = f" on axis {axis}" if len(shape) > 1 else ""
        prefix = f"{where}: " if where else ""
        return (f"{prefix}kernel '{self.meta.name}': index {index} out of range{on_axis} "
                f"for {target} of shape {shape}")

