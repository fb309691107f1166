"""`qd.simt` primitives in kernels (compiler/language/simt.py names them): barriers and fences,
thread/block/lane indices, subgroup exchanges and votes, block-shared arrays. A mixin of
FrontEnd (see ast_to_ir.py).

Subgroup exchanges work on one 32- or 64-bit scalar per lane: narrower integers and bools are
widened to i32 and narrowed back, vectors and matrices exchange component by component. The
subgroup size is a compile-time int per arch (`subgroup_size`); on Vulkan it is the device's,
read when direct mode starts, else the `vulkan_subgroup_size` option, and a device of another
size refuses the kernel at load.

The library funcs of compiler/language/simt.py are inlined like a user's; the statements and
errors they produce point at the user's call (`library_site`).
"""
from __future__ import annotations

import ast
import math

import numpy as np

from qdc.runtime.contract import types as T

from .. import ir
from ..language import matrix as M
from ..language import field_methods, graph, simt, simt_tiles
from .objects import NdarrayHandle, SharedArrayHandle
from .values import is_runtime
from .vectors import VectorValue

# The subgroup size each arch compiles for (Vulkan: see `subgroup_size`); the CPU's is notional:
# its kernels refuse the statements that would use it.
_SUBGROUP_SIZES = {"cuda": 32, "amdgpu": 64, "metal": 32, "vulkan": 32, "cpu": 32}
_SYNCS = {"block.sync": "block_barrier", "block.mem_fence": "block_fence", "subgroup.sync": "subgroup_barrier",
          "subgroup.mem_fence": "subgroup_fence", "grid.mem_fence": "grid_fence", "warp.sync": "subgroup_barrier"}
_INDICES = {"block.thread_idx": "thread_idx", "block.block_idx": "block_idx", "block.block_dim": "block_dim",
            "subgroup.invocation_id": "lane"}
_EXCHANGES = {"subgroup.shuffle": "shuffle", "subgroup.shuffle_up": "shuffle_up",
              "subgroup.shuffle_down": "shuffle_down", "subgroup.broadcast": "broadcast"}
_VOTES = {"subgroup.vote_all": "all", "subgroup.vote_any": "any"}


def is_library_func(func) -> bool:
    """Whether `func` (a lang.Func) is one of the language's own funcs, written in the kernel
    language: qd.simt's library (a tile's methods included), a field's kernel-scope methods."""
    return getattr(func.fn, "__module__", None) in (simt.__name__, simt_tiles.__name__, field_methods.__name__)


