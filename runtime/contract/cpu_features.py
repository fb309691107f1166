"""The CPU library record's machine and feature names (KernelMeta.cpu_libraries): the
compiler records, per library, the architecture family it was built for and the features its
code needs, as LLVM names them; the runtime picks the best library whose needs the host meets
(runtime/devices/cpu/device.py detects the features through HOST_FEATURE_SOURCES)."""
from __future__ import annotations

import platform
import sys

# Where each feature is read from: numpy's CPUID-based detection (what the CPU really
# executes, also under an emulator, and only what the OS enabled), then /proc/cpuinfo on Linux
# or sysctl on macOS for the features numpy does not report (older numpy reports fewer).
# Feature name -> (numpy key, /proc/cpuinfo flag, macOS sysctl: "machdep:TOKEN" or a hw key).
# Only features LLVM can use in ordinary code: a native build records the ones its CPU has,
# and instructions reached only through intrinsics (aes, sha, rdrand, ...) are never emitted
# for kernels (a hypervisor may also hide them from /proc/cpuinfo while CPUID reports them).
HOST_FEATURE_SOURCES = {
    # x86-64
    "sse3": ("SSE3", "pni", "machdep:SSE3"),
    "ssse3": ("SSSE3", "ssse3", "machdep:SSSE3"),
    "sse4.1": ("SSE41", "sse4_1", "machdep:SSE4.1"),
    "sse4.2": ("SSE42", "sse4_2", "machdep:SSE4.2"),
    "popcnt": ("POPCNT", "popcnt", "machdep:POPCNT"),
    "cx16": ("CX16", "cx16", "machdep:CX16"),
    "sahf": ("LAHF", "lahf_lm", "machdep:LAHF"),
    "avx": ("AVX", "avx", "machdep:AVX1.0"),
    "avx2": ("AVX2", "avx2", "machdep:AVX2"),
    "bmi": ("BMI", "bmi1", "machdep:BMI1"),
    "bmi2": ("BMI2", "bmi2", "machdep:BMI2"),
    "f16c": ("F16C", "f16c", "machdep:F16C"),
    "fma": ("FMA3", "fma", "machdep:FMA"),
    "lzcnt": ("LZCNT", "abm", "machdep:LZCNT"),
    "movbe": ("MOVBE", "movbe", "machdep:MOVBE"),
    "xsave": ("AVX", "xsave", "machdep:XSAVE"),  # usable AVX means the OS has XSAVE enabled
    "avx512f": ("AVX512F", "avx512f", "machdep:AVX512F"),
    "avx512bw": ("AVX512BW", "avx512bw", "machdep:AVX512BW"),
    "avx512cd": ("AVX512CD", "avx512cd", "machdep:AVX512CD"),
    "avx512dq": ("AVX512DQ", "avx512dq", "machdep:AVX512DQ"),
    "avx512vl": ("AVX512VL", "avx512vl", "machdep:AVX512VL"),
    "avx512vnni": ("AVX512VNNI", "avx512_vnni", "machdep:AVX512VNNI"),
    "avx512ifma": ("AVX512IFMA", "avx512ifma", "machdep:AVX512IFMA"),
    "avx512vbmi": ("AVX512VBMI", "avx512vbmi", "machdep:AVX512VBMI"),
    "avx512vbmi2": ("AVX512VBMI2", "avx512_vbmi2", "machdep:AVX512VBMI2"),
    "avx512bitalg": ("AVX512BITALG", "avx512_bitalg", "machdep:AVX512BITALG"),
    "avx512vpopcntdq": ("AVX512VPOPCNTDQ", "avx512_vpopcntdq", "machdep:AVX512VPOPCNTDQ"),
    "avx512bf16": ("AVX512BF16", "avx512_bf16", "machdep:AVX512BF16"),
    "avx512fp16": ("AVX512FP16", "avx512_fp16", "machdep:AVX512FP16"),
    "gfni": ("GFNI", "gfni", "machdep:GFNI"),
    "vaes": ("VAES", "vaes", "machdep:VAES"),
    "vpclmulqdq": ("VPCLMULQDQ", "vpclmulqdq", "machdep:VPCLMULQDQ"),
    "fma4": ("FMA4", "fma4", None),
    "xop": ("XOP", "xop", None),
    # aarch64
    "neon": ("ASIMD", "asimd", "hw.optional.neon"),
    "fp-armv8": (None, "fp", "hw.optional.floatingpoint"),
    "crc": (None, "crc32", "hw.optional.armv8_crc32"),
    "lse": (None, "atomics", "hw.optional.arm.FEAT_LSE"),
    "rdm": (None, "asimdrdm", "hw.optional.arm.FEAT_RDM"),
    "fullfp16": ("ASIMDHP", "asimdhp", "hw.optional.arm.FEAT_FP16"),
    "dotprod": ("ASIMDDP", "asimddp", "hw.optional.arm.FEAT_DotProd"),
    "sve": ("SVE", "sve", None),
}

# On Linux aarch64 the kernel's AT_HWCAP bits (getauxval) are the truth, as numpy reads them:
# an emulator (qemu-aarch64) sets them for the CPU it emulates, while /proc/cpuinfo is the
# real host's, and numpy does not report every feature (crc, lse, rdm; SVE only from 1.25).
AARCH64_HWCAP_BITS = {"fp-armv8": 0, "neon": 1, "crc": 7, "lse": 8, "fullfp16": 10, "rdm": 12, "dotprod": 20,
                      "sve": 22}


def normalise_machine(machine: str) -> str:
    """An architecture family name as entries record it: x86_64, aarch64, ..."""
    m = machine.lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def host_machine() -> str:
    return normalise_machine(platform.machine())


def host_os() -> str:
    """The operating system as library records name it: "linux", "macos", else sys.platform."""
    return "linux" if sys.platform.startswith("linux") else "macos" if sys.platform == "darwin" else sys.platform


def host_platform() -> str:
    """This host's CPU platform as library records and `cpu_targets` name it: "x86_64-linux"."""
    return f"{host_machine()}-{host_os()}"
