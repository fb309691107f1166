"""`@qd.func` functions: the object the front end inlines (kept apart from lang.py so that the
modules lang.py imports, structs.py's methods among them, can recognise one)."""
from __future__ import annotations


class Func:
    """A `@qd.func`: inlined into every kernel (or func) that calls it."""

    def __init__(self, fn, requires_top_level: bool = False):
        self.fn = fn
        self.requires_top_level = requires_top_level  # callable only where a `for` is a top-level loop
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__module__, self.__qualname__ = fn.__module__, fn.__qualname__  # how a template names it
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"qd.func {self.__name__} can only be called from a kernel or another qd.func")

    def __get__(self, instance, owner=None):
        # Read from an instance, a qd.func method is bound to it as a Python method is: Quadrants
        # programs store and pass such methods (`self.update = self._update_elastic`).
        return self if instance is None else BoundFunc(self, instance)


class BoundFunc:
    """A `@qd.func` method read from an instance: called in a kernel, the instance is its first
    argument (`self`). `__func__` and `__self__` are named as a Python method's are, so that
    the launch reaches arrays the instance holds by the path `....method.__self__.array`."""
    __slots__ = ("__func__", "__self__")

    def __init__(self, func: Func, receiver):
        self.__func__, self.__self__ = func, receiver

    @property
    def __name__(self):
        return self.__func__.__name__

    def __call__(self, *args, **kwargs):
        return self.__func__(*args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, BoundFunc) and other.__func__ is self.__func__ and other.__self__ is self.__self__

    def __hash__(self):
        return hash((id(self.__func__), id(self.__self__)))

    def __repr__(self):
        return f"<bound qd.func {type(self.__self__).__name__}.{self.__name__}>"
