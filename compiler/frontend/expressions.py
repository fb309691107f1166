"""Python expressions in kernels (a mixin of ast_to_ir.FrontEnd): arithmetic, unary and
comparison operators, `and`/`or` and `a if c else b`, each on compile-time values (evaluated
as Python does) or on run-time values (IR statements). Short-circuiting is Python's: an operand
runs only where the ones before it did not decide. Vector, matrix and tuple operands go on to
the element-wise operators of vectors.py.

It is apart from ast_to_ir.py, which holds the front end's frames, names and statements: a reader of
an operator's semantics needs none of those.
"""
from __future__ import annotations

import ast
import operator

import numpy as np

from .. import ir
from .host_objects import unwrap
from .objects import GLOBAL_ARRAYS
from .structs import StructValue
from .values import holds_runtime, is_number, is_runtime, not_a_value_message
from .vectors import VectorValue

# AST operator -> the IR's binary operation (also that of an augmented assignment)
BINARY_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
              ast.Mod: "mod", ast.Pow: "pow", ast.BitAnd: "bit_and", ast.BitOr: "bit_or",
              ast.BitXor: "bit_xor", ast.LShift: "shl", ast.RShift: "shr"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_PY_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
               ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not,
               ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_PY_COMPARE_SYMBOL = {ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_UNARY = {ast.USub: "neg", ast.Not: "not", ast.Invert: "bit_not"}


class ExpressionLowering:
    def scalar(self, v, node):
        """`v` as an arithmetic operand: a run-time value or a compile-time number."""
        if is_runtime(v):
            return v
        if is_number(v):
            return v.item() if isinstance(v, np.generic) else v
        if isinstance(v, GLOBAL_ARRAYS):
            self.error("a field or ndarray must be indexed to be used as a value", node)
        if isinstance(v, tuple):
            self.error("a tuple cannot be used as a scalar value", node)
        if isinstance(v, VectorValue):
            self.error(f"a vector/matrix of shape {v.shape} cannot be used where a scalar is needed", node)
        if isinstance(v, StructValue):
            self.error(f"a struct {v.stype!r} cannot be used where a scalar is needed", node)
        self.error(not_a_value_message(v), node)

    def visit_BinOp(self, node: ast.BinOp):
        op = "matmul" if isinstance(node.op, ast.MatMult) else BINARY_OPS.get(type(node.op))
        if op is None:
            self.error(f"operator {type(node.op).__name__} is not supported")
        a, b = self.visit(node.left), self.visit(node.right)
        if isinstance(a, VectorValue) or isinstance(b, VectorValue) or op == "matmul":
            return self.vector_binary(op, self.vector_operand(a, node.left), self.vector_operand(b, node.right), node)
        if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
            return self.tuple_binary(op, a, b, node)
        return self.values.binary(op, self.scalar(a, node.left), self.scalar(b, node.right))

    def visit_UnaryOp(self, node: ast.UnaryOp):
        x = self.visit(node.operand)
        if isinstance(x, VectorValue):
            if isinstance(node.op, ast.Not):  # refused, as in Quadrants: which truth would it be?
                self.error("'not' is not defined on a vector/matrix; use v.any() / v.all(), or compare "
                           "components (v == 0 is element-wise)", node)
            return x if isinstance(node.op, ast.UAdd) else self.vector_unary(_UNARY[type(node.op)], x)
        x = self.scalar(x, node.operand)
        if isinstance(node.op, ast.UAdd):
            return x
        return self.values.unary(_UNARY[type(node.op)], x)

    def visit_Compare(self, node: ast.Compare):
        """`a < b < c` is `a < b and b < c`: `b` evaluated once, `c` only if `a < b`."""
        def compare_from(i, left):
            right = self.visit(node.comparators[i])
            result = self.compare(node.ops[i], left, right, node)
            if i + 1 == len(node.ops):
                return result
            return self.short_circuit(True, result, lambda: compare_from(i + 1, right))
        return compare_from(0, self.visit(node.left))

    def compare(self, op_node, left, right, node):
        """One comparison. Between compile-time values any Python comparison works (e.g.
        `qd.static(a is None)`, `qd.static(x.dtype == qd.f32)`); run-time values support
        the six ordering and equality comparisons. As in Quadrants, `is` / `is not` compare only
        with None, and `in` only compile-time values."""
        if isinstance(op_node, (ast.Is, ast.IsNot)) and left is not None and right is not None \
                and not (self.static_depth and not is_runtime(left) and not is_runtime(right)):
            self.error(f"'{_PY_COMPARE_SYMBOL[type(op_node)]}' in a kernel compares only with None; "
                       f"compare values with == / !=", node)
        if isinstance(op_node, (ast.In, ast.NotIn)) and (holds_runtime(left) or holds_runtime(right)
                                                          or isinstance(right, VectorValue)
                                                          or isinstance(left, GLOBAL_ARRAYS)
                                                          or isinstance(right, GLOBAL_ARRAYS)):
            self.error(f"'{_PY_COMPARE_SYMBOL[type(op_node)]}' needs compile-time operands (e.g. in "
                       f"qd.static(...)); compare run-time values with == one by one", node)
        if isinstance(left, VectorValue) or isinstance(right, VectorValue):
            op = _CMPOPS.get(type(op_node))
            if op is None:
                self.error(f"comparison '{_PY_COMPARE_SYMBOL[type(op_node)]}' is not defined on vectors", node)
            return self.vector_compare(op, self.vector_operand(left, node), self.vector_operand(right, node), node)
        if not holds_runtime(left) and not holds_runtime(right):
            try:  # objects reached from arguments compare as themselves
                return _PY_COMPARE[type(op_node)](unwrap(left), unwrap(right))
            except TypeError as e:  # e.g. `1 < "a"`: Python's own message names the operand types
                self.error(f"compile-time comparison failed: {e}", node)
        if isinstance(left, tuple) or isinstance(right, tuple):
            self.error("tuples holding run-time values cannot be compared; compare their elements", node)
        op = _CMPOPS.get(type(op_node))
        if op is None:
            self.error(f"comparison '{_PY_COMPARE_SYMBOL[type(op_node)]}' needs compile-time operands; "
                       f"run-time values support < <= > >= == !=", node)
        return self.values.binary(op, self.scalar(left, node), self.scalar(right, node))

    def visit_BoolOp(self, node: ast.BoolOp):
        """`and`/`or` short-circuit and give an operand, as in Python (`1 and 2` is 2): an operand
        runs only if the ones before did not decide."""
        is_and = isinstance(node.op, ast.And)

        def from_operand(i):
            v = self.visit(node.values[i])
            if isinstance(v, GLOBAL_ARRAYS):  # compile-time operands otherwise use Python truthiness
                self.error("a field or ndarray is not a condition; index it", node.values[i])
            if isinstance(v, VectorValue) and i + 1 < len(node.values):
                return self.vector_logical(is_and, v, node.values[i + 1:])
            if i + 1 == len(node.values):
                return v
            return self.short_circuit(is_and, v, lambda: from_operand(i + 1), node.values[i])
        return from_operand(0)

    def short_circuit(self, is_and: bool, first, rest, node=None):
        """`first and rest()` / `first or rest()`: `first` when it decides, else `rest()`, which
        is evaluated only on the path where `first` does not decide. A run-time result has the
        operands' common type."""
        if not is_runtime(first):
            if isinstance(first, VectorValue):
                self.error("a vector is not a condition; use .any() or .all()", node)
            return first if bool(first) != is_and else rest()
        decided = self.values.to_bool(first)
        branch = self.emit(ir.If(decided if not is_and else self.values.unary("not", decided)))
        other = self.emit_into(branch.else_block, rest)
        if isinstance(other, VectorValue):
            self.error("the operands of and/or must be scalars", node)
        if not (is_runtime(other) or is_number(other)):  # a compile-time object (a tuple, None): its truth
            other = bool(other)
        result = ir.Alloca(self.values.common_type(first, other), "", self.frame.src.loc(node or self.node_stack[-1]))
        _insert_before(branch, result)
        for block, value in ((branch.then_block, first), (branch.else_block, other)):
            self.emit_into(block, lambda v=value: self.emit(ir.LocalStore(result, self.values.cast(v, result.type))))
        return self.emit(ir.LocalLoad(result))

    def visit_IfExp(self, node: ast.IfExp):
        """`a if c else b` evaluates only the taken side, as Python does."""
        cond = self.visit(node.test)
        if isinstance(cond, (tuple, list)) or cond is None:  # a compile-time object: its Python truth
            return self.visit(node.body if cond else node.orelse)
        cond = self.scalar(cond, node.test)
        if not is_runtime(cond):
            return self.visit(node.body if cond else node.orelse)
        branch = self.emit(ir.If(self.values.to_bool(cond)))
        a = self.emit_into(branch.then_block, lambda: self.vector_operand(self.visit(node.body), node.body))
        b = self.emit_into(branch.else_block, lambda: self.vector_operand(self.visit(node.orelse), node.orelse))
        if isinstance(a, VectorValue) or isinstance(b, VectorValue):
            return self.vector_if_exp(branch, a, b, node)
        result = ir.Alloca(self.values.common_type(a, b), "", self.frame.src.loc(node))
        _insert_before(branch, result)
        for block, value in ((branch.then_block, a), (branch.else_block, b)):
            self.emit_into(block, lambda v=value: self.emit(ir.LocalStore(result, self.values.cast(v, result.type))))
        return self.emit(ir.LocalLoad(result))


def _insert_before(anchor: ir.Stmt, stmt: ir.Stmt) -> None:
    block = anchor.block
    block.stmts.insert(block.stmts.index(anchor), stmt)
    stmt.block = block
