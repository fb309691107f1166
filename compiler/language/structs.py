"""Struct types of the kernel language (docs/api.md, Structs).

`qd.types.struct(a=qd.f32, v=qd.math.vec3)` and `@qd.dataclass` classes are `StructType`s:
constructors in kernels (`S(a=1.0, v=...)`, members left out are zero), annotations of locals
and func parameters, and field element types (`S.field(shape=n)`, `qd.Struct.field({...})`).
A struct field is one field per member (runtime/fields.py, StructField); in kernels every
struct is lowered to its members by the front end (compiler/frontend/structs.py), so nothing
past the front end knows about structs.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T
from qdc.runtime.contract.python_scope import device_arrays

from . import matrix as _matrix
from .funcs import Func


def _member_type(struct: str, member: str, dtype):
    if dtype is int or dtype is float:  # Python's types mean the default types in force now
        default_ip, default_fp = _matrix._default_types()
        return default_ip if dtype is int else default_fp
    if dtype is bool:  # as in Quadrants: a u1 member
        return T.u1
    if isinstance(dtype, (T.DataType, _matrix.MatrixType, StructType)):
        return dtype
    raise TypeError(f"struct {struct}: member '{member}' has type {dtype!r}, which is not a qd scalar, "
                    f"vector/matrix or struct type")


class StructType:
    """The members (name -> qd scalar type, vector/matrix type or struct type, in declaration
    order) and `@qd.func` methods of a struct."""

    def __init__(self, members: dict, name: str | None = None, methods: dict | None = None):
        self.name = name or "struct"
        if not members:
            raise TypeError(f"struct {self.name} needs at least one member")
        self.members = {k: _member_type(self.name, k, v) for k, v in members.items()}
        self.methods = dict(methods or {})

    def field(self, shape=(), name=None, offset=None, needs_grad=False, needs_dual=False, layout=None):
        """A field of these structs: one field per member (`.to_numpy()` gives a dict of arrays;
        `layout=qd.Layout.AOS/SOA` is a storage hint, runtime/tensors.py); Quadrants' parameters."""
        return device_arrays.struct_field(self, shape, name=name, offset=offset, needs_grad=needs_grad,
                                          needs_dual=needs_dual, layout=layout)

    def __call__(self, *positional, **values) -> dict:
        """Python scope: a dict of the members (missing ones zero), as struct fields read and
        write; positional values fill the members in declaration order, as in a kernel."""
        if len(positional) > len(self.members):
            raise TypeError(f"struct {self.name} has {len(self.members)} member(s), got {len(positional)} "
                            f"positional values")
        for member, value in zip(self.members, positional):
            if member in values:
                raise TypeError(f"struct {self.name}: member '{member}' given by position and by name")
            values[member] = value
        unknown = set(values) - set(self.members)
        if unknown:
            raise TypeError(f"struct {self.name} has no member(s) {sorted(unknown)}")
        return {k: values.get(k, 0) for k in self.members}

    def leaves(self, default_ip: T.DataType, default_fp: T.DataType) -> list:
        """(member path, scalar type, element shape) of every scalar or vector/matrix member, in
        member order, nested structs flattened: how a struct travels as scalars (kernel
        parameters and return values, one scalar per element, row-major)."""
        out = []
        for member, mtype in self.members.items():
            if isinstance(mtype, StructType):
                out += [((member, *path), dtype, shape) for path, dtype, shape in mtype.leaves(default_ip, default_fp)]
            elif isinstance(mtype, _matrix.MatrixType):
                out.append(((member,), mtype.element_dtype(default_ip, default_fp), tuple(mtype.shape)))
            else:
                out.append(((member,), mtype, ()))
        return out

    def layout(self, default_ip: T.DataType, default_fp: T.DataType) -> dict:
        """The struct as the artifact metadata records it (runtime/contract/artifact.py,
        check_struct_layout): {"name": ..., "members": [[member, [dtype, shape] or a nested layout]]}."""
        members = []
        for member, mtype in self.members.items():
            if isinstance(mtype, StructType):
                members.append([member, mtype.layout(default_ip, default_fp)])
            elif isinstance(mtype, _matrix.MatrixType):
                members.append([member, [mtype.element_dtype(default_ip, default_fp).name, list(mtype.shape)]])
            else:
                members.append([member, [mtype.name, []]])
        return {"name": self.name, "members": members}

    def _spec(self):
        members = [(k, v._spec() if isinstance(v, (StructType, _matrix.MatrixType)) else getattr(v, "name", repr(v)))
                   for k, v in self.members.items()]
        return (self.name, tuple(members), tuple(sorted(self.methods)))

    def __qdc_key__(self):  # the cache key identifies a captured type by what it is (methods: by their source)
        return repr(self._spec())

    def __eq__(self, other):
        return isinstance(other, StructType) and self._spec() == other._spec() and self.methods == other.methods

    def __hash__(self):
        return hash(self._spec())

    def __repr__(self):
        return self.name if self.name != "struct" else \
            "struct(" + ", ".join(f"{k}={v!r}" for k, v in self.members.items()) + ")"


def struct(**members) -> StructType:
    """`qd.types.struct(a=qd.f32, v=qd.math.vec3, ...)`."""
    return StructType(members)


def dataclass(cls) -> StructType:
    """`@qd.dataclass`: the class's annotated attributes are the members, its `@qd.func`
    functions the methods (called as `s.method(...)` in kernels, `self` being the struct)."""
    annotations = cls.__dict__.get("__annotations__", {})
    methods = {k: v for k, v in cls.__dict__.items() if isinstance(v, Func)}
    return StructType(annotations, cls.__name__, methods)


class Struct:
    """`qd.Struct.field({"a": qd.f32, "v": qd.math.vec3}, shape=n)`."""

    @staticmethod
    def field(members: dict, methods=None, shape=(), name=None, offset=None, needs_grad=False, needs_dual=False,
              layout=None):
        """Quadrants' parameters: `methods`, qd.funcs callable on each element (`s[i].m()`)."""
        return StructType(members, methods=methods).field(shape, name, offset, needs_grad, needs_dual, layout)
