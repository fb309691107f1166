"""The qdc runtime: loads artifacts and launches them. It never imports the compiler.

`load` (and `FwdMode`, forward mode for loaded modules as for direct mode) are resolved on
first use so that `import qdc` stays light.
"""


def __getattr__(name):
    if name == "load":
        from .loader import load
        return load
    if name == "FwdMode":
        from .forward_mode import FwdMode
        return FwdMode
    raise AttributeError(f"module 'qdc.runtime' has no attribute '{name}'")
