"""Kernels on Vulkan: a compute pipeline per task from its SPIR-V (`spirv_t<i>`), built once
per loaded kernel, and the per-launch pieces the ABI fixes (docs/design.md, Devices and launches; the task
record's "bindings", runtime/contract/artifact.py):

- descriptor set layouts from the bindings: every buffer a storage buffer; "args" and
  "errors" are *dynamic* storage buffers, so a launch only changes their dynamic offsets (the
  args ring, the launch's error slot) and a descriptor set is reused across launches that bind
  the same fields, ndarrays and temporaries;
- the workgroup size through specialization constant 0 (the task's block_dim, 0 = the device's
  default);
- the "args" words: per parameter, a scalar of 8/16/32 bits is one 32-bit word (sign- or
  zero-extended), a 64-bit scalar two (low first), an ndarray one word per dimension (shape);
  built from the launcher's ctx words, which already hold every argument;
- capabilities: a module declaring a capability the device lacks is refused at load.
"""
from __future__ import annotations

import numpy as np

from ...contract.errors import QdcError
from ...contract.error_slot import ERROR_SLOT_WORDS
from ..spirv_abi import ArgsPlan, dispatch_grid, resolve_binding_word  # noqa: F401 (the ABI's shared part)

SPIRV_MAGIC = 0x07230203
OP_CAPABILITY = 17
# SPIR-V capability id -> (VulkanCapabilities field, what it is) for those a device may lack.
CAPABILITY_NEEDS = {
    9: ("float16", "Float16 (16-bit floats)"),
    10: ("float64", "Float64 (64-bit floats)"),
    11: ("int64", "Int64 (64-bit integers)"),
    12: ("int64_atomics", "Int64Atomics (64-bit integer atomics)"),
    22: ("int16", "Int16 (16-bit integers)"),
    39: ("int8", "Int8 (8-bit integers)"),
    61: ("subgroup_basic", "GroupNonUniform (subgroup operations in compute shaders)"),
    62: ("subgroup_vote", "GroupNonUniformVote (subgroup all/any in compute shaders)"),
    63: ("subgroup_arithmetic", "GroupNonUniformArithmetic (subgroup reductions in compute shaders)"),
    64: ("subgroup_ballot", "GroupNonUniformBallot (subgroup ballot and broadcast in compute shaders)"),
    65: ("subgroup_shuffle", "GroupNonUniformShuffle (subgroup shuffles in compute shaders)"),
    66: ("subgroup_shuffle_relative", "GroupNonUniformShuffleRelative (subgroup shuffle up/down in compute shaders)"),
    4466: ("ieee_preserve", "SignedZeroInfNanPreserve (IEEE signed zeros, infinities and NaNs kept)"),
    4433: ("storage_16bit", "StorageBuffer16BitAccess (16-bit values in buffers)"),
    4448: ("storage_8bit", "StorageBuffer8BitAccess (8-bit values in buffers)"),
    6033: ("atomic_float32_add", "AtomicFloat32AddEXT (atomic add on f32)"),
    6034: ("atomic_float64_add", "AtomicFloat64AddEXT (atomic add on f64)"),
    5347: ("buffer_device_address", "PhysicalStorageBufferAddresses (arrays reached by buffer device address)"),
}
DYNAMIC_RESOURCES = ("args", "errors", "addresses")
ERROR_SLOT_BYTES = 8 * ERROR_SLOT_WORDS


class UnsupportedKernelError(QdcError, ValueError):
    """A kernel's code needs something this Vulkan device does not have."""


def spirv_words(blob: bytes, what: str) -> np.ndarray:
    if len(blob) < 20 or len(blob) % 4:
        raise UnsupportedKernelError(f"{what}: not a SPIR-V module ({len(blob)} bytes)")
    words = np.frombuffer(blob, np.uint32)
    if int(words[0]) != SPIRV_MAGIC:
        raise UnsupportedKernelError(f"{what}: not a SPIR-V module (magic {int(words[0]):#x})")
    return words


def declared_capabilities(words: np.ndarray) -> list:
    """The OpCapability operands of a module (the layout rules put them first, after the header)."""
    caps, i = [], 5
    while i < len(words):
        head = int(words[i])
        count, opcode = head >> 16, head & 0xFFFF
        if count == 0 or opcode != OP_CAPABILITY:
            break
        caps.append(int(words[i + 1]))
        i += count
    return caps


def check_capabilities(words: np.ndarray, caps, what: str) -> None:
    for cap in declared_capabilities(words):
        need = CAPABILITY_NEEDS.get(cap)
        if need is not None and not getattr(caps, need[0]):
            raise UnsupportedKernelError(f"{what} needs {need[1]}, which the Vulkan device '{caps.name}' does not "
                                         f"support; run it on another device (QDC_VULKAN_DEVICE=N) or on arch=cpu")
