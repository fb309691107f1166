"""CPU backend: LLVM IR → optimised object → shared library the runtime dlopens, with code for
every CPU level that `cpu_target` asks for (isa_levels.py; several levels: multiversion.py).

Range-for tasks are split over worker threads with libgomp's `GOMP_parallel` (a persistent
thread pool), as contiguous chunks the threads take from a shared counter. Ranges too small
to repay waking the pool run on the calling thread.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time

import llvmlite.binding as llvm
from llvmlite import ir as ll

from qdc.runtime.contract.adstack_layout import REQUIRED_MAX as ADSTACK_REQUIRED_MAX, REQUIRED_SHIFT as ADSTACK_REQUIRED_SHIFT
from qdc.runtime.contract.artifact import KernelMeta

from ... import ir, timings
from ...ir.adstack import AdStackAlloca
from .multiversion import (equal_levels, function_definitions, level_assembly, multiversioned_ir, with_features,
                           without_equal_levels)
from .numpy_prologue import add_numpy_entry
from .half_conversions import with_half_conversions
from .isa_levels import NATIVE, CpuLevel, CpuPlatform
from . import parallel_llvm
from .link import link_shared_library
from .module_split import split_module
from .llvm_pipeline import (Pipeline, choose as choose_pipeline, largest_function, mark as mark_pipeline,
                            scalar_levels_without_slp)
from .platforms import cpu_levels, cpu_platforms, host_platform, optimised_with
from .retarget import declared_functions, retargeted
from ..llvm.llvm_artifacts import LlvmArtifacts
from ..llvm.llvm_ir import ModuleBuilder
from ..llvm.llvm_text import module_text
from ..llvm.llvm_types import I1, I32, I64, PTR, VOID
from .widen_codegen import CpuKernelCodegen, task_choices, gathering_chunk_features
from .arch import PARALLEL_WORK_THRESHOLD

# A parallel range is cut into this many chunks per thread, handed out dynamically.
CHUNKS_PER_THREAD = 4


def new_target_machine(opt_level: int, cpu: str | None = None, features: str | None = None, triple: str | None = None):
    """A target machine of `triple` (default: this process's), for `cpu` with `features`
    (default: the host's). One thread at a time uses a target machine: a part's worker thread
    makes its own (parallel_llvm.py); the others share `_target_machine`'s."""
    if triple is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        triple = llvm.get_process_triple()
    else:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple(triple)
    if cpu is None:
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=cpu, features=features or "", opt=opt_level, reloc="pic",
                                        codemodel="default")


_target_machine = functools.lru_cache(maxsize=None)(new_target_machine)


def _dispatch(builder: ll.IRBuilder, ctx, task: ir.Task, chunk, begin, end, cost, meta: KernelMeta,
              lanes: int = 1):
    """`lanes`: the heap slices one thread of the task uses (its width-W chunk's most lanes)."""
    mb_module = builder.module
    it = begin.type
    n = builder.sub(end, begin)
    fn = builder.function
    run = fn.append_basic_block(f"{task.task_name}.run")
    done = fn.append_basic_block(f"{task.task_name}.done")
    builder.cbranch(builder.icmp_signed(">", n, ll.Constant(it, 0)), run, done)
    builder.position_at_end(run)
    if task.serial:
        builder.call(chunk, [ctx, begin, end, ALONE])
        builder.branch(done)
        builder.position_at_end(done)
        return
    if "noinline" not in chunk.attributes:
        # Called from the serial path, from the worker threads' body, and (through both) from
        # the task entry and the fused entry: inlined, LLVM optimised, vectorised and emitted
        # the loop up to four times; one copy costs one call per chunk (issue 14: build time).
        chunk.attributes.add("noinline")
    n64 = builder.sext(n, I64) if it.width < 64 else n
    threads = builder.load(builder.gep(ctx, [ll.Constant(I64, meta.threads_slot)], source_etype=I64), typ=I64)
    if any(isinstance(s, AdStackAlloca) for s in task.body.stmts):  # at most the heap's thread slices
        slot = ll.Constant(I64, meta.adstack_threads_slot)
        limit = builder.load(builder.gep(ctx, [slot], source_etype=I64), typ=I64)
        if lanes > 1:  # a thread takes `lanes` slices; the heap holds that many per thread it sized for
            limit = builder.udiv(limit, ll.Constant(I64, lanes))
            _skip_without_slices(builder, ctx, limit, done, meta)
        threads = builder.select(builder.icmp_unsigned("<", limit, threads), limit, threads)
    if task.max_threads:  # qd.loop_config(parallelize=N)
        cap = ll.Constant(I64, task.max_threads)
        threads = builder.select(builder.icmp_unsigned("<", cap, threads), cap, threads)
    big = builder.icmp_signed(">=", builder.mul(n64, ll.Constant(I64, max(cost, 1))),
                              ll.Constant(I64, PARALLEL_WORK_THRESHOLD))
    multi = builder.icmp_signed(">", threads, ll.Constant(I64, 1))
    par = fn.append_basic_block(f"{task.task_name}.par")
    ser = fn.append_basic_block(f"{task.task_name}.ser")
    builder.cbranch(builder.and_(big, multi), par, ser)
    builder.position_at_end(ser)
    builder.call(chunk, [ctx, begin, end, ALONE])
    builder.branch(done)

    builder.position_at_end(par)
    nt = builder.select(builder.icmp_signed("<", n64, threads), n64, threads)
    chunks = builder.mul(nt, ll.Constant(I64, CHUNKS_PER_THREAD))
    chunk_size = builder.sdiv(builder.add(n64, builder.sub(chunks, ll.Constant(I64, 1))), chunks)
    closure = builder.alloca(I64, size=len(_CLOSURE))  # in the entry function's body: fine, it runs once
    words = {"ctx": builder.ptrtoint(ctx, I64), "begin": builder.sext(begin, I64) if it.width < 64 else begin,
             "n": n64, "chunk_size": chunk_size, "next_chunk": ll.Constant(I64, 0)}
    for i, name in enumerate(_CLOSURE):
        builder.store(words[name], builder.gep(closure, [ll.Constant(I64, i)], source_etype=I64))
    gomp = mb_module.globals.get("GOMP_parallel") or ll.Function(
        mb_module, ll.FunctionType(VOID, [PTR, PTR, I32, I32]), name="GOMP_parallel")
    builder.call(gomp, [_omp_body(mb_module, task, chunk, it), closure, builder.trunc(nt, I32), ll.Constant(I32, 0)])
    builder.branch(done)
    builder.position_at_end(done)


def _skip_without_slices(builder: ll.IRBuilder, ctx, limit, done, meta: KernelMeta) -> None:
    """A heap smaller than one thread's slices (the runtime sizes it from an upper bound of
    the trip count, so only a trip count it judged empty could meet this): the task does not
    run and the launch reports an adstack overflow, rather than writing past the heap."""
    fn = builder.function
    short = fn.append_basic_block("lanes.short")
    enough = fn.append_basic_block("lanes.enough")
    builder.cbranch(builder.icmp_unsigned("==", limit, ll.Constant(I64, 0)), short, enough)
    builder.position_at_end(short)
    overflow = builder.load(builder.gep(ctx, [ll.Constant(I64, meta.adstack_slot + 2)], source_etype=I64), typ=PTR)
    builder.atomic_rmw("umax", overflow, ll.Constant(I64, ADSTACK_REQUIRED_MAX << ADSTACK_REQUIRED_SHIFT),
                       "monotonic")
    builder.branch(done)
    builder.position_at_end(enough)


# A chunk's `alone` argument (KernelCodegen.emit_chunk): the calling thread runs the whole task
# (a serialized loop, one thread, or too little work to share), and a launch holds the GIL, so
# no other kernel runs meanwhile; worker threads share the task.
ALONE, NOT_ALONE = ll.Constant(I1, 1), ll.Constant(I1, 0)

# The words of the closure `_dispatch` hands to each worker thread.
_CLOSURE = ("ctx", "begin", "n", "chunk_size", "next_chunk")


def _omp_body(module, task: ir.Task, chunk, it):
    """`void body(i64 closure[5])`: each thread takes chunks [begin + c*size, begin + (c+1)*size)
    off a shared counter until none is left. Dynamic rather than one fixed slice per thread,
    so that a thread the OS delays (the machine is shared) or a slice of costlier iterations
    does not hold up the others."""
    fn = ll.Function(module, ll.FunctionType(VOID, [PTR]), name=task.task_name + "_omp")
    fn.linkage = "internal"
    b = ll.IRBuilder(fn.append_basic_block("entry"))
    closure = fn.args[0]
    word = {name: b.gep(closure, [ll.Constant(I64, i)], source_etype=I64) for i, name in enumerate(_CLOSURE)}
    ctx = b.inttoptr(b.load(word["ctx"], typ=I64), PTR)
    begin, n, size = (b.load(word[name], typ=I64) for name in ("begin", "n", "chunk_size"))
    take = fn.append_basic_block("take")
    run = fn.append_basic_block("run")
    done = fn.append_basic_block("done")
    b.branch(take)
    b.position_at_end(take)
    c = b.atomic_rmw("add", word["next_chunk"], ll.Constant(I64, 1), "monotonic")
    lo = b.mul(c, size)
    b.cbranch(b.icmp_signed("<", lo, n), run, done)
    b.position_at_end(run)
    hi = b.add(lo, size)
    hi = b.select(b.icmp_signed("<", hi, n), hi, n)
    lo, hi = b.add(begin, lo), b.add(begin, hi)
    if it.width < 64:
        lo, hi = b.trunc(lo, it), b.trunc(hi, it)
    b.call(chunk, [ctx, lo, hi, NOT_ALONE])
    b.branch(take)
    b.position_at_end(done)
    b.ret_void()
    return fn


def generate_llvm(kernel: ir.KernelIR, meta: KernelMeta, fast_math: bool = False, *, target,
                  levels: tuple = (), platform: CpuPlatform | None = None) -> ll.Module:
    """`target`: the CpuTarget whose math table and thread slice index the lowering uses;
    `levels`: the ISA levels the code is for (default: the host's), which set each width-W
    chunk's W (widen_codegen.py); `platform`: the one it is for (default: the host's). The
    module carries the tasks' choices (`widen_choices`) and the per-level chunks
    (`widen_overrides`) for compile_kernel."""
    platform = platform or host_platform()
    tm = _target_machine(3, *_machine_of(platform))  # for the data layout, which every level of the triple shares
    mb = ModuleBuilder(kernel.name, platform.triple, str(tm.target_data))
    choices = task_choices(kernel, levels or (_host_level(),))
    cg = CpuKernelCodegen(mb, kernel, meta, fast_math, target=target, choices=choices)

    def dispatch(b, ctx, task, chunk, begin, end, cost):
        choice = choices.get(task)
        _dispatch(b, ctx, task, chunk, begin, end, cost, meta, choice.max_lanes if choice else 1)
    cg.emit_kernel(dispatch)
    add_numpy_entry(mb.module, meta)
    mb.module.widen_choices, mb.module.widen_overrides = choices, cg.overrides
    mb.module.gathering_chunks = cg.gathering_chunks
    return mb.module


def _host_level() -> CpuLevel:
    return cpu_levels(NATIVE)[0]


def _machine_of(platform: CpuPlatform, level: CpuLevel | None = None) -> tuple:
    """_target_machine's cpu, features and triple for `level` (default: its generic CPU) of
    `platform`; the process's own triple (and the host CPU) for a platform of its own."""
    if platform.triple == llvm.get_process_triple():
        return (level.llvm_cpu, level.llvm_features) if level else ()
    return (level.llvm_cpu, level.llvm_features, platform.triple) if level else ("generic", "", platform.triple)


# Options for small modules. A small kernel is a few loops of a few instructions, and two of
# LLVM's O3 transformations made much of its build time without making it faster:
# - loop strength reduction (in object emission) searches the addressing of every memory access
#   of a loop for the fewest induction variables; the vectoriser's interleaved loops over vector
#   fields gave it hundreds of candidates (half of DiffMPM's clear_grid emission, a third of
#   heat.commit's), where x86's addressing modes take `base + index*scale + offset` as they are.
#   Width-W chunks keep it (nbody.kick's ran 1% slower without), and so does other code than
#   x86's (AArch64 has no such addressing mode, and strength reduction forms its post-increments).
# - non-trivial loop unswitching copies a loop once per value of a branch condition the loop does
#   not change (only loops below its cost threshold, `-unswitch-threshold`, 50 by default: so
#   small loops only), each copy then vectorised and emitted on its own: heat.step's row loop,
#   copied for its boundary rows and its interior, doubled its LLVM time and ran 10% slower.
#   Chunks with atomics keep it: there it copies the loop for `alone` (a thread that runs the
#   whole task), whose copy has plain read-modify-writes that the loop vectoriser widens
#   (`x[i] += y[i]` on one thread ran 4.8 times slower without it).
# Modules whose largest function has at most this many instructions are built so; larger ones,
# whose small loops are a small share of their build, keep LLVM's defaults.
SMALL_MODULE_LARGEST_FUNCTION = 1000
_NO_STRENGTH_REDUCTION, _NO_UNSWITCHING = "-disable-lsr=true", "-unswitch-threshold=1"
_LLVM_DEFAULTS = ("-disable-lsr=false", "-unswitch-threshold=50")
# LLVM's options are global to the process: one CPU module at a time sets them and restores
# LLVM's defaults after, so that no other module (a GPU one compiled in the same process) sees them.
_OPTIONS_LOCK = threading.Lock()


def small_module_options(largest: int, text: str, widened: bool, machine: str) -> tuple[str, ...]:
    """LLVM's options for the module of IR `text` whose largest function has `largest`
    instructions (none: LLVM's defaults); `widened`: whether it has width-W chunks; `machine`:
    its platform's ISA family."""
    if largest > SMALL_MODULE_LARGEST_FUNCTION:
        return ()
    atomics = any("atomicrmw " in body or "cmpxchg " in body
                  for name, body in function_definitions(text).items() if "_chunk" in name)
    reduce_strength = widened or machine != "x86_64"
    return (() if reduce_strength else (_NO_STRENGTH_REDUCTION,)) + (() if atomics else (_NO_UNSWITCHING,))


@contextlib.contextmanager
def _llvm_options(options: tuple[str, ...]):
    """LLVM's process-wide `options` while a module is optimised and emitted, then its defaults."""
    if not options:
        yield
        return
    with _OPTIONS_LOCK:
        for option in options:
            llvm.set_option("", option)
        try:
            yield
        finally:
            for option in _LLVM_DEFAULTS:
                llvm.set_option("", option)


def optimise(module, opt_level: int, level: CpuLevel | None = None, platform: CpuPlatform | None = None,
             pipeline: Pipeline | None = None, tm=None):
    """Parse (an ll.Module) or take (a parsed module) and optimise it for `level` (default: the
    host CPU) of `platform` (default: the host's): the vectorisers pick vector widths from the
    target, so each level is optimised on its own. `pipeline`: what LLVM's optimiser runs
    (llvm_pipeline.choose; default: `opt_level` with both vectorisers from speed level 2 on);
    `tm`: the target machine (default: the shared one of that level)."""
    tm = tm or _target_machine(opt_level, *_machine_of(platform or host_platform(), level))
    if isinstance(module, ll.Module):
        module = llvm.parse_assembly(str(module))
        module.verify()
    pipeline = pipeline or Pipeline(opt_level, opt_level >= 2, opt_level >= 2)
    if pipeline.speed_level > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=pipeline.speed_level)
        pto.loop_vectorization = pipeline.loop_vectorization
        pto.slp_vectorization = pipeline.slp_vectorization
        pb = llvm.create_pass_builder(tm, pto)
        parallel_llvm.run_passes(pb.getModulePassManager(), module, pb)
    return module, tm


