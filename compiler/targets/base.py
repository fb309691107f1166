"""The interface every compiler target implements, and what a target declares about itself.

A target turns an offloaded, optimised kernel (one IR for every backend) into the artifacts
its runtime device loads. It declares its capabilities (what the generated code may use), the
description that enters the cache key, the source folders its code comes from (the compiler
fingerprint of its cache entries covers those and the backend-neutral stages, nothing else),
how it launches a task (which adstack sizing needs, without importing any target), and the
options it takes (`options`: TargetOption specs, from which Options, qdc.yaml / [tool.qdc] and
the `qdc build` flags such as `--cuda-arch` are made).

`compile` first checks what the kernel needs against the capabilities (a 64-bit value on a
target without 64-bit types, an adstack of a type the target cannot store: a
`TargetCannotExpress` error at that statement's line; a launch of more threads per workgroup
than the target allows), then calls the target's `generate`.
Errors found while generating code are `QdcCompileError`s at the statement's source line
(`codegen_error`), never a bare exception from deep inside a code generator.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass
from typing import Callable

from qdc.runtime.contract.errors import QdcCompileError

from .. import ir
from ..ir.adstack import AdStackAlloca


@dataclass(frozen=True)
class Capabilities:
    int64: bool = True
    float64: bool = True
    float_atomic_add: bool = True
    # Names of the adstack element types the target can store (None: any IR type).
    adstack_dtypes: frozenset | None = None
    # The most threads a launch's workgroup may have (None: each device's own limit, checked at load).
    max_workgroup_size: int | None = None
    subgroup_size: int | None = None
    # chunk_final's atomics combine the partials of a subgroup/warp first (one atomic per group)
    subgroup_reductions: bool = False
    # Runs tasks as blocks of threads: qd.simt's barriers, indices, subgroup ops, shared arrays
    simt: bool = False


@dataclass(frozen=True)
class TargetOption:
    """An option a target takes: an Options attribute and a qdc.yaml / [tool.qdc] key `name`,
    and a `qdc build` flag `--name-with-dashes`. Unset (None) means `default` (in `qdc build`,
    `build_default` where given); `check` is the one validation of every way of setting it."""
    name: str
    help: str
    default: object = None
    type: type = str  # of the flag's value (a configuration file may give a list where the check allows it)
    choices: tuple | None = None
    # The `qdc build` default where it differs from direct mode's `default` (the CPU: portable code).
    build_default: object = None
    # Whether every cache entry records (and is keyed by) its effective value on its own arch;
    # otherwise the target's cache_description covers it.
    keyed: bool = False
    # Raises ValueError naming the option for a bad value (called with every set value).
    validate: Callable | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value) -> None:
        """ValueError unless `value` is None or a value this option may take."""
        if value is None:
            return
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        if self.validate is not None:
            self.validate(value)


class Target:
    """One arch's code generator. Subclasses live in compiler/targets/<arch>/target.py."""
    arch: str = ""
    # How the target's errors name it ("CUDA allows ...") and a workgroup ("threads per block").
    display_name: str = ""
    workgroup_word: str = "workgroup"
    capabilities = Capabilities()
    # Folders under compiler/targets/ whose sources make up this target (own and shared).
    source_folders: tuple = ()
    options: tuple = ()  # TargetOption

    def warm_up(self) -> None:
        """Import the code generator and set up what every kernel needs (`qdc build` calls it
        once, before it forks its workers, so that they share it); nothing by default."""

    def cache_description(self, opts) -> str:
        """Everything about the target that changes generated code (ISA level, sm_XX, gfx list...)."""
        raise NotImplementedError

    def launch_policy(self, task: ir.Task) -> dict:
        """How the runtime launches `task`, as its task record says (runtime/contract/artifact.py,
        LAUNCH_POLICIES): the CPU's {"policy": "cpu_chunks", "parallel_from": N}, a GPU's
        {"policy": "grid", "block_dim": B} (B from qd.loop_config, `task.block_dim`, or the
        target's default). The device turns it and the trip count into the thread slices a
        launch dispatches (Device.task_slices), which adstack heaps are sized for."""
        raise NotImplementedError

    def compile(self, kernel: ir.KernelIR, meta, opts) -> dict:
        """Artifacts (name -> bytes) for `kernel`; may add target records to `meta`."""
        self.check_capabilities(kernel)
        self.check_block_dims(kernel)
        return self.generate(kernel, meta, opts)

    def generate(self, kernel: ir.KernelIR, meta, opts) -> dict:
        """`compile` once the kernel is known to fit the capabilities."""
        raise NotImplementedError

    def check_capabilities(self, kernel: ir.KernelIR) -> None:
        """TargetCannotExpress at the first adstack whose element type the target cannot store
        (the more specific message), else at the first statement whose type it lacks."""
        if self._lacks_nothing(kernel):
            return
        storable = self.capabilities.adstack_dtypes
        first_other = None  # (statement, location, message, describe) of the first other refusal
        for task in kernel.tasks:
            for s, where in _located(task, task.loc or kernel.loc):
                if storable is not None and isinstance(s, AdStackAlloca) and s.type.name not in storable:
                    raise codegen_error(
                        kernel, s, f"the {s.type.name} value of '{s.var_name}' must be kept on an adstack (it "
                        f"changes in a dynamic loop of a kernel that needs a gradient), but target "
                        f"'{self.arch}' stores only {', '.join(sorted(storable))} there: use one of those "
                        f"types for it", where, describe=False, error=TargetCannotExpress)
                if first_other is None:
                    first_other = self._refusal(s, where)
        if first_other is not None:
            s, where, message, describe = first_other
            raise codegen_error(kernel, s, message, where, describe=describe, error=TargetCannotExpress)

    def _lacks_nothing(self, kernel: ir.KernelIR) -> bool:
        """Whether the target has every type (no adstack element types or 64-bit types it lacks)
        and, if it runs no blocks of threads, no statement of `kernel` needs them: then nothing
        is refused, and no statement's location need be followed (a large kernel's walk with
        them cost the CPU's compile 10-20 ms)."""
        capabilities = self.capabilities
        if capabilities.adstack_dtypes is not None or not (capabilities.int64 and capabilities.float64):
            return False
        return capabilities.simt or not any(ir.simt_construct(s) is not None for task in kernel.tasks
                                            for s in ir.walk_nested(task))

    def _refusal(self, s: ir.Stmt, where) -> tuple | None:
        """(s, where, message, describe) if the target cannot express `s` for another reason than
        its adstack's type, else None."""
        construct = None if self.capabilities.simt else ir.simt_construct(s)
        if construct is not None:
            return (s, where, f"{construct} needs a GPU arch (cuda, amdgpu, vulkan, metal): target "
                    f"'{self.arch}' runs no blocks of threads", False)
        lacking = self._lacking_type(s)
        if lacking is not None:
            return (s, where, f"type {lacking.name} needs {'Float64' if lacking.is_float else 'Int64'}, which "
                    f"target '{self.arch}' does not have: this kernel cannot be built for it (use "
                    f"{'f32' if lacking.is_float else 'i32/u32'} for this value, or another arch)", True)
        return None

    def check_block_dims(self, kernel: ir.KernelIR) -> None:
        """A QdcCompileError at the first task launched with more threads per workgroup than
        `capabilities.max_workgroup_size` (qd.loop_config(block_dim=...))."""
        limit = self.capabilities.max_workgroup_size
        if limit is None:
            return
        for task in kernel.tasks:
            block = self.launch_policy(task).get("block_dim")
            if block is not None and block > limit:
                where = next((s for s in ir.walk_nested(task) if s.loc is not None), task)
                raise codegen_error(kernel, where, f"qd.loop_config(block_dim={block}) is more threads per "
                                    f"{self.workgroup_word} than {self.display_name} allows ({limit})",
                                    task.loc or kernel.loc, describe=False)

    def _lacking_type(self, s: ir.Stmt):
        """The 64-bit type of `s`'s value if the target has none (a loop index is typed by its
        lowering, not by the IR)."""
        t = s.type
        if t is None or isinstance(s, ir.LoopIndex) or getattr(t, "bits", None) != 64:
            return None
        return None if (self.capabilities.float64 if t.is_float else self.capabilities.int64) else t


