"""Locals, arguments, temporaries, fields, ndarrays and atomics in SPIR-V (a mixin of
lowering.TaskLowering; the ABI is in compiler/targets/vulkan/target.py's docstring).

- "args": 32-bit words; a parameter's scalar in one word (two for 64 bits, low first), an
  ndarray's extents one word per dimension (i32: the launcher refuses larger arrays); then,
  in a kernel that draws random numbers, the four words of its random state.
- "temps": kernel temporary s in the 8 bytes at 8*s, its value in the low bytes.
- "field" i / "ndarray" p / "ndarray_grad" p: the elements, row-major; a u1 is a byte. A task
  lowered with `address_arrays` binds none of them: it reads each array's buffer device address
  (a u64, two words, low first) from "addresses" at word 2k, k its place in `addressed`, and
  reaches the elements through PhysicalStorageBuffer pointers.
The launch-constant buffers (LAUNCH_CONSTANT: the device writes them before a launch, no shader
writes them) are decorated NonWritable, and each of their words a task reads is loaded once, in
the entry block, as is what depends on them alone: ndarray extents, scalar arguments, each
addressed array's base pointer (one OpConvertUToPtr per array and element type). An access is
then one OpAccessChain from a base, wherever it is.
Atomics: integers of 32 and 64 bits natively; f32 add natively where the target has float
atomic add (SPV_EXT_shader_atomic_float_add), other float updates and every multiplication
(`qd.atomic_mul`) as compare-and-swap loops on the element's bits.
"""
from __future__ import annotations

import math

from qdc.runtime.contract import types as T
from qdc.runtime.contract.bounds import MAX_AXES
from qdc.runtime.contract.error_slot import BOUNDS_WORD

from ... import ir
from ...passes.reductions import COMBINE  # an atomic's update as a combination (sub adds -v)
from ..base import Unsupported
from .spec import (GROUP_OPERATION_REDUCE, MEMORY_ACCESS_ALIGNED, SCOPE_DEVICE, SCOPE_SUBGROUP, SEMANTICS_RELAXED,
                   Capability, Decoration, Op, StorageClass)

ARRAY_RESOURCES = ("field", "ndarray", "ndarray_grad")  # what `address_arrays` reaches by address
# Written by the device before a launch (runtime/devices/vulkan/pipelines.py, LAUNCH_WRITTEN), read-only here
LAUNCH_CONSTANT = ("args", "addresses", "adstack_meta")

_INT_ATOMICS = {"add": Op.AtomicIAdd, "sub": Op.AtomicISub, "and": Op.AtomicAnd, "or": Op.AtomicOr,
                "xor": Op.AtomicXor, ("min", True): Op.AtomicSMin, ("min", False): Op.AtomicUMin,
                ("max", True): Op.AtomicSMax, ("max", False): Op.AtomicUMax}
_BITS_OF = {8: T.u8, 16: T.u16, 32: T.u32, 64: T.u64}
# (combination, kind) -> the subgroup reduction; float min/max are left out (their NaN rules
# differ from the atomics'), and so are 64-bit values (shaderSubgroupExtendedTypes).
_SUBGROUP_REDUCE = {("add", "float"): Op.GroupNonUniformFAdd, ("add", "int"): Op.GroupNonUniformIAdd,
                    ("add", "uint"): Op.GroupNonUniformIAdd, ("min", "int"): Op.GroupNonUniformSMin,
                    ("min", "uint"): Op.GroupNonUniformUMin, ("max", "int"): Op.GroupNonUniformSMax,
                    ("max", "uint"): Op.GroupNonUniformUMax, ("mul", "float"): Op.GroupNonUniformFMul,
                    ("mul", "int"): Op.GroupNonUniformIMul, ("mul", "uint"): Op.GroupNonUniformIMul,
                    ("and", "int"): Op.GroupNonUniformBitwiseAnd,
                    ("and", "uint"): Op.GroupNonUniformBitwiseAnd, ("or", "int"): Op.GroupNonUniformBitwiseOr,
                    ("or", "uint"): Op.GroupNonUniformBitwiseOr, ("xor", "int"): Op.GroupNonUniformBitwiseXor,
                    ("xor", "uint"): Op.GroupNonUniformBitwiseXor, ("min", "float"): Op.GroupNonUniformFMin,
                    ("max", "float"): Op.GroupNonUniformFMax}


