"""`@qd.data_oriented`: a class whose methods may be kernels, and whose instances may be
template arguments.

A `@qd.kernel` defined in a class takes its unannotated `self` as a template argument
(compiler/driver/kernel.py), so `obj.step(dt)` compiles `step` for `obj` as it would for any
object passed to a `qd.template()` parameter: the fields it holds are the kernel's fields,
its numbers, strings and nested objects compile-time values. Only the class needs marking,
as in Quadrants; `stable_members` and `template_primitives=True` are Quadrants' defaults and
what qdc does (members are read when the kernel compiles), `template_primitives=False` (members
read at each launch) is not offered.
"""
from __future__ import annotations


def data_oriented(cls=None, *, stable_members: bool = False, template_primitives: bool = True):
    if cls is None:
        return lambda c: data_oriented(c, stable_members=stable_members, template_primitives=template_primitives)
    if not isinstance(cls, type):
        raise TypeError(f"@qd.data_oriented decorates a class, got {type(cls).__name__}")
    if not template_primitives:
        raise NotImplementedError(f"@qd.data_oriented(template_primitives=False) on {cls.__qualname__}: qdc compiles "
                                  f"the numbers an instance holds into its kernels; pass the ones that change as "
                                  f"kernel arguments")
    cls._data_oriented = True
    if stable_members:
        cls._qd_stable_members = True
    cls._qd_template_primitives = True
    return cls
