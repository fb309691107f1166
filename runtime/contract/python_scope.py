"""What the kernel language and the runtime's data objects share in Python scope, so that
neither imports the other: the default types a declaration resolves `int` and `float` to,
and the classes that make fields and ndarrays.

`qd.field(float, shape=n)` (runtime/fields.py), `qd.Vector.field(3, float, shape=n)` and
`qd.field(qd.math.vec3, shape=n)` (compiler/language/matrix.py), a struct member `x: float`
(compiler/language/structs.py): each resolves its types when it runs, for a module-level
declaration when its module is imported, from `scope_types`. The language's constructors
(`qd.Vector.field`, `qd.types.vector(3).ndarray`, ...) make the runtime's objects through
`device_arrays`, which runtime/fields.py fills in when it is imported: the package root
imports it, so it is filled before any module of the language runs.
"""
from __future__ import annotations

import contextlib
import contextvars

from . import types as T

DEFAULT_IP, DEFAULT_FP = T.i32, T.f32  # the default_ip / default_fp options' defaults (Quadrants')


class ScopeTypes:
    """The (default_ip, default_fp) of Python-scope declarations. Two sources, the inner first:
    - an import context (`importing(default_ip, default_fp)`): `qdc build` imports the kernel
      modules of a build inside one (compiler/commands/build.py), so that their declarations
      take that build's options; it ends, in a `finally`, when the imports do, so nothing of
      one build reaches the next build or direct mode. It is a context variable: another
      thread never sees it.
    - direct mode's, which `qd.init` sets along with the rest of its options
      (compiler/jit/api.py); the defaults before any, and in a deployment.
    Kernels never read it: the compiler takes its options as an argument."""

    def __init__(self):
        self._direct = (DEFAULT_IP, DEFAULT_FP)
        self._importing: contextvars.ContextVar = contextvars.ContextVar("qdc_import_default_types", default=None)

    def current(self) -> tuple:
        """(default_ip, default_fp) in force here."""
        return self._importing.get() or self._direct

    def set_direct(self, default_ip: T.DataType, default_fp: T.DataType) -> None:
        self._direct = (default_ip, default_fp)

    @contextlib.contextmanager
    def importing(self, default_ip: T.DataType, default_fp: T.DataType):
        token = self._importing.set((default_ip, default_fp))
        try:
            yield
        finally:
            self._importing.reset(token)


scope_types = ScopeTypes()


class DeviceArrays:
    """The runtime's field, ndarray and struct field classes (runtime/fields.py installs them)."""

    field = ndarray = struct_field = None

    def install(self, field, ndarray, struct_field) -> None:
        self.field, self.ndarray, self.struct_field = field, ndarray, struct_field


device_arrays = DeviceArrays()
