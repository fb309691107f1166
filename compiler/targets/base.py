"""The interface every compiler target implements, and what a target declares about itself.

A target turns an offloaded, optimised kernel (one IR for every backend) into the artifacts
its runtime device loads. It declares its capabilities (what the generated code may use), the
description that enters the cache key, the source folders its code comes from (the compiler
fingerprint of its cache entries covers those and the backend-neutral stages, nothing else),
and how it launches a task (which adstack sizing needs, without importing any target).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir


@dataclass(frozen=True)
class Capabilities:
    int64: bool = True
    float64: bool = True
    float_atomic_add: bool = True
    # Adstack element types the target can store (None: any IR type).
    adstack_dtypes: frozenset | None = None
    max_workgroup_size: int | None = None
    subgroup_size: int | None = None


class Target:
    """One arch's code generator. Subclasses live in compiler/targets/<arch>/target.py."""
    arch: str = ""
    capabilities = Capabilities()
    # Folders under compiler/targets/ whose sources make up this target (own and shared).
    source_folders: tuple = ()

    def cache_description(self, opts) -> str:
        """Everything about the target that changes generated code (ISA level, sm_XX, gfx list...)."""
        raise NotImplementedError

    def parallel_from(self, task: ir.Task) -> int:
        """The least trip count from which `task` runs on more than one thread slice (0: never).
        Adstack sizing records it so the runtime sizes heaps for the slices really dispatched."""
        raise NotImplementedError

    def compile(self, kernel: ir.KernelIR, meta, opts) -> dict:
        """Artifacts (name -> bytes) for `kernel`; may add target records to `meta`."""
        raise NotImplementedError
