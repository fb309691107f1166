"""The CPU platforms and levels a `cpu_target` / `cpu_targets` builds, and the cache key's
description of them. LLVM is asked only about the host's own CPU (`native`) or an unknown
platform: the description of portable code needs no llvmlite, so that an offline process
(compiler/jit/offline_cache.py) computes cache keys without loading LLVM."""
from __future__ import annotations

import functools

from qdc.runtime.contract.cpu_features import HOST_FEATURE_SOURCES, host_machine, host_os

from .isa_levels import (CPU_LEVEL_OF, NATIVE, PLATFORMS, PORTABLE, CpuLevel, CpuPlatform,
                         check_cpu_target, level_by_name, parse_cpu_targets, platform_levels)
from .. import lld


@functools.lru_cache(maxsize=None)
def host_platform() -> CpuPlatform:
    """The platform this process runs on: the PLATFORMS one of its ISA family and operating
    system, else one of its own (another family: one generic library, isa_levels.GENERIC)."""
    machine, os_name = host_machine(), host_os()
    known = PLATFORMS.get(f"{machine}-{os_name}")
    if known is not None:
        return known
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    kind = ("dylib_" if os_name == "macos" else "so_") + machine.replace("-", "_")[:10]
    return CpuPlatform(f"{machine}-{os_name}", machine, os_name, llvm.get_process_triple(), kind)


def cpu_platforms(cpu_targets) -> tuple[CpuPlatform, ...]:
    """The platforms `cpu_targets` builds libraries for (unset: the host's), in PLATFORMS' order."""
    names = parse_cpu_targets(cpu_targets)
    return (host_platform(),) if names is None else tuple(PLATFORMS[name] for name in names)


@functools.lru_cache(maxsize=None)
def cpu_levels(cpu_target: str, platform: CpuPlatform | None = None) -> tuple[CpuLevel, ...]:
    """The levels `cpu_target` builds for `platform` (compiler/targets/cpu/isa_levels.py; default:
    the host's), lowest level first."""
    platform = platform or host_platform()
    machine = platform.machine
    if cpu_target == PORTABLE:
        return platform_levels(platform)
    if cpu_target == NATIVE:
        if platform != host_platform():
            raise ValueError(f"cpu_target 'native' is this machine's CPU, which cannot run {platform.name} code: build "
                             f"with cpu_target 'portable' (the default of `qdc build`) for cpu_targets beyond "
                             f"this machine's")
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        features = llvm.get_host_cpu_features().flatten()
        needed = sorted(f[1:] for f in features.split(",") if f[:1] == "+" and f[1:] in HOST_FEATURE_SOURCES)
        cpu = llvm.get_host_cpu_name()
        return (CpuLevel(cpu, cpu, features, tuple(needed)),)
    check_cpu_target(cpu_target)  # an ISA level or a CPU name whose level is known, else ValueError
    level_machine, level = level_by_name(CPU_LEVEL_OF.get(cpu_target, cpu_target))
    if level_machine != machine and platform == host_platform():
        raise ValueError(f"cpu_target '{cpu_target}' is for {level_machine} CPUs, but this compiler generates "
                         f"{machine} code")
    if level_machine != machine:
        raise ValueError(f"cpu_target '{cpu_target}' is for {level_machine} CPUs: it cannot build the {platform.name} "
                         f"library of cpu_targets (use cpu_target 'portable', the default of `qdc build`)")
    if cpu_target == level.name:
        return (level,)
    return (CpuLevel(cpu_target, cpu_target, "", level.requires),)


# A platform whose library a portable build makes from another platform's optimised IR at one
# of its levels, where it builds both (compiler/targets/cpu/retarget.py): every Apple silicon
# core runs armv8.2-a code, and the aarch64 platforms generate the same IR but for the data
# layout, so macOS's library costs its emission and link, not a second optimisation.
OPTIMISED_WITH = {"aarch64-macos": ("aarch64-linux", "armv8.2-a")}


def optimised_with(platform: CpuPlatform, cpu_target: str, chosen: tuple) -> tuple[str | None, str | None]:
    """(platform name, level name) whose optimised IR makes `platform`'s library in a build of
    `cpu_target` for the platforms `chosen`; (None, None): its own."""
    found = OPTIMISED_WITH.get(platform.name)
    if cpu_target != PORTABLE or found is None or PLATFORMS[found[0]] not in chosen:
        return None, None
    return found


@functools.lru_cache(maxsize=None)
def target_description(cpu_target: str = NATIVE, cpu_targets=None) -> str:
    """Goes into the cache key: code built for one CPU is not reused on another. Portable code
    does not depend on the build host's CPU, only on the triples and the levels it is built
    for, on the platform whose optimised IR makes another's library (OPTIMISED_WITH), and on
    the linker (LLD's version; none named where the host's system linker links).
    Kept per process (asking LLVM for the host's features takes ~0.5 ms, twice per kernel built)."""
    if cpu_target == NATIVE and cpu_targets is None:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        return (f"{llvm.get_process_triple()}/{llvm.get_host_cpu_name()}/{llvm.get_host_cpu_features().flatten()}"
                f"{_host_linker()}")
    parts = []
    chosen = cpu_platforms(cpu_targets)
    for platform in chosen:
        levels = [[lvl.name, lvl.llvm_cpu, lvl.llvm_features, list(lvl.requires)]
                  for lvl in cpu_levels(cpu_target, platform)]
        linker = _host_linker() if platform == host_platform() else "/" + _cross_linker(platform)
        source, level = optimised_with(platform, cpu_target, chosen)
        reused = f"/optimised as {source} {level}" if source else ""
        parts.append(f"{platform.triple}/{cpu_target}/{levels}{linker}{reused}")
    return ";".join(parts)


def _host_linker() -> str:
    """"/lld-N" where LLD links the host's own libraries, "" where its system linker does."""
    from .host_linker import host_linker
    linker = host_linker()
    return f"/{linker}" if linker else ""


def _cross_linker(platform: CpuPlatform) -> str:
    found = lld.find("ld64.lld" if platform.os == "macos" else "ld.lld")
    return f"lld-{found[1]}" if found else "no-lld"
