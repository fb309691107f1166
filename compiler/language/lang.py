"""The kernel language's Python surface: annotations and intrinsics, and what the decorators
(compiler/jit/kernel.py) make.

Intrinsics (`qd.sin`, `qd.atomic_add`, `qd.static`, ...) are ordinary Python functions so
that they also work in Python scope; inside kernels the front end recognises them by
identity through the INTRINSICS table and emits IR instead of calling them.
"""
from __future__ import annotations

import builtins
import inspect
import itertools
import math
import operator
from types import FunctionType

import numpy as np

from qdc.runtime.contract import matrix_value as _matrix_value
from qdc.runtime.contract import types as T

from . import matrix as _matrix
from . import bitops as _bitops
from . import numeric as _numeric
from . import structs as _structs
from .funcs import BoundFunc, Func  # noqa: F401  (lang.Func: what the front end inlines)
from .structs import Struct, dataclass  # noqa: F401  (qd.Struct, qd.dataclass)
from .numeric import bit_shr, random, raw_div, raw_mod, stop_grad  # noqa: F401  (qd.random, ...)


# ---- annotations ---------------------------------------------------------------------

class NdarrayType:
    """`qd.types.ndarray(dtype=qd.f32, ndim=1, needs_grad=None)` parameter annotation. None
    (the default, as in Quadrants) follows the argument: dtype and ndim are the argument's, and
    a `qd.ndarray(..., needs_grad=True)` gets its gradient (the kernel is specialised on it)."""

    def __init__(self, dtype=None, ndim=None, needs_grad=None, element_dim=None, element_shape=None,
                 field_dim=None):
        self.element_shape = ()  # an ndarray of vectors/matrices (dtype=qd.math.vec3): its element's shape
        if isinstance(dtype, UnsizedElementType) or dtype is float or dtype is int:
            dtype = None  # follows the argument (Python float/int: the default_fp/default_ip arrays)
        if getattr(dtype, "element_shape", None) is not None and not isinstance(dtype, T.DataType):
            self.element_shape, dtype = tuple(dtype.element_shape), dtype.dtype
        if dtype is not None and not isinstance(dtype, T.DataType):
            dtype = T.from_numpy(dtype)
        if needs_grad is not None:
            needs_grad = bool(needs_grad)
        if field_dim is not None:  # Quadrants' older name of ndim
            if ndim is not None and ndim != field_dim:
                raise TypeError(f"qd.types.ndarray(): ndim={ndim} and field_dim={field_dim} disagree")
            ndim = field_dim
        self.element_shape = _element_axes(self.element_shape, element_dim, element_shape)
        self.dtype, self.ndim, self.needs_grad = dtype, ndim, needs_grad

    def __repr__(self):
        grad = "" if self.needs_grad is None else f", needs_grad={self.needs_grad}"
        element = f", element_shape={self.element_shape}" if self.element_shape else ""
        return f"ndarray(dtype={self.dtype}{element}, ndim={self.ndim}{grad})"


def _element_axes(from_dtype: tuple, element_dim, element_shape) -> tuple:
    """The element shape of an ndarray annotation, as Quadrants' `element_dim` (0 scalars,
    1 vectors, 2 matrices) and `element_shape` say it; an axis of an element_dim without a
    shape is None: its length is the argument's (its trailing axes)."""
    if element_shape is not None:
        element_shape = tuple(int(n) for n in element_shape)
        if len(element_shape) > 2 or any(n <= 0 for n in element_shape):
            raise TypeError(f"qd.types.ndarray(): element_shape {element_shape} is not the shape of a vector "
                            f"(n,) or a matrix (n, m)")
        if element_dim is not None and element_dim != len(element_shape):
            raise TypeError(f"qd.types.ndarray(): element_shape {element_shape} and element_dim={element_dim} "
                            f"disagree")
        if from_dtype and from_dtype != element_shape:
            raise TypeError(f"qd.types.ndarray(): element_shape {element_shape} and the dtype's element shape "
                            f"{from_dtype} disagree")
        return element_shape
    if element_dim is None:
        return from_dtype
    if element_dim not in (0, 1, 2) or isinstance(element_dim, bool):
        raise TypeError(f"qd.types.ndarray(): element_dim must be 0 (scalars), 1 (vectors) or 2 (matrices), "
                        f"got {element_dim!r}")
    if from_dtype:
        if len(from_dtype) != element_dim:
            raise TypeError(f"qd.types.ndarray(): element_dim={element_dim} and the dtype's element shape "
                            f"{from_dtype} disagree")
        return from_dtype
    return (None,) * element_dim


