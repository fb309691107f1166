"""`quadrants.types`: qdc's `qd.types` namespace as a module (`from quadrants.types import ndarray`)."""
from qdc.compiler.language.lang import types as _types


def __getattr__(name):
    return getattr(_types, name)
