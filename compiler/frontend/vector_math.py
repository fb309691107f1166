"""Methods of vectors and matrices in kernels (`v.dot(w)`, `m.inverse()`, swizzles) and the
`qd.math` functions, each lowered to scalar operations (see vectors.py).

A mixin of FrontEnd (see ast_to_ir.py), beside VectorLowering.
"""
from __future__ import annotations

import ast

from qdc.runtime.contract import types as T

from ..language import mathlib
from .values import is_runtime
from .vectors import VectorValue, shape_text

_MAX_INVERSE = 4


class VectorMath:
    def vector_attribute(self, v: VectorValue, attr: str):
        """`v.x`, `v.xy` (swizzles), `.n`/`.m`, `.T`, or a method to call (`v.dot`)."""
        if attr in ("n", "m"):
            return v.shape[0] if attr == "n" else (v.shape[1] if v.is_matrix else 1)
        if attr == "T":
            return self.transpose(v)
        method = _METHODS.get(attr)
        if method is not None:
            return BoundMethod(v, attr, method)
        indices = self.swizzle_indices(v.shape, attr)
        if len(indices) == 1:
            return v.components[indices[0]]
        return VectorValue((len(indices),), [v.components[i] for i in indices])

    def call_vector_method(self, bound: "BoundMethod", node: ast.Call):
        self.reject_unpacking(node)
        args = [self.visit(a) for a in node.args]
        kwargs = {kw.arg: self.visit(kw.value) for kw in node.keywords}
        try:
            return bound.method(self, bound.value, *args, **kwargs)
        except TypeError as e:
            self.error(f".{bound.name}(): {e}")

    def call_math(self, fn, node: ast.Call):
        """`qd.math.dot/cross/length/normalize/clamp/mix/sign/fract/step/smoothstep(...)`."""
        self.reject_unpacking(node)
        impl = _MATH[fn]
        args = [self.visit(a) for a in node.args]
        kwargs = {kw.arg: self.visit(kw.value) for kw in node.keywords}
        try:
            return impl(self, *args, **kwargs)
        except TypeError as e:
            self.error(f"qd.math.{fn.__name__}(): {e}")

    # ---- methods ----------------------------------------------------------------------------
    def transpose(self, v: VectorValue) -> VectorValue:
        if not v.is_matrix:
            return VectorValue((1, v.shape[0]), v.components)  # a row vector, as in Quadrants
        n, m = v.shape
        return VectorValue((m, n), [v.at(i, j) for j in range(m) for i in range(n)])

    def determinant(self, v: VectorValue):
        n = self.square(v, "determinant")
        return self.det_of([[v.at(i, j) for j in range(n)] for i in range(n)])

    def det_of(self, rows):
        """Laplace expansion along the first row (exact for the sizes allowed, up to 4x4)."""
        b = self.values.binary
        if len(rows) == 1:
            return rows[0][0]
        if len(rows) == 2:
            return b("sub", b("mul", rows[0][0], rows[1][1]), b("mul", rows[0][1], rows[1][0]))
        acc = None
        for j in range(len(rows)):
            minor = [r[:j] + r[j + 1:] for r in rows[1:]]
            term = b("mul", rows[0][j], self.det_of(minor))
            acc = term if acc is None else b("sub" if j % 2 else "add", acc, term)
        return acc

    def inverse(self, v: VectorValue) -> VectorValue:
        """The adjugate divided by the determinant (no pivoting: as Quadrants, up to 4x4)."""
        n = self.square(v, "inverse")
        rows = [[v.at(i, j) for j in range(n)] for i in range(n)]
        det = self.det_of(rows)
        inv_det = self.values.binary("truediv", 1.0, det)
        if n == 1:
            return VectorValue((1, 1), [inv_det])
        out = []
        for i in range(n):
            for j in range(n):  # entry (i, j) is the cofactor (j, i) / det
                minor = [r[:i] + r[i + 1:] for k, r in enumerate(rows) if k != j]
                cof = self.det_of(minor)
                if (i + j) % 2:
                    cof = self.values.unary("neg", cof)
                out.append(self.values.binary("mul", cof, inv_det))
        return VectorValue((n, n), out)

    def square(self, v: VectorValue, what: str) -> int:
        if not v.is_matrix or v.shape[0] != v.shape[1]:
            self.error(f"{what} needs a square matrix, got shape {shape_text(v.shape)}")
        if v.shape[0] > _MAX_INVERSE:
            self.error(f"{what} is supported up to {_MAX_INVERSE}x{_MAX_INVERSE}, got {v.shape[0]}x{v.shape[1]}")
        return v.shape[0]

    def reduce(self, op: str, v: VectorValue):
        acc = v.components[0]
        for c in v.components[1:]:
            acc = self.values.binary(op, acc, c)
        return acc

    def dot(self, a, b):
        self.same_vectors(a, b, "dot")
        return self.sum_of_products(a.components, b.components)

    def cross(self, a, b):
        self.same_vectors(a, b, "cross")
        s, m = self.values.binary, lambda x, y: self.values.binary("mul", x, y)
        if a.shape == (2,):
            return s("sub", m(a.at(0), b.at(1)), m(a.at(1), b.at(0)))
        if a.shape != (3,):
            self.error(f"cross() needs 2- or 3-vectors, got shape {shape_text(a.shape)}")
        return VectorValue((3,), [s("sub", m(a.at((i + 1) % 3), b.at((i + 2) % 3)),
                                    m(a.at((i + 2) % 3), b.at((i + 1) % 3))) for i in range(3)])

    def outer_product(self, a, b):
        if not isinstance(a, VectorValue) or not isinstance(b, VectorValue) or a.is_matrix or b.is_matrix:
            self.error("outer_product() needs two vectors")
        return VectorValue((a.shape[0], b.shape[0]),
                           [self.values.binary("mul", x, y) for x in a.components for y in b.components])

    def same_vectors(self, a, b, what: str) -> None:
        if not isinstance(a, VectorValue) or not isinstance(b, VectorValue):
            self.error(f"{what}() needs two vectors")
        if a.shape != b.shape:
            self.error(f"{what}() of vectors of different shapes: {shape_text(a.shape)} and {shape_text(b.shape)}")

    def norm_sqr(self, v):
        return self.sum_of_products(v.components, v.components)

    def norm(self, v, eps=0):
        return self.values.unary("sqrt", self.values.binary("add", self.norm_sqr(v), eps))

    def normalized(self, v, eps=0):
        inv = self.values.binary("truediv", 1.0, self.values.binary("add", self.norm(v), eps))
        return self.vector_binary("mul", v, inv)


