"""Reverse-mode autodiff: the gradient kernel of an offloaded kernel.

The gradient kernel has the forward kernel's parameters and fields plus the gradient buffers
it writes. Its tasks are, in order:
1. if values cross tasks through kernel temporaries, a replay of the tasks that set them
   (only the temporaries are written), and a task zeroing the temporaries' adjoints;
2. the adjoint of every forward task, last task first (task_adjoint.py): each iteration
   runs a forward sweep pushing to adstacks, then a reverse sweep popping them.
Then dead work is removed, a stack whose adjoint can live in a local loses its adjoint slot
(register_adjoints.py), the usual simplifications run, and every adstack is sized
(sizing.py). Kernels whose gradient would be wrong are rejected first (checks.py).
"""
from __future__ import annotations

from .. import ir
from ..passes.intrinsics import lower_intrinsics
from ..passes.pipeline import verify_requested
from ..passes.reductions import thread_local_reductions
from ..passes.simplify import simplify
from .activity import Activity
from . import checks
from .checks import check_kernel, error
from .cleanup import remove_dead_adstacks
from .register_adjoints import adjoints_in_registers
from .companions import CompanionBuffers
from .sizing import size_stacks
from .task_adjoint import NeedStack, TaskAdjoint

# The forward pipeline's last pass that the gradient transform runs after; later passes
# (thread-local reductions) run on the gradient kernel instead.
PIPELINE_STOP = "simplify_tasks"


class GradKernelIR:
    """The result: the gradient kernel's IR, the Field objects of its field table, and the
    adstack records for KernelMeta.adstack."""

    def __init__(self, kernel: ir.KernelIR, field_objects: list, stacks: list):
        self.kernel, self.field_objects, self.stacks = kernel, field_objects, stacks


def make_grad_kernel(k: ir.KernelIR, field_objects: list, opts) -> GradKernelIR:
    """`k` is an offloaded kernel (pipeline run up to PIPELINE_STOP); `field_objects` are the
    runtime Fields of `k.fields`, in order."""
    ctx = _KernelContext(k, field_objects)
    check_kernel(k, ctx.differentiable)  # also marks loads the kernel's own writes clobber
    ctx.activity = Activity(k, ctx.differentiable)
    _check_gradient_through_plain_globals(k, ctx)
    checks.check_shared_parallel_stores(k, ctx.differentiable, ctx.activity.values)
    g = ctx.grad
    tasks = _replay_tasks(k) + _zero_adjoint_temps(ctx)
    for t in reversed(k.tasks):
        tasks.append(_adjoint_task(ctx, t, f"{k.name}_grad_t{len(tasks)}_{t.source_kind}"))
    for t in tasks:
        g.body.append(t)
    lower_intrinsics(g)  # as the forward pipeline does after the point autodiff starts from
    remove_dead_adstacks(g)
    adjoints_in_registers(g)
    simplify(g)
    remove_dead_adstacks(g)
    thread_local_reductions(g)
    _check_unstable_loads(g)
    g.body.stmts = [t for t in g.body.stmts if t.body.stmts]
    for i, t in enumerate(g.tasks):
        t.task_name = f"{k.name}_grad_t{i}_{t.source_kind}"
    if verify_requested():
        ir.verify(g, offloaded=True)
    return GradKernelIR(g, ctx.field_objects, size_stacks(g, opts))


class _KernelContext:
    """What every task's adjoint shares: the kernel, gradient buffers, adjoint temporaries."""

    def __init__(self, k: ir.KernelIR, field_objects: list):
        self.k = k
        self.field_objects = list(field_objects)
        self.grad = ir.KernelIR(k.name, k.params, k.loc)
        self.grad.fields = list(k.fields)
        self.grad.num_temps, self.grad.temp_types = k.num_temps, list(k.temp_types)
        self.grad.messages = list(k.messages)  # the forward sweep's prints and debug checks name them
        self.grad.members = dict(k.members)  # the parameters read off dataclass and template arguments
        self.activity = None
        self.adjoint_temps: dict = {}  # temp slot -> slot of its adjoint
        self._grads = CompanionBuffers(self.grad, self.field_objects, "grad")

    def differentiable(self, target) -> bool:
        return self._grads.has(target)

    def grad_target(self, target):
        """The gradient buffer of a differentiable field or ndarray (added to the field table)."""
        return self._grads.of(target)

    def new_temp(self, dtype) -> int:
        g = self.grad
        g.temp_types.append(dtype)
        g.num_temps += 1
        return g.num_temps - 1