def _without_equal_levels(mod, task_bodies: list[str], levels: tuple[CpuLevel, ...], alike: dict, tm):
    """(module, {(body, level): lower level}, its text or None): the optimised module without
    the task bodies of a level whose code equals a lower level's (multiversion.equal_levels;
    `alike`: those it never had), so that they are not emitted again, and without what only
    they used; its text where it is the module given (printing a large module is not free).
    `tm`: a target machine this thread may use."""
    text = parallel_llvm.printed(mod)
    same = equal_levels(text, task_bodies, levels, alike)
    if same == alike:
        return mod, same, text
    smaller = parallel_llvm.parse(without_equal_levels(text, same))
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(0))
    parallel_llvm.run_passes(pm, smaller, builder)
    return smaller, same, None


def _module_text(module: ll.Module, task_bodies: list[str], levels: tuple, alike: dict,
                 scalar_code: bool = False) -> str:
    """The module's IR text, its task bodies dispatched per level where several, the width-W
    chunks that gather with the features of `gathering_chunk_features`; `alike` receives the
    bodies a level runs a lower level's code of (multiversion.multiversioned_ir; `scalar_code`:
    llvm_pipeline.scalar_levels_without_slp)."""
    gathering = module.gathering_chunks
    if len(levels) > 1:
        return multiversioned_ir(module, task_bodies, levels, module.widen_overrides,
                                 lambda name, level: gathering_chunk_features(level) if name in gathering
                                 else level.llvm_features, alike, scalar_code)
    text = module_text(module)
    if gathering and gathering_chunk_features(levels[0]) != levels[0].llvm_features:
        text = with_features(text, sorted(gathering), gathering_chunk_features(levels[0]))
    return text


