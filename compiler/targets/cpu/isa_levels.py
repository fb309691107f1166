"""What `cpu_target` (docs/api.md, Configuration) means: the CPU levels a kernel's native code is built for.

    portable  one library per ISA level of the architecture family (x86-64-v2/v3/v4 on x86,
              armv8-a / armv8.2-a / armv8.2-a+SVE on aarch64); the runtime loads the best one
              the host supports. The default of `qdc build`.
    native    the build host's CPU, all of its features. The default of direct mode.
    NAME      an ISA level above, or an LLVM CPU name whose ISA level qdc knows (`haswell`,
              `znver4`, `neoverse-n1`, ...).

Each library's entry record lists the CPU features its code needs (`requires`, LLVM feature
names), so a host without them gets a clear CacheError instead of an illegal instruction.
The runtime detects those features (HOST_FEATURE_SOURCES of runtime/contract/cpu_features.py
covers every name used here).

What `cpu_targets` (docs/api.md, Configuration) means: the platforms (ISA family and operating system) CPU code
is built for, each its own library of the levels above, all in one cache entry; the runtime
loads the one of its host's platform. An ISA family names every platform qdc deploys it on
(`aarch64`: Linux and macOS); `aarch64-linux` names one. Unset: the host's platform alone.
Pure data, no llvmlite: option validation imports it.
"""
from __future__ import annotations

from typing import NamedTuple

PORTABLE, NATIVE = "portable", "native"


class CpuLevel(NamedTuple):
    name: str           # recorded in entries and shown in errors: "x86-64-v3"
    llvm_cpu: str       # the CPU LLVM generates code for
    llvm_features: str  # extra LLVM feature flags on top of that CPU's own
    requires: tuple     # features the host must have to run the code (LLVM names)


_X86_V2 = ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_X86_V3 = _X86_V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_X86_V4 = _X86_V3 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
_ARM_V8 = ("fp-armv8", "neon")
_ARM_V82 = _ARM_V8 + ("crc", "dotprod", "fullfp16", "lse", "rdm")

# Lowest first: the runtime takes the last one the host can run. One library holds the code
# of every level (multiversion.py); the lowest is the code that runs until the runtime chooses.
LEVELS = {
    "x86_64": (
        CpuLevel("x86-64-v2", "x86-64-v2", "", _X86_V2),
        CpuLevel("x86-64-v3", "x86-64-v3", "", _X86_V3),
        # LLVM tunes x86-64-v4 for 256-bit vectors (Skylake-X clocks down on zmm); the level
        # exists for AVX-512, and the CPUs that have it today (Zen 4/5, Sapphire Rapids on) run
        # 512-bit vectors at full speed, so let the vectoriser use zmm registers.
        CpuLevel("x86-64-v4", "x86-64-v4", "-prefer-256-bit", _X86_V4),
    ),
    "aarch64": (
        CpuLevel("armv8-a", "generic", "+" + ",+".join(_ARM_V8), _ARM_V8),
        CpuLevel("armv8.2-a", "generic", "+" + ",+".join(_ARM_V82), _ARM_V82),
        CpuLevel("armv8.2-a+sve", "generic", "+" + ",+".join(_ARM_V82 + ("sve",)), _ARM_V82 + ("sve",)),
    ),
}
# What makes a task body whose optimised IR is the same at a level and the one below it compile to
# different code at the higher level (multiversion.equal_levels keeps such a body per level; any
# other runs the lower level's code, valid on the higher level's CPUs), as regular expressions
# over the body's IR. A level not named here shares no body.
_X86_SENSITIVE = r"\b(contract|fast|reassoc|afn)\b|@llvm\.(fma|fmuladd|ctpop|ctlz|cttz)\b|\bhalf\b"
LEVEL_SENSITIVE = {
    # Fused multiply-adds where the flags allow contraction, bit counts, f16 conversions (F16C).
    "x86-64-v3": _X86_SENSITIVE,
    "x86-64-v4": _X86_SENSITIVE,
    # Half-precision arithmetic (FEAT_FP16). FMA, bit counts and f16 conversions are armv8-a's
    # already. LSE atomics are left out: most bodies end with the atomic that combines their
    # partial results, so counting them would emit nearly every body twice for contended atomics
    # alone; such bodies run armv8-a's load/store-exclusive loops on every level.
    "armv8.2-a": r"\bhalf\b",
    # What LLVM lowers to SVE instructions even on NEON-sized vectors: 64-bit lanes' multiply,
    # min/max and bit counts, vector division and remainder.
    "armv8.2-a+sve": r"x i64>|\b[su](div|rem) <|@llvm\.(ctpop|ctlz|cttz)\.v",
}

# What makes LLVM's optimiser treat IR differently at a level than at the level below it (the
# cost model it asks differs there), for the levels where that is little: a task body with none
# of it, in itself or in any function it may call, made from the same chunk as at the level
# below, is optimised once, at the lower level, and the level runs that code (multiversion.py),
# as it would once the equal optimised bodies were found (LEVEL_SENSITIVE). armv8.2-a adds half
# arithmetic (FEAT_FP16) and the dot products that the vectorisers make of reductions of
# extended i8 values (FEAT_DotProd); its LSE atomics, CRC and RDM matter to code generation only.
OPTIMISED_ALIKE_UNLESS = {
    "armv8.2-a": r"\bhalf\b|\b[sz]ext (<\d+ x )?i8\b",
}

