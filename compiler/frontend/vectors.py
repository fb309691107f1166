"""Vectors and matrices in kernels, lowered to scalars here so that the IR stays scalar.

A vector or matrix value is a `VectorValue`: its shape and its components, row-major, each a
scalar front-end value (a run-time Stmt or a compile-time number). A vector local is a
`VectorVar`: one scalar variable per component, so a vector carried by a dynamic loop gets one
adstack per component from autodiff without it knowing about vectors. A field or ndarray of
vectors stores the components as trailing axes: `x[i]` loads `x[i, 0], x[i, 1], ...`.

A mixin of FrontEnd (see ast_to_ir.py); the operator visitors (expressions.py) hand vector operands here.
"""
from __future__ import annotations

import ast
import inspect
import itertools

import numpy as np

from qdc.runtime.contract import types as T

from .. import ir
from ..language import matrix as M
from .objects import GLOBAL_ARRAYS
from .values import is_runtime

# Swizzle letters, as in Quadrants (GLSL's three sets); one swizzle uses one set.
_SWIZZLE_SETS = ("xyzw", "rgba", "stpq")
_SWIZZLE = {c: i for group in _SWIZZLE_SETS for i, c in enumerate(group)}
_OP_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
              "bit_and": "&", "bit_or": "|", "bit_xor": "^", "shl": "<<", "shr": ">>", "min": "min", "max": "max",
              "atan2": "atan2", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ATOMIC_AUG = {"add": "add", "sub": "sub", "bit_and": "and", "bit_or": "or", "bit_xor": "xor"}


class VectorValue:
    """A vector (shape `(n,)`) or matrix (shape `(n, m)`) in a kernel: `components` row-major.

    Kernel return values and anything else that must pass a vector through scalar machinery
    use `flatten` / `unflatten` (structs.py): `components` lists the scalars, and
    `VectorValue(shape, components)` rebuilds the value from them."""

    __slots__ = ("shape", "components")

    def __init__(self, shape, components):
        self.shape = tuple(shape)
        self.components = list(components)
        assert len(self.components) == component_count(self.shape), (self.shape, len(self.components))

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) == 2

    def at(self, i: int, j: int | None = None):
        return self.components[i] if j is None else self.components[i * self.shape[1] + j]

    def rows(self) -> tuple:
        """What unpacking yields: a vector's components, a matrix's rows (as vectors)."""
        if not self.is_matrix:
            return tuple(self.components)
        m = self.shape[1]
        return tuple(VectorValue((m,), self.components[i * m:(i + 1) * m]) for i in range(self.shape[0]))

    def map(self, fn) -> "VectorValue":
        return VectorValue(self.shape, [fn(c) for c in self.components])

    def __repr__(self):
        return f"VectorValue{self.shape}"


class VectorVar:
    """A vector/matrix local variable: one scalar Alloca per component (row-major)."""

    __slots__ = ("shape", "variables")

    def __init__(self, shape, variables: list):
        self.shape, self.variables = tuple(shape), list(variables)


class Target:
    """The scalar places an assignment writes: Allocas, GlobalPtrs or `RuntimeComponent`s,
    row-major, forming `shape` (() for a single component)."""

    def __init__(self, shape, places: list):
        self.shape, self.places = tuple(shape), list(places)


class RuntimeComponent:
    """`v[i]` of a vector local with `i` known only at run time: a write tests each component."""

    def __init__(self, index: ir.Stmt, variables: list):
        self.index, self.variables = index, variables
        self.type = variables[0].type


class ElementParam(ir.Param):
    """One element of a vector/matrix kernel parameter (`v: qd.math.vec3`, passed by value): a
    scalar parameter of the IR named `v[i]` (`m[i, j]`), so that dumps say which element an
    argument load reads; `argument` is the parameter's own name, which the metadata records
    under (runtime/contract/artifact.py)."""
    __slots__ = ("argument",)

    def __init__(self, argument: str, position: tuple, dtype: T.DataType, shape: tuple):
        super().__init__(f"{argument}[{', '.join(map(str, position))}]", "scalar", dtype, 0, False, shape)
        self.argument = argument


def element_params(params: list) -> list:
    """The IR's parameters for the kernel's `params` (compiler/driver/kernel.py, parse_params):
    each of kind "vector" becomes one ElementParam per element, row-major; the others stay."""
    out = []
    for p in params:
        if p.kind != "vector":
            out.append(p)
            continue
        out += [ElementParam(p.name, position, p.dtype, p.element_shape)
                for position in itertools.product(*(range(n) for n in p.element_shape))]
    return out