def compile_kernel(kernel: ir.KernelIR, meta: KernelMeta, opt_level: int = 3, fast_math: bool = False,
                   cpu_target: str = NATIVE, keep_assembly: bool = False, *, target, cpu_targets=None) -> dict:
    """Artifacts of one kernel for the CPU: per platform of `cpu_targets` (default: the host's)
    one shared library (the platform's artifact kind: "so" for x86_64 Linux) holding code for
    every level of `cpu_target` (multiversion.py: the runtime picks the level at load), the
    records of the libraries' levels ("cpu_libraries", for KernelMeta.cpu_libraries), and the
    optimised LLVM bitcode of the first platform (the host's when built), its text ("ll") made
    when asked for (llvm_artifacts.py).
    A platform whose library another one's optimised IR makes (platforms.optimised_with) is
    not generated and optimised again (retarget.py).
    `keep_assembly` adds the assembly of each level's task bodies as "asm:<level>" (other
    platforms than the first: "asm:<platform>:<level>"; for tests)."""
    out = LlvmArtifacts(cpu_libraries=[], cpu_tasks={})
    chosen = cpu_platforms(cpu_targets)
    sources = {optimised_with(platform, cpu_target, chosen)[0] for platform in chosen} - {None}
    optimised = {}  # platform name -> (its levels, optimised IR text, its generated IR's calls, LLVM options)
    for n, platform in enumerate(chosen):
        levels = cpu_levels(cpu_target, platform)
        task_bodies = [task.task_name + "_chunk" for task in kernel.tasks]  # KernelCodegen.emit_chunk's names
        module = None
        reused = _retargeted(platform, levels, opt_level, cpu_target, chosen, optimised)
        if reused is not None:
            retargeted_module, tm, options = reused
        else:
            module, alike, text, pipeline = _generated(kernel, meta, fast_math, target, platform, levels, task_bodies,
                                                       opt_level)
            largest = largest_function(module)
            widened = any(choice.max_lanes > 1 for choice in module.widen_choices.values())
            options = small_module_options(largest, text, widened, platform.machine)
        wanted = n == 0 or platform.name in sources  # whether the optimised module itself is needed
        keep_text = platform.name in sources  # and its text (another platform's retargeting)
        with _llvm_options(options):
            if module is not None:
                split = split_module(text)
                build = _build_whole if split is None else functools.partial(_build_parts, split)
                built = build(text, opt_level, platform, levels, pipeline, task_bodies, alike, keep_assembly, wanted,
                              keep_text)
                if platform.name in sources:
                    optimised[platform.name] = (levels, built.text, declared_functions(text), options)
            else:
                with timings.phase("object emission"):
                    built = _Built(retargeted_module, [tm.emit_object(retargeted_module)])
                if keep_assembly:
                    built.assembly = tm.emit_assembly(retargeted_module)
            if n == 0:
                with timings.phase("artifacts"):
                    out["bc"] = built.module.as_bitcode()
        with timings.phase("linking"):
            library = link_shared_library(built.objects, platform, host=platform == host_platform())
        out[platform.artifact] = library
        out[platform.artifact + "_sha256"] = hashlib.sha256(library).hexdigest()
        if keep_assembly:
            prefix = "asm:" if n == 0 else f"asm:{platform.name}:"
            for i, level in enumerate(levels):
                out[prefix + level.name] = built.assembly if len(levels) == 1 else level_assembly(
                    built.assembly, task_bodies, i, built.same)
        for task, choice in (module.widen_choices.items() if module else ()):  # a thread takes the most lanes
            record = out["cpu_tasks"].setdefault(task.task_name, choice.record())  # of any platform's
            if "lanes" in record:
                record["lanes"] = max(record["lanes"], choice.max_lanes)
        out["cpu_libraries"] += [{"artifact": platform.artifact, "target": level.name, "machine": platform.machine,
                                  "os": platform.os, "triple": platform.triple, "features": sorted(level.requires),
                                  **({"level": i} if len(levels) > 1 else {})}
                                 for i, level in enumerate(levels)]
    return out


