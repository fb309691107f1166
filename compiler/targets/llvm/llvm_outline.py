"""Large regions of a huge task body lowered as functions of their own, before LLVM sees them
(design.md, "Build time").

LLVM optimises and emits one function on one thread, and its time grows faster than the
function: Genesis's collision detection is one task body of 44,000 instructions (its narrow
phase inlined: box-box, MPR, GJK), which the CPU backend's module parts (cpu/module_split.py)
could not spread over the cores. Taichi and Quadrants compile each offloaded task on its own;
here a task body of at least OUTLINED_TASK_STATEMENTS statements has its large compound
statements (an `if` with its branches, a serial loop) lowered as internal `noinline` functions
`<chunk>.outlined<N>` that the body calls, which the module's cut deals to different parts
like entry points.

A region is one statement with its blocks: the IR's scoping (a value defined in a block is not
seen after it) means no value it defines is used after it, so a call replaces it exactly. What
it reads from outside is passed in: the ctx, the chunk's `alone` flag, each value it uses
(constants are written in as they are), the pointer of each local array, and the value of each
scalar local variable, which the function keeps in a local variable of its own, so SROA and
mem2reg promote it on both sides; the variables the region writes come back as the function's
result (a literal struct) and are stored into the caller's. A region with a `break` or
`continue` of a loop around it, or with adstack or GPU-only statements, is not outlined.

Which regions: bottom-up, a compound statement whose own statements (its outlined regions not
counted) are at least REGION_STATEMENTS, so that each function is worth a part's LLVM work and
what stays in the caller is the glue between them. The choice depends on the IR alone, so a
kernel builds the same bytes every time and on any number of threads.
"""
from __future__ import annotations

from llvmlite import ir as ll

from ... import ir
from ...ir import adstack
from ..base import lower_statement
from .llvm_ir import start_function
from .llvm_types import I1, PTR, VOID, lltype

# Statements of a task body (counted in its blocks, at any depth) from which it is outlined:
# Genesis's solver and collision kernels have 700-26,000 (2,000-44,000 LLVM instructions as
# generated; one of 818 statements, kernel_refresh_invweight_and_meaninertia's second task, was
# 0.7 of the kernel's 1.1 s of LLVM time, 0.2 outlined); the demo kernels and DiffMPM have at
# most 600, so they build the same bytes as before.
OUTLINED_TASK_STATEMENTS = 700
# The fewest statements of a region's own: below, what LLVM saves by a smaller function does not
# repay a call and a function's fixed costs (150 and 600 made no measurable difference to
# Genesis's LLVM time on two cores).
REGION_STATEMENTS = 300

# An outlined function's name: `<task>_chunk.outlined<N>` (and multiversion's level copies of it).
INFIX = ".outlined"

_WRITES = (ir.LocalStore, ir.LocalAccumulate, ir.LocalAtomic)
_FOREIGN = (ir.SimtSync, ir.SimtIndex, ir.SubgroupOp)  # a GPU's block of threads
_LOOPS = (ir.RangeFor, ir.While)


def outlined_regions(task: ir.Task) -> dict:
    """{statement: None} of the statements of `task`'s body that are lowered as functions of
    their own (none in a body of fewer than OUTLINED_TASK_STATEMENTS statements); emit_outlined
    notes each one's interface there as it works it out."""
    if _statements(task.body) < OUTLINED_TASK_STATEMENTS:
        return {}
    chosen: list = []
    _choose(task.body, chosen)
    return dict.fromkeys(chosen)


def _statements(block: ir.Block) -> int:
    count = len(block.stmts)
    for s in block.stmts:
        if s.BLOCKS:
            for child in s.blocks():
                count += _statements(child)
    return count


def _choose(block: ir.Block, chosen: list) -> tuple[int, bool, bool]:
    """(the statements of `block` outside the regions chosen in it, whether it holds a `break`
    or `continue` of a loop around it, whether it holds adstack or GPU-only statements); appends
    the regions chosen in it to `chosen`, inner ones first."""
    own, leaves, foreign = 0, False, False
    for s in block.stmts:
        own += 1
        if not s.BLOCKS:
            leaves |= isinstance(s, (ir.Break, ir.Continue))
            foreign |= isinstance(s, _FOREIGN) or type(s).__module__ == adstack.__name__
            continue
        inner, inner_leaves, inner_foreign = 0, False, False
        for child in s.blocks():
            n, child_leaves, child_foreign = _choose(child, chosen)
            inner += n
            inner_leaves |= child_leaves
            inner_foreign |= child_foreign
        inner_leaves &= not isinstance(s, _LOOPS)  # a loop's own breaks and continues stay inside it
        if not (inner_leaves or inner_foreign) and inner + 1 >= REGION_STATEMENTS:
            chosen.append(s)
            continue
        own += inner
        leaves |= inner_leaves
        foreign |= inner_foreign
    return own, leaves, foreign


