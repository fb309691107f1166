"""Hand-written SPIR-V compute shaders following the Vulkan ABI (compiler/targets/vulkan/target.py),
for the Vulkan device's tests and bench/bench_vulkan.py: they exercise the device without the
compiler. Assemble them with qdc.compiler.targets.spirv.tools.assemble."""

# The ABI's prologue: invocation id and total from the 2-D grid and the block size (SpecId 0).
# The entry point is named as the task record that loads the shader names its entry.
HEAD = """
OpCapability Shader
{caps}
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "{entry}" %gid %nwg {interface}
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %nwg BuiltIn NumWorkgroups
OpDecorate %wgsize BuiltIn WorkgroupSize
OpDecorate %bx SpecId 0
OpDecorate %by SpecId 1
OpDecorate %bz SpecId 2
OpDecorate %rta_u32 ArrayStride 4
OpDecorate %rta_f32 ArrayStride 4
OpDecorate %UBlock Block
OpMemberDecorate %UBlock 0 Offset 0
OpDecorate %FBlock Block
OpMemberDecorate %FBlock 0 Offset 0
{decorations}
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%float = OpTypeFloat 32
%bool = OpTypeBool
%v3u = OpTypeVector %uint 3
%rta_u32 = OpTypeRuntimeArray %uint
%rta_f32 = OpTypeRuntimeArray %float
%UBlock = OpTypeStruct %rta_u32
%FBlock = OpTypeStruct %rta_f32
%p_ub = OpTypePointer StorageBuffer %UBlock
%p_fb = OpTypePointer StorageBuffer %FBlock
%p_u = OpTypePointer StorageBuffer %uint
%p_fl = OpTypePointer StorageBuffer %float
%p_in = OpTypePointer Input %v3u
%p_fn_u = OpTypePointer Function %uint
{variables}
%gid = OpVariable %p_in Input
%nwg = OpVariable %p_in Input
%bx = OpSpecConstant %uint 1
%by = OpSpecConstant %uint 1
%bz = OpSpecConstant %uint 1
%wgsize = OpSpecConstantComposite %v3u %bx %by %bz
%c0 = OpConstant %uint 0
%c1 = OpConstant %uint 1
%c2 = OpConstant %uint 2
%c4 = OpConstant %uint 4
%main = OpFunction %void None %fn
%entry = OpLabel
%i = OpVariable %p_fn_u Function
%g = OpLoad %v3u %gid
%gx = OpCompositeExtract %uint %g 0
%gy = OpCompositeExtract %uint %g 1
%nw = OpLoad %v3u %nwg
%nx = OpCompositeExtract %uint %nw 0
%ny = OpCompositeExtract %uint %nw 1
%rowlen = OpIMul %uint %nx %bx
%yoff = OpIMul %uint %gy %rowlen
%id = OpIAdd %uint %gx %yoff
%total = OpIMul %uint %rowlen %ny
"""

# y[i] = a * x[i] + y[i]; args: a (f32 bits), shape of x, shape of y; grid-stride loop.
SAXPY = HEAD.format(caps="{caps}", entry="saxpy_t0", interface="%args %x %y", decorations="""
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %x DescriptorSet 0
OpDecorate %x Binding 1
OpDecorate %y DescriptorSet 0
OpDecorate %y Binding 2""", variables="""
%args = OpVariable %p_ub StorageBuffer
%x = OpVariable %p_fb StorageBuffer
%y = OpVariable %p_fb StorageBuffer""") + """
%pa = OpAccessChain %p_u %args %c0 %c0
%abits = OpLoad %uint %pa
%a = OpBitcast %float %abits
%pn = OpAccessChain %p_u %args %c0 %c1
%n = OpLoad %uint %pn
OpStore %i %id
OpBranch %header
%header = OpLabel
OpLoopMerge %merge %continue None
OpBranch %cond
%cond = OpLabel
%iv = OpLoad %uint %i
%lt = OpULessThan %bool %iv %n
OpBranchConditional %lt %body %merge
%body = OpLabel
%px = OpAccessChain %p_fl %x %c0 %iv
%xv = OpLoad %float %px
%py = OpAccessChain %p_fl %y %c0 %iv
%yv = OpLoad %float %py
%ax = OpFMul %float %a %xv
%s = OpFAdd %float %ax %yv
OpStore %py %s
OpBranch %continue
%continue = OpLabel
%inext = OpIAdd %uint %iv %total
OpStore %i %inext
OpBranch %header
%merge = OpLabel
OpReturn
OpFunctionEnd
"""

# Every invocation stores args[0] (a bounds failure code) and args[1] (the index) into the
# launch's error slot: word BOUNDS_WORD (u32 index 2) and the next (u32 index 4).
FAIL = HEAD.format(caps="", entry="fail_t0", interface="%args %errors", decorations="""
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %errors DescriptorSet 0
OpDecorate %errors Binding 1""", variables="""
%args = OpVariable %p_ub StorageBuffer
%errors = OpVariable %p_ub StorageBuffer""") + """
%pcode = OpAccessChain %p_u %args %c0 %c0
%code = OpLoad %uint %pcode
%pidx = OpAccessChain %p_u %args %c0 %c1
%idx = OpLoad %uint %pidx
%pe = OpAccessChain %p_u %errors %c0 %c2
OpStore %pe %code
%pi = OpAccessChain %p_u %errors %c0 %c4
OpStore %pi %idx
OpReturn
OpFunctionEnd
"""


# Does nothing: an empty dispatch, for launch overhead.
EMPTY = HEAD.format(caps="", entry="empty_t0", interface="%args", decorations="""
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0""", variables="""
%args = OpVariable %p_ub StorageBuffer""") + """
OpReturn
OpFunctionEnd
"""