class _Built:
    """A platform's optimised module (`text`: its IR text where already printed), its objects
    (one per part), {(body, level): lower level} of multiversion.equal_levels and, with
    keep_assembly, its assembly."""

    def __init__(self, module, objects, text=None, same=None, assembly=None):
        self.module, self.objects, self.text = module, objects, text
        self.same, self.assembly = same or {}, assembly


def _build_whole(text: str, opt_level: int, platform: CpuPlatform, levels: tuple, pipeline: Pipeline,
                 task_bodies: list, alike: dict, keep_assembly: bool, wanted: bool, keep_text: bool) -> _Built:
    """The module of IR `text` parsed, optimised and emitted on this thread; its optimised text
    where `keep_text`."""
    with timings.phase("LLVM parse"):
        # A context of its own: the shared one accumulates metadata kinds from earlier modules,
        # which the bitcode writer records, so the same kernel's bitcode (and a `qdc pack` bundle)
        # would depend on what the process compiled before it.
        parsed = parallel_llvm.parse(text)
    with timings.phase("LLVM optimisation"):
        mod, tm = optimise(parsed, opt_level, levels[0], platform, pipeline)
    same, optimised_text = {}, None
    if len(levels) > 1:
        with timings.phase("IR multiversioning"):
            mod, same, optimised_text = _without_equal_levels(mod, task_bodies, levels, alike, tm)
    if keep_text and optimised_text is None:
        with timings.phase("artifacts"):
            optimised_text = str(mod)
    with timings.phase("object emission"):
        obj = tm.emit_object(mod)
    return _Built(mod, [obj], optimised_text, same, tm.emit_assembly(mod) if keep_assembly else None)


