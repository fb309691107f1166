"""CPU device: memory is host memory; kernels are native shared libraries loaded with ctypes.

A kernel library exports one entry point per kernel, `void entry(uint64_t *ctx)`, which runs
the kernel's tasks in order and spreads range-for tasks over worker threads itself (libgomp),
so a launch is a single foreign call: the fast path (`launch_call`). It also exports one entry
per task (`void task_entry(uint64_t *ctx)`, the task record's `entry`: the whole task, its
range computed from the ctx), which `launch_task` calls: the asynchronous protocol of
runtime/device.py, which GPUs use. The CPU runs such a launch at once; errors are still
reported at `sync`, as on a GPU. `QDC_CPU_LAUNCH=tasks` (or `CpuDevice(launch="tasks")`)
drives every launch through that path, with a sync after each launch;
`QDC_CPU_LAUNCH=tasks-deferred` leaves the sync to the caller (`qd.sync()`, reading a
field...), as an asynchronous device would.

That call holds the GIL for the kernel's duration (the libraries are loaded as `ctypes.PyDLL`),
as Quadrants' launches do: other Python threads wait during a long kernel, and in exchange
an empty launch costs a third less (releasing and re-acquiring the GIL is the most expensive
part of a plain ctypes call).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import os
import sys
import tempfile

import numpy as np

from . import numpy_binding
from ...contract import cpu_binding, cpu_features, entry_points
from ...device import Allocation, Device, DeviceCapabilities
from ...contract.errors import CacheError, ModuleNotBuiltError, QdcError

_ALIGN = 64
LAUNCH_MODES = ("fused", "tasks", "tasks-deferred")


class CpuKernel:
    """A loaded kernel: its fused entry, the entry that binds numpy arrays itself (None in
    libraries built without it; numpy_binding.py) and (resolved on first use) its task entries."""
    __slots__ = ("fused", "numpy_entry", "lib", "task_symbols", "_tasks")

    def __init__(self, lib, meta):
        self.lib = lib
        self.fused = _function(lib, meta.entry)
        self.numpy_entry = None
        if _exports(lib, cpu_binding.MARKER) and any(cpu_binding.eligible(p) for p in meta.params):
            self.numpy_entry = _function(lib, meta.entry + "_np")
            self.numpy_entry.restype = ctypes.c_int
        self.task_symbols = [t.entry for t in meta.tasks]
        self._tasks = None

    def task(self, index: int):
        if self._tasks is None:
            self._tasks = [_function(self.lib, name) for name in self.task_symbols]
        return self._tasks[index]


def _exports(lib, symbol: str) -> bool:
    try:
        lib[symbol]
    except AttributeError:
        return False
    return True


def _function(lib, symbol: str):
    # A function object of its own (lib[...] does not cache), so its call settings are ours.
    # No argtypes: ctypes then passes a byref() argument with the least work per call.
    fn = lib[symbol]
    fn.restype = None
    fn.argtypes = None
    return fn


class CpuDevice(Device):
    arch = "cpu"

    def __init__(self, num_threads: int | None = None, launch: str | None = None):
        self.num_threads = num_threads or os.cpu_count() or 1
        self._libs: dict = {}  # sha256 -> PyDLL, so a library is dlopen'ed once per device
        launch = launch or os.environ.get("QDC_CPU_LAUNCH", "") or "fused"
        if launch not in LAUNCH_MODES:
            raise ValueError(f"QDC_CPU_LAUNCH={launch!r}: expected one of {', '.join(LAUNCH_MODES)}")
        self.launch_mode = launch
        self.sync_each_launch = launch == "tasks"
        self.capabilities = DeviceCapabilities(host_memory=True, synchronous=True, fused_launch=launch == "fused")

    def allocate(self, nbytes: int) -> Allocation:
        raw = np.zeros(max(nbytes, 1) + _ALIGN, dtype=np.uint8)  # zeroed, as the protocol promises
        start = (-raw.ctypes.data) % _ALIGN
        host = raw[start:start + nbytes]
        return Allocation(host.ctypes.data if nbytes else raw.ctypes.data + start, nbytes, host, raw)

    def free(self, alloc: Allocation) -> None:
        alloc.host = alloc.handle = None

    def copy_to_device(self, alloc, src, offset=0):
        b = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
        _check_range(alloc, offset, b.size)
        alloc.host[offset:offset + b.size] = b

    def copy_to_host(self, alloc, dst, offset=0):
        _check_range(alloc, offset, dst.nbytes)
        dst.view(np.uint8).reshape(-1)[:] = alloc.host[offset:offset + dst.nbytes]

    def load_library(self, lib_bytes: bytes, digest: str) -> ctypes.PyDLL:
        """dlopen a verified shared library (see load_verified_library)."""
        lib = self._libs.get(digest)
        if lib is None:
            prepare_libgomp()
            lib = self._libs[digest] = load_verified_library(lib_bytes, digest)
        return lib

    def load_kernel(self, artifacts: dict, meta) -> CpuKernel:
        record = select_library(meta.cpu_libraries, meta.name)
        kind = record["artifact"]
        try:
            lib = self.load_library(artifacts[kind], artifacts[kind + "_sha256"])
        except LibraryLoadError as e:
            raise LibraryLoadError(f"kernel '{meta.name}': {e}") from None
        if "level" in record:  # one library for several levels: it runs the chosen one's code
            _function(lib, entry_points.CPU_LEVEL_SETTER)(ctypes.c_int32(record["level"]))
        return CpuKernel(lib, meta)

    def launch_call(self, loaded: CpuKernel, ctx: ctypes.Array) -> tuple:
        return loaded.fused, ctypes.byref(ctx)

    def numpy_binding(self, loaded: CpuKernel, meta) -> numpy_binding.NumpyBinding | None:
        """The kernel's numpy-binding entry (numpy_binding.py) when its library has one and this
        numpy's arrays are laid out as the entry reads them; else None."""
        if loaded.numpy_entry is None or not numpy_binding.numpy_layout_matches():
            return None
        return numpy_binding.NumpyBinding(loaded.numpy_entry, meta)

    def launch_task(self, loaded: CpuKernel, task: int, ctx_address: int, slices: int) -> None:
        # The task entry computes its range and splits it over the worker threads itself (the
        # native rule that task_slices mirrors), so `slices` is not passed on, and the entry
        # runs even for 0 slices: correctness never rests on the recorded trip count.
        loaded.task(task)(ctypes.c_void_p(ctx_address))

    def task_slices(self, launch: dict, iterations: int | None) -> int:
        """The native dispatch's rule (compiler/targets/cpu/codegen.py, `_dispatch`): a task of
        v iterations runs on no thread if v <= 0, on one below its `parallel_from` (0: never
        more), else on min(v, worker threads); unknown v: every worker thread. Each thread of a
        task lowered W iterations at a time takes `lanes` adstack slices (one per lane), so
        the slices are threads * lanes, at least one thread's (the CPU's launches do not use
        the count otherwise)."""
        if launch["policy"] != "cpu_chunks":
            raise ValueError(f"the CPU cannot launch a task with launch policy {launch['policy']!r}")
        lanes = launch.get("lanes", 1)
        if iterations is None:
            return self.num_threads * lanes
        if iterations <= 0:  # a widened task's one thread still finds its slices, should the count be wrong
            return 0 if lanes == 1 else lanes
        parallel_from = launch["parallel_from"]
        if parallel_from == 0 or iterations < parallel_from:
            return lanes
        return min(iterations, self.num_threads) * lanes


