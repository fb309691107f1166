"""Direct-mode entry points: `qd.init`, `qd.sync`."""
from __future__ import annotations

from qdc.runtime import context

from . import options as options_mod


def init(arch=None, **options):
    """Select the device and set options; re-init resets the runtime (fields re-zeroed)."""
    opts = options_mod.Options()
    if arch is not None:
        options["arch"] = arch
    opts.update(**options)
    options_mod.current = opts
    context.reset(opts.arch, opts.cpu_max_num_threads)
    return opts


def reset():
    init()


def sync():
    context.current().device.sync()
