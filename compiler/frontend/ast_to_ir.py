"""Python AST → IR. One visitor method per node kind; every error carries file:line:col.

Compile-time evaluation happens here because it needs Python values: `qd.static` loops are
unrolled and `if qd.static(...)` picks a branch while the AST is walked, and `@qd.func`
calls are inlined at their call sites (as Taichi's and Quadrants' front ends do). Names
resolve through the kernel's locals, then the Python function's closure and globals.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import math
import textwrap

import numpy as np

from qdc.runtime import types as T
from qdc.runtime.errors import QdcCompileError
from qdc.runtime.fields import Field

from .. import ir
from .. import lang
from .values import ValueBuilder, is_number


class NdarrayHandle:
    """An ndarray parameter as seen inside a kernel (a compile-time object)."""

    def __init__(self, arg_index: int, name: str, dtype: T.DataType, ndim: int, needs_grad: bool, grad=False):
        self.arg_index, self.name, self.dtype, self.ndim = arg_index, name, dtype, ndim
        self.needs_grad, self.is_grad = needs_grad, grad

    def ref(self) -> ir.NdarrayRef:
        return ir.NdarrayRef(self.arg_index, self.name, self.dtype, self.ndim, self.is_grad)


class _Shape(tuple):
    """`a.shape` of an ndarray inside a kernel: a tuple of i32 statements."""


class _RuntimeRange:
    """`range(...)` with run-time bounds: only valid as a for-loop iterable."""

    def __init__(self, begin, end, step):
        self.begin, self.end, self.step = begin, end, step


class SourceInfo:
    """Where a Python function's source lives, so AST positions map to file positions."""

    def __init__(self, fn):
        self.filename = inspect.getsourcefile(fn) or "<unknown>"
        lines, start = inspect.getsourcelines(fn)
        self.file_lines = lines
        raw = "".join(lines)
        dedented = textwrap.dedent(raw)
        self.indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        self.first_line = start
        self.tree = ast.parse(dedented)
        self.fn_def = self.tree.body[0]

    def loc(self, node) -> ir.SourceLoc:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        return ir.SourceLoc(self.filename, self.first_line + line - 1, col + self.indent + 1)

    def source_line(self, node) -> str | None:
        idx = getattr(node, "lineno", 1) - 1
        return self.file_lines[idx] if 0 <= idx < len(self.file_lines) else None


_SOURCE_CACHE: dict = {}


def source_info(fn) -> SourceInfo:
    info = _SOURCE_CACHE.get(fn)
    if info is None:
        try:
            info = SourceInfo(fn)
        except (OSError, TypeError) as e:
            raise QdcCompileError(f"cannot read the source of {getattr(fn, '__name__', fn)}: {e}") from None
        _SOURCE_CACHE[fn] = info
    return info


class _Frame:
    """One function being lowered (the kernel, or a func inlined into it)."""

    def __init__(self, fn, src: SourceInfo):
        self.fn = fn
        self.src = src
        self.scopes: list[dict] = [{}]
        self.globals = fn.__globals__
        self.closure = {}
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    self.closure[name] = cell.cell_contents
                except ValueError:
                    pass
        self.block_depth, self.start_index = 0, 0  # where an inlined call began (return slots go there)
        self.return_vars = None  # list of Alloca (one per returned value) once a return is seen
        self.return_is_tuple = False
        self.deps: list = []  # funcs called, for the cache key


_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.BitAnd: "bit_and", ast.BitOr: "bit_or",
           ast.BitXor: "bit_xor", ast.LShift: "shl", ast.RShift: "shr"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_AUG_ATOMIC = {ast.Add: "add", ast.Sub: "sub"}


