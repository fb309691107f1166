"""Calls: qd intrinsics, Python builtins, atomics, and inlining of `@qd.func`s (with returns).

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import ast
import builtins
import difflib
import inspect
import types
import weakref

import numpy as np

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker

from .. import ir
from ..language import field_methods, lang, simt
from ..language.simt_tiles import TileConstructor
from ..language.dataclass_args import MAX_KEYED_VALUES
from .numeric_calls import NUMERIC_CALLS
from .objects import GLOBAL_ARRAYS, NdarrayHandle, RangeSpec
from .simt_calls import is_library_func
from .lambda_source import callable_source
from .host_objects import HostObject, check_dataclass_parameter, unwrap
from .source import is_tail_return
from .values import is_runtime
from .vector_math import MATH_FUNCTIONS, BoundMethod
from .structs import BoundStructMethod, StructTarget, StructValue, StructVar, flatten, unflatten
from .vectors import VectorValue, VectorVar, shape_text
from ..language.structs import StructType
from ..language import matrix as M

_MAX_INLINE_DEPTH = 64
_LOCAL_ATOMIC_OP = {"add": "add", "sub": "sub", "mul": "mul", "min": "min", "max": "max",
                    "and": "bit_and", "or": "bit_or", "xor": "bit_xor"}
_BUILTINS = (builtins.abs, builtins.min, builtins.max, builtins.int, builtins.float, builtins.bool,
             builtins.range, builtins.len, builtins.pow, builtins.any, builtins.all)


_PLAIN_FUNCS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _plain_function(callee) -> bool:
    """A Python function or lambda of the user's whose source can be read: it is inlined like
    a qd.func."""
    if not inspect.isfunction(callee) or (callee.__module__ or "").split(".")[0] == "qdc":
        return False
    try:
        inspect.getsource(callee)
    except (OSError, TypeError):
        return False
    return True


def _fill(val):
    """The parameters of `x.fill(val)` in kernels (a field, an ndarray, a vector or matrix
    local), by which the front end binds `x.fill(val=v)`, Quadrants' keyword."""


def _bound_method(callee):
    """(the qd.func, the instance) of a method bound to an instance: a qd.func method, or a
    plain Python method whose source can be read (inlined like a qd.func); else None."""
    if isinstance(callee, lang.BoundFunc):
        return callee.__func__, callee.__self__
    if isinstance(callee, types.MethodType) and _plain_function(callee.__func__):
        return _as_func(callee.__func__), callee.__self__
    return None


def _on_host(callee):
    """What Python runs inside qd.static(...): a method of an object reached from an argument
    bound to the object itself, not to the front end's view of it (HostObject)."""
    if isinstance(callee, types.MethodType) and isinstance(callee.__self__, HostObject):
        return types.MethodType(callee.__func__, callee.__self__.value)
    return callee


def _as_func(fn) -> lang.Func:
    """One qd.func wrapper per plain function, so recursion checks see the same object."""
    wrapped = _PLAIN_FUNCS.get(fn)
    if wrapped is None:
        wrapped = _PLAIN_FUNCS[fn] = lang.Func(fn)
    return wrapped