def _check_range(alloc: Allocation, offset: int, nbytes: int) -> None:
    if offset < 0 or offset + nbytes > alloc.nbytes:
        raise ValueError(f"a copy of {nbytes} bytes at offset {offset} does not fit an allocation of "
                         f"{alloc.nbytes} bytes")


# ---- how long idle worker threads spin ----------------------------------------------------
#
# After a parallel task libgomp's workers spin before sleeping on a futex: by default 300000
# iterations of `pause`, about 9 ms on the development machine's AMD EPYC (~28 ns each), so
# every launch left a core busy for 9 ms, halving a numpy copy running beside it. 1500
# iterations (about 45 µs there; shorter on CPUs with a cheaper `pause`) still catch
# back-to-back launches, which would otherwise pay a futex wake-up each (measured by
# bench/bench_idle_threads.py). libgomp reads the setting once, when it is loaded, so it is
# set for the loading of libgomp only, before the first kernel library needs it, and only
# where neither the user (GOMP_SPINCOUNT, OMP_WAIT_POLICY) nor an earlier import (libgomp
# already loaded, e.g. by PyTorch) decided it. QDC_GOMP_SPINCOUNT overrides the count;
# QDC_GOMP_SPINCOUNT=libgomp leaves libgomp's own default.
GOMP_SPINCOUNT = 1500
_LIBGOMP = "libgomp.so.1"
_libgomp_prepared = False