class _NdarraySubscript(NdarrayType):
    """`qd.types.NDArray[dtype, ndim]` (Quadrants' spelling; bare `qd.types.NDArray` follows the
    argument in dtype and ndim too)."""

    def __getitem__(self, key) -> NdarrayType:
        dtype, ndim = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if ndim is not None and (not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 0):
            raise TypeError(f"qd.types.NDArray[dtype, ndim]: ndim must be a non-negative int, got {ndim!r}")
        return NdarrayType(dtype=dtype, ndim=ndim)

    def __repr__(self):
        return "NDArray"


class Template:
    """`qd.template()` (also the class itself, `qd.Template`) parameter annotation: the argument
    is a field, or a Python value that becomes a compile-time constant; the kernel is compiled
    once per distinct template argument (compiler/driver/templates.py)."""

    def __repr__(self):
        return "template()"


def template() -> Template:
    return Template()


def is_template_annotation(ann) -> bool:
    """`qd.template()`, `qd.Template`, and `qd.template` itself (a class in Quadrants, so code
    written for it may leave out the call)."""
    return ann is Template or ann is template or isinstance(ann, Template)


class UnsizedElementType:
    """`qd.types.vector()` / `qd.types.matrix()` without sizes: only an ndarray annotation's
    hint that its elements are vectors/matrices, whose type and shape follow the argument."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self):
        return f"{self.kind}()"


def vector(n=None, dtype=None, *, unpacked: bool = False):
    """`qd.types.vector(n, dtype)`; without n, an ndarray annotation's hint (UnsizedElementType).
    `unpacked=True` is Quadrants' storage hint for a dataclass member (one register slot per
    component): the values are the same either way, and qdc keeps every component of a local
    vector in its own slot already, so the hint changes nothing here."""
    if n is None:
        return UnsizedElementType("vector")
    return _matrix.vector(n, dtype)


def matrix(n=None, m=None, dtype=None):
    """`qd.types.matrix(n, m, dtype)`; without sizes, an ndarray annotation's hint (UnsizedElementType)."""
    if n is None and m is None:
        return UnsizedElementType("matrix")
    return _matrix.matrix(n, m, dtype)


class _TypesNamespace:
    ndarray = NdarrayType
    NDArray = _NdarraySubscript()
    template = staticmethod(template)
    Template = Template
    vector = staticmethod(vector)
    matrix = staticmethod(matrix)
    struct = staticmethod(_structs.struct)
    is_signed, is_integral, is_real, is_tensor = map(staticmethod, _numeric.TYPE_PREDICATES)

    def __init__(self):
        for t in T.ALL_TYPES:
            setattr(self, t.name, t)
        self.primitive_types = _PrimitiveTypes()


class _PrimitiveTypes:
    """`qd.types.primitive_types`: the scalar types, also grouped as Quadrants groups them."""

    def __init__(self):
        for t in T.ALL_TYPES:
            setattr(self, t.name, t)
        self.all_types = list(T.ALL_TYPES)
        self.real_types = [t for t in T.ALL_TYPES if t.is_float]
        self.integer_types = [t for t in T.ALL_TYPES if not t.is_float and t is not T.u1]
        self.signed_integer_types = [t for t in self.integer_types if t.name.startswith("i")]
        self.unsigned_integer_types = [t for t in self.integer_types if t.name.startswith("u")]


types = _TypesNamespace()