class CallLowering:
    def visit_Call(self, node: ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "fill":
            target = self.vector_target(node.func.value)
            if target is not None and not isinstance(target, StructTarget):  # v.fill(x): every component x
                node = self.keywords_in_place(_fill, node)
                (value,) = self.call_args(node, 1, 1, "fill")
                return self.store_target(target, self.scalar(value, node.args[0]), node.args[0])
            field = self.visit(node.func.value) if target is None else None
            if isinstance(field, (Field, StructFieldMarker)):  # x.fill(v) on a field: every element v
                node = self.keywords_in_place(_fill, node)
                self.reject_unpacking(node)
                if len(node.args) != 1 or node.keywords:
                    self.error(f"fill() takes 1 argument, got {len(node.args) + len(node.keywords)}")
                return self.inline_library_func(field_methods.fill, node, receiver=field)
        callee = unwrap(self.visit(node.func))  # a method of an object reached from an argument: the method
        if _hashable(callee) and (callee in lang.INTRINSICS or callee in MATH_FUNCTIONS or callee in _SCOPE_BUILTINS):
            node = self.keywords_in_place(callee, node)
        callee = _SCOPE_BUILTINS.get(callee, callee) if _hashable(callee) else callee
        if self.is_host_call(callee, _BUILTINS):  # Python run now, inside qd.static(...)
            return self.host_call(_on_host(callee), node)
        if isinstance(callee, lang.Func):
            return self.inline_library_func(callee, node) if is_library_func(callee) else self.inline_func(callee, node)
        if (method := _bound_method(callee)) is not None:  # `self` is the instance it was read from
            inline = self.inline_library_func if is_library_func(method[0]) else self.inline_func
            return inline(method[0], node, receiver=method[1])
        if _hashable(callee) and callee in simt.PRIMITIVES:
            return self.call_simt(simt.PRIMITIVES[callee], node)
        if isinstance(callee, StructType):
            return self.construct_struct(callee, node)
        if isinstance(callee, BoundStructMethod):  # `self` is the struct it was called on
            inline = self.inline_library_func if is_library_func(callee.func) else self.inline_func
            return inline(callee.func, node, receiver=callee.receiver)
        if isinstance(callee, TileConstructor):
            return self.call_tile_constructor(callee, node)
        vector = self.vector_call(callee, node)
        if vector is not None:
            return vector
        kind = lang.INTRINSICS.get(callee) if _hashable(callee) else None
        if kind is not None:
            return self.call_intrinsic(kind, node)
        if any(callee is b for b in _BUILTINS):
            return self.call_builtin(callee, node)
        if isinstance(callee, T.DataType):  # qd.f32(x): a cast
            (arg,) = self.call_args(node, 1, 1, callee.name)
            return self.convert(self.scalar(arg, node.args[0]), callee, node.args[0])
        name = getattr(callee, "__name__", type(callee).__name__)
        if lang.is_kernel_function(callee):
            self.error(f"kernel '{name}' cannot be called from a kernel; make it a @qd.func")
        if _plain_function(callee):  # inlined like a @qd.func, as Quadrants does (docs/api.md)
            return self.inline_func(_as_func(callee), node)
        hint = " (decorate it with @qd.func)" if inspect.isfunction(callee) else ""
        self.error(f"'{name}' is not a qd.func or a qd intrinsic and cannot be called in a kernel{hint}")

    def vector_call(self, callee, node):
        """A call that makes or works on vectors and matrices (compiler/frontend/vectors.py), else None."""
        if isinstance(callee, BoundMethod):
            return self.call_vector_method(callee, node)
        if isinstance(callee, M.MatrixType):
            return self.construct(callee, node)
        if callee is M.Vector or callee is M.Matrix:
            return self.vector_literal(callee, node)
        helper = _MATRIX_HELPERS.get(callee) if _hashable(callee) else None
        if helper is not None:
            return self.matrix_helper(helper, node, callee)
        if _hashable(callee) and callee in MATH_FUNCTIONS:
            return self.call_math(callee, node)
        if callee is M.zero:
            (x,) = self.call_args(node, 1, 1, "zero")
            return self.elementwise(self.zero_like, [x], node.args)
        if any(callee is f for f in (M.vector, M.matrix, lang.vector, lang.matrix)):  # a type, made now
            args = self.call_args(node, 2, 3, callee.__name__)
            if any(is_runtime(a) for a in args):
                self.error(f"qd.types.{callee.__name__}() needs compile-time arguments")
            return callee(*args)
        return None

    def keywords_in_place(self, callee, node: ast.Call) -> ast.Call:
        """`node` with the keyword arguments that name `callee`'s positional parameters (Quadrants'
        names: `qd.atomic_add(x=a[i], y=1)`, `qd.math.clamp(v, xmin=0, xmax=1)`) moved to their
        positions, skipped optional ones filled with their defaults; keyword-only parameters
        (`qd.ndrange(axes=)`) stay keywords. The intrinsics' lowering then reads positions."""
        if not node.keywords or any(isinstance(a, ast.Starred) for a in node.args) \
                or any(k.arg is None for k in node.keywords):
            return node  # unpacking: the lowering reports it
        try:
            signature = inspect.signature(callee)
        except (TypeError, ValueError):
            return node
        params = list(signature.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional or (any(p.kind is p.VAR_POSITIONAL for p in params) and len(node.args) > len(positional)):
            return node  # keyword-only options (loop_config), or extra positional arguments: left as they are
        name = getattr(callee, "__name__", "call")
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
        for k in node.keywords:
            if k.arg not in signature.parameters and not takes_any:
                close = difflib.get_close_matches(k.arg, signature.parameters, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"it takes {', '.join(signature.parameters)}"
                self.error(f"{name}() has no parameter '{k.arg}' ({hint})", k)
        try:
            bound = signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            self.error(f"{name}(): {e}", node)
        named = [i for i, p in enumerate(positional) if p.name in bound.arguments]
        args = []
        for p in positional[:max(named, default=-1) + 1]:
            if p.name in bound.arguments:
                args.append(bound.arguments[p.name])
            elif p.default is None or isinstance(p.default, (bool, int, float, str)):
                args.append(ast.copy_location(ast.Constant(p.default), node))
            else:
                self.error(f"{name}(): pass '{p.name}' too when passing parameters after it by keyword", node)
        keywords = [k for k in node.keywords if k.arg not in {p.name for p in positional}]
        return ast.copy_location(ast.Call(func=node.func, args=args, keywords=keywords), node)

    def call_args(self, node, lo: int, hi: int, name: str) -> list:
        self.reject_unpacking(node)
        if node.keywords:
            self.error(f"{name}() takes no keyword arguments in kernels")
        if not lo <= len(node.args) <= hi:
            count = lo if lo == hi else f"{lo} to {hi}"
            self.error(f"{name}() takes {count} argument(s), got {len(node.args)}")
        return [self.visit(a) for a in node.args]

    def zero_like(self, x):
        """Zero of the type of scalar `x` (a compile-time number keeps its Python type)."""
        return self.values.cast(0, x.type) if is_runtime(x) else type(x)(0)

    def call_operands(self, node, lo: int, hi: int, name: str) -> tuple[list, list]:
        """(values, nodes) of the arguments, `*v` spread: a vector's components, a matrix's rows,
        a compile-time tuple's items (`qd.max(*v)`)."""
        for k in node.keywords:
            if k.arg is None:
                self.error("argument unpacking (**kwargs) is not supported in kernels", k)
        if node.keywords:
            self.error(f"{name}() takes no keyword arguments in kernels")
        values, nodes = self.spread(node.args)
        if not lo <= len(values) <= hi:
            self.error(f"{name}() takes {lo} to {hi} arguments, got {len(values)}")
        return values, nodes

    def reject_unpacking_keywords(self, node: ast.Call):
        for k in node.keywords:
            if k.arg is None:
                self.error("argument unpacking (**kwargs) is not supported in kernels", k)

    def spread(self, arg_nodes) -> tuple[list, list]:
        """(values, nodes) of the expressions `arg_nodes`, each `*x` spread into its items: a
        vector's components, a matrix's rows, a tuple's items (`qd.ndrange(*shape)`), a small
        numpy array's values when its template argument is keyed by them (`*self.grid_res`)."""
        values, nodes = [], []
        for a in arg_nodes:
            if not isinstance(a, ast.Starred):
                values.append(self.visit(a))
                nodes.append(a)
                continue
            v = self.visit(a.value)
            if isinstance(v, VectorValue):
                v = v.rows()
            elif isinstance(v, NdarrayHandle) and v.keyed_values is not None:
                v = v.keyed_values
            if not isinstance(v, (tuple, list)):
                self.error(f"only a vector, a matrix, a tuple or a 1-D numpy array of at most {MAX_KEYED_VALUES} "
                           f"numbers held by a template argument can be unpacked with *", a)
            values += v
            nodes += [a] * len(v)
        return values, nodes

    def reject_unpacking(self, node: ast.Call):
        for a in [*node.args, *node.keywords]:
            if isinstance(a, ast.Starred) or (isinstance(a, ast.keyword) and a.arg is None):
                self.error("argument unpacking (*args, **kwargs) is not supported in kernels", a)

    def scalar_args(self, node, lo: int, hi: int, name: str) -> list:
        return [self.scalar(v, a) for v, a in zip(self.call_args(node, lo, hi, name), node.args)]

    # ---- Python builtins -----------------------------------------------------------------
    def call_builtin(self, fn, node):
        name = fn.__name__
        if fn is builtins.range:
            return self.range_spec(self.call_args(node, 1, 3, "range"), node)
        if fn is builtins.len:
            return self.length(self.call_args(node, 1, 1, "len")[0])
        if fn in (builtins.min, builtins.max):
            args, nodes = self.call_operands(node, 2, 64, name)
            acc = args[0]
            for a, n in zip(args[1:], nodes[1:]):
                acc = self.elementwise(lambda x, y: self.values.binary(name, x, y), [acc, a], [nodes[0], n])
            return acc
        if fn is builtins.pow:
            return self.elementwise(lambda x, y: self.values.binary("pow", x, y), self.call_args(node, 2, 2, "pow"),
                                    node.args)
        if fn is builtins.abs:
            return self.elementwise(lambda x: self.values.unary("abs", x), self.call_args(node, 1, 1, name), node.args)
        if fn in (builtins.any, builtins.all):  # any(v) / all(v) of a vector or matrix, as in Quadrants
            (v,) = self.call_args(node, 1, 1, name)
            if not isinstance(v, VectorValue):
                self.error(f"{name}() in a kernel takes a vector or matrix", node.args[0])
            return self.reduce("bit_or" if fn is builtins.any else "bit_and", v.map(self.values.to_bool))
        (arg,) = self.scalar_args(node, 1, 1, name)
        if not is_runtime(arg):
            return fn(arg)  # int(), float(), bool() of a compile-time number
        target = {builtins.int: self.values.default_ip, builtins.float: self.values.default_fp}.get(fn, T.u1)
        return self.values.cast(arg, target)

    def range_spec(self, args, node) -> RangeSpec:
        begin, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        constant_step = isinstance(step, int) and not isinstance(step, bool)
        # inside qd.static(...) a constant range is Python's: it may count down
        if not constant_step or step <= 0 and not (self.static_depth and step < 0):
            self.error("range() step must be a compile-time positive integer", node.args[2])
        for v, a in zip(args, node.args[:1] if len(args) == 1 else node.args[:2]):
            v = self.scalar(v, a)
            if isinstance(v, float) or (is_runtime(v) and v.type.is_float):
                self.error("range() bounds must be integers", a)
        return RangeSpec(begin, end, step)

    def length(self, a):
        if isinstance(a, Field):
            if not a.shape:
                self.error(f"len() of 0-d field '{a.name}'")
            return a.shape[0]
        if isinstance(a, NdarrayHandle):
            return self.extent(a, 0)
        if isinstance(a, (tuple, list)):
            return len(a)
        if isinstance(a, VectorValue):
            return a.shape[0]
        self.error("len() needs a field, an ndarray, a vector or a tuple")

    # ---- qd intrinsics ---------------------------------------------------------------------
    def call_intrinsic(self, kind, node):
        what, op = kind
        fname = getattr(node.func, "attr", getattr(node.func, "id", what))
        if what == "unary" and op in ("floor", "ceil", "round"):
            return self.rounding(op, fname, node)
        if what == "unary":  # element-wise on vectors, as every math function below
            return self.elementwise(lambda x: self.values.unary(op, x), self.call_args(node, 1, 1, fname), node.args)
        if what == "binary":
            return self.elementwise(lambda x, y: self.values.binary(op, x, y), self.call_args(node, 2, 2, fname),
                                    node.args)
        if what == "select":
            def select(c, a, b):
                return (a if c else b) if not is_runtime(c) else self.values.select(c, a, b)
            return self.elementwise(select, self.call_args(node, 3, 3, "select"), node.args)
        if what == "cast":
            x, dtype = self.call_args(node, 2, 2, "cast")
            if dtype is int or dtype is float:
                dtype = self.values.default_ip if dtype is int else self.values.default_fp
            if not isinstance(dtype, T.DataType):
                self.error("qd.cast() needs a qd type as its second argument", node.args[1])
            if isinstance(x, VectorValue):
                return x.map(lambda c: self.convert(c, dtype, node.args[0]))
            return self.convert(self.scalar(x, node.args[0]), dtype, node.args[0])
        if what == "static":  # its argument is Python evaluated now: `is` between compile-time values is fine
            self.static_depth += 1
            try:
                args = self.call_args(node, 1, 8, "static")
            finally:
                self.static_depth -= 1
            return self.static_value(args, node)
        if what == "atomic":
            if node.keywords or len(node.args) != 2:
                self.error(f"{fname}() takes 2 arguments: a field/ndarray element (or local) and a value")
            target = self.vector_target(node.args[0])
            if target is not None:
                value = self.vector_operand(self.visit(node.args[1]), node.args[1])
                return self.atomic_target(op, target, value, node.args[1])
            return self.atomic(op, node.args[0], self.scalar(self.visit(node.args[1]), node.args[1]))
        if what == "ndrange":
            self.reject_unpacking_keywords(node)
            values, nodes = self.spread(node.args)
            dims = [self.ndrange_dim(v, a) for v, a in zip(values, nodes)]
            axes = None
            for kw in node.keywords:
                if kw.arg != "axes":
                    self.error(f"qd.ndrange() has no keyword argument '{kw.arg}' (it takes axes=)", kw)
                axes = self.visit(kw.value)
                if _holds_runtime_value(axes):
                    self.error("qd.ndrange(axes=...) must be known at compile time", kw.value)
            try:
                return lang.ndrange(*dims, axes=axes)
            except (TypeError, ValueError) as e:
                self.error(str(e), node.keywords[0].value if node.keywords else node)
        if what == "loop_config":
            return self.loop_config(node)
        if what in NUMERIC_CALLS:
            return NUMERIC_CALLS[what](self, node, fname)
        if what == "grouped":
            (it,) = self.call_args(node, 1, 1, "grouped")
            return lang.grouped(it)
        if what == "func":  # qd.func(f) applied in a kernel: f, inlined when called
            (fn,) = self.call_args(node, 1, 1, "func")
            if isinstance(fn, lang.Func):
                return fn
            if not _plain_function(fn):
                self.error("qd.func() takes a Python function whose source can be read", node.args[0])
            return _as_func(fn)
        self.error(f"unsupported intrinsic {fname}")

    def rounding(self, op: str, fname: str, node: ast.Call):
        """`qd.floor/ceil/round(x, dtype=None)`: element-wise; with a dtype (as in Quadrants) the
        result is converted to it (`qd.floor(x, qd.i32)`)."""
        self.reject_unpacking(node)
        if not 1 <= len(node.args) + len(node.keywords) <= 2 or not node.args \
                or any(k.arg != "dtype" for k in node.keywords):
            self.error(f"{fname}() takes a value and an optional dtype")
        x = self.visit(node.args[0])
        dtype_node = node.args[1] if len(node.args) > 1 else (node.keywords[0].value if node.keywords else None)
        dtype = None if dtype_node is None else self.visit(dtype_node)
        if dtype is int or dtype is float:
            dtype = self.values.default_ip if dtype is int else self.values.default_fp
        if dtype is not None and not isinstance(dtype, T.DataType):
            self.error(f"{fname}()'s dtype must be a qd type, got {dtype!r}", dtype_node)
        result = self.elementwise(lambda v: self.values.unary(op, v), [x], node.args[:1])
        if dtype is None:
            return result
        if isinstance(result, VectorValue):
            return result.map(lambda c: self.convert(c, dtype, node))
        return self.convert(self.scalar(result, node), dtype, node)

    def ndrange_dim(self, d, node):
        """One argument of qd.ndrange(): an integer (compile-time or run-time) or a (begin, end) pair."""
        parts = d if isinstance(d, (tuple, list)) else (d,)
        if isinstance(d, (tuple, list)) and len(d) != 2:
            self.error(f"qd.ndrange() arguments must be integers or (begin, end) pairs, got a tuple of {len(d)}",
                       node)
        for v in parts:
            if is_runtime(v) and v.type.is_integral and v.type is not T.u1:
                continue
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                continue
            what = f"a run-time {v.type} value" if is_runtime(v) else repr(v)
            self.error(f"qd.ndrange() arguments must be integers or (begin, end) pairs of integers, got {what}",
                       node)
        return d

    def static_value(self, values, node):
        """`qd.static(v)`: `v` must be known at compile time; a constant range() becomes a Python range."""
        out = []
        for v, a in zip(values, node.args):
            if isinstance(v, RangeSpec):
                v = v.as_static()
            if v is None or is_runtime(v):
                self.error("qd.static() needs a value known at compile time", a)
            out.append(v)
        return out[0] if len(out) == 1 else tuple(out)

    def loop_config(self, node):
        """`qd.loop_config(serialize=, block_dim=, parallelize=, block_dim_adaptive=, bit_vectorize=, name=)`
        configures the `for` right after it; any other key is an error (a misspelt `serialise=`
        must not leave the loop parallel)."""
        if node.args:
            self.error(f"qd.loop_config() takes keyword arguments only ({_LOOP_CONFIG_KEYS_TEXT})")
        config = LoopConfig()
        for kw in node.keywords:
            if kw.arg not in LOOP_CONFIG_KEYS:
                self.error(_unknown_key_message(kw.arg), kw)
            v = self.visit(kw.value)
            if is_runtime(v) or isinstance(v, GLOBAL_ARRAYS):
                self.error(f"qd.loop_config({kw.arg}=...) must be a compile-time value", kw.value)
            if kw.arg == "serialize":
                config.serialize = bool(v)
            elif kw.arg == "block_dim_adaptive":
                pass  # Quadrants' permission to choose the block size: what every device here does anyway
            elif kw.arg == "bit_vectorize":
                pass  # Quadrants packs struct-fors over quant arrays with it; qdc has no quant arrays
            elif kw.arg == "name":
                if v is not None and not (isinstance(v, str) and v.isidentifier() and v.isascii() and len(v) <= 64):
                    self.error(f"qd.loop_config(name=...) must be an identifier of at most 64 ASCII characters, "
                               f"got {v!r}", kw.value)
                config.label = v
            elif v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= _MAX_LOOP_CONFIG_INT:
                    self.error(f"qd.loop_config({kw.arg}=...) must be a positive integer, got {v!r}", kw.value)
                setattr(config, kw.arg, v)
        self.pending_loop_config = config
        return None

    def check_atomic_type(self, op: str, t, node) -> None:
        if op in ("and", "or", "xor") and t.is_float:
            self.error(f"atomic {op} needs an integer target, got {t}", node)
        if op == "mul" and t is T.u1:
            self.error("qd.atomic_mul needs a numeric target, got u1 (a product of booleans is atomic_and)", node)

    def atomic(self, op: str, target_node, value):
        """`qd.atomic_op(target, v)`: returns the old value."""
        if isinstance(target_node, ast.Subscript):
            base = self.visit(target_node.value)
            if isinstance(base, GLOBAL_ARRAYS):
                ptr = self.global_ptr(base, target_node)
                self.check_atomic_type(op, ptr.type, target_node)
                return self.emit(ir.AtomicRMW(op, ptr, self.values.cast(value, ptr.type)))
        if isinstance(target_node, ast.Name):
            var = self.lookup(target_node.id, target_node)
            if self.shared_by_iterations(var):  # every iteration of the parallel loop updates it
                self.check_atomic_type(op, var.type, target_node)
                return self.emit(ir.LocalAtomic(op, var, self.values.cast(value, var.type)))
            if isinstance(var, ir.Alloca):  # a local: no other thread can see it
                old = self.emit(ir.LocalLoad(var))
                new = value if op == "xchg" else self.values.binary(_LOCAL_ATOMIC_OP[op], old, value)
                self.emit(ir.LocalStore(var, self.values.cast(new, var.type)))
                return old
        self.error("the target of an atomic operation must be a field/ndarray element or a local variable",
                   target_node)

    # ---- qd.func inlining ----------------------------------------------------------------------
    def inline_func(self, func: lang.Func, node: ast.Call, receiver=None):
        if any(f.fn is func.fn for f in self.frames):
            self.error(f"qd.func '{func.__name__}' calls itself (directly or through other funcs); "
                       f"recursion is not supported")
        if len(self.frames) > _MAX_INLINE_DEPTH:
            self.error("qd.func calls nested too deeply")
        if func.requires_top_level and not self.at_top_level():
            self.error(f"qd.func '{func.__name__}' is declared requires_top_level=True: call it at the kernel's "
                       f"top level, not inside a run-time for, if or while")
        src = callable_source(func.fn)
        if not any(f is func for f in self.funcs_used):
            self.funcs_used.append(func)
        self.reject_unpacking_keywords(node)
        args, arg_nodes = self.spread(node.args)
        args = [receiver] * (receiver is not None) + args
        arg_nodes = [None] * (receiver is not None) + arg_nodes
        kwargs = {kw.arg: self.visit(kw.value) for kw in node.keywords}
        signature = self.signature(func.fn)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            self.error(f"call to qd.func '{func.__name__}': {e}")
        bound.apply_defaults()
        matrix_types = {name: self.matrix_parameter(func, name, value, node) for name, value in bound.arguments.items()}
        aliases = self.template_aliases(func, signature, node, arg_nodes)
        for name, value in bound.arguments.items():
            check_dataclass_parameter(func.__name__, name, self.parameter_annotation(func, name), value, self.error)
            if name not in aliases and (dtype := self.scalar_parameter_type(func, name)) is not None:
                # an annotated scalar parameter converts its argument, as in Quadrants
                arg_node = self.argument_node(signature, node, arg_nodes, name) or node
                if isinstance(value, (tuple, list, VectorValue, StructValue)):
                    self.error(f"call to qd.func '{func.__name__}': parameter '{name}' is a {dtype}, "
                               f"the argument is not a scalar", arg_node)
                with self.at(arg_node):
                    bound.arguments[name] = self.convert(self.scalar(value, arg_node), dtype, arg_node)
        frame = self.new_frame(func.fn, src)
        self.frames.append(frame)
        try:
            for name, value in bound.arguments.items():
                if name in aliases:  # a qd.template() parameter names the caller's variable itself
                    frame.scopes[0][name] = aliases[name]
                    continue
                if self.binds_once(name, parameter=True) and self.binds_value(value):
                    pass  # read only: bound to the argument's value
                elif is_runtime(value):  # pass by value: the func gets its own copy
                    var = self.new_local(value.type, name)
                    self.emit(ir.LocalStore(var, value))
                    value = var
                elif isinstance(value, VectorValue):
                    mtype = matrix_types[name]
                    dtype = mtype and mtype.element_dtype(self.values.default_ip, self.values.default_fp)
                    if not (self.binds_once(name, parameter=True) and self.binds_value(value, dtype)):
                        value = self.new_vector_var(value, name, dtype)
                elif isinstance(value, StructValue):
                    value = self.new_struct_var(value, name)
                frame.scopes[0][name] = value
            self.visit_body(src.func_body)
            result = self.func_result(frame)
            return self.convert_func_result(func.fn, result, frame.returns[-1][2] if frame.returns else src.fn_def)
        finally:
            self.frames.pop()

    def passes_by_value(self, callee_node) -> bool:
        """Whether the call named by `callee_node` (a name or a module's attribute) surely takes
        a variable passed to it by name as a value: a math, vector or type function, or a
        qd.func without qd.template() parameters. Not an atomic operation or a qd.template()
        parameter (they write the variable itself), nor anything not known before the call."""
        callee = self.known_callee(callee_node)
        if callee is None:
            return False
        callee = _SCOPE_BUILTINS.get(callee, callee) if _hashable(callee) else callee
        if isinstance(callee, (M.MatrixType, T.DataType)) or any(callee is b for b in _BUILTINS):
            return True
        if _hashable(callee) and (callee in MATH_FUNCTIONS or lang.INTRINSICS.get(callee, ("",))[0] in _BY_VALUE):
            return True
        method = _bound_method(callee)
        if isinstance(callee, lang.Func) or _plain_function(callee) or method is not None:
            func = callee if isinstance(callee, lang.Func) else method[0] if method else _as_func(callee)
            return not any(lang.is_template_annotation(self.parameter_annotation(func, p))
                           for p in self.signature(func.fn).parameters)
        return False

    def known_callee(self, node):
        """What `node` names now, found without emitting anything: a name not assigned in the
        current function (its scopes, closure, globals, builtins), an attribute of a module or
        class so found; None for anything else."""
        if isinstance(node, ast.Attribute):
            base = self.known_callee(node.value)
            return unwrap(getattr(base, node.attr, None)) if isinstance(base, (type, types.ModuleType)) else None
        if not isinstance(node, ast.Name) or node.id in self.frame.src.value_names.assigned:
            return None
        for scope in reversed(self.frame.scopes):
            if node.id in scope:
                return unwrap(scope[node.id])
        for space in (self.frame.closure, self.frame.globals, vars(builtins)):
            if node.id in space:
                return unwrap(space[node.id])
        return None

    def parameter_annotation(self, func: lang.Func, name: str):
        """The annotation of parameter `name` of `func` (None where it has none or it cannot be
        evaluated: qdc then does not read it)."""
        parameter = self.signature(func.fn).parameters[name]
        ann = parameter.annotation
        if ann is inspect.Parameter.empty or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            return None
        if isinstance(ann, str):  # postponed annotations: evaluated as typing would
            try:
                ann = eval(ann, func.fn.__globals__)  # noqa: S307  (the user's own annotation)
            except Exception:  # noqa: BLE001  (an annotation qdc does not read: no check)
                return None
        return ann

    def scalar_parameter_type(self, func: lang.Func, name: str) -> T.DataType | None:
        """The scalar type parameter `name` of `func` is annotated with (`qd.f32`, `int`, `float`,
        `bool`), None for any other annotation."""
        ann = self.parameter_annotation(func, name)
        if ann is int:
            return self.values.default_ip
        if ann is float:
            return self.values.default_fp
        if ann is bool:
            return T.u1
        return ann if isinstance(ann, T.DataType) else None

    def argument_node(self, signature, node: ast.Call, arg_nodes: list, name: str):
        """The source node of the argument bound to parameter `name` (None for a default or the
        method receiver); `arg_nodes`: the node of each positional argument."""
        for kw in node.keywords:
            if kw.arg == name:
                return kw.value
        names = list(signature.parameters)
        position = names.index(name) if name in names else -1
        return arg_nodes[position] if 0 <= position < len(arg_nodes) else None

    def template_aliases(self, func: lang.Func, signature, node: ast.Call, arg_nodes: list) -> dict:
        """{parameter: the caller's variable} for each qd.template() parameter whose argument is
        a plain name of a local variable: in Quadrants the func then works on that variable
        itself (`x = 1` in the func assigns the caller's variable)."""
        aliases = {}
        for name in signature.parameters:
            if not lang.is_template_annotation(self.parameter_annotation(func, name)):
                continue
            arg = self.argument_node(signature, node, arg_nodes, name)
            if not isinstance(arg, ast.Name):
                continue
            var = self.caller_variable(arg.id)
            if isinstance(var, (ir.Alloca, VectorVar, StructVar)):
                aliases[name] = var
        return aliases

    def caller_variable(self, name: str):
        for scope in reversed(self.frame.scopes):
            if name in scope:
                return scope[name]
        return None

    def matrix_parameter(self, func: lang.Func, name: str, value, node) -> M.MatrixType | None:
        """The vector/matrix type parameter `name` of `func` is annotated with (None for any other
        annotation); the argument must have its shape (it is converted to its element type)."""
        ann = self.parameter_annotation(func, name)
        if not isinstance(ann, M.MatrixType):
            return None
        if not isinstance(value, VectorValue) or value.shape != ann.shape:
            got = f"shape {shape_text(value.shape)}" if isinstance(value, VectorValue) else "a scalar"
            self.error(f"call to qd.func '{func.__name__}': parameter '{name}' is a {ann!r}, the argument has "
                       f"{got}", node)
        return ann

    def visit_Return(self, node: ast.Return):
        if self.frame.is_kernel:
            return self.kernel_return(node)  # returns.py
        frame = self.frame
        # outside run-time control flow (under `if qd.static`, in a qd.static loop) a return
        # always runs when reached: it ends the func (frame.stop skips the rest)
        reached_always = self.blocks[-1] is frame.base_block and all(k == "static" for k in frame.loops)
        if not is_tail_return(node) and not reached_always:
            self.error("return must be the last statement of a qd.func, or end an if/else branch "
                       "(returns inside run-time loops or followed by code are not supported)")
        value = None if node.value is None else self.visit(node.value)
        frame.returns.append((self.blocks[-1], value, node))
        if reached_always:
            frame.stop = "return"

    def func_result(self, frame):
        """The value of an inlined call. A single return at the func's top level is its value
        as is (possibly compile-time); returns in several branches store into shared locals."""
        returns = frame.returns
        if not returns:
            return None
        if len(returns) == 1 and returns[0][0] is frame.base_block:
            return returns[0][1]
        if any(_holds_vector(v) for _, v, _ in returns):  # vectors travel as their scalar components
            flat = [flatten(v) for _, v, _ in returns]
            if any(layout != flat[0][0] for layout, _ in flat):
                self.error("all returns of a qd.func must return values of the same shapes", returns[-1][2])
            returns = [(block, tuple(scalars), ret) for (block, _, ret), (_, scalars) in zip(returns, flat)]
            return unflatten(flat[0][0], self.merge_returns(frame, returns, len(flat[0][1])))
        shapes = {_return_shape(v) for _, v, _ in returns}
        if len(shapes) != 1:
            self.error("all returns of a qd.func must return the same number of values", returns[-1][2])
        (shape,) = shapes
        if shape is None:
            return None
        results = self.merge_returns(frame, returns, shape)
        return tuple(results) if shape != "scalar" else results[0]

    def merge_returns(self, frame, returns, shape) -> list:
        """One shared local per returned scalar, stored by each return: their loads, in order."""
        columns = zip(*[v if isinstance(v, tuple) else (v,) for _, v, _ in returns])
        results = []
        for column in columns:
            column = [self.scalar(v, ret) for (_, _, ret), v in zip(returns, column)]
            var = ir.Alloca(self.values.common_type_of(column), "return", frame.src.loc(returns[0][2]))
            var.block = frame.base_block
            frame.base_block.stmts.insert(frame.start_index, var)
            for (block, _, ret), v in zip(returns, column):
                self.node_stack.append(ret)
                try:
                    self.emit_into(block, lambda v=v: self.emit(ir.LocalStore(var, self.values.cast(v, var.type))))
                finally:
                    self.node_stack.pop()
            results.append(self.emit(ir.LocalLoad(var)))
        return results


LOOP_CONFIG_KEYS = ("serialize", "block_dim", "parallelize", "block_dim_adaptive", "bit_vectorize", "name")
_LOOP_CONFIG_KEYS_TEXT = ", ".join(f"{k}=" for k in LOOP_CONFIG_KEYS)
_MAX_LOOP_CONFIG_INT = 1 << 16  # threads of a block, or of a CPU loop
# Python-scope versions of builtins (element-wise on qd.Matrix values); in kernels, the builtins
_SCOPE_BUILTINS = {lang.min: builtins.min, lang.max: builtins.max, lang.abs: builtins.abs}
_BY_VALUE = ("unary", "binary", "select", "cast")  # kinds of intrinsics that only read their arguments
_MATRIX_HELPERS = {M.Matrix.identity: "identity", M.Matrix.diag: "diag", M.Matrix.zero: "zero",
                   M.Matrix.one: "one", M.Matrix.rows: "rows", M.Matrix.cols: "cols",
                   M.Vector.zero: "zero", M.Vector.one: "one", M.Vector.unit: "unit"}


class LoopConfig:
    """What `qd.loop_config(...)` set for the next loop. `block_dim` is kept on the RangeFor
    for GPU backends (threads per block), `parallelize` for the CPU (most threads), `label`
    (name=) names its task."""

    def __init__(self):
        self.serialize, self.block_dim, self.parallelize, self.label = False, None, None, None

    def apply(self, loop: ir.RangeFor) -> None:
        loop.block_dim, loop.max_threads, loop.label = self.block_dim, self.parallelize, self.label


def _unknown_key_message(key) -> str:
    if key is None:
        return f"qd.loop_config() does not take **kwargs; it accepts {_LOOP_CONFIG_KEYS_TEXT}"
    close = difflib.get_close_matches(key, LOOP_CONFIG_KEYS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"qd.loop_config() has no option '{key}'{hint}; it accepts {_LOOP_CONFIG_KEYS_TEXT}"


def _holds_runtime_value(v) -> bool:
    return is_runtime(v) or isinstance(v, (tuple, list, VectorValue)) and any(
        _holds_runtime_value(e) for e in (v.components if isinstance(v, VectorValue) else v))


def _holds_vector(v) -> bool:
    return isinstance(v, (VectorValue, StructValue)) or isinstance(v, tuple) and any(_holds_vector(e) for e in v)


def _return_shape(v):
    if v is None:
        return None
    return len(v) if isinstance(v, tuple) else "scalar"


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False
