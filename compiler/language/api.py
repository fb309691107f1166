"""Direct-mode entry points: `qd.init`, `qd.reset`, `qd.sync`."""
from __future__ import annotations

from qdc.runtime import context

from ..driver import options as options_mod


def init(arch=None, **options):
    """Select the device and set options (API.md §5).

    Calling it again resets the runtime: fields and ndarrays come back zeroed on first use,
    and kernels are recompiled (through the offline cache) for the new options on their next
    launch. A failing call (unknown option or arch, a cache_dir that is a file) leaves the
    previous runtime active; a cache_dir that is not writable is a warning (kernels are then
    compiled without being stored).
    """
    from ..driver.kernel import check_cache_dir
    opts = options_mod.Options()
    if arch is not None:
        options["arch"] = arch
    opts.update(**options)
    check_cache_dir(opts)
    context.reset(opts.arch, opts.cpu_max_num_threads)
    options_mod.current = opts
    return opts


def reset():
    """`qd.init()` with default options."""
    init()


def sync():
    """Wait until every launched kernel has finished (host reads already do this)."""
    context.current().device.sync()