class MemoryLowering:
    # ---- buffers --------------------------------------------------------------------------------
    def buffer(self, resource: str, index: int, t: T.DataType) -> int:
        """The variable viewing buffer (resource, index) as an array of `t` (bound on first use)."""
        key = (resource, index)
        binding = self.bindings.setdefault(key, len(self.bindings))
        element = self.ty(t)
        var = self.views.get((key, element))
        if var is None:
            if t.bits in (8, 16):
                self.m.require(Capability.StorageBuffer8BitAccess if t.bits == 8 else
                               Capability.StorageBuffer16BitAccess)
            name = f"{resource}{index}" if resource in ARRAY_RESOURCES else resource
            var = self.views[key, element] = self.m.storage_buffer(element, t.nbytes, 0, binding, name)
            if resource in LAUNCH_CONSTANT:
                self.m.decorate(var, Decoration.NonWritable)
        return var

    def element(self, resource: str, index: int, t: T.DataType, position: int) -> int:
        """A pointer to element `position` (an id) of the buffer viewed as `t`."""
        if self.addressed is not None and resource in ARRAY_RESOURCES:
            return self.addressed_element((resource, index), t, position)
        ptr_type = self.m.pointer(StorageClass.StorageBuffer, self.ty(t))
        return self.fb.emit(Op.AccessChain, ptr_type, self.buffer(resource, index, t), self.c(T.u32, 0), position)

    def entry_value(self, key, compute) -> int:
        """`compute()`, emitted once for the whole task in the entry block (which dominates every
        use): for values of constants and launch-constant words alone."""
        value = self.entry_values.get(key)
        if value is None:
            with self.fb.at_entry():
                value = self.entry_values[key] = compute()
        return value

    def addressed_element(self, key: tuple, t: T.DataType, position: int) -> int:
        """A PhysicalStorageBuffer pointer to element `position` of array `key`, from the array's
        base pointer. Loads and stores through it say its alignment (`aligned`)."""
        base = self.entry_value(("base", key, t), lambda: self.array_base(key, t))
        pointer = self.fb.emit(Op.AccessChain, self.m.pointer(StorageClass.PhysicalStorageBuffer, self.ty(t)), base,
                               self.c(T.u32, 0), position)
        self.aligned[pointer] = t.nbytes
        return pointer

    def array_base(self, key: tuple, t: T.DataType) -> int:
        """Array `key` as a PhysicalStorageBuffer block of `t`, from the address the launch wrote
        for it (a u64, two words of "addresses" at its slot)."""
        slot = self.addressed.setdefault(key, len(self.addressed))
        address = self.entry_value(("address", key), lambda: self.from_words(
            [self.word("addresses", 0, 2 * slot + i) for i in range(2)], T.u64))
        self.m.require(Capability.PhysicalStorageBufferAddresses)
        if t.bits in (8, 16):
            self.m.require(Capability.StorageBuffer8BitAccess if t.bits == 8 else Capability.StorageBuffer16BitAccess)
        block = self.m.buffer_block(self.ty(t), t.nbytes)
        return self.fb.emit(Op.ConvertUToPtr, self.m.pointer(StorageClass.PhysicalStorageBuffer, block), address)

    def memory_access(self, pointer: int) -> tuple:
        """The memory operands a load or store through `pointer` needs (Aligned for an address)."""
        alignment = self.aligned.get(pointer)
        return () if alignment is None else (MEMORY_ACCESS_ALIGNED, alignment)

    def word(self, resource: str, index: int, position: int) -> int:
        """The u32 word at constant `position` of a buffer (of a launch-constant one: loaded once)."""
        def load():
            return self.fb.emit(Op.Load, self.ty(T.u32), self.element(resource, index, T.u32, self.c(T.u32, position)))
        return self.entry_value(("word", resource, index, position), load) if resource in LAUNCH_CONSTANT else load()

    def from_words(self, words: list, t: T.DataType) -> int:
        """A value of type `t` from its one (two for 64 bits, low first) little-endian u32 words."""
        if t is T.u1:
            return self.boolean(Op.INotEqual, words[0], self.c(T.u32, 0))
        if t.bits == 64:
            lo, hi = (self.op(Op.UConvert, T.u64, w) for w in words)
            bits = self.op(Op.BitwiseOr, T.u64, lo, self.op(Op.ShiftLeftLogical, T.u64, hi, self.c(T.u64, 32)))
        elif t.bits < 32:
            bits = self.op(Op.UConvert, _BITS_OF.get(t.bits, T.u8), words[0])
        else:
            bits = words[0]
        unsigned = _BITS_OF.get(t.bits, T.u8)
        return bits if t is unsigned else self.op(Op.Bitcast, t, bits)

    def to_words(self, v: int, t: T.DataType) -> list:
        """`v`'s u32 words (one, or two for 64 bits), narrower values zero-extended."""
        if t is T.u1:
            return [self.select(T.u32, v, self.c(T.u32, 1), self.c(T.u32, 0))]
        unsigned = _BITS_OF.get(t.bits, T.u8)
        bits = v if t is unsigned else self.op(Op.Bitcast, unsigned, v)
        if t.bits == 64:
            hi = self.op(Op.ShiftRightLogical, T.u64, bits, self.c(T.u64, 32))
            return [self.op(Op.UConvert, T.u32, bits), self.op(Op.UConvert, T.u32, hi)]
        return [bits if t.bits == 32 else self.op(Op.UConvert, T.u32, bits)]

    # ---- arguments ------------------------------------------------------------------------------------
    def s_ArgLoad(self, s):
        first = self.arg_word[s.arg_index]
        count = 2 if s.type.bits == 64 else 1
        return self.entry_value(("arg", s.arg_index, s.type), lambda: self.from_words(
            [self.word("args", 0, first + i) for i in range(count)], s.type))

    def s_NdarrayShape(self, s):
        return self.ndarray_extent(s.arg_index, s.dim, s.type)

    def ndarray_extent(self, arg_index: int, dim: int, t: T.DataType) -> int:
        """An ndarray argument's extent along `dim` (an i32 word of "args") as a `t`."""
        return self.entry_value(("extent", arg_index, dim, t), lambda: self.convert(self.op(
            Op.Bitcast, T.i32, self.word("args", 0, self.arg_word[arg_index] + dim)), T.i32, t))

    def s_RandomState(self, s):
        return self.word("args", 0, self.random_word + s.word)

    # ---- locals ---------------------------------------------------------------------------------------
    def s_Alloca(self, s):
        var = self.fb.local_variable(self.ty(s.type))
        self.fb.emit_void(Op.Store, var, self.c(s.type, 0))
        return var

    def s_LocalLoad(self, s):
        return self.fb.emit(Op.Load, self.ty(s.type), self.v(s.var))

    def s_LocalStore(self, s):
        self.fb.emit_void(Op.Store, self.v(s.var), self.v(s.value))

    def s_LocalAccumulate(self, s):
        """A per-invocation partial of a reduction (chunk_init / chunk_final around the body)."""
        t, var = s.var.type, self.v(s.var)
        old = self.fb.emit(Op.Load, self.ty(t), var)
        self.fb.emit_void(Op.Store, var, self.combine(s.op, t, old, self.v(s.value)))

    def s_LocalAtomic(self, s):
        """Single-invocation semantics (before offloading makes it a TempAtomic)."""
        t, var = s.type, self.v(s.var)
        old = self.fb.emit(Op.Load, self.ty(t), var)
        value = self.v(s.value)
        if s.op == "sub":
            value = self.op(Op.FNegate if t.is_float else Op.SNegate, t, value)
        self.fb.emit_void(Op.Store, var, self.combine("add" if s.op == "sub" else s.op, t, old, value))
        return old

    def combine(self, op: str, t: T.DataType, a: int, b: int) -> int:
        binary = {"add": "add", "mul": "mul", "min": "min", "max": "max", "and": "bit_and", "or": "bit_or",
                  "xor": "bit_xor"}[op]
        if t is T.u1:
            return self.bool_binary(binary, a, b)
        return self.float_binary(binary, a, b, t) if t.is_float else self.int_binary(binary, a, b, t)

    # ---- temporaries ------------------------------------------------------------------------------
    def s_TempLoad(self, s):
        count = 2 if s.type.bits == 64 else 1
        return self.from_words([self.word("temps", 0, 2 * s.slot + i) for i in range(count)], s.type)

    def s_TempStore(self, s):
        for i, w in enumerate(self.to_words(self.v(s.value), s.value.type)):
            self.fb.emit_void(Op.Store, self.element("temps", 0, T.u32, self.c(T.u32, 2 * s.slot + i)), w)

    def s_TempAtomic(self, s):
        def locate(view: T.DataType) -> int:
            position = 2 * s.slot if view.bits == 32 else s.slot
            return self.element("temps", 0, view, self.c(T.u32, position))
        if self.flushing_partials:
            return self.flush_partial(s.op, s.type, self.v(s.value), locate)
        return self.atomic(s.op, s.type, self.v(s.value), locate)

    # ---- fields and ndarrays ------------------------------------------------------------------------
    def s_GlobalPtr(self, s):
        target = s.target
        # 64-bit for a 64-bit index or a field past 2**31 elements; an ndarray never is (its
        # extents are i32 words: the launcher refuses a larger one)
        wide = any(i.type.bits == 64 for i in s.indices) or \
            isinstance(target, ir.FieldRef) and math.prod(target.shape) >= 1 << 31
        it = T.i64 if wide else T.i32
        if isinstance(target, ir.FieldRef):
            key = ("field", target.slot)

            def extent(d: int) -> int:
                return self.c(it, target.shape[d])
        else:
            key = ("ndarray_grad" if target.is_grad else "ndarray", target.arg_index)

            def extent(d: int) -> int:
                return self.ndarray_extent(target.arg_index, d, it)
        linear = self.c(T.i32, 0)
        indices = []
        for n, idx in enumerate(s.indices):
            i = self.convert(self.v(idx), idx.type, it)
            indices.append(i)
            linear = i if n == 0 else self.op(Op.IAdd, it, self.op(Op.IMul, it, linear, extent(n)), i)
        if s in self.check_ids:
            linear = self.bounds_checked(s, it, linear, indices, [extent(d) for d in range(len(indices))])
        self.pointers[s] = (key, linear)
        self.index_types[s] = it if s.indices else T.i32
        return self.element(*key, self.mem_type(s.type), linear)

    # ---- debug bounds checks (runtime/contract/bounds.py) -----------------------------------------
    def bounds_checked(self, s, it: T.DataType, linear: int, indices: list, dims: list) -> int:
        """`linear` when every index is below its dimension (one unsigned compare each, which
        also catches negative ones), else 0 after recording the first failing axis and its
        index in the launch's bounds words; the store or atomic through the pointer is skipped
        (`guards`), a load reads element 0: memory outside the array is never touched."""
        unsigned = T.u64 if it is T.i64 else T.u32
        as_u = lambda v: self.op(Op.Bitcast, unsigned, v)  # noqa: E731
        in_range = [self.boolean(Op.ULessThan, as_u(i), as_u(d)) for i, d in zip(indices, dims)]
        ok = in_range[0]
        for r in in_range[1:]:
            ok = self.boolean(Op.LogicalAnd, ok, r)
        self.guards[s] = ok
        check = self.check_ids[s]

        def fail():
            code, value = self.c(T.u32, 0), self.c(it, 0)
            for axis in reversed(range(len(indices))):  # the first failing axis is reported
                bad = self.boolean(Op.LogicalNot, in_range[axis])
                code = self.select(T.u32, bad, self.c(T.u32, check * MAX_AXES + axis + 1), code)
                value = self.select(it, bad, indices[axis], value)
            self.record_bounds_failure(code, value, it)
        self.if_then(ok, lambda: None, fail)
        return self.select(it, ok, linear, self.c(it, 0))

    def record_bounds_failure(self, code: int, value: int, it: T.DataType) -> None:
        """The first failure of a launch (compare-and-swap from 0) stores its code and index."""
        scope, relaxed = self.c(T.u32, SCOPE_DEVICE), self.c(T.u32, SEMANTICS_RELAXED)
        if self.caps.int64:
            self.m.require(Capability.Int64Atomics)
            word = self.element("errors", 0, T.u64, self.c(T.u32, BOUNDS_WORD))
            seen = self.fb.emit(Op.AtomicCompareExchange, self.ty(T.u64), word, scope, relaxed, relaxed,
                                self.op(Op.UConvert, T.u64, code), self.c(T.u64, 0))
            won = self.boolean(Op.IEqual, seen, self.c(T.u64, 0))
            index = self.op(Op.Bitcast, T.u64, self.convert(value, it, T.i64))
            self.if_then(won, lambda: self.fb.emit_void(
                Op.Store, self.element("errors", 0, T.u64, self.c(T.u32, BOUNDS_WORD + 1)), index))
            return
        word = self.element("errors", 0, T.u32, self.c(T.u32, 2 * BOUNDS_WORD))
        seen = self.fb.emit(Op.AtomicCompareExchange, self.ty(T.u32), word, scope, relaxed, relaxed, code,
                            self.c(T.u32, 0))
        won = self.boolean(Op.IEqual, seen, self.c(T.u32, 0))
        negative = self.boolean(Op.SLessThan, value, self.c(T.i32, 0))

        def store():
            low = self.element("errors", 0, T.u32, self.c(T.u32, 2 * BOUNDS_WORD + 2))
            high = self.element("errors", 0, T.u32, self.c(T.u32, 2 * BOUNDS_WORD + 3))
            self.fb.emit_void(Op.Store, low, self.op(Op.Bitcast, T.u32, value))
            self.fb.emit_void(Op.Store, high, self.select(T.u32, negative, self.c(T.u32, 0xFFFFFFFF),
                                                          self.c(T.u32, 0)))
        self.if_then(won, store)

    def guarded(self, ptr_stmt, emit):
        """`emit()` only where the checked pointer `ptr_stmt` is in range."""
        ok = self.guards.get(ptr_stmt)
        if ok is None:
            return emit()
        self.if_then(ok, emit)

    def s_GlobalLoad(self, s):
        v = self.fb.emit(Op.Load, self.ty(self.mem_type(s.type)), self.v(s.ptr), *self.memory_access(self.v(s.ptr)))
        return self.boolean(Op.INotEqual, v, self.c(T.u8, 0)) if s.type is T.u1 else v

    def s_GlobalStore(self, s):
        v = self.v(s.value)
        if s.value.type is T.u1:
            v = self.select(T.u8, v, self.c(T.u8, 1), self.c(T.u8, 0))
        self.guarded(s.ptr, lambda: self.fb.emit_void(Op.Store, self.v(s.ptr), v, *self.memory_access(self.v(s.ptr))))

    def s_AtomicRMW(self, s):
        key, linear = self.pointers[s.ptr]
        if s.type is not T.u1 and s.type.bits < 32:
            def update():
                return self.subword_atomic(s.op, s.type, self.v(s.value), key, linear, self.index_types[s.ptr])
        else:
            def update():
                return self.atomic(s.op, s.type, self.v(s.value), lambda view: self.element(*key, view, linear))
            if self.flushing_partials and s.ptr not in self.guards:
                return self.flush_partial(s.op, s.type, self.v(s.value), lambda view: self.element(*key, view, linear))
        if s.ptr not in self.guards:
            return update()
        result = self.fb.local_variable(self.ty(s.type))  # the old value; 0 where the access is skipped
        self.fb.emit_void(Op.Store, result, self.c(s.type, 0))

        def run():
            self.fb.emit_void(Op.Store, result, update())
        self.guarded(s.ptr, run)
        return self.fb.emit(Op.Load, self.ty(s.type), result)

    # ---- atomics ---------------------------------------------------------------------------------------
    def flush_partial(self, op: str, t: T.DataType, value: int, locate) -> int:
        """chunk_final's atomic of a per-invocation partial (passes/reductions.py), combined
        across the subgroup first so that one elected invocation per subgroup does the atomic:
        32x fewer atomics on one address on NVIDIA. Only the invocations that ran iterations
        take part (group operations are defined on the active ones). The old value is unused.
        32-bit types and f64 (64-bit integers in group operations need a device feature of their
        own, and have native atomics): float min/max and f64 add are compare-and-swap loops, and
        one per invocation on one address ran long enough for an NVIDIA driver to drop the device."""
        opcode = _SUBGROUP_REDUCE.get((op, t.kind)) if t.bits == 32 or t is T.f64 else None
        if opcode is None:
            return self.atomic(op, t, value, locate)
        self.m.require(Capability.GroupNonUniform)
        self.m.require(Capability.GroupNonUniformArithmetic)
        subgroup = self.c(T.u32, SCOPE_SUBGROUP)
        total = self.fb.emit(opcode, self.ty(t), subgroup, GROUP_OPERATION_REDUCE, value)
        elected = self.fb.emit(Op.GroupNonUniformElect, self.m.bool(), subgroup)
        self.if_then(elected, lambda: self.atomic(op, t, total, locate))
        return self.c(t, 0)

    def atomic(self, op: str, t: T.DataType, value: int, locate) -> int:
        """`op` applied atomically at the element `locate(view type)` points to; the old value."""
        if t is T.u1 or t.bits < 32:
            raise Unsupported(f"atomic '{op}' on {t.name} is not available on target '{self.arch}' here (8- and "
                              f"16-bit atomics are supported on field and ndarray elements only)")
        scope, relaxed = self.c(T.u32, SCOPE_DEVICE), self.c(T.u32, SEMANTICS_RELAXED)
        if t.bits == 64:
            if not self.caps.int64:
                raise Unsupported(f"atomic '{op}' on {t.name} needs 64-bit atomics, which target '{self.arch}' "
                                  f"does not have")
            self.m.require(Capability.Int64Atomics)
        if op == "mul":  # no multiplying atomic: a compare-and-swap loop on the element's bits
            return self.cas_loop(op, t, value, locate(_BITS_OF[t.bits]))
        if op == "xchg":  # on the element's bits: a float exchange needs no float-atomics feature
            bits_t = _BITS_OF[t.bits]
            bits = value if t is bits_t else self.op(Op.Bitcast, bits_t, value)
            old = self.fb.emit(Op.AtomicExchange, self.ty(bits_t), locate(bits_t), scope, relaxed, bits)
            return old if t is bits_t else self.op(Op.Bitcast, t, old)
        if not t.is_float:
            opcode = _INT_ATOMICS.get(op) or _INT_ATOMICS[op, t.kind == "int"]
            return self.fb.emit(opcode, self.ty(t), locate(t), scope, relaxed, value)
        if op == "sub":
            op, value = "add", self.op(Op.FNegate, t, value)
        if op == "add" and t is T.f32 and self.caps.float_atomic_add:
            self.m.require(Capability.AtomicFloat32AddEXT, "SPV_EXT_shader_atomic_float_add")
            return self.fb.emit(Op.AtomicFAddEXT, self.ty(t), locate(t), scope, relaxed, value)
        if op not in ("add", "min", "max"):
            raise Unsupported(f"atomic '{op}' on {t.name}")
        return self.cas_loop(op, t, value, locate(_BITS_OF[t.bits]))

    def subword_atomic(self, op: str, t: T.DataType, value: int, key, linear: int, it: T.DataType) -> int:
        """An 8- or 16-bit element updated atomically: a compare-and-swap loop on the u32 word
        that holds it (buffers are bound at word-aligned offsets; elements are little-endian in
        their word), leaving the word's other elements as they are. The old value."""
        if op not in COMBINE:
            raise Unsupported(f"atomic '{op}' on {t.name}")
        per_word = 32 // t.bits
        word_index = self.op(Op.ShiftRightLogical, it, linear, self.c(it, per_word.bit_length() - 1))
        lane = self.convert(self.op(Op.BitwiseAnd, it, linear, self.c(it, per_word - 1)), it, T.u32)
        shift = self.op(Op.IMul, T.u32, lane, self.c(T.u32, t.bits))
        mask = self.c(T.u32, (1 << t.bits) - 1)
        keep = self.op(Op.Not, T.u32, self.op(Op.ShiftLeftLogical, T.u32, mask, shift))
        pointer = self.element(*key, T.u32, word_index)
        narrow = _BITS_OF[t.bits]

        def element_of(word: int) -> int:
            bits = self.op(Op.UConvert, narrow, self.op(Op.BitwiseAnd, T.u32,
                                                         self.op(Op.ShiftRightLogical, T.u32, word, shift), mask))
            return bits if t is narrow else self.op(Op.Bitcast, t, bits)

        operand = value
        if op == "sub":
            operand = self.op(Op.FNegate if t.is_float else Op.SNegate, t, value)

        def desired(expected: int) -> int:
            updated = self.combine(COMBINE[op], t, element_of(expected), operand)
            bits = updated if t is narrow else self.op(Op.Bitcast, narrow, updated)
            placed = self.op(Op.ShiftLeftLogical, T.u32, self.op(Op.UConvert, T.u32, bits), shift)
            return self.op(Op.BitwiseOr, T.u32, self.op(Op.BitwiseAnd, T.u32, expected, keep), placed)
        return element_of(self.compare_and_swap_loop(T.u32, pointer, desired))

    def cas_loop(self, op: str, t: T.DataType, value: int, pointer: int) -> int:
        """`op(*p, value)` stored atomically at `p` (viewed as unsigned bits); the old value."""
        bits_t = _BITS_OF[t.bits]
        if t is bits_t:  # already the unsigned bits (OpBitcast needs two different types)
            return self.compare_and_swap_loop(bits_t, pointer, lambda expected: self.combine(op, t, expected, value))

        def desired(expected: int) -> int:
            return self.op(Op.Bitcast, bits_t, self.combine(op, t, self.op(Op.Bitcast, t, expected), value))
        return self.op(Op.Bitcast, t, self.compare_and_swap_loop(bits_t, pointer, desired))

    def compare_and_swap_loop(self, bits_t: T.DataType, pointer: int, desired) -> int:
        """old = *p; until compare-and-swap(p, old, desired(old)) sees `old`: retry with what it
        saw. The word it replaced (an unsigned integer of type `bits_t`)."""
        fb, bits = self.fb, self.ty(bits_t)
        scope, relaxed = self.c(T.u32, SCOPE_DEVICE), self.c(T.u32, SEMANTICS_RELAXED)
        seen = fb.local_variable(bits)
        fb.emit_void(Op.Store, seen, fb.emit(Op.AtomicLoad, bits, pointer, scope, relaxed))
        header, body, cont, merge = (fb.new_label() for _ in range(4))
        fb.branch(header)
        fb.place(header)
        fb.loop_header(merge, cont)
        fb.branch(body)
        fb.place(body)
        expected = fb.emit(Op.Load, bits, seen)
        found = fb.emit(Op.AtomicCompareExchange, bits, pointer, scope, relaxed, relaxed, desired(expected), expected)
        fb.emit_void(Op.Store, seen, found)
        fb.branch_conditional(self.boolean(Op.IEqual, found, expected), merge, cont)
        fb.place(cont)
        fb.branch(header)
        fb.place(merge)
        return fb.emit(Op.Load, bits, seen)