class BoundMethod:
    """`v.dot` etc. inside a kernel: called right away by visit_Call."""

    def __init__(self, value: VectorValue, name: str, method):
        self.value, self.name, self.method = value, name, method


_METHODS = {
    "dot": lambda fe, v, other: fe.dot(v, other),
    "cross": lambda fe, v, other: fe.cross(v, other),
    "outer_product": lambda fe, v, other: fe.outer_product(v, other),
    "norm": lambda fe, v, eps=0: fe.norm(v, eps),
    "norm_sqr": lambda fe, v: fe.norm_sqr(v),
    "normalized": lambda fe, v, eps=0: fe.normalized(v, eps),
    "norm_inv": lambda fe, v, eps=0: fe.values.unary("rsqrt", fe.values.binary("add", fe.norm_sqr(v), eps)),
    "transpose": lambda fe, v: fe.transpose(v),
    "sum": lambda fe, v: fe.reduce("add", v),
    "max": lambda fe, v: fe.reduce("max", v),
    "min": lambda fe, v: fe.reduce("min", v),
    "trace": lambda fe, v: _trace(fe, v),
    "determinant": lambda fe, v: fe.determinant(v),
    "inverse": lambda fe, v: fe.inverse(v),
    "cast": lambda fe, v, dtype: _cast(fe, v, dtype),
    "any": lambda fe, v: fe.reduce("bit_or", v.map(fe.values.to_bool)),
    "all": lambda fe, v: fe.reduce("bit_and", v.map(fe.values.to_bool)),
}


