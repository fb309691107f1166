"""Structs in kernels, lowered to their members here so that the IR never sees a struct.

A struct value is a `StructValue`: its type and one front-end value per member (a scalar, a
VectorValue or a nested StructValue). A struct local is a `StructVar`: one variable (Alloca,
VectorVar or StructVar) per member. A struct field is one field per member
(runtime/fields.py), so `p[i]` is the members' elements at `i` and `p[i].v.x = 1` a store into
member `v`'s field. Writes go through `StructTarget`s, whose members are the vector front
end's `Target`s (compiler/frontend/vectors.py).

A mixin of FrontEnd (see ast_to_ir.py).
"""
from __future__ import annotations

import ast
import difflib
import itertools

from qdc.runtime.contract import types as T
from qdc.runtime.contract.artifact_schema import MAX_ELEMENT_AXIS, MAX_STRUCT_SCALARS
from qdc.runtime.contract.objects import StructFieldMarker as StructField

from .. import ir
from ..language import matrix as M
from ..language.structs import StructType
from .objects import Shape
from .vectors import Target, VectorValue, VectorVar, component_count, kind_of, shape_text


class StructValue:
    __slots__ = ("stype", "members")

    def __init__(self, stype: StructType, members: dict):
        self.stype, self.members = stype, members

    def __repr__(self):
        return f"StructValue({self.stype!r})"


class StructVar:
    """A struct local: one variable per member (Alloca, VectorVar or StructVar)."""
    __slots__ = ("stype", "members")

    def __init__(self, stype: StructType, members: dict):
        self.stype, self.members = stype, members


class StructTarget:
    """The places a struct assignment writes: a `Target` or nested StructTarget per member."""

    def __init__(self, stype: StructType, members: dict):
        self.stype, self.members = stype, members


class BoundStructMethod:
    """`s.method` of a `@qd.dataclass` struct, called with `s` as `self`."""

    def __init__(self, func, receiver):
        self.func, self.receiver = func, receiver


class StructParamType:
    """The `dtype` of a struct kernel parameter before the front end splits it: its `name`
    spells the whole layout, so that the cache key tells two struct types apart."""
    __slots__ = ("stype", "layout", "name")
    is_float = False

    def __init__(self, stype: StructType, default_ip: T.DataType, default_fp: T.DataType):
        self.stype = stype
        self.layout = stype.layout(default_ip, default_fp)
        self.name = "struct" + _layout_text(self.layout["members"])

    def __repr__(self):
        return self.name


def _layout_text(members: list) -> str:
    parts = []
    for member, sub in members:
        if isinstance(sub, dict):
            parts.append(f"{member}:{sub['name']}{_layout_text(sub['members'])}")
        else:
            parts.append(f"{member}:{sub[0]}{sub[1] if sub[1] else ''}")
    return "(" + ",".join(parts) + ")"


def struct_param(name: str, stype: StructType, default_ip: T.DataType, default_fp: T.DataType) -> ir.Param:
    """The parameter `name: stype` (compiler/driver/kernel.py, parse_params): kind "struct",
    passed by value; the front end makes a scalar parameter of each member element
    (`scalar_params`), the metadata a scalar record of each (runtime/contract/artifact.py)."""
    return ir.Param(name, "struct", StructParamType(stype, default_ip, default_fp))


def struct_param_problem(stype: StructType, default_ip: T.DataType, default_fp: T.DataType) -> str | None:
    """Why `stype` cannot be passed by value (what the metadata cannot record), else None."""
    leaves = stype.leaves(default_ip, default_fp)
    wide = next((path for path, _, shape in leaves if any(n > MAX_ELEMENT_AXIS for n in shape)), None)
    if wide is not None:
        return (f"is a struct whose member '{'.'.join(wide)}' has more than {MAX_ELEMENT_AXIS} rows or columns; "
                f"pass an ndarray")
    scalars = sum(component_count(shape) for _, _, shape in leaves)
    if scalars > MAX_STRUCT_SCALARS:
        return f"is a struct of {scalars} scalars; a struct parameter has at most {MAX_STRUCT_SCALARS}"
    return None


