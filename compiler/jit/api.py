"""Direct-mode entry points: `qd.init`, `qd.reset` (`qd.sync` is the runtime's: qdc.runtime.sync)."""
from __future__ import annotations

import os
import warnings

from qdc.runtime import context, lifecycle, random_stream
from qdc.runtime.contract.arches import GPU_ARCHES
from qdc.runtime.contract.python_scope import scope_types

from .. import compile_threads
from ..driver import options as options_mod
from .offline_cache import check_cache_dir

# Direct mode's options: the one process-wide compiler setting, as Quadrants keeps its runtime
# config. `qd.init` replaces it; the kernel objects (kernel.py) read it when they compile and
# pass it down explicitly. Python-scope declarations read its default types from the
# contract's ScopeTypes (runtime/contract/python_scope.py), which qd.init keeps in step.
OFFLINE_VARIABLE = "QDC_OFFLINE"  # "1": offline unless qd.init says otherwise


def _offline_defaults(opts: options_mod.Options) -> options_mod.Options:
    """An offline process looks up what `qdc build` builds: each target option it leaves unset
    takes the build's default (portable CPU code, not the host's native one)."""
    if opts.offline:
        for name, (_, option) in options_mod.target_options().items():
            if getattr(opts, name) is None and option.build_default is not None:
                setattr(opts, name, option.build_default)
    return opts


