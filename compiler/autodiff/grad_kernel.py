"""Reverse-mode autodiff: the gradient kernel of an offloaded kernel.

The gradient kernel has the forward kernel's parameters and fields plus the gradient buffers
it writes. Kernels whose gradient would be wrong are rejected first (checks.py). Its tasks are,
in order:
1. if values cross tasks through kernel temporaries, a replay of the tasks that set them
   (only the temporaries are written), and a task zeroing the temporaries' adjoints;
2. the adjoint of every forward task, last task first (task_adjoint.py): each iteration
   runs a forward sweep pushing to adstacks, then a reverse sweep popping them.
Then GRAD_PIPELINE runs through the forward kernels' machinery (passes/pipeline.py: the IR
verified between passes under QDC_VERIFY_IR=1, each pass's result dumped): dead work is
removed, a stack whose adjoint can live in a local loses its adjoint slot
(register_adjoints.py), the usual simplifications run; finally every adstack is sized
(sizing.py).
"""
from __future__ import annotations

from .. import ir
from ..passes.intrinsics import lower_intrinsics
from ..passes.local_arrays import expand_component_accesses, group_local_arrays
from ..passes.pipeline import run_passes
from ..passes.reductions import thread_local_reductions
from ..passes.simplify import simplify
from .activity import Activity
from . import checks
from .cleanup import drop_empty_tasks, remove_dead_adstacks
from .register_adjoints import adjoints_in_registers
from .companions import CompanionBuffers
from .simt_adjoints import SharedAdjoints
from .sizing import size_stacks
from .task_adjoint import NeedStack, TaskAdjoint

# The forward pipeline's last pass that the gradient transform runs after; later passes
# (intrinsics, thread-local reductions) run on the gradient kernel instead, in GRAD_PIPELINE.
PIPELINE_STOP = "simplify_tasks"

# The gradient kernel's passes, after the reverse-mode transform (make_grad_kernel).
GRAD_PIPELINE = [
    ("lower_intrinsics", lower_intrinsics),            # as the forward pipeline does after PIPELINE_STOP
    ("remove_dead_adstacks", remove_dead_adstacks),    # stacks whose pops nothing needs
    ("adjoints_in_registers", adjoints_in_registers),  # a stack pushed before its adjoint is used: adjoint in a local
    ("simplify", simplify),                            # store forwarding, folding, CSE, DCE
    ("remove_dead_adstacks_again", remove_dead_adstacks),  # stacks left unread by simplify
    ("thread_local_reductions", thread_local_reductions),  # one atomic per chunk, as forward kernels
    ("check_unstable_loads", checks.check_unstable_loads),  # refuses a clobbered load still needed
    ("drop_empty_tasks", drop_empty_tasks),            # and names the tasks as their entry points
    ("local_arrays", group_local_arrays),              # as the forward pipeline's last pass
]


class GradKernelIR:
    """The result: the gradient kernel's IR, the Field objects of its field table, and the
    adstack records for KernelMeta.adstack."""

    def __init__(self, kernel: ir.KernelIR, field_objects: list, stacks: list):
        self.kernel, self.field_objects, self.stacks = kernel, field_objects, stacks


def make_grad_kernel(k: ir.KernelIR, field_objects: list, opts, dump=None) -> GradKernelIR:
    """`k` is an offloaded kernel (pipeline run up to PIPELINE_STOP); `field_objects` are the
    runtime Fields of `k.fields`, in order. `dump` as for run_pipeline."""
    if expand_component_accesses(k):  # adjoints and adstacks of scalars only: the scalar form's gradients
        simplify(k)
    ctx = _KernelContext(k, field_objects)
    checks.check_kernel(k, ctx.differentiable)  # also marks loads the kernel's own writes clobber
    ctx.activity = Activity(k, ctx.differentiable)
    ctx.shared_adjoints = SharedAdjoints(k, ctx.activity.shared)
    checks.check_gradient_through_plain_globals(k, ctx.activity, ctx.differentiable)
    checks.check_shared_parallel_stores(k, ctx.differentiable, ctx.activity.values)
    g = ctx.grad
    tasks = _replay_tasks(k) + _zero_adjoint_temps(ctx)
    for t in reversed(k.tasks):
        tasks.append(_adjoint_task(ctx, t, f"{k.name}_grad_t{len(tasks)}_{t.source_kind}"))
    for t in tasks:
        g.body.append(t)
    if dump is not None:
        dump("reverse_mode", ir.print_kernel(g))
    run_passes(g, GRAD_PIPELINE, "the reverse-mode transform", dump=dump, offloaded=True)
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
        self.grad.signature = k.signature
        self.grad.subgroup_size = k.subgroup_size
        self.activity = None
        self.shared_adjoints = None  # SharedAdjoints, once the activity is known
        self.adjoint_temps: dict = {}  # temp slot -> slot of its adjoint
        self._grads = CompanionBuffers(self.grad, self.field_objects, "grad")

    def differentiable(self, target) -> bool:
        """Has field or ndarray `target` a gradient buffer? (A SharedArray's adjoint is the
        task's own: simt_adjoints.SharedAdjoints.)"""
        return not isinstance(target, ir.SharedRef) and self._grads.has(target)

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
    """Keeps a SharedArray's writes: the replay rebuilds what it reads."""
    block.stmts = [s for s in block.stmts if not isinstance(s, (ir.GlobalStore, ir.AtomicRMW))
                   or isinstance(s.ptr.target, ir.SharedRef)]
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
