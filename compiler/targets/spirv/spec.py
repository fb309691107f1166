"""The numbers of the SPIR-V specification (unified, 1.5/1.6 rev.) that the builder uses, and
of the GLSL.std.450 extended instruction set. Only what qdc emits; names as in the spec.

SPIR-V spec §2.3 (physical layout), §3 (binary form: the enumerants of §3.x cited below) and
§3.52 (instructions, with their opcodes); GLSL.std.450 spec §2 (extended instruction numbers).
"""
from __future__ import annotations

MAGIC = 0x07230203        # §3.1 magic number
VERSION_1_5 = 0x00010500  # §2.3: major in bits 16-23, minor in bits 8-15
GENERATOR = 0             # §2.3: 0 = unregistered tool

# §3.52 opcodes
class Op:
    Nop = 0
    Name = 5
    Extension = 10
    ExtInstImport = 11
    ExtInst = 12
    MemoryModel = 14
    EntryPoint = 15
    ExecutionMode = 16
    Capability = 17
    TypeVoid = 19
    TypeBool = 20
    TypeInt = 21
    TypeFloat = 22
    TypeVector = 23
    TypeRuntimeArray = 29
    TypeStruct = 30
    TypePointer = 32
    TypeFunction = 33
    ConstantTrue = 41
    ConstantFalse = 42
    Constant = 43
    ConstantComposite = 44
    ConstantNull = 46
    SpecConstant = 50
    SpecConstantComposite = 51
    Function = 54
    FunctionEnd = 56
    Variable = 59
    Load = 61
    Store = 62
    AccessChain = 65
    Decorate = 71
    MemberDecorate = 72
    CompositeConstruct = 80
    CompositeExtract = 81
    ConvertFToU = 109
    ConvertFToS = 110
    ConvertSToF = 111
    ConvertUToF = 112
    UConvert = 113
    SConvert = 114
    FConvert = 115
    ConvertUToPtr = 120
    Bitcast = 124
    SNegate = 126
    FNegate = 127
    IAdd = 128
    FAdd = 129
    ISub = 130
    FSub = 131
    IMul = 132
    FMul = 133
    UDiv = 134
    SDiv = 135
    FDiv = 136
    UMod = 137
    SRem = 138
    FRem = 140
    IsNan = 156
    LogicalEqual = 164
    LogicalNotEqual = 165
    LogicalOr = 166
    LogicalAnd = 167
    LogicalNot = 168
    Select = 169
    IEqual = 170
    INotEqual = 171
    UGreaterThan = 172
    SGreaterThan = 173
    UGreaterThanEqual = 174
    SGreaterThanEqual = 175
    ULessThan = 176
    SLessThan = 177
    ULessThanEqual = 178
    SLessThanEqual = 179
    FOrdEqual = 180
    FUnordNotEqual = 183
    FOrdLessThan = 184
    FOrdGreaterThan = 186
    FOrdLessThanEqual = 188
    FOrdGreaterThanEqual = 190
    ShiftRightLogical = 194
    ShiftRightArithmetic = 195
    ShiftLeftLogical = 196
    BitwiseOr = 197
    BitwiseXor = 198
    BitwiseAnd = 199
    Not = 200
    AtomicLoad = 227
    AtomicExchange = 229
    AtomicCompareExchange = 230
    AtomicIAdd = 234
    AtomicISub = 235
    AtomicSMin = 236
    AtomicUMin = 237
    AtomicSMax = 238
    AtomicUMax = 239
    AtomicAnd = 240
    AtomicOr = 241
    AtomicXor = 242
    LoopMerge = 246
    SelectionMerge = 247
    Label = 248
    Branch = 249
    BranchConditional = 250
    Return = 253
    Unreachable = 255
    GroupNonUniformElect = 333
    ControlBarrier = 224
    MemoryBarrier = 225
    TypeArray = 28
    GroupNonUniformAll = 334
    GroupNonUniformAny = 335
    GroupNonUniformBroadcast = 337
    GroupNonUniformBallot = 339
    GroupNonUniformShuffle = 345
    GroupNonUniformShuffleXor = 346
    GroupNonUniformShuffleUp = 347
    GroupNonUniformShuffleDown = 348
    GroupNonUniformIAdd = 349
    GroupNonUniformFAdd = 350
    GroupNonUniformIMul = 351
    GroupNonUniformFMul = 352
    GroupNonUniformSMin = 353
    GroupNonUniformUMin = 354
    GroupNonUniformFMin = 355
    GroupNonUniformSMax = 356
    GroupNonUniformUMax = 357
    GroupNonUniformFMax = 358
    GroupNonUniformBitwiseAnd = 359
    GroupNonUniformBitwiseOr = 360
    GroupNonUniformBitwiseXor = 361
    AtomicFAddEXT = 6035  # SPV_EXT_shader_atomic_float_add