def prepare_libgomp() -> None:
    global _libgomp_prepared
    if _libgomp_prepared:
        return
    _libgomp_prepared = True
    if sys.platform == "darwin":
        load_libomp()
        return
    count = os.environ.get("QDC_GOMP_SPINCOUNT", str(GOMP_SPINCOUNT))
    if count == "libgomp" or "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ \
            or not sys.platform.startswith("linux") or _libgomp_loaded():
        return
    os.environ["GOMP_SPINCOUNT"] = count
    try:
        ctypes.CDLL(_LIBGOMP)  # stays loaded: the kernel libraries' dependency resolves to it
    except OSError:
        pass  # then the kernel library's own load reports what is missing
    finally:
        del os.environ["GOMP_SPINCOUNT"]


# macOS has no libgomp: a macOS kernel library (compiler/targets/cpu/link.py) leaves its GOMP_*
# and omp_* calls to dyld's flat lookup, which LLVM's OpenMP runtime answers (libomp implements
# libgomp's interface); it must be loaded, globally, before the first kernel library.
LIBOMP_PATHS = ("libomp.dylib", "/opt/homebrew/opt/libomp/lib/libomp.dylib", "/usr/local/opt/libomp/lib/libomp.dylib")
LIBOMP_HINT = "macOS kernel libraries need LLVM's OpenMP runtime, libomp: brew install libomp"


def load_libomp() -> str | None:
    """Load the first libomp of LIBOMP_PATHS with its symbols global; its path, or None."""
    for path in LIBOMP_PATHS:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return path
    return None


