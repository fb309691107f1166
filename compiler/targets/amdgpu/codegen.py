"""AMDGPU backend: the shared LLVM lowering → LLVM's AMDGPU backend (llvmlite) → ld.lld, one
code object per gfx processor of `amdgpu_targets`.

Every task becomes an `amdgpu_kernel` entry named as its task record's `entry`, taking one
pointer (the device copy of the launch's ctx words, a flat address), as on CUDA (llvm/grid.py):
a grid-stride loop over the global thread id g = workgroup_id.x * workgroup_size.x +
workitem_id.x, stride G = the grid's work-items; the adstack slice of a thread is g. The
workgroup size and grid size come from the dispatch packet (hsa_kernel_dispatch_packet_t:
workgroup_size_x, a u16 at byte 4; grid_size_x, a u32 at byte 12, counted in work-items).

Code objects are version 5 (module flag `amdhsa_code_object_version` = 500): LLVM 22 defaults
to 6, which LLD older than 19 rejects and ROCm before 6.2 cannot load. Each processor gets a
fresh parse of the module (a second codegen of one llvmlite module can abort the process),
its own optimisation and ld.lld. Math the backend lowers no call for is the shared inline IR
(target.py), defined in the module itself: nothing is linked in.
"""
from __future__ import annotations

import functools

import llvmlite.binding as llvm
from llvmlite import ir as ll

from qdc.runtime.contract.artifact import KernelMeta

from ... import ir, timings
from ..llvm.grid import GridKernelCodegen, internalize
from ..llvm.llvm_ir import ModuleBuilder
from ..llvm.llvm_types import I16, I32, I64
from . import linker
from .arch import CODE_OBJECT_VERSION, TRIPLE

CONSTANT = 4  # the constant address space, where the dispatch packet lives
DISPATCH_WORKGROUP_SIZE_X, DISPATCH_GRID_SIZE_X = 4, 12


@functools.lru_cache(maxsize=None)
def target_machine(gfx: str, opt_level: int = 3, features: str = ""):
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=gfx, features=features, opt=opt_level,
                                                                 reloc="pic")


def wavefront_features(kernel: ir.KernelIR) -> str:
    """Block-level code (qd.simt) assumes wavefronts of 64 lanes (simt.py), which RDNA (gfx10+,
    32 lanes by default) runs when asked; other kernels keep the processor's default."""
    return "+wavefrontsize64" if any(ir.uses_simt(t) is not None for t in kernel.tasks) else ""


def dispatch_field(mb: ModuleBuilder, b: ll.IRBuilder, offset: int, ty):
    """A field of the dispatch packet, zero-extended to i64."""
    packet_type = ll.PointerType(addrspace=CONSTANT)
    packet = b.call(mb.declare("llvm.amdgcn.dispatch.ptr", packet_type, []), [])
    field = b.gep(packet, [ll.Constant(I64, offset)], source_etype=ll.IntType(8))
    return b.zext(b.load(field, typ=ty), I64)


def global_thread_id(mb: ModuleBuilder, b: ll.IRBuilder):
    group = b.zext(b.call(mb.declare("llvm.amdgcn.workgroup.id.x", I32, []), []), I64)
    item = b.zext(b.call(mb.declare("llvm.amdgcn.workitem.id.x", I32, []), []), I64)
    size = dispatch_field(mb, b, DISPATCH_WORKGROUP_SIZE_X, I16)
    return b.add(b.mul(group, size, flags=("nuw",)), item, flags=("nuw",))


class AmdgpuKernelCodegen(GridKernelCodegen):
    calling_convention = "amdgpu_kernel"

    def thread_id(self, b: ll.IRBuilder):
        return global_thread_id(self.mb, b)

    def grid_threads(self, b: ll.IRBuilder):
        return dispatch_field(self.mb, b, DISPATCH_GRID_SIZE_X, I32)


def generate_llvm(kernel: ir.KernelIR, meta: KernelMeta, fast_math: bool, target) -> str:
    """The kernel's LLVM IR text for every gfx processor (their data layouts are the same)."""
    tm = target_machine("gfx90a")
    mb = ModuleBuilder(kernel.name, TRIPLE, str(tm.target_data))
    AmdgpuKernelCodegen(mb, kernel, meta, fast_math, target=target).emit_task_kernels()
    mb.module.add_named_metadata("llvm.module.flags", [ll.Constant(I32, 1), "amdhsa_code_object_version",
                                                       ll.Constant(I32, CODE_OBJECT_VERSION)])
    return str(mb.module)


def compile_for(text: str, gfx: str, entries: set, opt_level: int, features: str = "") -> tuple:
    """(relocatable object, (optimised IR text, its bitcode)) for processor `gfx` from the
    module text."""
    context = llvm.create_context()  # the bitcode must not depend on earlier kernels (cpu/codegen.py)
    with timings.phase("LLVM parse"):
        module = llvm.parse_assembly(text, context=context)
        module.verify()  # llvmlite's LLVM aborts the process on bad IR given to a backend
        internalize(module, entries)
    tm = target_machine(gfx, opt_level, features)
    with timings.phase("LLVM optimisation"):
        pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        module.verify()
    with timings.phase("artifacts"):
        optimised = (str(module).encode(), module.as_bitcode())  # code generation then rewrites the module
    with timings.phase("object emission"):
        return tm.emit_object(module), optimised


def compile_code_objects(kernel: ir.KernelIR, meta: KernelMeta, gfx_targets: tuple, opt_level: int = 3,
                         fast_math: bool = False, *, target) -> dict:
    """Artifacts of one kernel for AMDGPU: "hsaco_<gfx>" per processor (every task's entry in
    one code object), and the first processor's optimised module as "ll" and "bc"."""
    text = generate_llvm(kernel, meta, fast_math, target)
    entries = {t.entry for t in meta.tasks}
    artifacts = {}
    for gfx in gfx_targets:
        obj, optimised = compile_for(text, gfx, entries, opt_level, wavefront_features(kernel))
        with timings.phase("linking"):
            artifacts[f"hsaco_{gfx}"] = linker.link(obj, f"kernel '{kernel.name}' for {gfx}")
        if "ll" not in artifacts:
            artifacts["ll"], artifacts["bc"] = optimised
    return artifacts