def _adjoint_task(ctx: _KernelContext, task: ir.Task, name: str) -> ir.Task:
    stacked: set = set()
    while True:
        try:
            return TaskAdjoint(ctx, task, stacked).build(name)
        except NeedStack as e:
            assert e.var not in stacked, "a stacked local was asked to be stacked again"
            stacked.add(e.var)


def _replay_tasks(k: ir.KernelIR) -> list:
    """Copies of the tasks that set temporaries, writing nothing else."""
    out = []
    for t in k.tasks:
        if not any(isinstance(s, (ir.TempStore, ir.TempAtomic)) for s in ir.walk(t.body)):
            continue
        copy = ir.clone_stmt(t, {})
        _drop_global_writes(copy.body)
        copy.task_name = f"{k.name}_replay{len(out)}"
        out.append(copy)
    return out


def _drop_global_writes(block: ir.Block) -> None:
    block.stmts = [s for s in block.stmts if not isinstance(s, (ir.GlobalStore, ir.AtomicRMW))]
    for s in block.stmts:
        for b in s.blocks():
            _drop_global_writes(b)


def _zero_adjoint_temps(ctx: _KernelContext) -> list:
    """A serial task zeroing the adjoint of every temporary that carries a gradient."""
    slots = sorted(ctx.activity.temps)
    if not slots:
        return []
    task = ir.Task("serial", ctx.k.loc)
    for slot in slots:
        dtype = ctx.k.temp_types[slot]
        adj = ctx.adjoint_temps[slot] = ctx.new_temp(dtype)
        task.body.append(ir.TempStore(adj, task.body.append(ir.Const(0.0, dtype))))
    return [task]


# ---- loads the forward kernel's own writes make unrepeatable ------------------------------

def _check_gradient_through_plain_globals(k: ir.KernelIR, ctx: _KernelContext) -> None:
    """A value with a gradient stored into a field or ndarray without one, and read back into
    the result: the gradient would silently stop there."""
    act = ctx.activity
    read_back = {checks.buffer_key(s.ptr.target) for s in ir.walk(k.body)
                 if isinstance(s, ir.GlobalLoad) and s in act.useful and s.type.is_float}
    for s in ir.walk(k.body):
        if isinstance(s, (ir.GlobalStore, ir.AtomicRMW)) and s.value in act.varied \
                and not ctx.differentiable(s.ptr.target) and checks.buffer_key(s.ptr.target) in read_back:
            target = s.ptr.target
            raise error(s.loc, f"a value with a gradient is stored into '{target.name}', which has none, and read "
                               f"back into the result: the gradient would stop here. Create it with "
                               f"needs_grad=True")


def _check_unstable_loads(g: ir.KernelIR) -> None:
    """Reject a load marked by checks.mark_clobbered_loads that the gradient still needs."""
    for s in ir.walk(g.body):
        write_loc = getattr(s, "_ad_clobbered_by", None)
        if isinstance(s, ir.GlobalLoad) and write_loc is not None:
            target = s.ptr.target
            raise error(s.loc, f"the gradient needs the value read here (its use is not linear), but kernel "
                               f"'{g.name}' overwrites '{target.name}' afterwards (line "
                               f"{write_loc.line if write_loc else '?'}), and its gradient kernel runs after it "
                               f"and would read the new value. Keep the update linear in the old value "
                               f"(`x[i] = x[i] * c + v` with c free of gradients), or write the new values to "
                               f"a separate field")