class FrontEnd(ast.NodeVisitor):
    """Lowers one `@qd.kernel` into a KernelIR."""

    def __init__(self, fn, params: list[ir.Param], options):
        self.src = source_info(fn)
        self.kernel = ir.KernelIR(fn.__name__, params, self.src.loc(self.src.fn_def))
        self.field_objects: list[Field] = []
        self.options = options
        self.frames: list[_Frame] = [_Frame(fn, self.src)]
        self.blocks: list[ir.Block] = [self.kernel.body]
        self.loop_depth = 0
        self.pending_serialize = False
        self.node_stack: list[ast.AST] = []
        self.values = ValueBuilder(self.emit, options.default_ip, options.default_fp, self.error)
        self.constants_used: dict = {}  # name -> value of captured compile-time constants (cache key)
        self.funcs_used: list = []
        self.static_loop_depths: list[int] = []

    # ---- infrastructure -------------------------------------------------------------
    @property
    def frame(self) -> _Frame:
        return self.frames[-1]

    def error(self, message: str, node=None):
        node = node or (self.node_stack[-1] if self.node_stack else self.frame.src.fn_def)
        src = self.frame.src
        loc = src.loc(node)
        raise QdcCompileError(message, loc.filename, loc.line, loc.col, src.source_line(node))

    def emit(self, stmt: ir.Stmt) -> ir.Stmt:
        if stmt.loc is None and self.node_stack:
            stmt.loc = self.frame.src.loc(self.node_stack[-1])
        return self.blocks[-1].append(stmt)

    def visit(self, node):
        self.node_stack.append(node)
        try:
            method = getattr(self, "visit_" + type(node).__name__, None)
            if method is None:
                self.error(f"{_describe(node)} is not supported in qdc kernels")
            return method(node)
        except QdcCompileError:
            raise
        except RecursionError:
            self.error("expression nested too deeply")
        except Exception as e:  # an internal failure still points at the user's line
            self.error(f"internal compiler error while compiling this line: {type(e).__name__}: {e}")
        finally:
            self.node_stack.pop()

    def visit_body(self, stmts: list[ast.stmt]):
        stmts = _fold_early_returns(stmts)
        for s in stmts:
            self.visit(s)

    def in_block(self, block: ir.Block, stmts: list[ast.stmt], scope=True):
        self.blocks.append(block)
        if scope:
            self.frame.scopes.append({})
        try:
            self.visit_body(stmts)
        finally:
            self.blocks.pop()
            if scope:
                self.frame.scopes.pop()

    # ---- entry ----------------------------------------------------------------------
    def build(self) -> ir.KernelIR:
        fdef = self.src.fn_def
        if not isinstance(fdef, ast.FunctionDef):
            self.error("a kernel must be a plain function definition", fdef)
        scope = self.frame.scopes[0]
        for i, p in enumerate(self.kernel.params):
            if p.kind == "scalar":
                var = self.emit(ir.Alloca(p.dtype, p.name, self.src.loc(fdef)))
                self.emit(ir.LocalStore(var, self.emit(ir.ArgLoad(i, p.dtype, self.src.loc(fdef)))))
                scope[p.name] = var
            else:
                scope[p.name] = NdarrayHandle(i, p.name, p.dtype, p.ndim, p.needs_grad)
        for s in _fold_early_returns(fdef.body):
            if isinstance(s, ast.Return) and s.value is None:
                break
            self.visit(s)
        return self.kernel

    # ---- names ----------------------------------------------------------------------
    def lookup(self, name: str, node):
        for scope in reversed(self.frame.scopes):
            if name in scope:
                return scope[name]
        fr = self.frame
        if name in fr.closure:
            return self.capture(name, fr.closure[name])
        if name in fr.globals:
            return self.capture(name, fr.globals[name])
        if hasattr(builtins, name):
            return getattr(builtins, name)
        self.error(f"name '{name}' is not defined (variables assigned inside if/for/while bodies are "
                   f"local to that body, as in Quadrants: assign it before the block)", node)

    def capture(self, name, value):
        if isinstance(value, (bool, int, float)) or isinstance(value, np.generic):
            self.constants_used[name] = value
        return value

    def visit_Name(self, node: ast.Name):
        v = self.lookup(node.id, node)
        if isinstance(v, ir.Alloca):
            return self.emit(ir.LocalLoad(v))
        return v

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, (bool, int, float)) or node.value is None:
            return node.value
        if isinstance(node.value, str):
            return node.value
        self.error(f"constant {node.value!r} is not supported in kernels")

    def visit_Tuple(self, node: ast.Tuple):
        return tuple(self.visit(e) for e in node.elts)

    visit_List = visit_Tuple

    def visit_Attribute(self, node: ast.Attribute):
        base = self.visit(node.value)
        attr = node.attr
        if isinstance(base, NdarrayHandle):
            if attr == "shape":
                return _Shape(self.emit(ir.NdarrayShape(base.arg_index, d, T.i32)) for d in range(base.ndim))
            if attr == "grad":
                if not base.needs_grad:
                    self.error(f"ndarray parameter '{base.name}' has no .grad: annotate it with needs_grad=True")
                return NdarrayHandle(base.arg_index, base.name, base.dtype, base.ndim, True, grad=True)
            self.error(f"ndarray has no attribute '{attr}' in kernels (use .shape or .grad)")
        if isinstance(base, Field):
            if attr == "grad":
                if base.grad is None:
                    self.error(f"field '{base.name}' has no .grad: declare it with needs_grad=True")
                return base.grad
            if attr == "shape":
                return tuple(base.shape)
            if attr == "dtype":
                return base.dtype
            self.error(f"field has no attribute '{attr}' in kernels")
        if isinstance(base, ir.Stmt):
            self.error(f"run-time value has no attribute '{attr}'")
        try:
            return getattr(base, attr)
        except AttributeError:
            self.error(f"'{type(base).__name__}' object has no attribute '{attr}'")

    # ---- expressions ------------------------------------------------------------------
    def visit_BinOp(self, node: ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            self.error(f"operator {type(node.op).__name__} is not supported")
        a, b = self.scalar(self.visit(node.left), node.left), self.scalar(self.visit(node.right), node.right)
        if op in ("floordiv", "mod") and not isinstance(b, ir.Stmt) and b == 0 \
                and isinstance(a, ir.Stmt) and not a.type.is_float:
            self.error("integer division by constant zero")
        return self.values.binary(op, a, b)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        x = self.scalar(self.visit(node.operand), node.operand)
        op = {ast.USub: "neg", ast.UAdd: None, ast.Not: "not", ast.Invert: "bit_not"}[type(node.op)]
        return x if op is None else self.values.unary(op, x)

    def visit_Compare(self, node: ast.Compare):
        """`a < b < c` is `a < b and b < c` (both sides evaluated once)."""
        left = self.scalar(self.visit(node.left), node.left)
        result = True
        for op_node, right_node in zip(node.ops, node.comparators):
            op = _CMPOPS.get(type(op_node))
            if op is None:
                self.error(f"comparison {type(op_node).__name__} is not supported")
            right = self.scalar(self.visit(right_node), right_node)
            r = self.values.binary(op, left, right)
            if result is True:
                result = r
            elif isinstance(result, ir.Stmt) or isinstance(r, ir.Stmt):
                result = self.values.binary("bit_and", self.values.to_bool(result), self.values.to_bool(r))
            else:
                result = result and r
            left = right
        return result

    def visit_BoolOp(self, node: ast.BoolOp):
        """`and`/`or` short-circuit: the right side runs only when needed."""
        is_and = isinstance(node.op, ast.And)
        first = self.visit(node.values[0])
        if not isinstance(first, ir.Stmt):
            if is_and and not first:
                return False
            if not is_and and first:
                return True
            if len(node.values) == 1:
                return bool(first)
            rest = ast.BoolOp(op=node.op, values=node.values[1:])
            ast.copy_location(rest, node.values[1])
            return self.visit(rest) if len(node.values) > 2 else self.truthy(self.visit(node.values[1]))
        result = self.emit(ir.Alloca(T.u1, "", None))
        first = self.values.to_bool(first)
        self.emit(ir.LocalStore(result, first))
        cond = first if is_and else self.values.unary("not", first)
        branch = self.emit(ir.If(cond))
        self.blocks.append(branch.then_block)
        try:
            if len(node.values) > 2:
                rest = ast.BoolOp(op=node.op, values=node.values[1:])
                ast.copy_location(rest, node.values[1])
                second = self.visit(rest)
            else:
                second = self.visit(node.values[1])
            self.emit(ir.LocalStore(result, self.values.to_bool(second)))
        finally:
            self.blocks.pop()
        return self.emit(ir.LocalLoad(result))

    def truthy(self, v):
        return self.values.to_bool(v) if isinstance(v, ir.Stmt) else bool(v)

    def visit_IfExp(self, node: ast.IfExp):
        cond = self.visit(node.test)
        if not isinstance(cond, ir.Stmt):
            return self.visit(node.body if cond else node.orelse)
        cond = self.values.to_bool(cond)
        # Evaluate only the taken side, as Python does: a store into a temporary per branch.
        branch = self.emit(ir.If(cond))
        results = []
        for block, expr in ((branch.then_block, node.body), (branch.else_block, node.orelse)):
            self.blocks.append(block)
            try:
                results.append(self.scalar(self.visit(expr), expr))
            finally:
                self.blocks.pop()
        a, b = results
        ta = a.type if isinstance(a, ir.Stmt) else None
        tb = b.type if isinstance(b, ir.Stmt) else None
        if ta is None and tb is None:
            rtype = T.promote(self.values.literal_type(a), self.values.literal_type(b))
        elif ta is None or tb is None:
            typed, weak = (a, b) if ta else (b, a)
            rtype = self.values.default_fp if isinstance(weak, float) and not typed.type.is_float else typed.type
        else:
            rtype = T.promote(ta, tb)
        var = ir.Alloca(rtype, "", self.frame.src.loc(node))
        self.blocks[-1].stmts.insert(self.blocks[-1].stmts.index(branch), var)
        var.block = self.blocks[-1]
        for block, val in ((branch.then_block, a), (branch.else_block, b)):
            self.blocks.append(block)
            try:
                self.emit(ir.LocalStore(var, self.values.cast(val, rtype)))
            finally:
                self.blocks.pop()
        return self.emit(ir.LocalLoad(var))

    def scalar(self, v, node):
        if isinstance(v, ir.Stmt) or is_number(v):
            if isinstance(v, np.generic):
                return v.item()
            return v
        if isinstance(v, (Field, NdarrayHandle)):
            self.error("a field or ndarray must be indexed to be used as a value", node)
        self.error(f"{type(v).__name__} value cannot be used in an arithmetic expression", node)

    # ---- subscripts and globals ----------------------------------------------------------
    def visit_Subscript(self, node: ast.Subscript):
        base = self.visit(node.value)
        if isinstance(base, (Field, NdarrayHandle)):
            return self.emit(ir.GlobalLoad(self.global_ptr(base, node)))
        if isinstance(base, (tuple, list)):
            idx = self.visit(node.slice)
            if isinstance(idx, ir.Stmt):
                self.error("a tuple can only be indexed with a compile-time constant")
            try:
                return base[idx]
            except (IndexError, TypeError) as e:
                self.error(str(e))
        self.error(f"'{type(base).__name__}' value is not subscriptable in kernels")

    def global_ptr(self, base, node: ast.Subscript) -> ir.GlobalPtr:
        idx = self.visit(node.slice)
        if idx is None:
            indices = []
        elif isinstance(idx, tuple):
            indices = list(idx)
        else:
            indices = [idx]
        if isinstance(base, Field):
            ref = self.field_ref(base)
            rank, what = len(base.shape), f"field '{base.name}'"
        else:
            ref = base.ref()
            rank, what = base.ndim, f"ndarray '{base.name}'"
        if len(indices) != rank:
            hint = " (index a 0-d field with x[None])" if rank == 0 else ""
            self.error(f"{what} has {rank} dimension(s) but is indexed with {len(indices)}{hint}", node)
        out = []
        for i in indices:
            i = self.scalar(i, node)
            if isinstance(i, ir.Stmt):
                if i.type.is_float:
                    self.error(f"index into {what} must be an integer, got {i.type}", node)
                if i.type is T.u1:
                    i = self.values.cast(i, T.i32)
                out.append(i)
            else:
                if isinstance(i, float) or isinstance(i, bool):
                    self.error(f"index into {what} must be an integer, got {type(i).__name__}", node)
                out.append(self.values.materialize(i))
        return self.emit(ir.GlobalPtr(ref, out))

    def field_ref(self, field: Field) -> ir.FieldRef:
        for i, f in enumerate(self.field_objects):
            if f is field:
                return self.kernel.fields[i]
        ref = ir.FieldRef(len(self.kernel.fields), field.name, field.dtype, tuple(field.shape), field.is_grad)
        self.kernel.fields.append(ref)
        self.field_objects.append(field)
        return ref

    # ---- calls -------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call):
        callee = self.visit(node.func)
        if isinstance(callee, lang.Func):
            return self.inline_func(callee, node)
        kind = lang.INTRINSICS.get(callee) if _hashable(callee) else None
        if kind is not None:
            return self.call_intrinsic(kind, node)
        if callee in (builtins.abs, builtins.min, builtins.max, builtins.int, builtins.float,
                      builtins.bool, builtins.range, builtins.len):
            return self.call_builtin(callee, node)
        if isinstance(callee, T.DataType):
            (arg,) = self.call_args(node, 1, 1, callee.name)
            return self.values.cast(self.scalar(arg, node), callee)
        name = getattr(callee, "__name__", type(callee).__name__)
        if type(callee).__name__ == "Kernel":
            self.error(f"kernel '{name}' cannot be called from a kernel; make it a @qd.func")
        self.error(f"'{name}' is not a qd.func or a qd intrinsic and cannot be called in a kernel")

    def call_args(self, node, lo, hi, name):
        if node.keywords:
            self.error(f"{name}() takes no keyword arguments here")
        if not lo <= len(node.args) <= hi:
            self.error(f"{name}() takes {lo if lo == hi else f'{lo} to {hi}'} argument(s), got {len(node.args)}")
        return [self.visit(a) for a in node.args]

    def call_builtin(self, fn, node):
        name = fn.__name__
        if fn is builtins.range:
            args = self.call_args(node, 1, 3, "range")
            if all(not isinstance(a, ir.Stmt) for a in args):
                return range(*args)
            begin, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
            if isinstance(step, ir.Stmt) or not isinstance(step, int) or step <= 0:
                self.error("range() step must be a constant positive integer")
            return _RuntimeRange(begin, end, step)
        if fn is builtins.len:
            (a,) = self.call_args(node, 1, 1, "len")
            if isinstance(a, Field):
                return a.shape[0]
            if isinstance(a, NdarrayHandle):
                return self.emit(ir.NdarrayShape(a.arg_index, 0, T.i32))
            if isinstance(a, (tuple, list)):
                return len(a)
            self.error("len() needs a field, an ndarray or a tuple")
        if fn in (builtins.min, builtins.max):
            args = [self.scalar(a, node) for a in self.call_args(node, 2, 64, name)]
            acc = args[0]
            for a in args[1:]:
                acc = self.values.binary(name, acc, a)
            return acc
        (arg,) = self.call_args(node, 1, 1, name)
        arg = self.scalar(arg, node)
        if fn is builtins.abs:
            return self.values.unary("abs", arg)
        if fn is builtins.int:
            return int(arg) if not isinstance(arg, ir.Stmt) else self.values.cast(arg, self.values.default_ip)
        if fn is builtins.float:
            return float(arg) if not isinstance(arg, ir.Stmt) else self.values.cast(arg, self.values.default_fp)
        return bool(arg) if not isinstance(arg, ir.Stmt) else self.values.to_bool(arg)

    def call_intrinsic(self, kind, node):
        what, op = kind
        fname = getattr(node.func, "attr", getattr(node.func, "id", what))
        if what == "unary":
            (x,) = self.call_args(node, 1, 1, fname)
            x = self.scalar(x, node)
            if not isinstance(x, ir.Stmt):
                return float(getattr(math, op if op not in ("rsqrt", "round") else "sqrt")(x)) if op not in ("rsqrt", "round") \
                    else (1.0 / math.sqrt(x) if op == "rsqrt" else float(builtins.round(x)))
            return self.values.unary(op, x)
        if what == "binary":
            a, b = (self.scalar(v, node) for v in self.call_args(node, 2, 2, fname))
            return self.values.binary(op, a, b)
        if what == "select":
            c, a, b = (self.scalar(v, node) for v in self.call_args(node, 3, 3, "select"))
            if not isinstance(c, ir.Stmt):
                return a if c else b
            return self.values.select(c, a, b)
        if what == "cast":
            x, dtype = self.call_args(node, 2, 2, "cast")
            if not isinstance(dtype, T.DataType):
                self.error("qd.cast needs a qd type as its second argument")
            return self.values.cast(self.scalar(x, node), dtype)
        if what == "static":
            vals = self.call_args(node, 1, 8, "static")
            for v in vals:
                if isinstance(v, ir.Stmt):
                    self.error("qd.static() needs a value known at compile time")
            return vals[0] if len(vals) == 1 else tuple(vals)
        if what == "atomic":
            if node.keywords or len(node.args) != 2:
                self.error(f"{fname}() takes 2 arguments")
            return self.atomic(op, node.args[0], self.scalar(self.visit(node.args[1]), node), node)
        if what == "ndrange":
            return lang.ndrange(*[self.visit(a) for a in node.args])
        if what == "loop_config":
            for kw in node.keywords:
                if kw.arg == "serialize":
                    v = self.visit(kw.value)
                    if isinstance(v, ir.Stmt):
                        self.error("loop_config(serialize=...) must be a compile-time value")
                    self.pending_serialize = bool(v)
            return None
        self.error(f"unsupported intrinsic {fname}")

    def atomic(self, op: str, target_node, value, node):
        """`qd.atomic_op(target, v)` / `target += v`: returns the old value."""
        if isinstance(target_node, ast.Subscript):
            base = self.visit(target_node.value)
            if isinstance(base, (Field, NdarrayHandle)):
                ptr = self.global_ptr(base, target_node)
                if op in ("and", "or", "xor") and ptr.type.is_float:
                    self.error(f"atomic {op} needs an integer target")
                return self.emit(ir.AtomicRMW(op, ptr, self.values.cast(value, ptr.type)))
        if isinstance(target_node, ast.Name):
            var = self.lookup(target_node.id, target_node)
            if isinstance(var, ir.Alloca):  # a local: no other thread can see it
                old = self.emit(ir.LocalLoad(var))
                binop = {"add": "add", "sub": "sub", "min": "min", "max": "max",
                         "and": "bit_and", "or": "bit_or", "xor": "bit_xor"}[op]
                new = self.values.binary(binop, old, value)
                self.emit(ir.LocalStore(var, self.values.cast(new, var.type)))
                return old
        self.error("the target of an atomic operation must be a field/ndarray element or a local variable", node)

    def inline_func(self, func: lang.Func, node: ast.Call):
        if any(f.fn is func.fn for f in self.frames):
            self.error(f"qd.func '{func.__name__}' calls itself; recursion is not supported")
        if len(self.frames) > 64:
            self.error("qd.func calls nested too deeply")
        src = source_info(func.fn)
        if func not in self.funcs_used:
            self.funcs_used.append(func)
        try:
            sig = inspect.signature(func.fn)
            args = [self.visit(a) for a in node.args]
            kwargs = {kw.arg: self.visit(kw.value) for kw in node.keywords}
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
        except TypeError as e:
            self.error(f"call to qd.func '{func.__name__}': {e}")
        frame = _Frame(func.fn, src)
        frame.block_depth, frame.start_index = len(self.blocks) - 1, len(self.blocks[-1].stmts)
        self.frames.append(frame)
        block_marker = len(self.blocks)
        try:
            scope = frame.scopes[0]
            for name, value in bound.arguments.items():
                if isinstance(value, ir.Stmt):  # pass by value: the func gets its own copy
                    var = self.emit(ir.Alloca(value.type, name))
                    self.emit(ir.LocalStore(var, value))
                    scope[name] = var
                else:
                    scope[name] = value
            fdef = src.fn_def
            self.visit_body(fdef.body)
            if frame.return_vars is None:
                return None
            vals = tuple(self.emit(ir.LocalLoad(v)) for v in frame.return_vars)
            return vals if frame.return_is_tuple else vals[0]
        finally:
            self.frames.pop()
            del self.blocks[block_marker:]

    def visit_Return(self, node: ast.Return):
        if len(self.frames) == 1:
            self.error("kernels cannot return values")
        fr = self.frame
        if not getattr(node, "_qdc_tail", False):
            self.error("return is only supported at the end of a qd.func, or as the last statement of "
                       "an if/else branch whose other paths also return")
        value = self.visit(node.value) if node.value is not None else None
        vals = value if isinstance(value, tuple) else (value,)
        if value is None:
            return
        if fr.return_vars is None:
            fr.return_is_tuple = isinstance(value, tuple)
            fr.return_vars = []
            for v in vals:
                v = self.values.materialize(self.scalar(v, node))
                var = ir.Alloca(v.type, "return", self.frame.src.loc(node))
                self.insert_at_frame_start(var)
                fr.return_vars.append(var)
        if len(vals) != len(fr.return_vars):
            self.error("all returns of a qd.func must return the same number of values")
        for var, v in zip(fr.return_vars, vals):
            self.emit(ir.LocalStore(var, self.values.cast(self.scalar(v, node), var.type)))

    def insert_at_frame_start(self, var: ir.Alloca):
        """Return slots are allocated where the inlined call began, so every branch can store into them."""
        block = self.blocks[self.frame.block_depth]
        var.block = block
        block.stmts.insert(self.frame.start_index, var)

    # ---- statements ----------------------------------------------------------------------
    def visit_Expr(self, node: ast.Expr):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.visit(node.value)

    def visit_Pass(self, node):
        pass

    def visit_Assign(self, node: ast.Assign):
        value = self.visit(node.value)
        for target in node.targets:
            self.assign(target, value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        dtype = self.visit(node.annotation)
        if not isinstance(dtype, T.DataType):
            self.error("a variable annotation must be a qd type")
        if node.value is None:
            self.error("an annotated variable needs a value")
        value = self.values.cast(self.scalar(self.visit(node.value), node), dtype)
        if not isinstance(node.target, ast.Name):
            self.error("only simple names can be annotated")
        var = self.emit(ir.Alloca(dtype, node.target.id))
        self.emit(ir.LocalStore(var, value))
        self.frame.scopes[-1][node.target.id] = var

    def assign(self, target, value, node):
        if isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, (tuple, list)):
                self.error("cannot unpack a non-tuple value")
            if len(value) != len(target.elts):
                self.error(f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v, node)
            return
        if isinstance(target, ast.Name):
            return self.assign_name(target.id, value, node)
        if isinstance(target, ast.Subscript):
            base = self.visit(target.value)
            if not isinstance(base, (Field, NdarrayHandle)):
                self.error("only field and ndarray elements can be assigned through a subscript")
            ptr = self.global_ptr(base, target)
            self.emit(ir.GlobalStore(ptr, self.values.cast(self.scalar(value, node), ptr.type)))
            return
        self.error(f"cannot assign to {_describe(target)}")

    def assign_name(self, name, value, node):
        for scope in reversed(self.frame.scopes):
            if name in scope:
                var = scope[name]
                if isinstance(var, ir.Alloca):
                    if not (isinstance(value, ir.Stmt) or is_number(value)):
                        self.error(f"cannot assign a {type(value).__name__} to run-time variable '{name}'")
                    self.emit(ir.LocalStore(var, self.values.cast(self.scalar(value, node), var.type)))
                    return
                break
        if isinstance(value, ir.Stmt) or is_number(value):
            v = self.values.materialize(self.scalar(value, node))
            var = self.emit(ir.Alloca(v.type, name))
            self.emit(ir.LocalStore(var, v))
            self.frame.scopes[-1][name] = var
        else:  # a compile-time object (field, ndarray, tuple, function): bind the name to it
            self.frame.scopes[-1][name] = value

    def visit_AugAssign(self, node: ast.AugAssign):
        op = _BINOPS.get(type(node.op))
        if op is None:
            self.error(f"operator {type(node.op).__name__}= is not supported")
        value = self.scalar(self.visit(node.value), node.value)
        if isinstance(node.target, ast.Subscript):
            base = self.visit(node.target.value)
            if isinstance(base, (Field, NdarrayHandle)):
                if type(node.op) in _AUG_ATOMIC:
                    ptr = self.global_ptr(base, node.target)
                    self.emit(ir.AtomicRMW(_AUG_ATOMIC[type(node.op)], ptr, self.values.cast(value, ptr.type)))
                    return
                ptr = self.global_ptr(base, node.target)
                old = self.emit(ir.GlobalLoad(ptr))
                self.emit(ir.GlobalStore(ptr, self.values.cast(self.values.binary(op, old, value), ptr.type)))
                return
        if isinstance(node.target, ast.Name):
            current = self.visit(node.target)
            self.assign_name(node.target.id, self.values.binary(op, self.scalar(current, node), value), node)
            return
        self.error(f"cannot assign to {_describe(node.target)}")

    def visit_If(self, node: ast.If):
        cond = self.visit(node.test)
        if not isinstance(cond, ir.Stmt):
            if isinstance(cond, (Field, NdarrayHandle)):
                self.error("a field or ndarray is not a condition; index it")
            self.visit_body(node.body if cond else node.orelse)  # compile-time branch
            return
        stmt = self.emit(ir.If(self.values.to_bool(cond)))
        self.in_block(stmt.then_block, node.body)
        self.in_block(stmt.else_block, node.orelse)

    def visit_While(self, node: ast.While):
        if node.orelse:
            self.error("while/else is not supported")
        loop = self.emit(ir.While())
        self.blocks.append(loop.body)
        self.frame.scopes.append({})
        self.loop_depth += 1
        try:
            cond = self.visit(node.test)
            if isinstance(cond, ir.Stmt) or not cond:
                exit_if = self.emit(ir.If(self.values.unary("not", self.values.to_bool(cond))
                                          if isinstance(cond, ir.Stmt) else self.values.materialize(True)))
                exit_if.then_block.append(ir.Break(loc=self.frame.src.loc(node)))
            self.visit_body(node.body)
        finally:
            self.loop_depth -= 1
            self.frame.scopes.pop()
            self.blocks.pop()

    def visit_Break(self, node):
        if self.loop_depth == 0:
            self.error("break outside a loop")
        if self.static_loop_depths and self.static_loop_depths[-1] == self.loop_depth:
            self.error("break inside a qd.static loop is not supported")
        self.emit(ir.Break())

    def visit_Continue(self, node):
        if self.loop_depth == 0:
            self.error("continue outside a loop")
        if self.static_loop_depths and self.static_loop_depths[-1] == self.loop_depth:
            self.error("continue inside a qd.static loop is not supported")
        self.emit(ir.Continue())

    def visit_For(self, node: ast.For):
        if node.orelse:
            self.error("for/else is not supported")
        serialize, self.pending_serialize = self.pending_serialize, False
        it = self.visit(node.iter)
        if isinstance(it, (range, tuple, list)) or (_is_static_iter(node.iter)):
            return self.static_for(node, it)
        if isinstance(it, _RuntimeRange):
            return self.range_for(node, [(it.begin, it.end, it.step)], serialize, "range")
        if isinstance(it, lang.ndrange):
            dims = []
            for d in it.dims:
                if isinstance(d, (tuple, list)):
                    if len(d) != 2:
                        self.error("qd.ndrange arguments must be ints or (begin, end) pairs")
                    dims.append((d[0], d[1], 1))
                else:
                    dims.append((0, d, 1))
            return self.range_for(node, dims, serialize, "ndrange")
        if isinstance(it, (Field, NdarrayHandle)):
            shape = it.shape if isinstance(it, Field) else \
                [self.emit(ir.NdarrayShape(it.arg_index, d, T.i32)) for d in range(it.ndim)]
            return self.range_for(node, [(0, s, 1) for s in shape], serialize, "struct")
        self.error("for loops iterate over range(), qd.ndrange(), qd.static(...), a field or an ndarray")

    def static_for(self, node: ast.For, it):
        if not isinstance(it, (range, tuple, list)):
            self.error("qd.static() loops need a compile-time iterable (a range of constants or a tuple)")
        self.static_loop_depths.append(self.loop_depth)
        try:
            for value in it:
                self.frame.scopes.append({})
                try:
                    self.bind_targets(node.target, value, node)
                    self.visit_body(node.body)
                finally:
                    self.frame.scopes.pop()
        finally:
            self.static_loop_depths.pop()

    def bind_targets(self, target, value, node):
        if isinstance(target, ast.Name):
            self.frame.scopes[-1][target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
                and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.bind_targets(t, v, node)
        else:
            self.error("cannot bind the loop target")

    def range_for(self, node: ast.For, dims, serialize: bool, kind: str):
        """One flat RangeFor over the product of `dims`; the targets decompose its index."""
        targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
        if any(not isinstance(t, ast.Name) for t in targets):
            self.error("loop targets must be plain names")
        if len(targets) != len(dims):
            self.error(f"the loop has {len(targets)} target(s) but iterates over {len(dims)} dimension(s)")
        top_level = len(self.blocks) == 1 and len(self.frames) == 1
        begins, extents = [], []
        for b, e, _ in dims:
            b, e = self.scalar(b, node), self.scalar(e, node)
            for v in (b, e):
                if (isinstance(v, ir.Stmt) and v.type.is_float) or isinstance(v, float):
                    self.error("range bounds must be integers")
            begins.append(b)
            extents.append(self.values.binary("max", self.values.binary("sub", e, b), 0))
        total = extents[0]
        for e in extents[1:]:
            total = self.values.binary("mul", total, e)
        total = self.values.materialize(total)
        index_type = total.type if total.type is not T.u1 else T.i32
        loop = self.emit(ir.RangeFor(self.values.materialize(0, index_type), self.values.cast(total, index_type),
                                     index_type, serial=serialize or not top_level, kind=kind))
        self.blocks.append(loop.body)
        self.frame.scopes.append({})
        self.loop_depth += 1
        try:
            rem = loop.index
            # Row-major: the last target varies fastest.
            values = [None] * len(dims)
            for d in reversed(range(len(dims))):
                if d == 0:
                    q = rem
                else:
                    q = self.values.binary("mod", rem, extents[d]) if len(dims) > 1 else rem
                    rem = self.values.binary("floordiv", rem, extents[d])
                values[d] = self.values.binary("add", q, begins[d]) if not _is_zero(begins[d]) else q
            if dims and dims[0][2] != 1:
                values[0] = self.values.binary("add", begins[0], self.values.binary("mul", loop.index, dims[0][2]))
            for t, v in zip(targets, values):
                self.frame.scopes[-1][t.id] = self.values.materialize(v)
            self.visit_body(node.body)
        finally:
            self.loop_depth -= 1
            self.frame.scopes.pop()
            self.blocks.pop()

    # Unsupported statement kinds get a clear message rather than the generic one.
    def visit_Try(self, node):
        self.error("try/except is not supported in kernels")

    def visit_With(self, node):
        self.error("with-statements are not supported in kernels")

    def visit_ClassDef(self, node):
        self.error("class definitions are not supported in kernels")

    def visit_FunctionDef(self, node):
        self.error("nested function definitions are not supported in kernels; use @qd.func at module level")

    def visit_Lambda(self, node):
        self.error("lambda is not supported in kernels")

    def visit_ListComp(self, node):
        self.error("comprehensions are not supported in kernels")

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def visit_Global(self, node):
        self.error("global/nonlocal declarations are not supported in kernels")

    visit_Nonlocal = visit_Global

    def visit_Raise(self, node):
        self.error("raise is not supported in kernels")

    def visit_Assert(self, node):
        self.error("assert is not supported in kernels")

    def visit_Delete(self, node):
        self.error("del is not supported in kernels")

    def visit_JoinedStr(self, node):
        self.error("f-strings are not supported in kernels")


def _is_static_iter(node) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "static"


def _is_zero(v) -> bool:
    return (not isinstance(v, ir.Stmt) and v == 0) or (isinstance(v, ir.Const) and v.value == 0)


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _describe(node) -> str:
    return {"Try": "try/except", "ListComp": "a list comprehension"}.get(type(node).__name__,
                                                                         f"'{type(node).__name__}'")


def _always_returns(stmts) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body) and _always_returns(last.orelse)
    return False


def _fold_early_returns(stmts: list) -> list:
    """Rewrite `if c: ...; return a` followed by more code into `if c: ... else: <rest>`, and
    mark returns that end every path (tail returns), the only form the inliner accepts."""
    stmts = list(stmts)
    for i, s in enumerate(stmts):
        if isinstance(s, ast.If) and i + 1 < len(stmts) and _always_returns(s.body) \
                and not s.orelse and _contains_return(s.body):
            new_if = ast.If(test=s.test, body=s.body, orelse=stmts[i + 1:])
            ast.copy_location(new_if, s)
            stmts = stmts[:i] + [new_if]
            break
    if stmts:
        _mark_tail(stmts[-1])
    return stmts


def _contains_return(stmts) -> bool:
    return any(isinstance(n, ast.Return) for s in stmts for n in ast.walk(s))


def _mark_tail(s):
    if isinstance(s, ast.Return):
        s._qdc_tail = True
    elif isinstance(s, ast.If):
        s.body = _fold_early_returns(s.body)
        s.orelse = _fold_early_returns(s.orelse)