def _offline_from_environment() -> bool:
    return os.environ.get(OFFLINE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


_direct = _offline_defaults(options_mod.Options(offline=_offline_from_environment()))


def direct_options() -> options_mod.Options:
    """The options of the last successful `qd.init` (the defaults before any)."""
    return _direct


def init(arch=None, **options):
    """Select the device and set options (docs/api.md, Configuration).

    `offline=True` (or QDC_OFFLINE=1): every kernel comes from the cache or the remote store
    (QDC_REMOTE) and nothing is compiled; a variant that is not there raises
    KernelNotPrebuiltError. Calling it again resets the runtime: fields and ndarrays come back zeroed on first use,
    and kernels are recompiled (through the offline cache) for the new options on their next
    launch. A failing call (unknown option or arch, a cache_dir that is a file) leaves the
    previous runtime active; a cache_dir that is not writable is a warning (kernels are then
    compiled without being stored).
    """
    opts = options_mod.Options()
    threads = _compile_threads(options.pop("num_compile_threads", None))
    options = quadrants_options(options)
    if arch is not None:
        options["arch"] = QUADRANTS_ARCHES.get(arch, arch)
    gpu = options.get("arch") == GPU
    if gpu:
        options["arch"] = GPU_ARCHES[0]  # validated with the rest; the one that works is chosen below
    if "offline" not in options and _offline_from_environment():
        options["offline"] = True
    _offline_defaults(opts.update(**options))
    random_stream.check_seed(opts.random_seed)
    check_cache_dir(opts)
    before = context.current().generation if context.has_runtime() else None
    try:
        if gpu:
            _start_first_gpu(opts)
        else:
            context.reset(opts.arch, opts.cpu_max_num_threads)
    finally:  # the replaced device's pending error may raise once the new runtime is in place
        if context.has_runtime() and context.current().generation != before:
            opts.arch = context.current().arch  # qd.gpu: the one chosen
            _adopt_device_subgroup_size(opts)
            _set_direct(opts)
            compile_threads.set_compile_threads(threads)
            random_stream.restart(opts.random_seed)
            lifecycle.runtime_replaced()
    return opts


def _compile_threads(value) -> int | None:
    """Quadrants' `num_compile_threads`: the threads that compile a kernel's module parts
    (targets/cpu/parallel_llvm.py); None: the cores this process may run on."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"qd.init: num_compile_threads must be a positive int, got {value!r}")
    return value


def _adopt_device_subgroup_size(opts) -> None:
    """On Vulkan, kernels are compiled for the device's subgroup size (qd.simt.subgroup.group_size()
    is a compile-time int) unless `vulkan_subgroup_size` was given."""
    if opts.arch == "vulkan" and opts.vulkan_subgroup_size is None:
        size = getattr(context.current().device.capabilities, "subgroup_size", 0)
        if size:
            opts.vulkan_subgroup_size = int(size)


def _set_direct(opts) -> None:
    global _direct
    _direct = opts
    scope_types.set_direct(opts.default_ip, opts.default_fp)


GPU = "gpu"

# Quadrants' names of the CPU arch
QUADRANTS_ARCHES = {"x64": "cpu", "arm64": "cpu", "host": "cpu"}

# Quadrants' qd.init options that change nothing on qdc, and why (docs/api.md lists them).
QUADRANTS_NO_OPS = {
    "enable_fallback": "qdc never falls back from the arch asked (but for qd.gpu, which warns)",
    "force_scalarize_matrix": "qdc always lowers vectors and matrices to scalars",
    "advanced_optimization": "qdc's pass pipeline is fixed; opt_level sets LLVM's level",
    "cfg_optimization": "qdc's pass pipeline is fixed",
    "ad_stack_experimental_enabled": "adstacks are always on and sized exactly (ad_stack_size)",
    "ad_stack_sparse_threshold_bytes": "adstacks are always sized from the launch's data",
    "offline_cache": "kernels always go through the cache at cache_dir",
    "offline_cache_max_size_of_files": "the direct-mode cache is not evicted automatically: `qdc clean --max-size`",
    "offline_cache_cleaning_policy": "the direct-mode cache is not evicted automatically: `qdc clean --max-size`",
    "offline_cache_file_path": "use cache_dir",
    "print_full_traceback": "qdc's errors name the kernel source line themselves",
    "print_ir": "use `qdc inspect --ir` or QDC_LOG",
    "kernel_profiler": "not offered",
    "device_memory_GB": "qdc allocates device memory per array",
    "device_memory_fraction": "qdc allocates device memory per array",
    "fast_math_reductions": "reductions follow fast_math",
}


def quadrants_options(options: dict) -> dict:
    """qd.init's keyword arguments with Quadrants' options applied: `log_level` sets the level of
    Quadrants' logging names, `check_out_of_bound=True` turns on qdc's bounds checks (debug), the
    options of QUADRANTS_NO_OPS are dropped."""
    out = {}
    for name, value in options.items():
        if name == "log_level":
            from qdc.quadrants_compat import logging as quadrants_logging
            quadrants_logging.set_logging_level(value)
        elif name != "check_out_of_bound" and name not in QUADRANTS_NO_OPS:
            out[name] = value
    if options.get("check_out_of_bound"):
        out["debug"] = True
    return out


def _start_first_gpu(opts) -> None:
    """`qd.gpu`: the first of GPU_ARCHES with a code generator and a device that starts here;
    none: the CPU, with a warning saying why each was passed over (as Quadrants falls back)."""
    from .. import targets
    from qdc.runtime import devices
    reasons = []
    for arch in GPU_ARCHES:
        if arch not in targets.available() or arch not in devices.available():
            reasons.append(f"{arch}: not supported by this build of qdc")
            continue
        before = context.current().generation if context.has_runtime() else None
        try:
            context.reset(arch)
            return arch
        except Exception as e:  # noqa: BLE001 (any failure to start means: not this one)
            if context.has_runtime() and context.current().generation != before:
                raise  # it started: the error is the replaced device's, raised once it is closed
            reasons.append(f"{arch}: {e}")
    warnings.warn("qd.init(arch=qd.gpu): no GPU backend works on this machine, using the CPU ("
                  + "; ".join(reasons) + ")", RuntimeWarning, stacklevel=3)
    context.reset("cpu", opts.cpu_max_num_threads)
    return "cpu"


def reset():
    """`qd.init()` with default options."""
    init()