def _libgomp_loaded() -> bool:
    try:
        ctypes.CDLL(_LIBGOMP, mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    return True


# ---- which library of a kernel this CPU can run (cpu_target, docs/api.md) ---------------------
#
# A CPU entry records its libraries lowest ISA level first (KernelMeta.cpu_libraries): the
# artifact kind, the level or CPU name, the architecture family and the features its code
# needs, as LLVM names them. The best library is the last one whose needs this host meets.

@functools.lru_cache(maxsize=None)
def host_features() -> frozenset:
    """The features of cpu_features.HOST_FEATURE_SOURCES this CPU (and OS) support."""
    numpy_says = _numpy_cpu_features()
    os_says = _os_cpu_flags()
    hwcap = _aarch64_hwcap()
    have = set()
    for feature, (numpy_key, cpuinfo_flag, sysctl_name) in cpu_features.HOST_FEATURE_SOURCES.items():
        if hwcap is not None and feature in cpu_features.AARCH64_HWCAP_BITS:
            if hwcap >> cpu_features.AARCH64_HWCAP_BITS[feature] & 1:
                have.add(feature)
        elif numpy_key is not None and numpy_key in numpy_says:
            if numpy_says[numpy_key]:
                have.add(feature)
        elif (cpuinfo_flag if sys.platform.startswith("linux") else sysctl_name) in os_says:
            have.add(feature)
    return frozenset(have)


_AT_HWCAP = 16


def _aarch64_hwcap() -> int | None:
    """getauxval(AT_HWCAP) on Linux aarch64 (see cpu_features.AARCH64_HWCAP_BITS); else None."""
    if not sys.platform.startswith("linux") or cpu_features.host_machine() != "aarch64":
        return None
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(getauxval(_AT_HWCAP))


def _numpy_cpu_features() -> dict:
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            features = getattr(__import__(module, fromlist=["_"]), "__cpu_features__", None)
        except ImportError:
            continue
        if isinstance(features, dict):
            return features
    return {}


def _os_cpu_flags() -> set:
    """Linux: the flags of /proc/cpuinfo (x86 "flags", aarch64 "Features"); macOS: the
    sysctl names of HOST_FEATURE_SOURCES (contract/cpu_features.py) that are set. Under an
    emulator such as qemu-user these can be the real host's, which is why numpy's detection
    comes first."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:  # under qemu-user the real host's, of another family: not read
                    name, _, value = line.partition(":")
                    if name.strip() == ("Features" if cpu_features.host_machine() == "aarch64" else "flags"):
                        return set(value.split())
        except OSError:
            pass
        return set()
    if sys.platform == "darwin":
        sources = cpu_features.HOST_FEATURE_SOURCES.values()
        return {source for _, _, source in sources if source and _sysctl_has(source)}
    return set()


def _sysctl_has(source: str) -> bool:
    if source.startswith("machdep:"):  # Intel Macs: space-separated feature strings
        token = source.split(":", 1)[1]
        return any(token in (_sysctl_string(name) or "").split()
                   for name in ("machdep.cpu.features", "machdep.cpu.leaf7_features", "machdep.cpu.extfeatures"))
    value = ctypes.c_int64(0)
    return _sysctlbyname(source, value) and value.value != 0


def _sysctl_string(name: str) -> str | None:
    buf = ctypes.create_string_buffer(4096)
    return buf.value.decode(errors="replace") if _sysctlbyname(name, buf) else None


def _sysctlbyname(name: str, out) -> bool:
    try:
        libc = ctypes.CDLL(None)
        size = ctypes.c_size_t(ctypes.sizeof(out))
        return libc.sysctlbyname(name.encode(), ctypes.byref(out), ctypes.byref(size), None, ctypes.c_size_t(0)) == 0
    except (OSError, AttributeError):
        return False


def library_platform(record: dict) -> str:
    """The platform a library record was built for ("aarch64-linux"); records written before
    they named the operating system were built on, and for, Linux."""
    return f"{record['machine']}-{record.get('os', 'linux')}"


def host_libraries(libraries: list, kernel: str, platform: str | None = None) -> list:
    """The records of `libraries` (KernelMeta.cpu_libraries) built for this host's platform
    (or `platform`); ModuleNotBuiltError naming the platforms built and the one needed when
    there are none (built with `cpu_targets` that leave this host out)."""
    if not libraries:
        raise CacheError(f"kernel '{kernel}': its cache entry does not record which CPU its code was built for "
                         f"(it was written by an older qdc); rebuild it with `qdc build`")
    platform = cpu_features.host_platform() if platform is None else platform
    ours = [lib for lib in libraries if library_platform(lib) == platform]
    if not ours:
        built = ", ".join(dict.fromkeys(library_platform(lib) for lib in libraries))
        family = platform.split("-")[0]
        raise ModuleNotBuiltError(f"kernel '{kernel}' was built for the CPU targets {built}, but this host is "
                                  f"{platform}: build it for this host too with `qdc build --cpu-targets "
                                  f"{family},...` (cpu_targets names the ISA families CPU code is built for)")
    return ours


def select_library(libraries: list, kernel: str, platform: str | None = None, features=None) -> dict:
    """The library record (KernelMeta.cpu_libraries) of the highest level this host can run;
    ModuleNotBuiltError when none is for this host's platform, CacheError saying what is
    missing when none fits its CPU. `platform`/`features` default to the host's."""
    ours = host_libraries(libraries, kernel, platform)
    features = host_features() if features is None else frozenset(features)
    usable = [lib for lib in ours if set(lib["features"]) <= features]
    if usable:
        return usable[-1]
    closest = min(ours, key=lambda lib: len(set(lib["features"]) - features))
    missing = ", ".join(sorted(set(closest["features"]) - features))
    raise CacheError(f"kernel '{kernel}': this CPU lacks {missing}, which its prebuilt code needs (built for "
                     f"{closest['target']}); rebuild it with `qdc build --cpu-target portable` (code for several "
                     f"CPU levels, the best chosen at load) or on a machine like this one")


# ---- dlopen without an executable temp folder ------------------------------------------

class LibraryLoadError(QdcError, OSError):
    """A verified kernel library could not be loaded into the process."""


def load_verified_library(lib_bytes: bytes, digest: str) -> ctypes.PyDLL:
    """dlopen verified library bytes. Preferred: an anonymous memory file (memfd), which needs
    no folder at all, so a temp folder mounted noexec does not matter (and it is faster than
    writing a file). Else a private temp file, as on systems without memfd_create. Calls into
    the library keep the GIL (see above)."""
    fd = _memfd_with(lib_bytes, digest)
    if fd is not None:
        try:
            return ctypes.PyDLL(_unique_fd_path(fd), mode=ctypes.RTLD_LOCAL)
        except OSError:
            pass  # e.g. a memfd_noexec policy: try the temp folder, which explains its own failure
        finally:
            os.close(fd)  # the mapping keeps the file alive
    return _dlopen_temp_file(lib_bytes)


_FD_PATHS_USED = itertools.count(1)


def _unique_fd_path(fd: int) -> str:
    """/proc/self/fd/<fd>, spelled differently every time. glibc's dlopen hands back the library
    already loaded under a path it has seen before, and descriptor numbers are reused once
    closed, so the plain path could silently give an earlier library. "./" and "/" after fd/
    change nothing, and spelling the bits of a counter with them makes every path unique."""
    n = next(_FD_PATHS_USED)
    return "/proc/self/fd/" + "".join("./" if bit == "1" else "/" for bit in f"{n:b}") + str(fd)


_MFD_EXEC = getattr(os, "MFD_EXEC", 0x10)  # Linux 6.3+: an executable memfd even under vm.memfd_noexec=1


def _memfd_with(data: bytes, digest: str) -> int | None:
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    name = f"qdc-{digest[:16]}.so"
    try:
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | _MFD_EXEC)
        except OSError:  # EINVAL: a kernel older than MFD_EXEC
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError:
        return None
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
    except OSError:
        os.close(fd)
        return None
    return fd


