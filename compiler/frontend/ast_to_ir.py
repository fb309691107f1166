"""Python AST → IR. One visitor method per node kind; every error carries file:line:col.

Compile-time evaluation happens here because it needs Python values: `qd.static` loops are
unrolled and `if qd.static(...)` picks a branch while the AST is walked, and `@qd.func`
calls are inlined at their call sites (as Taichi's and Quadrants' front ends do). Names
resolve through the kernel's locals, then the Python function's closure, globals and builtins.

Scoping follows Quadrants: a variable first assigned inside an `if`/`for`/`while` body is
local to that body. A local takes the type of its first assignment; later assignments
convert to it. Loops are in `loops.py`, calls (intrinsics, funcs, atomics) in `calls.py`, operators
and the other expressions in `expressions.py`.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import types
import warnings

import numpy as np

from qdc.runtime.contract import extents, types as T
from qdc.runtime.contract.errors import QdcCompileError
from qdc.runtime.contract.objects import FieldMarker as Field
from qdc.runtime.contract.matrix_value import MatrixValue

from .. import ir
from ..passes.debug_checks import insert_debug_checks
from .calls import CallLowering
from .expressions import BINARY_OPS, ExpressionLowering
from .loops import LoopLowering
from .func_returns import FuncReturns
from .returns import ReturnLowering
from .vector_math import VectorMath
from .vectors import ElementParam, VectorLowering, VectorValue, VectorVar, element_params
from .tiles import TileSyntax
from .structs import (BoundStructMethod, StructLeafParam, StructLowering, StructTarget, StructValue, StructVar,
                      scalar_params)
from ..language.structs import StructType
from qdc.runtime.contract.objects import StructFieldMarker as StructField
from ..language import matrix as M
from .objects import GLOBAL_ARRAYS, NdarrayHandle, Shape
from .printing import PrintLowering
from .subscripts import SubscriptLowering
from .simt_calls import SimtCalls
from .source import source_info
from .static_python import StaticPython
from .host_objects import HostObject, HostObjects
from ..language.dataclass_args import DataclassArgument
from .values import ValueBuilder, is_number, is_runtime, not_a_value_message, short_number


class Scope(dict):
    """Names bound in one body (name -> Alloca, run-time value or compile-time object), and the
    place its statements start (`block`, `index`): a compile-time number bound here that is
    later reassigned from a nested body becomes a variable created at that place."""

    def __init__(self, block: ir.Block, index: int):
        super().__init__()
        self.block, self.index = block, index


class Frame:
    """One function being lowered (the kernel, or a func inlined into it)."""

    def __init__(self, fn, src, is_kernel: bool, block: ir.Block, index: int):
        self.fn, self.src, self.is_kernel = fn, src, is_kernel
        self.scopes: list[Scope] = [Scope(block, index)]
        self.globals = fn.__globals__
        self.closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # a closure variable not yet assigned
                pass
        self.loops: list[str] = []  # kinds of the enclosing loops of this function: parallel/serial/static
        self.static_loop_depths: list[int] = []  # len(FrontEnd.blocks) where each enclosing qd.static loop began
        # What ends the rest of the body being lowered: "return" (a return the compiled code
        # always reaches), "break"/"continue" (of the innermost qd.static loop, at compile time).
        self.stop: str | None = None
        self.base_block, self.start_index = block, index  # where the (inlined) call began
        self.returns: list = []  # (block, value, node) for each `return` lowered (funcs only)


# Augmented assignments to a global element that are atomic read-modify-writes (as in Quadrants).
_AUG_ATOMIC = {"add": "add", "sub": "sub", "bit_and": "and", "bit_or": "or", "bit_xor": "xor"}

# Node kinds outside the language with a tailored message; the rest get a generic one.
_UNSUPPORTED = {
    "Try": "try/except is not supported in kernels",
    "TryStar": "try/except* is not supported in kernels",
    "With": "with-statements are not supported in kernels",
    "AsyncWith": "with-statements are not supported in kernels",
    "ClassDef": "class definitions are not supported in kernels",
    "FunctionDef": "nested function definitions are not supported in kernels; define a @qd.func at module level",
    "AsyncFunctionDef": "nested function definitions are not supported in kernels",
    "Lambda": "lambda is not supported in kernels; define a @qd.func at module level",
    "SetComp": "set comprehensions are not supported in kernels; use a list comprehension or a for loop",
    "GeneratorExp": "generator expressions are not supported in kernels; use a for loop",
    "Global": "global/nonlocal declarations are not supported in kernels",
    "Nonlocal": "global/nonlocal declarations are not supported in kernels",
    "Raise": "raise is not supported in kernels",
    "Delete": "del is not supported in kernels",
    "JoinedStr": "f-strings are not supported in kernels",
    "Import": "import is not supported in kernels; import at module level",
    "ImportFrom": "import is not supported in kernels; import at module level",
    "Dict": "dicts are not supported in kernels",
    "Set": "sets are not supported in kernels",
    "Starred": "starred expressions are not supported in kernels",
    "NamedExpr": "assignment expressions (:=) are not supported in kernels",
    "Match": "match statements are not supported in kernels",
    "Yield": "yield is not supported in kernels",
    "YieldFrom": "yield is not supported in kernels",
    "Await": "await is not supported in kernels",
    "AsyncFor": "async for is not supported in kernels",
}

# AST node class -> FrontEnd's visit_ function for it (None: unsupported), looked up once: a large
# kernel visits hundreds of thousands of nodes.
_VISITORS: dict = {}


class FrontEnd(LoopLowering, CallLowering, ExpressionLowering, ReturnLowering, FuncReturns, VectorLowering, VectorMath,
               PrintLowering, StructLowering, StaticPython, HostObjects, SimtCalls, TileSyntax, SubscriptLowering):
    """Lowers one `@qd.kernel` into a KernelIR. `templates`: name -> argument of its
    qd.template() parameters (compile-time objects); `returns`: whether to store the return
    value (the grad variant returns nothing); `arch`: the target (default `options.arch`), which
    decides the type of ndarray shapes."""

    def __init__(self, fn, params: list[ir.Param], options, templates: dict | None = None, returns: bool = True,
                 arch: str | None = None):
        self.src = source_info(fn)
        self.kernel = ir.KernelIR(fn.__name__, scalar_params(element_params(params), options.default_ip,
                                                             options.default_fp), self.src.loc(self.src.fn_def))
        self.field_objects: list[Field] = []
        self.options = options
        self.shape_type = extents.shape_type(arch or options.arch)  # of `a.shape[k]`: the target's index width
        self.target_arch = arch or options.arch
        self.frames: list[Frame] = [Frame(fn, self.src, True, self.kernel.body, 0)]
        self.blocks: list[ir.Block] = [self.kernel.body]
        self.pending_loop_config = None  # a LoopConfig set by qd.loop_config(...), consumed by the next for
        # > 0 inside the body of an `if` with a constant condition that is not qd.static(...):
        # compiled as a compile-time branch, but, as in Quadrants, its loops are not top-level ones
        self.constant_if_depth = 0
        self.node_stack: list[ast.AST] = []
        self.values = ValueBuilder(self.emit, options.default_ip, options.default_fp, self.error)
        self.values.describe = self.describe_number
        self.converting = None  # the expression node whose value convert() is converting
        self.constants_used: dict = {}  # name -> value of captured compile-time constants (cache key)
        self.funcs_used: list = []
        self.templates = templates or {}
        self.kernel.signature = [n for n in inspect.signature(fn).parameters
                                 if n not in self.templates or isinstance(self.templates[n], DataclassArgument)]
        self.member_variables: dict = {}  # parameter index -> the variable a dataclass's scalar member is read into
        self.member_parameters: dict = {}  # path of a member (host_objects.py) -> the index of its parameter
        self.node_locs: dict = {}  # syntax node -> the location of the statements emitted at it (see emit)
        self.signatures: dict = {}  # function -> its inspect.signature (see signature())
        self.init_returns(fn, returns)

    # ---- infrastructure -------------------------------------------------------------
    @property
    def frame(self) -> Frame:
        return self.frames[-1]

    def signature(self, fn) -> inspect.Signature:
        """inspect.signature(fn), made once per compile: inlining asks for it at every call of a
        qd.func and for each of its arguments, thousands of times in a large kernel."""
        try:
            got = self.signatures.get(fn)
        except TypeError:  # unhashable (a method of an unhashable object)
            return inspect.signature(fn)
        if got is None:
            got = self.signatures[fn] = inspect.signature(fn)
        return got

    def error(self, message: str, node=None):
        if self.library_site is not None:  # inside qd.simt's library: the user's call is at fault
            loc, line, _ = self.library_site
            raise QdcCompileError(message, loc.filename, loc.line, loc.col, line)
        node = node or (self.node_stack[-1] if self.node_stack else self.frame.src.fn_def)
        src = self.frame.src
        loc = src.loc(node)
        raise QdcCompileError(message, loc.filename, loc.line, loc.col, src.source_line(node))

    def emit(self, stmt: ir.Stmt) -> ir.Stmt:
        if stmt.loc is None:
            if self.library_site is not None:
                stmt.loc = self.library_site[0]
            elif self.node_stack:
                node = self.node_stack[-1]
                loc = self.node_locs.get(node)
                if loc is None:
                    loc = self.node_locs[node] = self.frames[-1].src.loc(node)
                stmt.loc = loc
        block = stmt.block = self.blocks[-1]  # Block.append, written out: every statement is emitted here
        block.stmts.append(stmt)
        return stmt

    def visit(self, node):
        self.node_stack.append(node)
        try:
            method = _VISITORS.get(node.__class__)
            if method is None:
                method = _VISITORS[node.__class__] = getattr(FrontEnd, "visit_" + type(node).__name__, None)
            if method is None:
                self.error(_UNSUPPORTED.get(type(node).__name__,
                                            f"'{type(node).__name__}' is not supported in qdc kernels"))
            return method(self, node)
        except QdcCompileError:
            raise
        except RecursionError:
            self.error("expression nested too deeply")
        except Exception as e:  # an internal failure still points at the user's line
            self.error(f"internal compiler error while compiling this line: {type(e).__name__}: {e}")
        finally:
            self.node_stack.pop()

    def visit_body(self, stmts: list[ast.stmt]):
        for i, s in enumerate(stmts):
            if self.pending_loop_config is not None and not isinstance(s, ast.For):
                self.error("qd.loop_config() must be followed directly by the for loop it configures", s)
            self.visit(s)
            if self.frame.stop is not None:  # the compiled code never reaches the rest
                if isinstance(s, ast.Return) and i + 1 < len(stmts):
                    if self.frame.is_kernel:
                        self.error("a kernel's return must be its last statement: this code would never run",
                                   stmts[i + 1])
                    self.error("return must be the last statement of a qd.func or of its block: the code after "
                               "it would never run", s)
                return

    def in_block(self, block: ir.Block, stmts: list[ast.stmt]):
        """Lower `stmts` into `block`, in a new scope."""
        self.blocks.append(block)
        try:
            with self.scope():
                self.visit_body(stmts)
        finally:
            self.blocks.pop()

    @contextlib.contextmanager
    def scope(self):
        """A new scope whose statements start at the current end of the current block."""
        self.frame.scopes.append(Scope(self.blocks[-1], len(self.blocks[-1].stmts)))
        try:
            yield self.frame.scopes[-1]
        finally:
            self.frame.scopes.pop()

    def emit_into(self, block: ir.Block, fn):
        """Run `fn()` with `block` as the emission target (no new scope); returns its result."""
        self.blocks.append(block)
        try:
            return fn()
        finally:
            self.blocks.pop()

    def new_frame(self, fn, src) -> Frame:
        """The frame of a func inlined at the current position."""
        return Frame(fn, src, False, self.blocks[-1], len(self.blocks[-1].stmts))

    def new_local(self, dtype: T.DataType, name: str = "") -> ir.Alloca:
        return self.emit(ir.Alloca(dtype, name))

    # ---- entry ----------------------------------------------------------------------
    def build(self) -> ir.KernelIR:
        fdef = self.src.fn_def
        if not isinstance(fdef, ast.FunctionDef):
            self.error("a kernel must be a plain function definition", fdef)
        scope = self.frame.scopes[0]
        struct_scalars: dict = {}  # struct parameter -> the locals of its scalars
        for i, p in enumerate(self.kernel.params):
            if p.kind == "scalar":
                var = self.emit(ir.Alloca(p.dtype, p.name, self.src.loc(fdef)))
                self.emit(ir.LocalStore(var, self.emit(ir.ArgLoad(i, p.dtype, self.src.loc(fdef)))))
                if isinstance(p, StructLeafParam):  # a struct parameter is a struct local
                    struct_scalars.setdefault(p.argument, (p.struct_type, []))[1].append(var)
                elif isinstance(p, ElementParam):  # a vector parameter is a vector local, as a scalar one is a local
                    elements = scope[p.argument].variables if p.argument in scope else []
                    scope[p.argument] = VectorVar(p.element_shape, elements + [var])
                else:
                    scope[p.name] = var
            else:
                es = p.element_shape
                scope[p.name] = NdarrayHandle(i, p.name, p.dtype, p.ndim - len(es), p.needs_grad, element_shape=es,
                                              layout=p.layout)
        for name, (stype, variables) in struct_scalars.items():
            scope[name] = self.struct_parameter_var(stype, variables)
        for name, value in self.templates.items():  # compile-time objects, like captured globals
            scope[name] = self.host_root(name, value)
        self.kernel.subgroup_size = self.subgroup_size()
        self.visit_body(fdef.body)
        if self.pending_loop_config is not None:
            self.error("qd.loop_config() must be followed directly by the for loop it configures")
        self.finish_returns()
        if self.options.debug:  # integer overflow and negative integer powers, reported at sync
            insert_debug_checks(self.kernel)
        return self.kernel

    # ---- names ----------------------------------------------------------------------
    def lookup(self, name: str, node):
        for scope in reversed(self.frame.scopes):
            if name in scope:
                return scope[name]
        return self.lookup_nonlocal(name, node)

    def lookup_nonlocal(self, name: str, node, required=True):
        fr = self.frame
        if name in fr.closure:
            return self.capture(name, fr.closure[name])
        if name in fr.globals:
            return self.capture(name, fr.globals[name])
        if hasattr(builtins, name):
            return getattr(builtins, name)
        if required:
            hint = ""
            if name in fr.src.assigned_names:
                hint = (" here (a variable first assigned inside an if/for/while body is local to that "
                        "body, as in Quadrants: assign it before the block)")
            self.error(f"name '{name}' is not defined{hint}", node)
        return None

    def capture(self, name, value):
        if is_number(value):
            self.constants_used[name] = value
            return value.item() if isinstance(value, np.generic) else value
        if isinstance(value, MatrixValue):  # a Python-scope qd.Vector/qd.Matrix: a constant vector
            return VectorValue(value.shape, value.to_numpy().ravel().tolist())
        return value

    def visit_Name(self, node: ast.Name):
        v = self.lookup(node.id, node)
        if isinstance(v, ir.Alloca):
            return self.emit(ir.LocalLoad(v))
        if isinstance(v, VectorVar):
            return self.load_vector_var(v)
        if isinstance(v, StructVar):
            return self.load_struct_var(v)
        return v

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        self.error(f"constant {node.value!r} is not supported in kernels")

    def visit_Tuple(self, node: ast.Tuple):
        if any(isinstance(e, ast.Starred) for e in node.elts):  # (*t, x), [*v]: spread, as in Python
            return tuple(self.spread(node.elts)[0])
        return tuple(self.visit(e) for e in node.elts)

    visit_List = visit_Tuple

    def visit_Attribute(self, node: ast.Attribute):
        if isinstance(node.value, ast.Name):  # a method of a struct local: `self` is the local itself
            var = self.caller_variable(node.value.id)
            if isinstance(var, StructVar) and node.attr in var.stype.methods:
                return BoundStructMethod(var.stype.methods[node.attr], var)
        base = self.visit(node.value)
        attr = node.attr
        if isinstance(base, VectorValue):
            return self.vector_attribute(base, attr)
        if isinstance(base, NdarrayHandle):
            return self.ndarray_attribute(base, attr)
        if isinstance(base, StructValue):
            return self.struct_attribute(base, attr, node)
        if isinstance(base, StructField):
            return self.struct_field_attribute(base, attr)
        if isinstance(base, HostObject):
            return self.host_attribute(base, attr, node)
        if isinstance(base, Field):
            if attr == "grad":
                if base.grad is None:
                    self.error(f"field '{base.name}' has no .grad: declare it with needs_grad=True")
                return base.grad
            if attr == "shape":
                return Shape(base.shape, "field", base.name)
            if attr == "dtype":
                return base.dtype
            self.error(f"field has no attribute '{attr}' in kernels (use .shape, .dtype or .grad)")
        if is_runtime(base):
            self.error(f"a run-time {base.type} value has no attribute '{attr}'")
        try:
            return getattr(base, attr)
        except AttributeError:
            what = f"module '{base.__name__}'" if isinstance(base, types.ModuleType) \
                else f"'{type(base).__name__}' object"
            self.error(f"{what} has no attribute '{attr}'")

    def extent(self, array: NdarrayHandle, dim: int) -> ir.Stmt:
        """`array.shape[dim]`, of the type the target's indices have (runtime/contract/extents.py:
        i64 where arrays may pass 2**31 elements). `dim` counts in declared order."""
        if getattr(array, "layout", None) is not None and dim < len(array.layout):
            dim = array.layout.index(dim)  # the shape words are in storage order
        return self.emit(ir.NdarrayShape(array.arg_index, dim, self.shape_type))

    def ndarray_attribute(self, base: NdarrayHandle, attr: str):
        if attr == "shape":
            return Shape((self.extent(base, d) for d in range(base.ndim)),
                         "ndarray parameter", base.name)
        if attr == "grad":
            if not base.needs_grad:
                self.error(f"ndarray parameter '{base.name}' has no .grad: annotate it with needs_grad=True")
            return NdarrayHandle(base.arg_index, base.name, base.dtype, base.ndim, True, grad=True,
                                 element_shape=base.element_shape, layout=base.layout)
        if attr == "dtype":
            return base.dtype
        self.error(f"ndarray has no attribute '{attr}' in kernels (use .shape, .dtype or .grad)")

    # ---- statements ----------------------------------------------------------------------
    def visit_Expr(self, node: ast.Expr):
        if isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
            return  # `...` as a statement: does nothing, as `pass`
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, (str, bytes)):
            if node is self.frame.src.fn_def.body[0] and isinstance(node.value.value, str):
                return  # the docstring
            self.error("a string is not a statement in kernels (only a docstring, the first statement of "
                       "a kernel or qd.func, may be a string); use a # comment", node.value)
        if self.is_print_call(node.value):
            self.node_stack.append(node.value)
            try:
                return self.lower_print(node.value)
            finally:
                self.node_stack.pop()
        self.visit(node.value)

    def visit_Pass(self, node):
        pass

    def visit_Assign(self, node: ast.Assign):
        value = self.visit(node.value)
        static = self.binds_static(node.value)
        for target in node.targets:
            if not (static and self.bind_static_names(target, value)):
                self.assign(target, value, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if not isinstance(node.target, ast.Name):
            self.error("only simple names can be annotated", node.target)
        dtype = self.visit(node.annotation)
        if isinstance(dtype, M.MatrixType) and node.value is not None:
            return self.annotated_vector(node, dtype)
        if isinstance(dtype, StructType) and node.value is not None:
            return self.annotated_struct(node, dtype)
        if dtype is int or dtype is float:
            dtype = self.values.default_ip if dtype is int else self.values.default_fp
        if not isinstance(dtype, T.DataType):
            self.error("a variable annotation must be a qd type such as qd.f32", node.annotation)
        if node.value is None:
            self.error("an annotated variable needs a value")
        value = self.convert(self.scalar(self.visit(node.value), node.value), dtype, node.value)
        var = self.new_local(dtype, node.target.id)
        self.emit(ir.LocalStore(var, value))
        self.frame.scopes[-1][node.target.id] = var

    def assign(self, target, value, value_node=None):
        """Assign `value` (computed from `value_node`, where errors about it point) to `target`."""
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, VectorValue):  # unpacking: a vector's components, a matrix's rows
                value = value.rows()
            if not isinstance(value, (tuple, list)):
                self.error("cannot unpack a non-tuple value", target)
            if len(value) != len(target.elts):
                self.error(f"cannot unpack {len(value)} value(s) into {len(target.elts)} name(s)", target)
            parts = value_node.elts if isinstance(value_node, (ast.Tuple, ast.List)) \
                and len(value_node.elts) == len(value) else [value_node] * len(value)
            for t, v, n in zip(target.elts, value, parts):
                self.assign(t, v, n)
        elif isinstance(target, ast.Name):
            self.assign_name(target, value, value_node)
        elif isinstance(target, ast.Subscript) and self.tile_assign(target, value, value_node):
            return  # a tile load or store (tiles.py)
        elif isinstance(target, (ast.Subscript, ast.Attribute)) and (places := self.vector_target(target)) is not None:
            if isinstance(places, StructTarget):
                self.store_struct(places, value, value_node or target)
            else:
                self.store_target(places, value, value_node)
        elif isinstance(target, ast.Subscript):
            base = self.visit(target.value)
            if not isinstance(base, GLOBAL_ARRAYS):
                self.error("only field and ndarray elements can be assigned through a subscript", target)
            ptr = self.global_ptr(base, target)
            self.emit(ir.GlobalStore(ptr, self.convert(self.scalar(value, value_node or target), ptr.type,
                                                       value_node)))
        else:
            self.error(f"cannot assign to {_describe_target(target)} in kernels", target)

    def convert(self, value, dtype: T.DataType, value_node=None) -> ir.Stmt:
        """`value` converted to `dtype`; a compile-time number that does not fit is an error at `value_node`."""
        outer, self.converting = self.converting, value_node
        try:
            with self.at(value_node):
                return self.values.cast(value, dtype)
        finally:
            self.converting = outer

    def describe_number(self, v) -> str:
        """How errors name the compile-time number `v`: the literal, or the constant expression
        that produced it (`2 ** 70`, a captured name) when convert() is converting one."""
        node = self.converting
        if node is None or not self.node_stack or self.node_stack[-1] is not node or _is_literal(node):
            return f"literal {short_number(v)}"
        return f"constant '{ast.unparse(node)}' = {short_number(v)}"

    @contextlib.contextmanager
    def at(self, node):
        """Errors and statements emitted inside point at `node` (if given)."""
        if node is None:
            yield
            return
        self.node_stack.append(node)
        try:
            yield
        finally:
            self.node_stack.pop()

    def assign_name(self, target: ast.Name, value, value_node=None):
        """Store into the visible variable of that name, or bind the name in the current scope
        (a new variable typed by `value` if it is a run-time value or a number)."""
        name = target.id
        scope = self.binding_scope(name)
        if name == "_":  # the throwaway name: bound afresh, whatever `_` held (`v, _, _ = f()`)
            self.frame.scopes[-1].pop(name, None)
            scope = None
        current = scope[name] if scope is not None else self.lookup_nonlocal(name, target, required=False)
        if isinstance(current, GLOBAL_ARRAYS) and not isinstance(value, GLOBAL_ARRAYS):
            self.error(f"cannot assign to '{name}', which is a field or ndarray: write its elements "
                       f"with {name}[i] = ... ({name}[None] = ... for a 0-d field)", target)
        if is_runtime(current) and not isinstance(current, ir.Alloca):
            # a loop index: as in Python, the rest of this iteration sees the new value
            current = self.promote_to_variable(scope, name, current)
        if isinstance(value, VectorValue) or isinstance(current, VectorVar):
            return self.assign_vector_name(target, current, value, value_node)
        if isinstance(value, StructValue) or isinstance(current, StructVar):
            return self.assign_struct_name(target, current, value, value_node)
        is_value = is_runtime(value) or is_number(value)
        if scope is not None and scope is not self.frame.scopes[-1] and is_number(current) and is_value:
            current = self.promote_to_variable(scope, name, current)
        if isinstance(value, (str, bytes)):
            self.error(not_a_value_message(value), value_node or target)
        if isinstance(current, ir.Alloca):
            if not is_value:
                self.error(f"cannot assign a {type(value).__name__} to the run-time variable '{name}'", target)
            if value_node is not None and self.shared_by_iterations(current) \
                    and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(value_node)):
                self.warn_racy_update(target)
            self.emit(ir.LocalStore(current, self.convert(self.scalar(value, target), current.type, value_node)))
        elif is_value:
            with self.at(value_node):
                v = self.values.materialize(self.scalar(value, target))
            if self.binds_once(name) and self.binds_value(v):
                self.frame.scopes[-1][name] = v
                return
            var = self.new_local(v.type, name)
            self.emit(ir.LocalStore(var, v))
            self.frame.scopes[-1][name] = var
        else:  # a compile-time object (field, ndarray, tuple, function): bind the name to it
            self.frame.scopes[-1][name] = value

    def binds_once(self, name: str, parameter: bool = False) -> bool:
        """Whether `name`, which the current function assigns (or, a `parameter`, never
        assigns), may be bound to its value, not made a variable (SourceInfo.value_names): it is
        assigned by one statement run once per call (not in a qd.static loop's unrolled body),
        and the calls it is passed to take their arguments by value (passes_by_value)."""
        names = self.frame.src.value_names
        if name not in (names.parameters if parameter else names.once) or \
                (not parameter and "static" in self.frame.loops):
            return False
        return all(self.passes_by_value(callee) for callee in names.passed_to.get(name, ()))

    def binds_value(self, value, dtype: T.DataType | None = None) -> bool:
        """Whether `value` (a scalar or a vector, of `dtype` if given) may be what a name is
        bound to instead of a variable: store forwarding would give every read of the variable
        that value, so only the variable's dead stores are saved. Not a constant or an ndarray
        shape: some lowering decides on them seen directly (a range from 0, a cast folded),
        and reads through a variable would not see them so."""
        components = value.components if isinstance(value, VectorValue) else [value]
        return all(isinstance(c, ir.Stmt) and not isinstance(c, (ir.Const, ir.NdarrayShape))
                   and (dtype is None or c.type is dtype) for c in components) and \
            (dtype is not None or len({c.type for c in components}) == 1)

    def binding_scope(self, name: str) -> Scope | None:
        for scope in reversed(self.frame.scopes):
            if name in scope:
                return scope
        return None

    def promote_to_variable(self, scope: Scope, name: str, number) -> ir.Alloca:
        """`name` is bound to a compile-time number (a func argument, a qd.static loop value) or
        a loop index in scope `scope` and is assigned: from now on it is a variable, created
        where that scope starts so that every later read, inside or after a nested body, sees
        the assignment. (Later insertions at an earlier place of the same block may shift that
        place; the variable is then created a little earlier, which is harmless; a loop index
        is defined before its body's scope starts.)"""
        staged = ir.Block()
        var = self.emit_into(staged, lambda: self.new_local(self.values.materialize(number).type, name))
        self.emit_into(staged, lambda: self.emit(ir.LocalStore(var, self.values.materialize(number, var.type))))
        for offset, stmt in enumerate(staged.stmts):
            stmt.block = scope.block
            scope.block.stmts.insert(scope.index + offset, stmt)
        scope[name] = var
        return var

    def visit_AugAssign(self, node: ast.AugAssign):
        op = BINARY_OPS.get(type(node.op))
        if op is None:
            self.error(f"operator {type(node.op).__name__}= is not supported")
        target = node.target
        if self.tile_aug_assign(node):  # `tile -= qd.outer(a, b)` (tiles.py)
            return
        vector_target = self.vector_target(target)
        if vector_target is not None:
            return self.aug_assign_target(op, vector_target, node.value)
        if isinstance(target, ast.Subscript):
            base = self.visit(target.value)
            if isinstance(base, GLOBAL_ARRAYS):
                return self.aug_assign_global(op, base, target, node.value)
        if not isinstance(target, (ast.Name, ast.Subscript)):
            self.error(f"cannot assign to {_describe_target(target)} in kernels", target)
        if isinstance(target, ast.Name):
            var = self.lookup(target.id, target)
            atomic = _AUG_ATOMIC.get(op)
            if atomic is not None and self.shared_by_iterations(var) \
                    and (var.type.is_integral or atomic in ("add", "sub")):
                value = self.scalar(self.visit(node.value), node.value)
                self.emit(ir.LocalAtomic(atomic, var, self.convert(value, var.type, node.value)))
                return
            if self.shared_by_iterations(var):
                self.warn_racy_update(target)
        current = self.scalar(self.visit(target), target)
        value = self.scalar(self.visit(node.value), node.value)
        self.assign(target, self.values.binary(op, current, value))

    def shared_by_iterations(self, var) -> bool:
        """`var` is a local declared outside the top-level parallel loop being lowered: all its
        iterations update the same variable (a kernel temporary once offloaded), so `+=` on it
        must be atomic, as it is on a global."""
        top = self.top_depth()  # a qd.graph.do_while body is the kernel's top level too
        if not isinstance(var, ir.Alloca) or len(self.blocks) <= top:
            return False
        loop = self.blocks[top].parent
        return isinstance(loop, ir.RangeFor) and not loop.serial and var.block in self.blocks[:top]

    def warn_racy_update(self, target: ast.Name) -> None:
        """`s = s + v` (or `s *= v`) on a kernel-scope local in a parallel loop: iterations race
        (as in Quadrants, only `+=`, `-=` and integer `&= |= ^=` are atomic)."""
        loc = self.frame.src.loc(target)
        warnings.warn_explicit(f"'{target.id}' is updated from its own value by every iteration of a parallel "
                               f"loop without an atomic: the iterations race. Write `{target.id} += ...` (atomic) "
                               f"or reduce into a field", UserWarning, loc.filename, loc.line)

    def aug_assign_global(self, op: str, base, target: ast.Subscript, value_node):
        ptr = self.global_ptr(base, target)
        value = self.scalar(self.visit(value_node), value_node)
        atomic = _AUG_ATOMIC.get(op)
        if atomic is not None and (ptr.type.is_integral or atomic in ("add", "sub")):
            self.emit(ir.AtomicRMW(atomic, ptr, self.convert(value, ptr.type, value_node)))
            return
        old = self.emit(ir.GlobalLoad(ptr))
        self.emit(ir.GlobalStore(ptr, self.values.cast(self.values.binary(op, old, value), ptr.type)))

    def visit_If(self, node: ast.If):
        cond = self.visit(node.test)
        if isinstance(cond, GLOBAL_ARRAYS):
            self.error("a field or ndarray is not a condition; index it", node.test)
        if isinstance(cond, VectorValue):
            self.error("a vector is not a condition; use .any() or .all()", node.test)
        if not is_runtime(cond):  # compile-time branch (qd.static or a constant): no new scope
            nested = not self.is_static_call(node.test)
            self.constant_if_depth += nested
            try:
                self.visit_body(node.body if cond else node.orelse)
            finally:
                self.constant_if_depth -= nested
            return
        stmt = self.emit(ir.If(self.values.to_bool(cond)))
        self.in_block(stmt.then_block, node.body)
        self.in_block(stmt.else_block, node.orelse)


def _is_literal(node) -> bool:
    """A number as written: `3`, `-3`, `+3.5`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant)


def _describe_target(node) -> str:
    return {ast.Attribute: "an attribute", ast.Starred: "a starred expression"}.get(
        type(node), f"'{type(node).__name__}'")