class SimtCalls:
    library_site = None  # (SourceLoc, source line, callee as written) of the user's call into qd.simt's library
    shared_arrays = 0    # SharedArrays made so far: the next one's uid

    def subgroup_size(self) -> int:
        if self.target_arch == "vulkan":
            return int(self.options.vulkan_subgroup_size or _SUBGROUP_SIZES["vulkan"])
        return _SUBGROUP_SIZES.get(self.target_arch, 32)

    def inline_library_func(self, func, node: ast.Call, receiver=None):
        """A qd.simt library func: what it emits, and every error inside it, points at the
        user's outermost call."""
        if self.library_site is not None:
            return self.inline_func(func, node, receiver=receiver)
        src = self.frame.src
        self.library_site = (src.loc(node), src.source_line(node), ast.unparse(node.func))
        try:
            return self.inline_func(func, node, receiver=receiver)
        finally:
            self.library_site = None

    def call_simt(self, name: str, node: ast.Call):
        result = self.simt_primitive(name, node)
        if self.library_site is not None and isinstance(result, (ir.SimtIndex, ir.SubgroupOp)):
            result.via = self.library_site[2]  # errors name the user's call, not the primitive inside it
        return result

    def simt_primitive(self, name: str, node: ast.Call):
        if name == "block.SharedArray":
            return self.shared_array(node)
        if name == "static_error":
            (message,) = self.call_args(node, 1, 1, "static_error")
            self.error(f"qd.simt: {message}")
        if name in ("subgroup.group_size", "subgroup.log2_group_size"):
            self.call_args(node, 0, 0, name)
            size = self.subgroup_size()
            return size if name == "subgroup.group_size" else size.bit_length() - 1
        if name in _SYNCS:
            self.call_args(node, 0, 1 if name == "warp.sync" else 0, f"qd.simt.{name}")
            sync = self.emit(ir.SimtSync(_SYNCS[name]))
            if self.library_site is not None:
                sync.via = self.library_site[2]
            return None
        if name in _INDICES:
            self.call_args(node, 0, 0, f"qd.simt.{name}")
            return self.emit(ir.SimtIndex(_INDICES[name], T.i32))
        if name == "block.global_thread_idx":
            self.call_args(node, 0, 0, f"qd.simt.{name}")
            block = self.emit(ir.SimtIndex("block_idx", T.i32))
            width = self.emit(ir.SimtIndex("block_dim", T.i32))
            return self.values.binary("add", self.values.binary("mul", block, width),
                                      self.emit(ir.SimtIndex("thread_idx", T.i32)))
        if name in _EXCHANGES:
            value, lane = self.call_args(node, 2, 2, f"qd.simt.{name}")
            lane = self.convert(self.scalar(lane, node.args[1]), T.u32, node.args[1])
            if isinstance(value, VectorValue):
                return value.map(lambda c: self.exchange(_EXCHANGES[name], c, lane, node))
            return self.exchange(_EXCHANGES[name], self.scalar(value, node.args[0]), lane, node)
        if name == "subgroup.ballot":
            (predicate,) = self.call_args(node, 1, 1, "qd.simt.subgroup.ballot")
            return self.emit(ir.SubgroupOp("ballot", self.truth(predicate, node.args[0]), None, T.u64))
        if name in _VOTES:
            (predicate,) = self.call_args(node, 1, 1, name)
            vote = self.emit(ir.SubgroupOp(_VOTES[name], self.truth(predicate, node.args[0]), None, T.u1))
            return self.values.cast(vote, T.i32)
        if name in ("subgroup.type_max", "subgroup.type_min"):
            (value,) = self.call_args(node, 1, 1, name)
            return self.type_limit(self.values.materialize(self.scalar(value, node.args[0])), name.endswith("max"))
        self.error(f"unsupported qd.simt call {name}")

    def truth(self, predicate, node) -> ir.Stmt:
        v = self.scalar(predicate, node)
        return self.values.to_bool(v) if is_runtime(v) else self.values.literal(bool(v), T.u1)

    def exchange(self, op: str, value, lane: ir.Stmt, node) -> ir.Stmt:
        """One lane's scalar exchanged: widths below 32 bits travel as an i32."""
        value = self.values.materialize(value)
        t = value.type
        if t.bits >= 32:
            return self.emit(ir.SubgroupOp(op, value, lane, t))
        wide = self.emit(ir.SubgroupOp(op, self.values.cast(value, T.i32), lane, T.i32))
        return self.values.cast(wide, t)

    def type_limit(self, value: ir.Stmt, largest: bool):
        t = value.type
        if t.is_float:
            return self.values.const(math.inf if largest else -math.inf, t)
        if t is T.u1:
            return self.values.literal(largest, t)
        limits = np.iinfo(t.np_dtype)
        return self.values.const(int(limits.max if largest else limits.min), t)

    def shared_array(self, node: ast.Call):
        """`SharedArray(shape, dtype)`: a new block-shared array, declared in a parallel loop."""
        self.reject_unpacking(node)
        args = [self.visit(a) for a in node.args] + [self.visit(k.value) for k in node.keywords]
        names = [None] * len(node.args) + [k.arg for k in node.keywords]
        if len(args) != 2 or not all(n in (None, "shape", "dtype") for n in names):
            self.error("qd.simt.block.SharedArray(shape, dtype) takes a shape and a dtype")
        shape, dtype = args if names[0] != "dtype" else args[::-1]
        shape = (shape,) if isinstance(shape, int) else shape
        if not isinstance(shape, (tuple, list)) or not shape or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            self.error(f"qd.simt.block.SharedArray shape must be a positive compile-time int or tuple of ints, "
                       f"got {shape!r}")
        element = ()
        if isinstance(dtype, M.MatrixType):
            element = tuple(dtype.shape)
            dtype = dtype.element_dtype(self.values.default_ip, self.values.default_fp)
        elif dtype is float or dtype is int:
            dtype = self.values.default_fp if dtype is float else self.values.default_ip
        if not isinstance(dtype, T.DataType):
            self.error(f"qd.simt.block.SharedArray dtype must be a qd scalar, vector or matrix type, got {dtype!r}")
        if not self.in_parallel_loop():
            self.error("qd.simt.block.SharedArray must be made inside a parallel for loop (its block's threads "
                       "share it)")
        self.shared_arrays += 1
        ref = ir.SharedRef(self.shared_arrays - 1, "shared", dtype, tuple(shape) + element)
        return SharedArrayHandle(ref, element)

    def in_parallel_loop(self) -> bool:
        top = self.top_depth()
        return len(self.blocks) > top and isinstance(self.blocks[top].parent, ir.RangeFor) \
            and not self.blocks[top].parent.serial

    # ---- qd.graph.do_while ------------------------------------------------------------------
    def top_depth(self) -> int:
        """How many of the blocks being lowered are the kernel's top level: its body, and the
        bodies of the qd.graph.do_while loops directly inside it."""
        depth = 1
        while depth < len(self.blocks) and isinstance(self.blocks[depth].parent, ir.GraphDoWhile):
            depth += 1
        return depth

    def is_graph_do_while(self, test) -> bool:
        return isinstance(test, ast.Call) and isinstance(test.func, (ast.Attribute, ast.Name)) \
            and self.visit(test.func) is graph.do_while

    def graph_do_while(self, node: ast.While):
        """`while qd.graph.do_while(flag):` (compiler/language/graph.py): a GraphDoWhile whose
        body is lowered as the kernel's top level."""
        if len(self.blocks) != self.top_depth() or self.constant_if_depth:
            self.error("qd.graph.do_while must be at the kernel's top level or directly in another "
                       "qd.graph.do_while body", node.test)
        (flag,) = self.call_args(node.test, 1, 1, "qd.graph.do_while")
        if not (isinstance(flag, NdarrayHandle) and not flag.is_grad and flag.dtype is T.i32 and flag.ndim == 0
                and not flag.element_shape):
            self.error("qd.graph.do_while(flag) needs a 0-d qd.i32 ndarray argument of the kernel "
                       "(qd.types.ndarray(qd.i32, ndim=0))", node.test.args[0])
        loop = self.emit(ir.GraphDoWhile(flag.arg_index))
        self.blocks.append(loop.body)
        try:
            with self.scope():
                self.visit_body(node.body)
        finally:
            self.blocks.pop()