def _dlopen_temp_file(lib_bytes: bytes) -> ctypes.PyDLL:
    folder = tempfile.gettempdir()
    try:
        fd, path = tempfile.mkstemp(prefix="qdc-", suffix=".so")
    except OSError as e:
        raise LibraryLoadError(f"cannot load a kernel library: writing it to the temp folder {folder} failed "
                               f"({e}); set TMPDIR to a writable folder") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lib_bytes)
        return ctypes.PyDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        if _is_noexec(folder):
            raise LibraryLoadError(f"cannot load a kernel library: the temp folder {folder} is on a filesystem "
                                   f"mounted noexec, so code written there cannot run (and this system offers no "
                                   f"in-memory alternative); set TMPDIR to a folder on an exec-mounted filesystem, "
                                   f"e.g. TMPDIR=$HOME/.cache/qdc-tmp") from None
        # dlopen's reason names the private copy, which is gone: the caller names the library
        reason = str(e).replace(path + ": ", "")
        hint = f" ({LIBOMP_HINT})" if sys.platform == "darwin" and "omp" in reason.lower() else ""
        raise LibraryLoadError(f"cannot load a kernel library: {reason}{hint}") from None
    finally:
        os.unlink(path)  # the mapping stays valid after unlink


def _is_noexec(folder: str) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False
