"""`@qd.func` functions: the object the front end inlines (kept apart from lang.py so that the
modules lang.py imports, structs.py's methods among them, can recognise one)."""
from __future__ import annotations


class Func:
    """A `@qd.func`: inlined into every kernel (or func) that calls it."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"qd.func {self.__name__} can only be called from a kernel or another qd.func")