class StructLeafParam(ir.Param):
    """One scalar of a struct kernel parameter: member `path` (element `position` of a vector or
    matrix member), named `s.v[1]` in dumps. Its metadata record is named as the argument and
    has the argument's scalar count as element shape, as a vector's elements do."""
    __slots__ = ("argument", "path", "position", "struct_type", "layout")

    def __init__(self, argument: str, path: tuple, position: tuple, dtype: T.DataType, count: int,
                 struct_type: StructType, layout: dict):
        suffix = f"[{', '.join(map(str, position))}]" if position else ""
        super().__init__(f"{argument}.{'.'.join(path)}{suffix}", "scalar", dtype, 0, False, (count,))
        self.argument, self.path, self.position = argument, path, position
        self.struct_type, self.layout = struct_type, layout


def scalar_params(params: list, default_ip: T.DataType, default_fp: T.DataType) -> list:
    """`params` with each struct parameter replaced by its StructLeafParams (members in order,
    nested structs flattened, vector/matrix members row-major)."""
    out = []
    for p in params:
        if p.kind != "struct":
            out.append(p)
            continue
        stype, layout = p.dtype.stype, p.dtype.layout
        leaves = [(path, dtype, position) for path, dtype, shape in stype.leaves(default_ip, default_fp)
                  for position in itertools.product(*(range(n) for n in shape))]
        out += [StructLeafParam(p.name, path, position, dtype, len(leaves), stype, layout)
                for path, dtype, position in leaves]
    return out


def struct_layouts(params: list) -> dict:
    """{argument: layout} of the kernel's struct parameters (the metadata's "structs")."""
    return {p.argument: p.layout for p in params if isinstance(p, StructLeafParam)}


