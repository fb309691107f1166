"""`quadrants.algorithms`: the parallel algorithms programs import by name."""
import importlib


def __getattr__(name):
    try:
        module = importlib.import_module("qdc.compiler.language.algorithms")
    except ModuleNotFoundError:
        module = None
    if module is not None and hasattr(module, name):
        return getattr(module, name)
    raise AttributeError(f"quadrants.algorithms.{name} is not offered by qdc")