def _cast(fe, v, dtype):
    """`v.cast(qd.f32)`; `float` / `int` are default_fp / default_ip, as in Quadrants."""
    if dtype is int or dtype is float:
        dtype = fe.values.default_ip if dtype is int else fe.values.default_fp
    if not isinstance(dtype, T.DataType):
        fe.error(f".cast() needs a qd scalar type, got {dtype!r}")
    return v.map(lambda c: fe.values.cast(c, dtype))


def _trace(fe, v):
    if not v.is_matrix or v.shape[0] != v.shape[1]:
        fe.error(f"trace() needs a square matrix, got shape {shape_text(v.shape)}")
    acc = v.at(0, 0)
    for i in range(1, v.shape[0]):
        acc = fe.values.binary("add", acc, v.at(i, i))
    return acc


def _clamp(fe, x, lo, hi):
    return fe.elementwise(lambda a, b, c: fe.values.binary("min", fe.values.binary("max", a, b), c),
                          [x, lo, hi], [None] * 3)


def _mix(fe, x, y, a):
    return fe.elementwise(lambda p, q, t: fe.values.binary(
        "add", fe.values.binary("mul", p, fe.values.binary("sub", 1.0, t)), fe.values.binary("mul", q, t)),
        [x, y, a], [None] * 3)


def _sign(fe, x):
    def sign(v):
        t = v.type if is_runtime(v) else fe.values.literal_type(v)
        pos = fe.values.cast(fe.values.binary("ge", v, 0), t)
        neg = fe.values.cast(fe.values.binary("le", v, 0), t)
        return fe.values.binary("sub", pos, neg)
    return fe.elementwise(sign, [x], [None])


def _fract(fe, x):
    return fe.elementwise(lambda v: fe.values.binary("sub", v, fe.values.unary("floor", v)), [x], [None])


def _step(fe, edge, x):
    def step(e, v):
        t = fe.values.float_type_of(v)
        return fe.values.cast(fe.values.binary("ge", v, e), t)
    return fe.elementwise(step, [edge, x], [None, None])


def _smoothstep(fe, edge0, edge1, x):
    b = fe.values.binary

    def smooth(e0, e1, v):
        t = b("truediv", b("sub", v, e0), b("sub", e1, e0))
        t = b("min", b("max", t, 0.0), 1.0)
        return b("mul", b("mul", t, t), b("sub", 3.0, b("mul", 2.0, t)))
    return fe.elementwise(smooth, [edge0, edge1, x], [None] * 3)


def _vector_arg(fe, v, what):
    if not isinstance(v, VectorValue):
        fe.error(f"qd.math.{what}() needs a vector")
    return v


_MATH = {
    mathlib.dot: lambda fe, a, b: fe.dot(a, b),
    mathlib.cross: lambda fe, a, b: fe.cross(a, b),
    mathlib.length: lambda fe, v: fe.norm(_vector_arg(fe, v, "length")),
    mathlib.normalize: lambda fe, v: fe.normalized(_vector_arg(fe, v, "normalize")),
    mathlib.clamp: _clamp,
    mathlib.mix: _mix,
    mathlib.sign: _sign,
    mathlib.fract: _fract,
    mathlib.step: _step,
    mathlib.smoothstep: _smoothstep,
    mathlib.distance: lambda fe, a, b: fe.norm(fe.vector_binary("sub", _vector_arg(fe, a, "distance"), b)),
    mathlib.reflect: lambda fe, x, n: fe.vector_binary(
        "sub", _vector_arg(fe, x, "reflect"), fe.vector_binary("mul", n, fe.values.binary("mul", 2.0, fe.dot(x, n)))),
    mathlib.radians: lambda fe, v: fe.elementwise(lambda c: fe.values.binary("mul", c, mathlib.pi / 180), [v], [None]),
    mathlib.degrees: lambda fe, v: fe.elementwise(lambda c: fe.values.binary("mul", c, 180 / mathlib.pi), [v], [None]),
    mathlib.determinant: lambda fe, m: fe.determinant(_vector_arg(fe, m, "determinant")),
    mathlib.inverse: lambda fe, m: fe.inverse(_vector_arg(fe, m, "inverse")),
}
MATH_FUNCTIONS = frozenset(_MATH)