# Other architectures: one library for the generic CPU of the family.
GENERIC = CpuLevel("generic", "generic", "", ())

# LLVM CPU names by the ISA level whose features they have (their code is recorded as needing
# that level's features; LLVM emits nothing beyond them for qdc's kernels). Not every name LLVM
# knows: an unknown name is refused rather than recorded with requirements qdc cannot state.
_KNOWN_CPUS = {
    "x86-64-v2": "nehalem corei7 westmere sandybridge corei7-avx ivybridge core-avx-i silvermont slm goldmont "
                 "goldmont-plus tremont btver2 bdver1 bdver2 bdver3",
    "x86-64-v3": "haswell core-avx2 broadwell skylake alderlake raptorlake meteorlake arrowlake arrowlake-s "
                 "lunarlake gracemont sierraforest grandridge clearwaterforest pantherlake bdver4 znver1 znver2 "
                 "znver3",
    "x86-64-v4": "skylake-avx512 skx cascadelake cooperlake cannonlake icelake-client icelake-server tigerlake "
                 "rocketlake sapphirerapids emeraldrapids graniterapids graniterapids-d diamondrapids znver4 znver5",
    "armv8-a": "cortex-a53 cortex-a57 cortex-a72 cortex-a73 thunderx2t99",
    "armv8.2-a": "cortex-a55 cortex-a75 cortex-a76 cortex-a77 cortex-a78 neoverse-n1 apple-m1 apple-m2 apple-m3",
    "armv8.2-a+sve": "neoverse-v1 neoverse-n2 neoverse-v2",
}
CPU_LEVEL_OF = {cpu: level for level, names in _KNOWN_CPUS.items() for cpu in names.split()}


class CpuPlatform(NamedTuple):
    name: str      # what `cpu_targets` and the library records call it: "aarch64-linux"
    machine: str   # the ISA family, a key of LEVELS
    os: str        # "linux" or "macos" (runtime/contract/cpu_features.py, host_os)
    triple: str    # LLVM's target triple
    artifact: str  # the artifact kind of its library in a cache entry


PLATFORMS = {p.name: p for p in (
    CpuPlatform("x86_64-linux", "x86_64", "linux", "x86_64-unknown-linux-gnu", "so"),
    CpuPlatform("aarch64-linux", "aarch64", "linux", "aarch64-unknown-linux-gnu", "so_aarch64"),
    # macOS 11 is the first release for Apple silicon.
    CpuPlatform("aarch64-macos", "aarch64", "macos", "arm64-apple-macosx11.0.0", "dylib_arm64"),
)}
FAMILIES = {"x86_64": ("x86_64-linux",), "aarch64": ("aarch64-linux", "aarch64-macos")}


def parse_cpu_targets(value) -> tuple[str, ...] | None:
    """The platform names `value` builds (None: unset, the host's platform), in PLATFORMS'
    order whatever the order given, so that one set of platforms is one cache key; ValueError
    naming an unknown one."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ValueError(f"cpu_targets must be ISA families such as 'x86_64,aarch64', comma-separated or a list, "
                         f"got {value!r}")
    chosen = set()
    for name in (n.strip() for n in names):
        found = FAMILIES.get(name) or ((name,) if name in PLATFORMS else None)
        if found is None:
            known = ", ".join([*FAMILIES, *PLATFORMS])
            raise ValueError(f"cpu_targets: unknown CPU target {name!r} (known: {known})")
        chosen.update(found)
    if not chosen:
        raise ValueError("cpu_targets names no CPU target")
    return tuple(name for name in PLATFORMS if name in chosen)


# Every arm64 Mac has an Apple M1 or a later core (ARMv8.5-A, with all of armv8.2-a and no SVE):
# macOS arm64 code is one level, tuned for the M1, which needs nothing the runtime must check
# beyond NEON (and costs a third of a three-level library to build).
APPLE_SILICON = CpuLevel("apple-m1", "apple-m1", "", _ARM_V8)


def platform_levels(platform: CpuPlatform) -> tuple:
    """The levels of a portable build for `platform`: its family's; one for Apple silicon."""
    if platform.name == "aarch64-macos":
        return (APPLE_SILICON,)
    return LEVELS.get(platform.machine, (GENERIC,))


def check_cpu_targets(value) -> None:
    parse_cpu_targets(value)


def level_by_name(name: str) -> tuple[str, CpuLevel] | None:
    """(architecture family, level) of an ISA level name, or None."""
    for machine, levels in LEVELS.items():
        for level in levels:
            if level.name == name:
                return machine, level
    return None


def check_cpu_target(value) -> None:
    """ValueError unless `value` is portable, native, an ISA level or a known LLVM CPU name."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"cpu_target must be a string such as 'portable', got {type(value).__name__}")
    if value in (None, PORTABLE, NATIVE) or value in CPU_LEVEL_OF or level_by_name(value) is not None:
        return
    levels = ", ".join(level.name for levels in LEVELS.values() for level in levels)
    raise ValueError(f"unknown cpu_target {value!r}: use 'portable', 'native', an ISA level ({levels}) or an "
                     f"LLVM CPU name qdc knows the level of (e.g. haswell, znver4, skylake-avx512, neoverse-n1)")