def emit_outlined(env, s: ir.Stmt) -> None:
    """Lower the region `s` (one of `outlined_regions`) in lowering `env` as a call of a function
    of its own, defined here (module docstring)."""
    values, variables, written = _interface(s, env.regions)
    b, module = env.b, env.mb.module
    root = getattr(env, "outlined_from", None) or b.function.name
    outlined = module.__dict__.setdefault("outlined_regions", {})  # function name -> its task body's
    number = sum(1 for r in outlined.values() if r == root) + 1
    passed, constants = [], {}
    for value in values:
        lowered = env.v(value)
        if isinstance(lowered, ll.Constant):
            constants[value] = lowered
        else:
            passed.append((value, lowered))
    alone = [env.alone] if env.alone is not None else []
    params = [PTR] + [I1] * len(alone) + [PTR if isinstance(v.type, ll.PointerType) else v.type for _, v in passed] \
        + [lltype(var.type) for var in variables]
    result = ll.LiteralStructType([lltype(var.type) for var in written]) if written else VOID
    fn = ll.Function(module, ll.FunctionType(result, params), name=f"{root}{INFIX}{number}")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.args[0].add_attribute("noalias")
    outlined[fn.name] = root

    inner = type(env)(env.cg, start_function(fn), fn.args[0])
    inner.regions, inner.outlined_from = env.regions, root
    inner.alone = fn.args[1] if alone else None
    inner.enclosing_loops, inner.carrying, inner.where = list(env.enclosing_loops), env.carrying, env.where
    inner.vals.update(constants)
    args = fn.args[1 + len(alone):]
    for (value, lowered), arg in zip(passed, args):
        if isinstance(value, ir.LocalArray):  # the caller's array: only this call touches it meanwhile
            arg.add_attribute("noalias")
        inner.vals[value] = arg
    for var, arg in zip(variables, args[len(passed):]):
        slot = inner.entry_alloca(lltype(var.type), var.var_name)
        inner.b.store(arg, slot)
        inner.vals[var] = slot
    lower_statement(inner, env.cg.k, s, inner.lower_stmt, "generating code")
    if not inner.b.block.is_terminated:
        if written:
            out = ll.Constant(result, ll.Undefined)
            for i, var in enumerate(written):
                out = inner.b.insert_value(out, inner.b.load(inner.vals[var], typ=lltype(var.type)), i)
            inner.b.ret(out)
        else:
            inner.b.ret_void()

    call = b.call(fn, [env.ctx, *alone, *(v for _, v in passed),
                       *(b.load(env.v(var), typ=lltype(var.type)) for var in variables)])
    for i, var in enumerate(written):
        b.store(b.extract_value(call, i), env.v(var))


def _interface(region: ir.Stmt, regions: dict) -> tuple[list, list, list]:
    """(the values `region` uses that are defined before it, other than scalar local variables;
    the scalar local variables it uses; those it writes), each in the order of first use; noted
    in `regions` (outlined_regions'), whose regions inside it take theirs from there rather than
    being walked again (a region nested in n others would be walked n + 1 times)."""
    if regions.get(region) is not None:
        return regions[region]
    defined, values, variables, written = set(), {}, {}, {}

    def walk(stmts):
        for s in stmts:
            if s in regions and s is not region:  # outside it, what it defines is not seen
                for inner, found in zip(_interface(s, regions), (values, variables, written)):
                    for o in inner:
                        if o not in defined:
                            found.setdefault(o, None)
                continue
            for o in s.operands():
                if o not in defined:
                    (variables if isinstance(o, ir.Alloca) else values).setdefault(o, None)
            if isinstance(s, _WRITES) and s.var not in defined:
                written.setdefault(s.var, None)
            if isinstance(s, ir.RangeFor):
                defined.add(s.index)
            for child in s.blocks():
                walk(child.stmts)
            defined.add(s)
    walk([region])
    regions[region] = list(values), list(variables), list(written)
    return regions[region]