class StructLowering:
    # ---- types and construction ---------------------------------------------------------
    def member_type(self, stype: StructType, member: str, node=None):
        if member not in stype.members:
            close = difflib.get_close_matches(member, stype.members, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            self.error(f"struct {stype!r} has no member '{member}'{hint}; its members are "
                       f"{', '.join(stype.members)}", node)
        return stype.members[member]

    def construct_struct(self, stype: StructType, node: ast.Call) -> StructValue:
        """`S(a=1.0, v=...)` or positional in member order; members left out are zero."""
        self.reject_unpacking(node)
        if len(node.args) > len(stype.members):
            self.error(f"struct {stype!r} has {len(stype.members)} member(s), got {len(node.args)} arguments", node)
        given = dict(zip(stype.members, ((a, self.visit(a)) for a in node.args)))
        for kw in node.keywords:
            self.member_type(stype, kw.arg, kw)
            if kw.arg in given:
                self.error(f"struct {stype!r}: member '{kw.arg}' is given twice", kw)
            given[kw.arg] = (kw.value, self.visit(kw.value))
        members = {}
        for member, mtype in stype.members.items():
            value_node, value = given.get(member, (node, 0))
            members[member] = self.as_member(stype, member, mtype, value, value_node)
        return StructValue(stype, members)

    def as_member(self, stype: StructType, member: str, mtype, value, node):
        """`value` converted to member `member`'s type (a located error when it cannot be)."""
        what = f"member '{member}' of struct {stype!r}"
        if isinstance(mtype, StructType):
            if isinstance(value, StructValue) and value.stype == mtype:
                return value
            if value == 0 and not isinstance(value, (StructValue, VectorValue)):
                return StructValue(mtype, {k: self.as_member(mtype, k, t, 0, node) for k, t in mtype.members.items()})
            self.error(f"{what} is a struct {mtype!r}, got {self.describe_value(value)}", node)
        if isinstance(value, StructValue):
            self.error(f"{what} is a {mtype!r}, got a struct {value.stype!r}", node)
        if isinstance(mtype, M.MatrixType):
            dtype = mtype.element_dtype(self.values.default_ip, self.values.default_fp)
            if isinstance(value, (tuple, list)):
                value = self.list_as_vector(value, mtype.shape, node)
            if not isinstance(value, VectorValue):
                value = VectorValue(mtype.shape, [self.scalar(value, node)] * component_count(mtype.shape))
            if value.shape != mtype.shape:
                self.error(f"{what} is a {mtype!r}, got a {kind_of(value.shape)} of shape "
                           f"{shape_text(value.shape)}", node)
            return VectorValue(mtype.shape, [self.convert(c, dtype, node) for c in value.components])
        if isinstance(value, VectorValue):
            self.error(f"{what} is a {mtype}, got a {kind_of(value.shape)} of shape {shape_text(value.shape)}", node)
        return self.convert(self.scalar(value, node), mtype, node)

    def describe_value(self, value) -> str:
        if isinstance(value, VectorValue):
            return f"a {kind_of(value.shape)} of shape {shape_text(value.shape)}"
        return f"a {value.type}" if isinstance(value, ir.Stmt) else repr(value)

    def struct_parameter_var(self, stype: StructType, variables: list) -> StructVar:
        """The struct local of a struct parameter whose scalars are in the locals `variables`
        (in StructType.leaves order)."""
        it = iter(variables)

        def build(st: StructType) -> StructVar:
            members = {}
            for member, mtype in st.members.items():
                if isinstance(mtype, StructType):
                    members[member] = build(mtype)
                elif isinstance(mtype, M.MatrixType):
                    members[member] = VectorVar(tuple(mtype.shape),
                                                [next(it) for _ in range(component_count(mtype.shape))])
                else:
                    members[member] = next(it)
            return StructVar(st, members)
        return build(stype)

    # ---- locals ---------------------------------------------------------------------------
    def new_struct_var(self, value: StructValue, name: str) -> StructVar:
        members = {}
        for member, v in value.members.items():
            mtype, label = value.stype.members[member], f"{name}.{member}"
            if isinstance(v, StructValue):
                members[member] = self.new_struct_var(v, label)
            elif isinstance(v, VectorValue):
                members[member] = self.new_vector_var(v, label, mtype.element_dtype(self.values.default_ip,
                                                                                     self.values.default_fp))
            else:
                var = self.new_local(mtype, label)
                self.emit(ir.LocalStore(var, self.values.cast(v, mtype)))
                members[member] = var
        return StructVar(value.stype, members)

    def annotated_struct(self, node: ast.AnnAssign, stype: StructType) -> None:
        """`s: S = value` (a struct of that type)."""
        value = self.visit(node.value)
        if not isinstance(value, StructValue) or value.stype != stype:
            self.error(f"cannot assign {self.describe_value(value) if not isinstance(value, StructValue) else 'a struct ' + repr(value.stype)} "
                       f"to '{node.target.id}' of type {stype!r}", node.value)
        self.frame.scopes[-1][node.target.id] = self.new_struct_var(value, node.target.id)

    def load_struct_var(self, var: StructVar) -> StructValue:
        return self.load_struct_target(self.struct_var_target(var))

    def assign_struct_name(self, target: ast.Name, current, value, value_node) -> None:
        """`s = <struct>`: a new struct local, or a store into the visible one of that name."""
        if isinstance(current, StructVar):
            self.store_struct(self.struct_var_target(current), value, value_node or target)
            return
        if not isinstance(value, StructValue):
            self.error(f"cannot assign to '{target.id}'", target)
        self.frame.scopes[-1][target.id] = self.new_struct_var(value, target.id)

    # ---- member access --------------------------------------------------------------------
    def struct_attribute(self, value: StructValue, attr: str, node):
        if attr in value.stype.methods:
            return BoundStructMethod(value.stype.methods[attr], value)
        self.member_type(value.stype, attr, node)
        return value.members[attr]

    def struct_field_attribute(self, sfield, attr: str):
        """`p.grad` (the struct field of the members' gradients), `p.shape`, `p.a` (a member's field)."""
        if attr == "grad":
            if sfield.grad is None:
                self.error(f"struct field '{sfield.name}' has no .grad: declare it with needs_grad=True")
            return sfield.grad
        if attr == "shape":
            return Shape(sfield.shape, "field", sfield.name)
        self.member_type(sfield.struct_type, attr)
        return sfield.members[attr]

    def require_non_struct(self, target, node) -> None:
        if isinstance(target, StructTarget):
            self.error("a whole struct can only be assigned (s = S(...)), not updated in place", node)

    def struct_field_element(self, sfield, node: ast.Subscript) -> StructValue:
        return self.load_struct_target(self.struct_element_target(sfield, node))

    # ---- places ---------------------------------------------------------------------------
    def struct_var_target(self, var: StructVar) -> StructTarget:
        members = {}
        for member, v in var.members.items():
            if isinstance(v, StructVar):
                members[member] = self.struct_var_target(v)
            elif isinstance(v, VectorVar):
                members[member] = Target(v.shape, v.variables)
            else:
                members[member] = Target((), [v])
        return StructTarget(var.stype, members)

    def struct_element_target(self, sfield, node: ast.Subscript) -> StructTarget:
        """The places of element `sfield[...]`: the index is computed once for every member."""
        leaves = sfield.leaves()
        _, indices = self.global_address(leaves[0][1], node)
        return self._field_members(sfield, indices)

    def _field_members(self, sfield, indices) -> StructTarget:
        members = {}
        for member, f in sfield.members.items():
            if isinstance(f, StructField):
                members[member] = self._field_members(f, indices)
                continue
            ref, shape = self.field_ref(f), tuple(f.element_shape)
            places = [self.emit(ir.GlobalPtr(ref, [*indices, *(self.values.const(c, T.i32) for c in comp)]))
                      for comp in itertools.product(*(range(n) for n in shape))]
            members[member] = Target(shape, places)
        return StructTarget(sfield.struct_type, members)

    def struct_place(self, node):
        """The places `node` names when it is a struct local, a struct field element, or a
        member of either (a StructTarget or a member's Target); None otherwise."""
        if isinstance(node, ast.Name):
            scope = self.binding_scope(node.id)
            value = scope[node.id] if scope is not None else None
            return self.struct_var_target(value) if isinstance(value, StructVar) else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)):
            base = self.visit(node.value)
            return self.struct_element_target(base, node) if isinstance(base, StructField) else None
        if isinstance(node, ast.Attribute):
            inner = self.struct_place(node.value)
            if isinstance(inner, StructTarget):
                self.member_type(inner.stype, node.attr, node)
                return inner.members[node.attr]
        return None

    def load_struct_target(self, target: StructTarget) -> StructValue:
        return StructValue(target.stype, {
            m: self.load_struct_target(t) if isinstance(t, StructTarget) else self.load_target(t)
            for m, t in target.members.items()})

    def store_struct(self, target: StructTarget, value, node) -> None:
        if not isinstance(value, StructValue) or value.stype != target.stype:
            got = f"a struct {value.stype!r}" if isinstance(value, StructValue) else self.describe_value(value)
            self.error(f"cannot assign {got} to a struct {target.stype!r}", node)
        for member, t in target.members.items():
            if isinstance(t, StructTarget):
                self.store_struct(t, value.members[member], node)
            else:
                self.store_target(t, value.members[member], node)


def flatten(value):
    """(layout, scalars) of a value made of scalars, vectors, structs and tuples of them; `unflatten`
    inverts it. For passing vectors through scalar-only machinery (returns of funcs and kernels)."""
    if isinstance(value, VectorValue):
        return ("vector", value.shape), list(value.components)
    if isinstance(value, StructValue):
        members = {m: flatten(v) for m, v in value.members.items()}
        return ("struct", value.stype, {m: layout for m, (layout, _) in members.items()}), \
            [s for _, scalars in members.values() for s in scalars]
    if isinstance(value, tuple):
        layouts, scalars = [], []
        for v in value:
            layout, s = flatten(v)
            layouts.append(layout)
            scalars += s
        return ("tuple", layouts), scalars
    return "scalar", [value]


def unflatten(layout, scalars: list):
    it = iter(scalars)

    def build(lay):
        if lay == "scalar":
            return next(it)
        if lay[0] == "vector":
            return VectorValue(lay[1], [next(it) for _ in range(component_count(lay[1]))])
        if lay[0] == "struct":
            return StructValue(lay[1], {m: build(sub) for m, sub in lay[2].items()})
        return tuple(build(sub) for sub in lay[1])
    return build(layout)
