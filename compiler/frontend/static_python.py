"""Host Python inside `qd.static(...)`: what Quadrants evaluates while it traces a kernel.

The argument of `qd.static` is Python run at compile time. Calls in it of anything that is
not part of the kernel language (a plain function, `enumerate`, `zip`, `getattr`,
`isinstance`, `sorted`, a numpy scalar function such as `np.nextafter`, a method of a config
object) are made right then, on the compile-time values of their arguments; run-time values
travel through them as opaque objects (`qd.static(enumerate((i_x, i_y)))` unrolls over the
pairs). Language constructs (`@qd.func`s, qd intrinsics, vector types, the builtins the
kernel language defines) keep their kernel meaning there.

A name bound to the result of `qd.static(...)` (`BW = qd.static(flag)`) is that compile-time
value, not a run-time variable initialised from it, so `if qd.static(BW):` is a compile-time
branch (as in Quadrants, where the assignment binds a Python name).

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import ast
import inspect

from .. import ir
from ..language import lang
from ..language import matrix as M
from ..language.structs import StructType
from .host_objects import unwrap
from .objects import RangeSpec
from .structs import StructVar
from .values import is_runtime
from .vectors import VectorVar


class StaticPython:
    static_depth = 0  # > 0 while the arguments of a qd.static(...) are lowered

    def is_host_call(self, callee, language_builtins) -> bool:
        """Whether `callee`, called inside qd.static(...), runs as Python now: anything that
        is not a kernel-language construct (those keep their meaning, and fold compile-time
        arguments themselves)."""
        if not self.static_depth or not callable(callee):
            return False
        if isinstance(callee, (lang.Func, lang.BoundFunc, StructType, M.MatrixType)) or lang.is_kernel_function(callee):
            return False
        if any(callee is b for b in language_builtins) or callee is M.Vector or callee is M.Matrix:
            return False
        try:
            if callee in lang.INTRINSICS:
                return False
        except TypeError:  # unhashable callables are never intrinsics
            pass
        module = getattr(callee, "__module__", None) or ""
        if module.startswith("qdc.compiler.") and not inspect.isclass(callee):
            return False  # the language's own helpers (vector methods, math functions); host APIs run
        return True

    def host_call(self, callee, node: ast.Call):
        """`callee(*args, **kwargs)` made now, in Python, with the values of the arguments."""
        args, _ = self.spread(node.args)
        args = [_host_value(a) for a in args]
        kwargs = {}
        for k in node.keywords:
            value = self.visit(k.value)
            if k.arg is None:
                if not isinstance(value, dict):
                    self.error("** in qd.static(...) needs a dict", k.value)
                kwargs.update(value)
            else:
                kwargs[k.arg] = _host_value(value)
        name = getattr(callee, "__qualname__", getattr(callee, "__name__", type(callee).__name__))
        try:
            return callee(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (the user's own Python, reported at its call)
            hint = ""
            if any(is_runtime(a) for a in (*args, *kwargs.values())):
                hint = " (an argument is a run-time value: qd.static(...) runs its calls in Python at compile time)"
            self.error(f"calling {name}() inside qd.static(...) at compile time raised "
                       f"{type(e).__name__}: {e}{hint}", node)

    def binds_static(self, value_node) -> bool:
        """Whether an assignment's value is `qd.static(...)`: its names are then compile-time."""
        return isinstance(value_node, ast.Call) and self.is_static_call(value_node)

    def bind_static_names(self, target, value) -> bool:
        """Bind the names of `target` to compile-time `value` (tuple targets element by
        element); False, binding nothing, when some name is a run-time variable already (which
        the value is then stored into, as any assignment)."""
        names = [t for t in ast.walk(target) if isinstance(t, ast.Name)]
        if not all(isinstance(t, (ast.Name, ast.Tuple, ast.List)) for t in ast.walk(target)
                   if not isinstance(t, (ast.Load, ast.Store))):
            return False
        for t in names:
            scope = self.binding_scope(t.id)
            if scope is not None and isinstance(scope[t.id], (ir.Stmt, VectorVar, StructVar)):
                return False
        if isinstance(target, (ast.Tuple, ast.List)) and not (isinstance(value, (tuple, list))
                                                              and len(value) == len(target.elts)):
            self.error("cannot unpack this qd.static(...) value into the names assigned", target)
        self.bind_targets(target, value)
        return True


def _host_value(v):
    """A value as Python code sees it: `range(3)` (a RangeSpec in kernels) as a range, an object
    reached from an argument as itself."""
    v = unwrap(v)
    if isinstance(v, RangeSpec):
        as_range = v.as_static()
        return v if as_range is None else as_range
    return v
