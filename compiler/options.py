"""Compile/runtime options (API.md §5): one dataclass, filled from defaults, files and flags."""
from __future__ import annotations

import dataclasses
import os

from qdc.runtime import types as T

ARCHES = ("cpu", "cuda", "vulkan", "metal", "amdgpu")


@dataclasses.dataclass
class Options:
    arch: str = "cpu"
    opt_level: int = 3
    fast_math: bool = False
    default_fp: T.DataType = T.f32
    default_ip: T.DataType = T.i32
    debug: bool = False
    ad_stack_size: int = 0
    default_ad_stack_size: int = 256
    ad_stack_strict: bool = False
    cache_dir: str | None = None
    cpu_max_num_threads: int | None = None

    # Options that change generated code: part of every cache key.
    CODE_AFFECTING = ("opt_level", "fast_math", "default_fp", "default_ip", "debug",
                      "ad_stack_size", "default_ad_stack_size", "ad_stack_strict")

    def update(self, **kw) -> "Options":
        for name, value in kw.items():
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise TypeError(f"unknown qdc option '{name}'")
            if name in ("default_fp", "default_ip") and isinstance(value, str):
                value = T.by_name(value)
            if name == "arch" and not isinstance(value, str):
                value = str(value)
            setattr(self, name, value)
        self.validate()
        return self

    def validate(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"unknown arch '{self.arch}' (choose from {', '.join(ARCHES)})")
        if not 0 <= int(self.opt_level) <= 3:
            raise ValueError("opt_level must be 0..3")
        if not self.default_fp.is_float:
            raise ValueError("default_fp must be a float type")
        if self.default_ip.is_float or self.default_ip is T.u1:
            raise ValueError("default_ip must be an integer type")
        if self.ad_stack_size < 0 or self.default_ad_stack_size <= 0:
            raise ValueError("ad_stack_size must be >= 0 and default_ad_stack_size > 0")

    def key(self) -> dict:
        return {n: (getattr(self, n).name if isinstance(getattr(self, n), T.DataType) else getattr(self, n))
                for n in self.CODE_AFFECTING}

    @property
    def resolved_cache_dir(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "qdc")


current = Options()
