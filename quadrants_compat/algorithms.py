"""`quadrants.algorithms`: the parallel algorithms Quadrants programs import by name.

qdc's own implementations come from `qdc.compiler.language.algorithms` where it has them; a name
qdc does not implement still imports (a program may import it for a path it never takes) and
raises, naming it, when it is used.
"""
from __future__ import annotations

import importlib

BLOCK_DIM = RADIX_DIGITS = 256  # the sort's block size and digits per 8-bit pass (Quadrants')
MAX_LOG256_MAX_N = 4  # 256**4 elements already pass what 32-bit indices address


def _implementation(name: str):
    try:
        module = importlib.import_module("qdc.compiler.language.algorithms")
    except ModuleNotFoundError:
        return None
    return getattr(module, name, None)


def _not_offered(name: str):
    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"quadrants.algorithms.{name} is not offered by qdc on this build")
    unavailable.__name__ = name
    return unavailable


def sort_scratch_slots(n: int, log256_max_n: int | None = None) -> int:
    """The u32 scratch slots a radix sort of `n` keys with scan depth `log256_max_n` uses: the
    tile histograms (256 per block of 256 keys) and the partials of each scan level (at least 1)."""
    if log256_max_n is None:
        log256_max_n, capacity = 1, RADIX_DIGITS
        while capacity < n:
            capacity, log256_max_n = capacity * RADIX_DIGITS, log256_max_n + 1
    if log256_max_n > MAX_LOG256_MAX_N:
        raise ValueError(f"log256_max_n={log256_max_n} exceeds {MAX_LOG256_MAX_N}: 256**{MAX_LOG256_MAX_N} keys "
                         f"already pass what 32-bit indices address")
    blocks = (n + BLOCK_DIM - 1) // BLOCK_DIM
    cursor = length = blocks * RADIX_DIGITS
    for _ in range(log256_max_n - 1):
        length = (length + BLOCK_DIM - 1) // BLOCK_DIM
        cursor += length
    return max(cursor, 1)


def __getattr__(name):
    found = _implementation(name)
    if found is not None:
        return found
    if name in ("sort", "reduce_add", "reduce_min", "reduce_max", "exclusive_scan_add", "select", "parallel_sort"):
        return _not_offered(name)
    raise AttributeError(f"quadrants.algorithms has no '{name}' on qdc")


_sort = _implementation("sort")
sort = _sort if _sort is not None else _not_offered("sort")
