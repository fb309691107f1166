"""Loops: `for` over ranges, ndranges, fields and ndarrays; `qd.static` unrolling; `while`.

A mixin of FrontEnd (see ast_to_ir.py). Every run-time `for` becomes one flat `RangeFor`
over the product of its dimensions; the loop targets decompose the flat index row-major.
"""
from __future__ import annotations

import ast
import types

from qdc.runtime.contract import types as T
from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker

from .. import ir
from ..language import lang
from .objects import NdarrayHandle, RangeSpec
from .values import fits, is_runtime


class LoopLowering:
    # ---- for --------------------------------------------------------------------------
    def visit_For(self, node: ast.For):
        if node.orelse:
            self.error("for/else is not supported in kernels")
        config, self.pending_loop_config = self.pending_loop_config, None
        iter_node = self.chosen_iterable(node.iter)
        if self.is_static_call(iter_node):
            if config is not None:
                self.error("qd.loop_config() does not apply to a qd.static loop (it is unrolled)")
            return self.static_for(node, self.visit(iter_node), iter_node)
        iterable = self.visit(iter_node)
        grouped = isinstance(iterable, lang.grouped)
        inner = iterable.iterable if grouped else iterable
        dims, kind = self.loop_dims(inner, iter_node, grouped)
        order = inner.order() if isinstance(inner, lang.ndrange) else None
        self.range_for(node, dims, kind, config, iter_node, grouped, order)

    def chosen_iterable(self, node):
        """The iterable a compile-time conditional picks (`A if qd.static(c) else
        qd.static(range(k))`, nested too); any other iterable as it is."""
        while isinstance(node, ast.IfExp):
            cond = self.visit(node.test)
            if is_runtime(cond):
                self.error("a loop's iterable can only be chosen at compile time: wrap the condition in "
                           "qd.static(...)", node.test)
            node = node.body if cond else node.orelse
        return node

    def is_static_call(self, node) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
            and self.visit(node.func) is lang.static

    def loop_dims(self, it, node, grouped: bool = False):
        """[(begin, end, step)] per dimension and the loop kind ("range", "ndrange", "struct").
        Something of no dimension is iterated only through qd.grouped (its one index is ()),
        as in Quadrants."""
        if isinstance(it, RangeSpec):
            return [(it.begin, it.end, it.step)], "range"
        if isinstance(it, lang.ndrange):
            dims = []
            for d in it.dims:
                if isinstance(d, (tuple, list)):
                    if len(d) != 2:
                        self.error("qd.ndrange() arguments must be ints or (begin, end) pairs", node)
                    dims.append((d[0], d[1], 1))
                else:
                    dims.append((0, d, 1))
            if not dims and not grouped:
                self.error("qd.ndrange() has no dimension: loop over qd.grouped(qd.ndrange()) (one iteration, "
                           "index ())", node)
            return dims, "ndrange"
        if isinstance(it, (Field, StructFieldMarker)):  # a struct field: every index of its members
            if not it.shape and not grouped:
                self.error(f"cannot loop over 0-d field '{it.name}'; read it as {it.name}[None] (or loop over "
                           f"qd.grouped({it.name}): one iteration, index ())", node)
            return [(0, s, 1) for s in it.shape], "struct"
        if isinstance(it, NdarrayHandle):
            if it.ndim == 0 and not grouped:
                self.error(f"cannot loop over 0-d ndarray '{it.name}' (loop over qd.grouped({it.name}): one "
                           f"iteration, index ())", node)
            return [(0, self.extent(it, d), 1) for d in range(it.ndim)], "struct"
        if isinstance(it, (tuple, list, range)):
            self.error("a loop over a tuple or list must be unrolled: wrap it in qd.static(...)", node)
        self.error("for loops iterate over range(), qd.ndrange(), qd.static(...), a field or an ndarray", node)

    def static_for(self, node: ast.For, it, iter_node):
        """`for v in qd.static(iterable)`: the body is lowered once per element; a `break` or
        `continue` the compiled body reaches (directly or under `if qd.static(...)`) acts on
        the unrolling; a `return` ends it and the function."""
        it = self.compile_time_items(it, iter_node, "qd.static() loops need a compile-time iterable (a range of "
                                                    "constants, a tuple or a qd.ndrange of constants)")
        frame = self.frame
        frame.loops.append("static")
        frame.static_loop_depths.append(len(self.blocks))
        try:
            for value in it:
                with self.scope():
                    self.bind_targets(node.target, value)
                    self.visit_body(node.body)
                stop = frame.stop
                if stop in ("break", "continue"):  # they end this iteration of the unrolling only
                    frame.stop = None
                if stop in ("break", "return"):
                    break
        finally:
            frame.loops.pop()
            frame.static_loop_depths.pop()

    # ---- comprehensions ----------------------------------------------------------------
    def visit_ListComp(self, node: ast.ListComp):
        return self.comprehension(node, lambda: self.visit(node.elt))

    def visit_DictComp(self, node: ast.DictComp):
        return dict(self.comprehension(node, lambda: (self.visit(node.key), self.visit(node.value))))

    def comprehension(self, node, element) -> list:
        """`[e for x in it if c]`, as Quadrants evaluates it: unrolled at compile time over
        compile-time iterables (a range of constants, a tuple or list, qd.static(...)), its
        conditions compile-time too; its elements may be run-time values. The names it binds
        stay inside it, as in Python."""
        out: list = []

        def unroll(level: int) -> None:
            if level == len(node.generators):
                out.append(element())
                return
            gen = node.generators[level]
            for value in self.compile_time_items(
                    self.visit(gen.iter), gen.iter, "a comprehension iterates over what the compiler knows: a range of "
                    "constants, a tuple or list, or qd.static(...); use a for loop for a run-time range"):
                with self.scope():
                    self.bind_targets(gen.target, value)
                    conditions = [self.visit(c) for c in gen.ifs]
                    for c, cond_node in zip(conditions, gen.ifs):
                        if is_runtime(c):
                            self.error("a comprehension's condition must be known at compile time", cond_node)
                    if all(conditions):
                        unroll(level + 1)
        unroll(0)
        return out

    def compile_time_items(self, it, iter_node, refusal: str):
        """The items a loop unrolled at compile time (qd.static, a comprehension) goes over: a
        range, tuple or list, a qd.ndrange of constants (qd.grouped: vector indices), a host
        iterable's items now; `refusal`, the error for anything else."""
        grouped = isinstance(it, lang.grouped)
        if grouped:
            it = it.iterable
        if isinstance(it, RangeSpec) and not any(is_runtime(v) for v in (it.begin, it.end, it.step)):
            it = range(it.begin, it.end, it.step)  # `range(3)` outside qd.static (a comprehension's)
        if isinstance(it, lang.ndrange):
            if any(is_runtime(x) for d in it.dims for x in (d if isinstance(d, (tuple, list)) else (d,))):
                self.error("qd.ndrange(...) unrolled at compile time needs compile-time bounds", iter_node)
            it = list(it)
        if grouped:  # qd.grouped(...): vector indices of constants
            it = [self.vector_of((len(i),), i) for i in (idx if isinstance(idx, tuple) else (idx,) for idx in it)]
        if _host_iterable(it):  # enumerate(...), zip(...), a dict's items(), a generator: its items now
            it = list(it)
        if not isinstance(it, (range, tuple, list)):
            self.error(refusal, iter_node)
        return it

    def bind_targets(self, target, value):
        if isinstance(target, ast.Name):
            self.frame.scopes[-1][target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
                and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.bind_targets(t, v)
        else:
            self.error("the loop target does not match the elements of the iterable", target)

    def range_for(self, node: ast.For, dims, kind: str, config, iter_node, grouped: bool, order=None):
        """One flat RangeFor over the product of `dims`; the targets decompose its index (a
        qd.grouped loop has one target: the vector of those indices). `config`: the loop's
        qd.loop_config, or None. `order`: the axes from outermost to innermost (qd.ndrange's
        axes=; None: in order), each target still bound to its own axis."""
        targets = [node.target] if grouped or not isinstance(node.target, ast.Tuple) else node.target.elts
        if any(not isinstance(t, ast.Name) for t in targets):
            self.error("loop targets must be plain names" + (" (a qd.grouped loop binds one vector index)"
                                                             if grouped else ""), node.target)
        if not dims:  # a 0-d loop runs its body once; its index is () (also a qd.grouped one)
            return self.zero_dim_for(node, config, targets, iter_node)
        if not grouped and len(targets) != len(dims):
            self.error(f"the loop has {len(targets)} target(s) but iterates over {len(dims)} "
                       f"dimension(s)", node.target)
        bounds = [(self.loop_bound(b, iter_node), self.loop_bound(e, iter_node), step) for b, e, step in dims]
        index_type = self.loop_index_type(bounds)
        begins = [self.values.cast(b, index_type) if is_runtime(b) else b for b, _, _ in bounds]
        with self.at(iter_node):  # a constant bound beyond 64 bits is an error at the iterable
            extents = [self.trip_count(b, e, step, index_type) for b, e, step in bounds]
            total = extents[0]
            for e in extents[1:]:
                total = self.values.binary("mul", total, e)
            end = self.values.cast(total, index_type)
        # At the kernel's top level (also inside a func called there, which is inlined): parallel.
        parallel = self.at_top_level() and not (config is not None and config.serialize)
        loop = self.emit(ir.RangeFor(self.values.const(0, index_type), end,
                                     index_type, serial=not parallel, kind=kind, ndim=len(dims)))
        if config is not None:
            config.apply(loop)
        self.blocks.append(loop.body)
        self.frame.loops.append("parallel" if parallel else "serial")
        try:
            steps = [step for _, _, step in bounds]
            if order is None or order == list(range(len(dims))):
                values = self.decompose_index(loop.index, begins, extents, steps)
            else:  # decompose in visiting order, then give each axis its own index
                physical = self.decompose_index(loop.index, [begins[a] for a in order], [extents[a] for a in order],
                                                [steps[a] for a in order])
                values = [None] * len(order)
                for level, axis in enumerate(order):
                    values[axis] = physical[level]
            if grouped:
                values = [self.vector_of((len(values),), values)]
            with self.scope() as scope:  # after the index values: assigning a target copies one (ast_to_ir)
                for t, v in zip(targets, values):
                    scope[t.id] = v
                self.visit_body(node.body)
        finally:
            self.frame.loops.pop()
            self.blocks.pop()

    def zero_dim_for(self, node: ast.For, config, targets, iter_node):
        """`for I in qd.grouped(x)` with `x` 0-d (a field, an ndarray or `qd.ndrange()`): one
        iteration (a one-iteration loop, so it is a task like any top-level loop) whose single
        target is the empty index ()."""
        if len(targets) != 1:
            self.error(f"a loop over no dimension binds one target (the empty index ()), not {len(targets)}",
                       node.target)
        parallel = self.at_top_level() and not (config is not None and config.serialize)
        loop = self.emit(ir.RangeFor(self.values.const(0, T.i32), self.values.const(1, T.i32), T.i32,
                                     serial=not parallel, kind="ndrange", ndim=1))
        if config is not None:
            config.apply(loop)
        self.blocks.append(loop.body)
        self.frame.loops.append("parallel" if parallel else "serial")
        try:
            with self.scope() as scope:
                scope[targets[0].id] = ()
                self.visit_body(node.body)
        finally:
            self.frame.loops.pop()
            self.blocks.pop()

    def at_top_level(self) -> bool:
        """Whether a `for` here is a top-level loop of the kernel (a parallel task): in its
        outermost block (also inside a func called there, which is inlined), not under an
        `if` (a constant condition too, as in Quadrants; `if qd.static(...)` is no `if`)."""
        return len(self.blocks) == self.top_depth() and not self.constant_if_depth

    def loop_bound(self, v, node):
        v = self.scalar(v, node)
        t = v.type if is_runtime(v) else None
        if isinstance(v, float) or (t is not None and t.is_float):
            self.error("range bounds must be integers", node)
        return self.values.cast(v, self.values.default_ip) if t is T.u1 else v

    def loop_index_type(self, bounds) -> T.DataType:
        """i32 unless a bound needs more (a 64-bit or u32 bound, a constant beyond i32, default_ip
        i64, or a constant trip count that overflows i32)."""
        if self.values.default_ip.bits == 64:
            return T.i64
        count = 1
        for b, e, step in bounds:
            for v in (b, e):
                if is_runtime(v) and (v.type.bits == 64 or (v.type.kind == "uint" and v.type.bits == 32)):
                    return T.i64
                if not is_runtime(v) and not fits(v, T.i32):
                    return T.i64
            if count is not None and not is_runtime(b) and not is_runtime(e):
                count *= max(0, -((b - e) // step))
            else:
                count = None
        return T.i64 if count is not None and not fits(count, T.i32) else T.i32

    def trip_count(self, begin, end, step: int, index_type):
        """max(0, ceil((end - begin) / step)) in the index type (a Python int when constant)."""
        if not is_runtime(begin) and not is_runtime(end):
            return max(0, -((begin - end) // step))
        if _is_zero(begin) and step == 1 and isinstance(end, ir.NdarrayShape):  # never negative
            return self.values.cast(end, index_type)
        v = self.values
        span = v.binary("sub", v.cast(end, index_type), v.cast(begin, index_type))
        if step != 1:
            span = v.binary("floordiv", v.binary("add", span, step - 1), step)
        return v.binary("max", span, 0)

    def decompose_index(self, index, begins, extents, steps):
        """Row-major: the last dimension varies fastest."""
        v = self.values
        offsets = [None] * len(extents)
        rest = index
        for d in reversed(range(1, len(extents))):
            offsets[d] = v.binary("mod", rest, extents[d])
            rest = v.binary("floordiv", rest, extents[d])
        offsets[0] = rest
        out = []
        for begin, offset, step in zip(begins, offsets, steps):
            if step != 1:
                offset = v.binary("mul", offset, step)
            out.append(offset if _is_zero(begin) else v.binary("add", offset, begin))
        return out

    # ---- while, break, continue ---------------------------------------------------------
    def visit_While(self, node: ast.While):
        if node.orelse:
            self.error("while/else is not supported in kernels")
        if self.is_graph_do_while(node.test):
            return self.graph_do_while(node)
        loop = self.emit(ir.While())
        self.blocks.append(loop.body)
        self.frame.loops.append("while")
        try:
            with self.scope():
                cond = self.scalar(self.visit(node.test), node.test)
                if is_runtime(cond):
                    exit_if = self.emit(ir.If(self.values.unary("not", self.values.to_bool(cond))))
                    self.emit_into(exit_if.then_block, lambda: self.emit(ir.Break()))
                elif not cond:
                    self.emit(ir.Break())
                self.visit_body(node.body)
        finally:
            self.frame.loops.pop()
            self.blocks.pop()

    def visit_Break(self, node):
        kind = self.innermost_loop("break")
        if kind == "parallel":
            self.error("break cannot leave a parallel loop (a top-level for); serialize it with "
                       "qd.loop_config(serialize=True) or use a while loop")
        if kind != "static":
            self.emit(ir.Break())

    def visit_Continue(self, node):
        if self.innermost_loop("continue") != "static":
            self.emit(ir.Continue())

    def innermost_loop(self, what: str) -> str:
        """The kind of the loop `what` (break/continue) acts on; in a qd.static loop it acts at
        compile time (frame.stop), which needs it not to sit under run-time control flow."""
        frame = self.frame
        if not frame.loops:
            where = "a loop" if frame.is_kernel else "a loop of the same qd.func"
            self.error(f"{what} outside {where}")
        kind = frame.loops[-1]
        if kind == "static":
            if len(self.blocks) != frame.static_loop_depths[-1]:
                self.error(f"{what} in a qd.static loop (which is unrolled) must be decided at compile time: "
                           f"put it under `if qd.static(...)`, not a run-time if")
            frame.stop = what
        return kind


def _is_zero(v) -> bool:
    return (not is_runtime(v) and v == 0) or (isinstance(v, ir.Const) and v.value == 0)


def _host_iterable(it) -> bool:
    """A Python iterable other than the language's (a range of constants, a tuple, a list, a
    qd.ndrange) and no string: its items are unrolled over (they may hold run-time values,
    `enumerate((i_x, i_y))`)."""
    if isinstance(it, (range, tuple, list, str, bytes, lang.ndrange, lang.grouped)) or is_runtime(it):
        return False
    return isinstance(it, (enumerate, zip, map, filter, reversed, dict, set, frozenset, types.GeneratorType)) \
        or type(it).__name__ in ("dict_keys", "dict_values", "dict_items")