def _build_parts(split: tuple, text: str, opt_level: int, platform: CpuPlatform, levels: tuple, pipeline: Pipeline,
                 task_bodies: list, alike: dict, keep_assembly: bool, wanted: bool, keep_text: bool) -> _Built:
    """The module of IR `text`, cut into `split` (module_split.split_module), each part parsed,
    optimised and emitted on its own in parallel threads (parallel_llvm.py); where `wanted`,
    the optimised parts linked back into one module (the "bc" artifact, another platform's
    retargeting), and its text where `keep_text`."""
    parts, shared_internal = split
    machine = _machine_of(platform, levels[0])

    def work(part: str, times: parallel_llvm.StepTimes) -> tuple:
        tm = new_target_machine(opt_level, *machine)
        with times.step("LLVM parse"):
            mod = parallel_llvm.parse(part)
        with times.step("LLVM optimisation"):
            mod, _ = optimise(mod, opt_level, levels[0], platform, pipeline, tm=tm)
        same = {}
        if len(levels) > 1:
            with times.step("IR multiversioning"):
                mod, same, _ = _without_equal_levels(mod, task_bodies, levels, alike, tm)
        with times.step("object emission"):
            obj = parallel_llvm.emitted(tm, mod)
        assembly = parallel_llvm.emitted(tm, mod, as_object=False).decode() if keep_assembly else None
        with times.step("artifacts"):
            bitcode = parallel_llvm.bitcode(mod) if wanted else None
        return obj, bitcode, same, assembly
    wall = time.perf_counter()
    results, times = parallel_llvm.run_parts(work, parts, [part.count("\n") for part in parts])
    timings.count_threads([t.steps for t in times], time.perf_counter() - wall)
    same = {}
    for _, _, part_same, _ in results:
        same.update(part_same)
    combined, combined_text = None, None
    if wanted:
        with timings.phase("artifacts"):
            combined = _linked([bitcode for _, bitcode, _, _ in results], shared_internal)
            combined_text = str(combined) if keep_text else None
    assembly = "".join(a for _, _, _, a in results) if keep_assembly else None
    return _Built(combined, [obj for obj, _, _, _ in results], combined_text, same, assembly)


