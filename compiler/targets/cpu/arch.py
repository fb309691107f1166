"""Constants the CPU target and its code generator share. Pure data, no llvmlite."""
from __future__ import annotations

# Iterations x per-iteration cost below which a range runs on one thread (~10 µs of work).
PARALLEL_WORK_THRESHOLD = 20000