# ---- compile-time helpers ----------------------------------------------------------

def static(x, *xs):
    """Evaluate at compile time: `for i in qd.static(range(4))` unrolls, `if qd.static(c)` picks a branch."""
    return (x, *xs) if xs else x


class ndrange:
    """`qd.ndrange(n, (b, e), ..., axes=None)`: the product of ranges; each argument an int or a
    (begin, end) pair. `axes`, as in Quadrants, is the order in which the axes are visited
    (outermost first; a permutation of the dimensions): the indices are still bound to their
    own axes, only the iteration order changes. None and the identity are the default order
    (`.axes` is then None)."""

    def __init__(self, *dims, axes=None):
        self.dims = dims
        self.axes = _ndrange_axes(axes, len(dims))

    def order(self) -> list:
        """The axes from outermost to innermost."""
        return list(self.axes) if self.axes is not None else list(range(len(self.dims)))

    def __iter__(self):  # Python scope
        ranges = [_ndrange_dim(d) for d in self.dims]
        order = self.order()
        for physical in itertools.product(*(ranges[a] for a in order)):
            idx = [0] * len(order)
            for level, axis in enumerate(order):
                idx[axis] = physical[level]
            idx = tuple(idx)
            yield idx if len(idx) != 1 else idx[0]  # qd.ndrange() (0-d) yields one empty index ()


def _ndrange_axes(axes, ndim: int):
    if axes is None:
        return None
    axes = tuple(axes)
    if any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
        raise TypeError(f"qd.ndrange(axes={axes!r}): entries must be Python ints")
    if len(axes) != ndim:
        raise ValueError(f"qd.ndrange(axes={axes!r}) has {len(axes)} entries but ndrange has {ndim} dimension(s)")
    if sorted(axes) != list(range(ndim)):
        raise ValueError(f"qd.ndrange(axes={axes!r}) is not a permutation of 0..{ndim - 1}")
    return None if axes == tuple(range(ndim)) else axes


def _ndrange_dim(d) -> range:
    try:
        if isinstance(d, (tuple, list)) and len(d) == 2:
            return range(operator.index(d[0]), operator.index(d[1]))
        return range(operator.index(d))
    except TypeError:
        raise TypeError(f"qd.ndrange() arguments must be integers or (begin, end) pairs of integers, "
                        f"got {d!r}") from None


class grouped:
    """`for I in qd.grouped(x)`: a loop over the indices of `x` (a field, an ndarray or a
    qd.ndrange) whose target `I` is one integer vector of all the loop's indices (`x[I]`,
    `I[0]`, `I + 1`). In Python scope it yields index tuples."""

    def __init__(self, x):
        self.iterable = x

    def __iter__(self):  # Python scope
        it = self.iterable
        if isinstance(it, ndrange):
            return (idx if isinstance(idx, tuple) else (idx,) for idx in it)
        return itertools.product(*(range(n) for n in it.shape))


def loop_config(*, serialize: bool = False, block_dim: int | None = None, parallelize: int | None = None,
                block_dim_adaptive: bool = True, bit_vectorize: bool = False, name: str | None = None):
    """Placed right before a top-level `for`: `serialize=True` runs that loop on one thread;
    `parallelize=N` runs it on at most N CPU threads; `block_dim` is the threads per block GPU
    backends use (the CPU ignores it, and `block_dim_adaptive`, Quadrants' hint to let the
    device choose it, changes nothing here; nor does `bit_vectorize`, which in Quadrants packs
    struct-for loops over quant arrays, a storage qdc does not have); `name` labels the loop's
    task (`qdc inspect`, error messages). Any other keyword is an error, in kernels and in Python scope alike."""
    return None


# ---- math and atomics (Python-scope fallbacks) -------------------------------------