class Capability:  # §3.31
    Shader = 1
    Float16 = 9
    Float64 = 10
    Int64 = 11
    Int64Atomics = 12
    Int16 = 22
    Int8 = 39
    GroupNonUniform = 61
    GroupNonUniformVote = 62
    GroupNonUniformArithmetic = 63
    GroupNonUniformBallot = 64
    GroupNonUniformShuffle = 65
    GroupNonUniformShuffleRelative = 66
    SignedZeroInfNanPreserve = 4466
    StorageBuffer16BitAccess = 4433
    StorageBuffer8BitAccess = 4448
    AtomicFloat32AddEXT = 6033
    PhysicalStorageBufferAddresses = 5347


ADDRESSING_LOGICAL = 0      # §3.4
ADDRESSING_PHYSICAL_STORAGE_BUFFER_64 = 5348
MEMORY_MODEL_GLSL450 = 1    # §3.5
EXECUTION_MODEL_GLCOMPUTE = 5  # §3.3
EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE = 4461  # §3.6 (SPIR-V 1.4)


class StorageClass:  # §3.7
    Input = 1
    Workgroup = 4
    Function = 7
    StorageBuffer = 12
    PhysicalStorageBuffer = 5349


MEMORY_ACCESS_ALIGNED = 0x2  # §3.26: followed by the alignment in bytes


class Decoration:  # §3.20
    SpecId = 1
    Block = 2
    ArrayStride = 6
    BuiltIn = 11
    NonWritable = 24
    NoContraction = 42
    Binding = 33
    DescriptorSet = 34
    Offset = 35


class BuiltIn:  # §3.21
    NumWorkgroups = 24
    WorkgroupSize = 25
    WorkgroupId = 26
    LocalInvocationId = 27
    GlobalInvocationId = 28
    SubgroupSize = 36
    SubgroupLocalInvocationId = 41


SCOPE_DEVICE = 1             # §3.27
SCOPE_WORKGROUP = 2
SCOPE_SUBGROUP = 3
GROUP_OPERATION_REDUCE = 0   # §3.28
SEMANTICS_RELAXED = 0        # §3.25
# AcquireRelease | UniformMemory (storage buffers) | WorkgroupMemory: what a barrier or fence orders
SEMANTICS_ACQ_REL_MEMORY = 0x8 | 0x40 | 0x100
SELECTION_CONTROL_NONE = 0   # §3.22
LOOP_CONTROL_NONE = 0        # §3.23
FUNCTION_CONTROL_NONE = 0    # §3.24


class GLSL:  # GLSL.std.450 §2 instruction numbers
    Round = 1
    RoundEven = 2
    Trunc = 3
    FAbs = 4
    SAbs = 5
    Floor = 8
    Ceil = 9
    Sin = 13
    Cos = 14
    Tan = 15
    Asin = 16
    Acos = 17
    Atan = 18
    Tanh = 21
    Atan2 = 25
    Pow = 26
    Exp = 27
    Log = 28
    Sqrt = 31
    InverseSqrt = 32
    UMin = 38
    SMin = 39
    UMax = 41
    SMax = 42
    NMin = 79
    NMax = 80


# GLSL.std.450 math that takes 16- or 32-bit floats only (the rest take 64-bit floats too).
GLSL_NO_FLOAT64 = frozenset((GLSL.Sin, GLSL.Cos, GLSL.Tan, GLSL.Asin, GLSL.Acos, GLSL.Atan, GLSL.Tanh,
                             GLSL.Atan2, GLSL.Pow, GLSL.Exp, GLSL.Log))