def component_count(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def element_shape(base) -> tuple:
    """The element shape of a field or ndarray handle (() for scalars)."""
    return tuple(getattr(base, "element_shape", ()))


class VectorLowering:
    # ---- construction --------------------------------------------------------------------
    def vector_of(self, shape, components, dtype: T.DataType | None = None) -> VectorValue:
        """A vector from scalar components; with `dtype`, each converted to it."""
        parts = [self.vector_scalar(c) for c in components]
        if dtype is not None:
            parts = [self.values.cast(c, dtype) for c in parts]
        return VectorValue(shape, parts)

    def vector_scalar(self, v):
        if isinstance(v, VectorValue):
            self.error("a vector/matrix cannot be a component of a vector (write its components)")
        return self.scalar(v, self.node_stack[-1] if self.node_stack else None)

    def vector_literal(self, callee, node: ast.Call):
        """`qd.Vector([a, b])`, `qd.Matrix([[a, b], [c, d]])` (also `qd.Matrix([v0, v1])`, rows
        given as vectors), with an optional `dt=`/`dtype=` element type."""
        self.reject_unpacking(node)
        dtype = None
        for kw in node.keywords:
            if kw.arg not in ("dt", "dtype"):
                self.error(f"{callee.__name__}() takes no keyword argument '{kw.arg}' in kernels", kw)
            dtype = self.visit(kw.value)
            if not isinstance(dtype, T.DataType):
                self.error(f"{callee.__name__}(..., {kw.arg}=) must be a qd scalar type", kw.value)
        if len(node.args) not in (1, 2):
            self.error(f"{callee.__name__}() takes a list of components in kernels")
        if len(node.args) == 2:
            dtype = self.visit(node.args[1])
            if not isinstance(dtype, T.DataType):
                self.error(f"the second argument of {callee.__name__}() must be a qd scalar type", node.args[1])
        value = self.visit(node.args[0])
        if isinstance(value, VectorValue):
            return self.vector_of(value.shape, value.components, dtype)
        if not isinstance(value, (tuple, list)) or not value:
            self.error(f"{callee.__name__}() needs a non-empty list of components", node.args[0])
        if callee is M.Vector:
            return self.vector_of((len(value),), value, dtype)
        rows = [r.components if isinstance(r, VectorValue) and not r.is_matrix else r for r in value]
        if all(isinstance(r, (tuple, list)) for r in rows):
            if len({len(r) for r in rows}) != 1 or not rows[0]:
                self.error("qd.Matrix() rows must all have the same, non-zero length", node.args[0])
            return self.vector_of((len(rows), len(rows[0])), [c for r in rows for c in r], dtype)
        if any(isinstance(r, (tuple, list)) for r in rows):
            self.error("qd.Matrix() needs a list of rows, each a list of the same length", node.args[0])
        return self.vector_of((len(rows),), rows, dtype)  # qd.Matrix([a, b]): a vector, as in Quadrants

    def construct(self, mtype: M.MatrixType, node: ast.Call) -> VectorValue:
        """`qd.math.vec3(1, 2, 3)`, `vec3(0)` (filled), `vec3(v2, z)` (concatenated),
        `mat2([[a, b], [c, d]])`: converted to the type's element type."""
        args = self.call_args(node, 1, 16, repr(mtype))
        flat = []
        for v in args:
            flat += _flatten_components(v)
        size = component_count(mtype.shape)
        if len(flat) == 1:
            flat = flat * size
        if len(flat) != size:
            self.error(f"{mtype!r} needs {size} component(s) (or one to fill it), got {len(flat)}")
        dtype = mtype.element_dtype(self.values.default_ip, self.values.default_fp)
        return self.vector_of(mtype.shape, flat, dtype)

    def matrix_helper(self, kind: str, node: ast.Call, callee) -> VectorValue:
        """`qd.Matrix.identity(dt, n)`, `.diag(dim, val)`, `.zero(dt, n, m)`, `.one(...)`,
        `.rows([v0, v1])`, `.cols([v0, v1])`, `qd.Vector.zero/one(dt, n)`, `qd.Vector.unit(n, i)`:
        all but rows, cols and diag take compile-time arguments only, so they are the Python
        function's value as constants."""
        self.reject_unpacking(node)
        args = [self.visit(a) for a in node.args]
        kwargs = {kw.arg: self.visit(kw.value) for kw in node.keywords}
        name = f"qd.{callee.__qualname__}"
        try:
            bound = inspect.signature(callee).bind(*args, **kwargs)
        except TypeError as e:
            self.error(f"{name}(): {e}", node)
        if kind in ("rows", "cols"):
            return self.matrix_of_vectors(kind, bound.arguments[kind], node)
        if kind == "diag":
            n, value = bound.arguments["dim"], self.vector_scalar(bound.arguments["val"])
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                self.error("qd.Matrix.diag(dim, val) needs a compile-time positive dim", node)
            return VectorValue((n, n), [value if i == j else 0 for i in range(n) for j in range(n)])
        if any(is_runtime(a) for a in [*args, *kwargs.values()]):
            self.error(f"{name}() takes compile-time arguments (a qd type and sizes)", node)
        try:
            value = callee(*args, **kwargs)
        except (TypeError, ValueError, IndexError, AttributeError) as e:
            self.error(f"{name}(): {e}", node)
        value = np.asarray(value)
        return self.vector_of(value.shape, value.ravel().tolist(), T.from_numpy(value.dtype))

    def matrix_of_vectors(self, kind: str, value, node: ast.Call) -> VectorValue:
        parts = value if isinstance(value, (tuple, list)) else [value]
        lines = [p.components if isinstance(p, VectorValue) and not p.is_matrix else p for p in parts]
        if not lines or any(not isinstance(v, (tuple, list)) for v in lines) or len({len(v) for v in lines}) != 1:
            self.error(f"qd.Matrix.{kind}() needs a list of vectors (or lists) of one length", node)
        n, m = len(lines), len(lines[0])
        if kind == "rows":
            return VectorValue((n, m), [self.scalar(c, node) for line in lines for c in line])
        return VectorValue((m, n), [self.scalar(lines[j][i], node) for i in range(m) for j in range(n)])

    # ---- locals --------------------------------------------------------------------------
    def new_vector_var(self, value: VectorValue, name: str, dtype: T.DataType | None = None) -> VectorVar:
        """A vector local holding `value`: one scalar variable per component, all of one type
        (the components' common type, or `dtype`)."""
        dtype = dtype or self.values.common_type_of(value.components)
        variables = []
        for c in value.components:
            var = self.new_local(dtype, name)
            self.emit(ir.LocalStore(var, self.values.cast(c, dtype)))
            variables.append(var)
        return VectorVar(value.shape, variables)

    def annotated_vector(self, node: ast.AnnAssign, mtype: M.MatrixType) -> None:
        """`v: qd.math.vec3 = value`: a vector local of that type (a scalar value fills it)."""
        value = self.vector_operand(self.visit(node.value), node.value)
        if not isinstance(value, VectorValue):
            value = VectorValue(mtype.shape, [value] * component_count(mtype.shape))
        if value.shape != mtype.shape:
            self.error(f"cannot assign a {kind_of(value.shape)} of shape {shape_text(value.shape)} to "
                       f"'{node.target.id}' of type {mtype!r}", node.value)
        dtype = mtype.element_dtype(self.values.default_ip, self.values.default_fp)
        self.frame.scopes[-1][node.target.id] = self.new_vector_var(value, node.target.id, dtype)

    def load_vector_var(self, var: VectorVar) -> VectorValue:
        return VectorValue(var.shape, [self.emit(ir.LocalLoad(v)) for v in var.variables])

    def assign_vector_name(self, target: ast.Name, current, value, value_node) -> None:
        """`v = <vector>` (a new vector local, or a store into the visible one of that name)."""
        name = target.id
        if isinstance(current, VectorVar):
            if not isinstance(value, VectorValue):
                self.error(f"'{name}' is a {kind_of(current.shape)} of shape {shape_text(current.shape)}: cannot "
                           f"assign a scalar to it (assign a vector, or one component: {name}[0] = ...)", target)
            self.store_target(Target(current.shape, current.variables), value, value_node)
            return
        if self.binds_once(name) and self.binds_value(value):
            self.frame.scopes[-1][name] = value  # VectorValue
            return
        self.frame.scopes[-1][name] = self.new_vector_var(value, name)

    # ---- operators ------------------------------------------------------------------------
    def vector_operand(self, v, node):
        """An operand of a vector operation: a vector, a tuple/list literal (`v == (1, 1, 1)`,
        `v + [1, 2, 3]`: a vector of its shape, as in Quadrants) or a scalar."""
        if isinstance(v, (tuple, list)):
            shape = _nested_shape(v)
            if shape is None or len(shape) not in (1, 2) or 0 in shape:
                self.error("a tuple or list operand of a vector operation must be a flat or nested list of "
                           "numbers of a vector's or matrix's shape", node)
            return self.list_as_vector(v, shape, node)
        return v if isinstance(v, VectorValue) else self.scalar(v, node)

    def tuple_binary(self, op: str, a, b, node):
        """Python's tuple operations, at compile time: `t + u` concatenates, `t * k` (k a
        compile-time int) repeats (`qd.ndrange(*((K,) * dim))`)."""
        if op == "add" and isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
            return tuple(a) + tuple(b)
        if op == "mul":
            seq, k = (a, b) if isinstance(a, (tuple, list)) else (b, a)
            if isinstance(k, int) and not isinstance(k, bool):
                return tuple(seq) * k
            self.error("a tuple can only be repeated by a compile-time integer", node)
        self.error(f"operator '{op}' is not defined on tuples (a tuple literal is a vector "
                   f"only combined with a vector)", node)

    def vector_logical(self, is_and: bool, first: VectorValue, rest_nodes: list) -> VectorValue:
        """`a and b` / `a or b` with vector operands, as in Quadrants: element-wise logical and/or
        (1 or 0, of the operands' integer type), every operand evaluated."""
        def logic(x, y):
            t = self.values.common_type(x, y)
            t = self.values.default_ip if t.is_float else t
            both = self.values.binary("bit_and" if is_and else "bit_or", self.values.to_bool(x), self.values.to_bool(y))
            return self.values.cast(both, t)
        acc = first
        for n in rest_nodes:
            acc = self.elementwise(logic, [acc, self.vector_operand(self.visit(n), n)], [n, n])
        return acc

    def vector_binary(self, op: str, a, b, node=None) -> VectorValue:
        """Element-wise `a op b`; a scalar operand is broadcast."""
        if op == "matmul":
            return self.matmul(a, b)
        if isinstance(a, VectorValue) and isinstance(b, VectorValue) and a.shape != b.shape:
            self.error(f"operands of '{_OP_SYMBOL.get(op, op)}' have different shapes: {shape_text(a.shape)} "
                       f"and {shape_text(b.shape)}", node)
        shape = a.shape if isinstance(a, VectorValue) else b.shape
        size = component_count(shape)
        xs = a.components if isinstance(a, VectorValue) else [a] * size
        ys = b.components if isinstance(b, VectorValue) else [b] * size
        return VectorValue(shape, [self.values.binary(op, x, y) for x, y in zip(xs, ys)])

    def vector_unary(self, op: str, v: VectorValue) -> VectorValue:
        return v.map(lambda c: self.values.unary(op, c))

    def matmul(self, a, b):
        """`a @ b`: matrix-matrix, matrix-vector, vector-matrix (a row vector), vector-vector (dot)."""
        if not isinstance(a, VectorValue) or not isinstance(b, VectorValue):
            self.error("both operands of '@' must be vectors or matrices")
        sa, sb = a.shape, b.shape
        inner_a, inner_b = sa[-1], sb[0]
        if inner_a != inner_b:
            self.error(f"'@' needs the inner dimensions to agree: {shape_text(sa)} @ {shape_text(sb)}")
        rows = sa[0] if len(sa) == 2 else None
        cols = sb[1] if len(sb) == 2 else None
        k = inner_a

        def entry(i, j):
            xs = [a.at(i, t) if rows is not None else a.at(t) for t in range(k)]
            ys = [b.at(t, j) if cols is not None else b.at(t) for t in range(k)]
            return self.sum_of_products(xs, ys)
        if rows is None and cols is None:
            return entry(None, None)
        if rows is None:
            return VectorValue((cols,), [entry(None, j) for j in range(cols)])
        if cols is None:
            return VectorValue((rows,), [entry(i, None) for i in range(rows)])
        return VectorValue((rows, cols), [entry(i, j) for i in range(rows) for j in range(cols)])

    def sum_of_products(self, xs, ys):
        acc = None
        for x, y in zip(xs, ys):
            p = self.values.binary("mul", x, y)
            acc = p if acc is None else self.values.binary("add", acc, p)
        return acc

    def vector_compare(self, op: str, a, b, node) -> VectorValue:
        return self.vector_binary(op, a, b, node)

    def vector_if_exp(self, branch: ir.If, a, b, node) -> VectorValue:
        """`a if c else b` with vector sides (same shape, or a scalar broadcast): one variable per
        component, declared before the branch and stored in each side."""
        shape = a.shape if isinstance(a, VectorValue) else b.shape
        sides = [self.target_components(Target(shape, [None] * component_count(shape)), v, node) for v in (a, b)]
        result = []
        for x, y in zip(*sides):
            var = ir.Alloca(self.values.common_type(x, y), "", self.frame.src.loc(node))
            var.block = branch.block
            branch.block.stmts.insert(branch.block.stmts.index(branch), var)
            for block, v in ((branch.then_block, x), (branch.else_block, y)):
                self.emit_into(block, lambda v=v, var=var: self.emit(ir.LocalStore(var, self.values.cast(v, var.type))))
            result.append(self.emit(ir.LocalLoad(var)))
        return VectorValue(shape, result)

    # ---- indexing and attributes -----------------------------------------------------------
    def vector_subscript(self, v: VectorValue, node: ast.Subscript):
        indices = self.component_indices(self.visit(node.slice))
        sliced = self.sliced_positions(indices, v.shape, node.slice)
        if sliced is not None:  # m[i, :], m[:, j], v[1:3]: the selected components, read
            shape, positions = sliced
            local = self.subscripted_local(node)
            values = [v.at(*p) if not any(is_runtime(i) for i in p) else self.runtime_component(v, list(p), local)
                      for p in positions]
            return values[0] if not shape else VectorValue(shape, values)
        if len(indices) == 1 and v.is_matrix:  # m[i]: row i
            i = self.component_index(indices[0], v.shape[0], node.slice)
            if is_runtime(i):
                self.error("a matrix row can only be selected with a compile-time index", node.slice)
            return v.rows()[i]
        if len(indices) != len(v.shape):
            self.error(f"a {kind_of(v.shape)} of shape {shape_text(v.shape)} is indexed with "
                       f"{len(indices)} index(es)", node.slice)
        checked = [self.component_index(i, n, node.slice) for i, n in zip(indices, v.shape)]
        if any(is_runtime(i) for i in checked):
            return self.runtime_component(v, checked, self.subscripted_local(node))
        return v.at(*checked)

    def subscripted_local(self, node: ast.Subscript) -> list | None:
        """The component locals of the vector local `node` subscripts by name (`v[i]`), if any."""
        if not isinstance(node.value, ast.Name):
            return None
        scope = self.binding_scope(node.value.id)
        value = scope[node.value.id] if scope is not None else None
        return value.variables if isinstance(value, VectorVar) else None

    def indexed_local(self, components: list | None) -> bool:
        """Whether a run-time index into the vector local of `components` is one ComponentLoad or
        ComponentStore (ir/local_arrays.py), for a local array in the end: for locals of
        INDEXED_MIN_COMPONENTS or more, declared inside the kernel's loops (offloading makes a
        kernel-scope local that tasks share kernel temporaries, one per scalar)."""
        return components is not None and len(components) >= ir.INDEXED_MIN_COMPONENTS and \
            components[0].block not in self.blocks[:self.top_depth()]

    @staticmethod
    def component_indices(index) -> list:
        """The indices of `v[index]`: a tuple's items, an integer vector's components (`m[I]`
        with `I` from a qd.grouped loop, as in Quadrants), or the one index."""
        if isinstance(index, VectorValue) and not index.is_matrix:
            return list(index.components)
        return list(index) if isinstance(index, (tuple, list)) else [index]

    def component_index(self, i, n: int, node):
        i = self.scalar(i, node)
        if is_runtime(i):
            if not i.type.is_integral or i.type is T.u1:
                self.error(f"a vector index must be an integer, got {i.type}", node)
            if self.options.debug:
                self.check_component_index(i, n, node)
            return i
        if isinstance(i, bool) or not isinstance(i, int):
            self.error(f"a vector index must be an integer, got {i!r}", node)
        if not -n <= i < n:
            self.error(f"index {i} is out of range for a dimension of size {n}", node)
        return i % n

    def check_component_index(self, i, n: int, node) -> None:
        """debug=True: a run-time component index outside [0, n) raises IndexError at sync,
        as a global access out of its bounds does (else the select chain gives the last one)."""
        signed = T.i32 if i.type.bits <= 32 else T.i64
        wide = i if i.type is signed else self.values.cast(i, signed)
        outside = self.values.binary("bit_or", self.values.binary("lt", wide, 0), self.values.binary("ge", wide, n))
        failed = self.emit(ir.If(self.values.to_bool(outside)))
        self.emit_into(failed.then_block, lambda: self.index_error(wide, n, node))  # printing.py

    def runtime_component(self, v: VectorValue, indices, components: list | None = None):
        """`v[i]` with `i` known at run time: a ComponentLoad of the vector local `v` holds, whose
        scalars are `components` (None: `v` is a value), else a chain of selects over the components."""
        flat = self.flat_index(indices, v.shape)
        if self.indexed_local(components):
            return self.emit(ir.ComponentLoad(components, flat))
        result = v.components[-1]
        for k in reversed(range(len(v.components) - 1)):
            hit = self.values.binary("eq", flat, k)
            result = self.values.select(hit, v.components[k], result)
        return result

    def flat_index(self, indices, shape):
        flat = indices[0]
        for i, n in zip(indices[1:], shape[1:]):
            flat = self.values.binary("add", self.values.binary("mul", flat, n), i)
        return flat

    def swizzle_indices(self, shape, attr: str) -> list:
        if len(shape) != 1 or not attr or len(attr) > 4 or any(c not in _SWIZZLE for c in attr):
            self.error(f"a {kind_of(shape)} has no attribute '{attr}'")
        if len({next(g for g in _SWIZZLE_SETS if c in g) for c in attr}) != 1:
            self.error(f"swizzle '{attr}' mixes letters of xyzw, rgba and stpq")
        indices = [_SWIZZLE[c] for c in attr]
        if max(indices) >= shape[0]:
            self.error(f"swizzle '{attr}' is out of range for a vector of {shape[0]} component(s)")
        return indices

    # ---- calls ----------------------------------------------------------------------------
    def elementwise(self, fn, args: list, nodes: list):
        """`fn` over scalars, applied component by component when some argument is a vector
        (the others broadcast); every vector argument must have the same shape."""
        shapes = {a.shape for a in args if isinstance(a, VectorValue)}
        if not shapes:
            return fn(*[self.scalar(a, n) for a, n in zip(args, nodes)])
        if len(shapes) > 1:
            self.error("vector arguments have different shapes: " + " and ".join(shape_text(s) for s in shapes))
        (shape,) = shapes
        columns = [a.components if isinstance(a, VectorValue) else [self.scalar(a, n)] * component_count(shape)
                   for a, n in zip(args, nodes)]
        return VectorValue(shape, [fn(*c) for c in zip(*columns)])

    # ---- writes ---------------------------------------------------------------------------
    def vector_target(self, node) -> Target | None:
        """The places `node` names when it is a vector local, a vector element of a field or
        ndarray, or a part of either (`v[i]`, `m[i, j]`, `x[i][j]`, `v.xy`), or a member of a
        struct (`s.a`, `p[i].v`: a whole struct gives a StructTarget); None otherwise."""
        member = self.struct_place(node)
        if member is not None:
            return member
        if isinstance(node, ast.Name):
            scope = self.binding_scope(node.id)
            value = scope[node.id] if scope is not None else None
            return Target(value.shape, value.variables) if isinstance(value, VectorVar) else None
        if not isinstance(node, (ast.Subscript, ast.Attribute)):
            return None
        inner = self.vector_target(node.value)
        if inner is None:
            if isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)):
                base = self.visit(node.value)
                if isinstance(base, GLOBAL_ARRAYS) and element_shape(base):
                    return Target(element_shape(base), self.global_vector_ptrs(base, node))
            return None
        if isinstance(node, ast.Attribute):
            indices = self.swizzle_indices(inner.shape, node.attr)
            if len(set(indices)) != len(indices):
                self.error(f"cannot assign to swizzle '{node.attr}': it repeats a component", node)
            if len(indices) == 1:
                return Target((), [inner.places[indices[0]]])
            return Target((len(indices),), [inner.places[i] for i in indices])
        return self.index_target(inner, node)

    def sliced_positions(self, indices: list, shape: tuple, node):
        """(result shape, component positions) of an index with slices (`m[i, :]`, `m[:, j]`,
        `v[1:3]`, `v[::-1]`, any step Python allows), None without one. A sliced axis takes the
        components Python's slice selects; an integer axis (a run-time one too) one component."""
        if not any(isinstance(i, slice) for i in indices):
            return None
        if len(indices) == 1 and len(shape) == 2:  # m[a:b]: rows
            indices = [indices[0], slice(None)]
        if len(indices) != len(shape):
            self.error(f"a {kind_of(shape)} of shape {shape_text(shape)} is indexed with {len(indices)} "
                       f"index(es)", node)
        axes, out_shape = [], []
        for i, n in zip(indices, shape):
            if isinstance(i, slice):
                picked = list(range(*i.indices(n)))
                if not picked:
                    self.error(f"the slice selects no component of a dimension of size {n}", node)
                axes.append(picked)
                out_shape.append(len(picked))
            else:
                axes.append([self.component_index(i, n, node)])
        return tuple(out_shape), list(itertools.product(*axes))

    def index_target(self, inner: Target, node: ast.Subscript) -> Target:
        indices = self.component_indices(self.visit(node.slice))
        shape = inner.shape
        sliced = self.sliced_positions(indices, shape, node.slice)
        if sliced is not None:  # m[i, :] = ...: the selected places
            out_shape, positions = sliced
            return Target(out_shape, [self.component_place(inner, list(p), shape) for p in positions])
        if len(indices) == 1 and len(shape) == 2:  # m[i]: a row
            i = self.component_index(indices[0], shape[0], node.slice)
            if is_runtime(i):
                self.error("a matrix row can only be selected with a compile-time index", node.slice)
            return Target((shape[1],), inner.places[i * shape[1]:(i + 1) * shape[1]])
        if len(indices) != len(shape):
            self.error(f"a {kind_of(shape)} of shape {shape_text(shape)} is indexed with {len(indices)} index(es)",
                       node.slice)
        checked = [self.component_index(i, n, node.slice) for i, n in zip(indices, shape)]
        return Target((), [self.component_place(inner, checked, shape)])

    def component_place(self, inner: Target, checked: list, shape: tuple):
        """The place of component `checked` (indices, compile-time or run-time) of `inner`."""
        if not any(is_runtime(i) for i in checked):
            flat = checked[0] if len(checked) == 1 else checked[0] * shape[1] + checked[1]
            return inner.places[flat]
        flat = self.values.cast(self.flat_index(checked, shape), T.i32)
        first = inner.places[0]
        if isinstance(first, ir.GlobalPtr):  # a run-time index into a field element: address it directly
            n_element = len(shape)
            field_indices = first.indices[:len(first.indices) - n_element]
            indices_rt = [self.values.cast(i, T.i32) for i in checked]
            return self.emit(ir.GlobalPtr(first.target, [*field_indices, *indices_rt]))
        if not all(isinstance(p, ir.Alloca) for p in inner.places):
            self.error("a run-time index cannot select part of this vector")
        return RuntimeComponent(flat, inner.places)

    def global_vector_ptrs(self, base, node: ast.Subscript) -> list:
        """One GlobalPtr per component of the vector element `base[...]`, row-major."""
        ref, indices = self.global_address(base, node)
        return [self.emit(ir.GlobalPtr(ref, [*indices, *(self.values.const(c, T.i32) for c in comp)]))
                for comp in itertools.product(*(range(n) for n in element_shape(base)))]

    def load_global_vector(self, base, node: ast.Subscript) -> VectorValue:
        return VectorValue(element_shape(base), [self.emit(ir.GlobalLoad(p)) for p in self.global_vector_ptrs(base, node)])

    def load_place(self, place):
        if isinstance(place, ir.Alloca):
            return self.emit(ir.LocalLoad(place))
        if isinstance(place, RuntimeComponent):
            if self.indexed_local(place.variables):
                return self.emit(ir.ComponentLoad(place.variables, place.index))
            return self.runtime_component(VectorValue((len(place.variables),),
                                                      [self.emit(ir.LocalLoad(v)) for v in place.variables]),
                                          [place.index])
        return self.emit(ir.GlobalLoad(place))

    def load_target(self, target: Target):
        values = [self.load_place(p) for p in target.places]
        return values[0] if not target.shape else VectorValue(target.shape, values)

    def target_components(self, target: Target, value, node) -> list:
        """`value` spread over the target's places: a vector of the same shape, or a scalar broadcast."""
        if isinstance(value, (tuple, list)) and target.shape:  # `m[i] = [[1, 2], [3, 4]]`, as in Quadrants
            value = self.list_as_vector(value, target.shape, node)
        if isinstance(value, VectorValue):
            if value.shape != target.shape:
                self.error(f"cannot assign a {kind_of(value.shape)} of shape {shape_text(value.shape)} to "
                           f"{_described_shape(target.shape, target.places)}", node)
            return value.components
        return [self.scalar(value, node)] * len(target.places)

    def list_as_vector(self, value, shape: tuple, node) -> VectorValue:
        """A list/tuple literal of the target's shape (nested for a matrix) as a vector value."""
        if _nested_shape(value) != shape:
            self.error(f"cannot assign a list of shape {_nested_shape(value)} to a {kind_of(shape)} of shape "
                       f"{shape_text(shape)}", node)
        return VectorValue(shape, [self.scalar(c, node) for c in _flatten_components(value)])

    def store_target(self, target: Target, value, value_node=None) -> None:
        for place, v in zip(target.places, self.target_components(target, value, value_node)):
            self.store_place(place, v, value_node)

    def store_place(self, place, value, value_node=None) -> None:
        v = self.convert(value, place.type, value_node)
        if isinstance(place, ir.Alloca):
            self.emit(ir.LocalStore(place, v))
        elif isinstance(place, RuntimeComponent):
            if any(self.shared_by_iterations(var) for var in place.variables):
                # a kernel-scope vector written by the iterations of a parallel loop: each writes
                # only its component (rewriting all of them would race with the other threads)
                self.store_one_component(place.index, place.variables, 0, v)
                return
            if self.indexed_local(place.variables):
                self.emit(ir.ComponentStore(place.variables, place.index, v))
                return
            for k, var in enumerate(place.variables):  # branch-free: a run of ifs on one index made LLVM's
                hit = self.values.binary("eq", place.index, k)  # optimiser superlinear (minutes at 1024)
                self.emit(ir.LocalStore(var, self.values.select(hit, v, self.emit(ir.LocalLoad(var)))))
        else:
            self.emit(ir.GlobalStore(place, v))

    def store_one_component(self, index, variables: list, first: int, v) -> None:
        """`variables[index - first] = v`, storing into that variable only: a balanced tree of
        ifs on `index` (depth log2 n, unlike a run of n ifs that LLVM's optimiser handles in
        superlinear time)."""
        if len(variables) == 1:
            self.emit(ir.LocalStore(variables[0], v))
            return
        half = len(variables) // 2
        branch = self.emit(ir.If(self.values.binary("lt", index, first + half)))
        self.emit_into(branch.then_block, lambda: self.store_one_component(index, variables[:half], first, v))
        self.emit_into(branch.else_block, lambda: self.store_one_component(index, variables[half:], first + half, v))

    def aug_assign_target(self, op: str, target: Target, value_node) -> None:
        """`t op= value`: atomic on field/ndarray components (add, sub, and integer bit ops) and
        on kernel-scope locals shared by a parallel loop, as for scalars."""
        self.require_non_struct(target, value_node)
        value = self.visit(value_node)
        if isinstance(value, (tuple, list)) and target.shape:
            value = self.list_as_vector(value, target.shape, value_node)
        parts = self.target_components(target, self.vector_operand(value, value_node), value_node)
        atomic = _ATOMIC_AUG.get(op)
        for place, v in zip(target.places, parts):
            usable = atomic is not None and (place.type.is_integral or atomic in ("add", "sub"))
            if usable and isinstance(place, ir.GlobalPtr):
                self.emit(ir.AtomicRMW(atomic, place, self.convert(v, place.type, value_node)))
            elif usable and self.shared_by_iterations(place):
                self.emit(ir.LocalAtomic(atomic, place, self.convert(v, place.type, value_node)))
            else:
                self.store_place(place, self.values.binary(op, self.load_place(place), v), value_node)

    def atomic_target(self, op: str, target: Target, value, node):
        """`qd.atomic_op(t, value)` on a vector target: per component; returns the old values."""
        self.require_non_struct(target, node)
        olds = []
        for place, v in zip(target.places, self.target_components(target, value, node)):
            self.check_atomic_type(op, place.type, node)
            v = self.values.cast(v, place.type)
            if isinstance(place, ir.GlobalPtr):
                olds.append(self.emit(ir.AtomicRMW(op, place, v)))
            elif self.shared_by_iterations(place):
                olds.append(self.emit(ir.LocalAtomic(op, place, v)))
            else:
                old = self.load_place(place)
                self.store_place(place, v if op == "xchg" else self.values.binary(_LOCAL_OP[op], old, v))
                olds.append(old)
        return olds[0] if not target.shape else VectorValue(target.shape, olds)