def _python_scope(name: str, impl, doc: str, params: str = "x"):
    """An intrinsic: in Python scope it computes with `impl` (numpy semantics, so it also works
    on arrays); inside kernels the front end recognises it by identity (INTRINSICS). `params`
    are Quadrants' parameter names (a trailing `=None` marks an optional one): callers may pass
    them as keywords, in Python scope and in kernels alike."""
    signature = inspect.Signature([
        inspect.Parameter(p.removesuffix("=None"), inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          **({"default": None} if p.endswith("=None") else {}))
        for p in params.split()])

    def intrinsic(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return impl(*bound.args)
    intrinsic.__name__ = intrinsic.__qualname__ = name
    intrinsic.__doc__ = doc
    intrinsic.__signature__ = signature
    return intrinsic


sin = _python_scope("sin", np.sin, "Sine.")
cos = _python_scope("cos", np.cos, "Cosine.")
tan = _python_scope("tan", np.tan, "Tangent.")
asin = _python_scope("asin", np.arcsin, "Arc sine.")
acos = _python_scope("acos", np.arccos, "Arc cosine.")
atan = _python_scope("atan", np.arctan, "Arc tangent.")
tanh = _python_scope("tanh", np.tanh, "Hyperbolic tangent.")
exp = _python_scope("exp", np.exp, "e ** x.")
log = _python_scope("log", np.log, "Natural logarithm.")
sqrt = _python_scope("sqrt", np.sqrt, "Square root.")
rsqrt = _python_scope("rsqrt", lambda x: 1.0 / np.sqrt(x), "1 / sqrt(x).")
def _rounding(fn):
    """floor/ceil/round with Quadrants' optional result type: `qd.floor(x, qd.i32)`."""
    def rounded(x, dtype=None):
        out = fn(x)
        if dtype is None:
            return out
        if dtype is int or dtype is float:
            default_ip, default_fp = _matrix._default_types()
            dtype = default_ip if dtype is int else default_fp
        if isinstance(out, _matrix_value.MatrixValue):
            return out.cast(dtype)
        return np.asarray(out).astype(getattr(dtype, "np_dtype", dtype))[()]
    return rounded


floor = _python_scope("floor", _rounding(np.floor), "Largest integral value <= x (a float, or of type dtype).",
                      "x dtype=None")
ceil = _python_scope("ceil", _rounding(np.ceil), "Smallest integral value >= x (a float, or of type dtype).",
                     "x dtype=None")
round = _python_scope("round", _rounding(lambda x: np.rint(x) if isinstance(x, _matrix_value.MatrixValue)  # noqa: A001
                                         else np.round(x)),  # np.rint: a ufunc, so a qd.Vector stays one
                      "Nearest integral value, ties to even (a float, or of type dtype).", "x dtype=None")
atan2 = _python_scope("atan2", np.arctan2, "Arc tangent of x1 / x2 in the right quadrant.", "x1 x2")
pow = _python_scope("pow", lambda x, y: x ** y, "base ** exponent.", "base exponent")  # noqa: A001
select = _python_scope("select", lambda cond, a, b: a if cond else b, "x1 if cond else x2.", "cond x1 x2")
cast = _python_scope("cast", lambda value, dtype: dtype(value),
                     "obj converted to dtype (`float` / `int`: default_fp / default_ip).", "obj dtype")


def _atomic(name):
    def fn(x, y):
        raise RuntimeError(f"qd.{name} can only be used inside a kernel or qd.func")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "Atomic read-modify-write of the field/ndarray element (or local) x with y; returns the old value."
    return fn


atomic_add, atomic_sub, atomic_min, atomic_max = map(_atomic, ("atomic_add", "atomic_sub", "atomic_min", "atomic_max"))
atomic_and, atomic_or, atomic_xor = map(_atomic, ("atomic_and", "atomic_or", "atomic_xor"))
atomic_mul = _atomic("atomic_mul")
atomic_exchange = _atomic("atomic_exchange")

def static_assert(cond, msg=None):
    """A compile-time assertion: in a kernel, a compile error (with `msg`) when the compile-time
    `cond` is false; in Python scope an AssertionError."""
    if not cond:
        raise AssertionError(msg or "static assertion failed")


def outer(a, b):
    """The outer product of two vectors: the matrix of a[i] * b[j] (`a.outer_product(b)`)."""
    return _matrix.Matrix(np.outer(np.asarray(a.to_numpy() if hasattr(a, "to_numpy") else a),
                                   np.asarray(b.to_numpy() if hasattr(b, "to_numpy") else b)))


def abs(x):  # noqa: A001
    """|x| (element-wise on vectors and matrices): the builtin, with Quadrants' parameter name."""
    return builtins.abs(x)


# `qd.min`, `qd.max` are n-ary as the builtins, and element-wise on Python-scope vectors and
# matrices, as in Quadrants (kernels treat them and qd.abs as the builtins).
min, max = _matrix_value.minimum, _matrix_value.maximum  # noqa: A001

# What the front end emits for each intrinsic: ("unary", op) | ("binary", op) | ("atomic", op) | kind
INTRINSICS = {
    sin: ("unary", "sin"), cos: ("unary", "cos"), tan: ("unary", "tan"), asin: ("unary", "asin"),
    acos: ("unary", "acos"), atan: ("unary", "atan"), tanh: ("unary", "tanh"), exp: ("unary", "exp"),
    log: ("unary", "log"), sqrt: ("unary", "sqrt"), rsqrt: ("unary", "rsqrt"), floor: ("unary", "floor"),
    ceil: ("unary", "ceil"), round: ("unary", "round"),
    atan2: ("binary", "atan2"), pow: ("binary", "pow"),
    atomic_add: ("atomic", "add"), atomic_sub: ("atomic", "sub"), atomic_min: ("atomic", "min"),
    atomic_max: ("atomic", "max"), atomic_and: ("atomic", "and"), atomic_or: ("atomic", "or"),
    atomic_xor: ("atomic", "xor"), atomic_mul: ("atomic", "mul"), atomic_exchange: ("atomic", "xchg"),
    select: ("select", None), cast: ("cast", None), static: ("static", None),
    static_assert: ("static_assert", None), outer: ("outer", None),
    ndrange: ("ndrange", None), grouped: ("grouped", None), loop_config: ("loop_config", None),
    math.sin: ("unary", "sin"), math.cos: ("unary", "cos"), math.tan: ("unary", "tan"),
    math.exp: ("unary", "exp"), math.log: ("unary", "log"), math.sqrt: ("unary", "sqrt"),
    math.tanh: ("unary", "tanh"), math.floor: ("unary", "floor"), math.ceil: ("unary", "ceil"),
    math.atan2: ("binary", "atan2"), math.asin: ("unary", "asin"), math.acos: ("unary", "acos"),
    math.atan: ("unary", "atan"),
    **_numeric.INTRINSICS, **_bitops.INTRINSICS,
}


# ---- what the decorators make (compiler/jit/kernel.py) ------------------------------

def func(fn=None, *, is_real_function: bool = False, requires_top_level: bool = False):
    """`@qd.func` or `@qd.func(...)`: inlined into every kernel (or func) that calls it;
    `qd.func(f)(...)` also works inside a kernel. Quadrants' `is_real_function=True` compiles the
    func once, as a called function: its values are those of the inlined func, and the recursion
    only a real function allows there is an error here either way. `requires_top_level=True`:
    a call nested in run-time control flow (not at the kernel's top level) is a compile error,
    as in Quadrants."""
    def make(f) -> Func:
        return Func(f, requires_top_level=requires_top_level)
    return make if fn is None else make(fn)


INTRINSICS[func] = ("func", None)


# The attribute of the function `@qd.kernel` returns that holds its kernel object (the name
# Quadrants gives it): the front end and the cache key recognise kernels by it, without
# importing the floor that makes them.
KERNEL_ATTRIBUTE = "_primal"


def is_kernel_function(obj) -> bool:
    """Whether `obj` is what `@qd.kernel` returned."""
    return isinstance(obj, FunctionType) and KERNEL_ATTRIBUTE in obj.__dict__