def _linked(bitcodes: list[bytes], shared_internal: set) -> llvm.ModuleRef:
    """One module of the optimised parts' `bitcodes`, as the whole module would have been: the
    globals the parts shared (variables, outlined regions) internal again."""
    context = llvm.create_context()
    module = llvm.parse_bitcode(bitcodes[0], context)
    for data in bitcodes[1:]:
        module.link_in(llvm.parse_bitcode(data, context))
    for name in sorted(shared_internal):
        value = next((g for g in (*module.global_variables, *module.functions) if g.name == name), None)
        if value is not None:
            value.linkage = "internal"
    return module


def _generated(kernel: ir.KernelIR, meta: KernelMeta, fast_math: bool, target, platform: CpuPlatform, levels: tuple,
               task_bodies: list[str], opt_level: int) -> tuple:
    """(generated module, the bodies a level runs a lower level's code of (`_module_text`), the
    IR text LLVM parses, LLVM's pipeline for it) of the kernel's library for `platform`."""
    module = generate_llvm(kernel, meta, fast_math, target=target, levels=levels, platform=platform)
    pipeline = choose_pipeline(module, opt_level, len(levels), platform.machine)
    mark_pipeline(module, pipeline)  # recorded in the optimised IR (`qdc inspect --llvm`)
    alike = {}
    with timings.phase("IR multiversioning" if len(levels) > 1 else "IR text"):
        scalar_code = pipeline.loop_vectorization and scalar_levels_without_slp(module, len(levels),
                                                                           platform.machine)
        text = _module_text(module, task_bodies, levels, alike, scalar_code)
        text = with_half_conversions(text)
    return module, alike, text, pipeline


def _retargeted(platform: CpuPlatform, levels: tuple, opt_level: int, cpu_target: str, chosen: tuple,
                optimised: dict) -> tuple | None:
    """(optimised module, target machine, LLVM options) of `platform` made from another
    platform's optimised module of this build (`optimised`), or None."""
    source, level_name = optimised_with(platform, cpu_target, chosen)
    if source not in optimised:
        return None
    source_levels, text, generated_calls, options = optimised[source]
    with timings.phase("IR retargeting"):
        tm = _target_machine(opt_level, *_machine_of(platform, levels[0]))
        module = retargeted(text, generated_calls, [lvl.name for lvl in source_levels].index(level_name), tm,
                            levels[0].llvm_cpu)
    return None if module is None else (module, tm, options)