def shape_text(shape) -> str:
    return "scalar" if not shape else "x".join(map(str, shape)) if len(shape) == 2 else f"({shape[0]},)"


def _described_shape(shape, places) -> str:
    if shape:
        return f"a {kind_of(shape)} of shape {shape_text(shape)}"
    return f"a scalar ({places[0].type})" if places and getattr(places[0], "type", None) is not None else "a scalar"


def kind_of(shape) -> str:
    return {0: "scalar", 1: "vector"}.get(len(shape), "matrix")


def _nested_shape(v) -> tuple | None:
    """The shape of a nested list/tuple of scalars and vectors (None when ragged)."""
    if isinstance(v, VectorValue):
        return v.shape
    if not isinstance(v, (tuple, list)):
        return ()
    inner = {_nested_shape(e) for e in v}
    if len(inner) > 1 or None in inner:
        return None
    return (len(v),) + (inner.pop() if inner else ())


def _flatten_components(v) -> list:
    if isinstance(v, VectorValue):
        return list(v.components)
    if isinstance(v, (tuple, list)):
        return [c for e in v for c in _flatten_components(e)]
    return [v]


_LOCAL_OP = {"add": "add", "sub": "sub", "mul": "mul", "min": "min", "max": "max", "and": "bit_and", "or": "bit_or",
             "xor": "bit_xor"}