def fixed_block_dim(task: ir.Task, default_block_dim: int) -> int:
    """The workgroup size of a target that fixes it at compile time: qd.loop_config's block_dim,
    else the target's default; 1 for a task that runs in order."""
    if task.kind == "serial" or task.serial:
        return 1
    return task.block_dim or default_block_dim


def _located(stmt: ir.Stmt, loc):
    """(statement, its location or its nearest located enclosing statement's) for every
    statement inside `stmt`, in program order. An explicit stack, as ir.walk: nested generators
    would hand each statement up through one frame per level of nesting."""
    stack = [(iter(b.stmts), loc) for b in reversed(stmt.blocks())]
    while stack:
        statements, outer = stack[-1]
        s = next(statements, None)
        if s is None:
            stack.pop()
            continue
        where = s.loc or outer
        yield s, where
        if s.BLOCKS:
            stack.extend((iter(b.stmts), where) for b in reversed(s.blocks()))


class TargetCannotExpress(QdcCompileError):
    """The kernel needs what the target does not have (a 64-bit type on Metal, an adstack of a
    type it cannot store): no fault of the code generator. `qdc build --arch all` reports such
    a kernel as skipped for that arch instead of failing the build."""


class Unsupported(Exception):
    """Raised inside a code generator for what it cannot lower; the statement being lowered
    turns it into a located QdcCompileError (`codegen_error`)."""


def lower_statement(lowering, kernel: ir.KernelIR, s: ir.Stmt, lower: Callable, generating: str):
    """`lower(s)` inside the one error context every code generator lowers statements in (as
    Numba's `lower_block`): `lowering.where` is the source location of the innermost located
    statement being lowered, and what goes wrong becomes a QdcCompileError at that line naming
    the kernel and the statement: an `Unsupported` as its message says, any other exception as
    an internal compiler error while `generating` (the cause chained for a developer)."""
    outer = lowering.where
    lowering.where = s.loc or outer
    try:
        r = lower(s)
    except QdcCompileError:
        raise
    except Unsupported as e:
        raise codegen_error(kernel, s, str(e), lowering.where) from None
    except Exception as e:  # a code generator bug: still located
        raise codegen_error(kernel, s, f"internal compiler error while {generating}: {type(e).__name__}: {e}",
                            lowering.where) from e
    lowering.where = outer
    return r


def codegen_error(kernel: ir.KernelIR, s: ir.Stmt, message: str, loc: ir.SourceLoc | None = None,
                  describe: bool = True, error: type = QdcCompileError) -> QdcCompileError:
    """A QdcCompileError (or subclass `error`) at `s`'s source line (else `loc`, the nearest
    enclosing one), naming the kernel and (`describe`) the statement as the IR printer shows it."""
    from ..ir.printer import Printer
    where = s.loc or loc
    if describe:
        message = f"{message} (kernel '{kernel.name}', statement `{Printer(kernel).describe(s)}`)"
    else:
        message = f"kernel '{kernel.name}': {message}"
    if where is None:
        return error(message)
    source = linecache.getline(where.filename, where.line) or None
    return error(message, where.filename, where.line, where.col, source)
