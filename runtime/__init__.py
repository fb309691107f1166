"""The qdc runtime: loads artifacts and launches them. It never imports the compiler.

`load` is resolved on first use so that `import qdc` stays light.
"""


def __getattr__(name):
    if name == "load":
        from .loader import load
        return load
    raise AttributeError(f"module 'qdc.runtime' has no attribute '{name}'")
