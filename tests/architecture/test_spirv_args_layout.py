"""The SPIR-V "args" words have one definition (runtime/contract/spirv_args.py): the compiler
reads each parameter at the words the devices pack it into, for scalars of every dtype (the
64-bit ones on two words, low first), vector and matrix parameters (a scalar per element),
ndarrays (one extent word per dimension) and the random state after them.

Checked twice: without a device, the compiler's offsets (from the kernel's IR) against the
words the devices' ArgsPlan packs (from the artifact's metadata and the launcher's ctx words);
and on a Vulkan device, a kernel that copies every argument out, against the arguments."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver.kernel import compile_kernel
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.spirv.lowering import arg_words
from qdc.runtime.contract import types as T
from qdc.runtime.contract.spirv_args import ArgsLayout
from qdc.runtime.devices.spirv_abi import ArgsPlan

from conftest import vulkan_unavailable_reason

SCALARS = {  # one value per dtype, chosen so that a word read from the wrong place shows
    "i8": -3, "i16": -1234, "i32": -123456789, "i64": -(2**40) - 7, "u8": 250, "u16": 65000,
    "u32": 4000000000, "u64": 2**63 + 2**35 + 11, "f16": -1.5, "f32": 0.1, "f64": 0.1,
}
VECTOR = np.array([0.5, -2.25, 3e-300])          # qd.types.vector(3, qd.f64): three f64 scalars
MATRIX = np.array([[2**33 + 1, -5], [7, -(2**34)]])  # qd.types.matrix(2, 2, qd.i64)
SHAPE = (3, 5)                                    # the ndarray's extents

F64_OUT = qd.types.ndarray(dtype=qd.f64, ndim=1)
I64_OUT = qd.types.ndarray(dtype=qd.i64, ndim=1)
U64_OUT = qd.types.ndarray(dtype=qd.u64, ndim=1)


@qd.kernel
def echo(a: qd.i8, b: qd.i16, c: qd.i32, d: qd.i64, e: qd.u8, f: qd.u16, g: qd.u32, h: qd.u64,
         p: qd.f16, q: qd.f32, r: qd.f64, v: qd.types.vector(3, qd.f64), m: qd.types.matrix(2, 2, qd.i64),
         arr: qd.types.ndarray(dtype=qd.f32, ndim=2), ints: I64_OUT, uints: U64_OUT, floats: F64_OUT):
    ints[0], ints[1], ints[2], ints[3] = a, b, c, d
    uints[0], uints[1], uints[2], uints[3] = e, f, g, h
    floats[0], floats[1], floats[2] = p, q, r
    for k in qd.static(range(3)):
        floats[3 + k] = v[k]
    for k in qd.static(range(2)):
        for j in qd.static(range(2)):
            ints[4 + 2 * k + j] = m[k, j]
    ints[8], ints[9] = arr.shape[0], arr.shape[1]


@qd.kernel
def echo_with_random(d: qd.i64, r: qd.f64, ints: I64_OUT, floats: F64_OUT):
    ints[0] = d
    floats[0] = r
    floats[1] = qd.random(qd.f64)


def _arguments():
    scalars = [SCALARS[name] for name in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64")]
    return scalars, qd.types.vector(3, qd.f64)(VECTOR), qd.types.matrix(2, 2, qd.i64)(MATRIX)


def _expected_scalars() -> dict:
    return {name: T.by_name(name).np_dtype.type(value) for name, value in SCALARS.items()}


# ---- without a device: the compiler's offsets against the devices' packing --------------------

def _ctx_word(value, dtype: T.DataType) -> int:
    """A scalar as the launcher writes its ctx word: its bytes in the low end, zero above."""
    raw = np.array([value], dtype.np_dtype).view(np.uint8)
    return int.from_bytes(raw.tobytes(), "little")


@pytest.mark.parametrize("kernel, random", [(echo, False), (echo_with_random, True)])
def test_the_compilers_offsets_read_what_the_devices_pack(kernel, random, rng):
    k = kernel_of(kernel)
    compiled = compile_kernel(k.fn, k.params_for(Options()), Options(arch="vulkan"), arch="vulkan")
    kir_params, meta = compiled.ir.params, compiled.meta
    assert (meta.random_slot is not None) == random
    assert len(kir_params) == len(meta.params)

    ctx = rng.integers(0, 2**63, meta.ctx_words, dtype=np.uint64)  # noise wherever nothing is written
    expected = {}
    for i, (p, pm) in enumerate(zip(kir_params, meta.params)):
        if p.kind == "ndarray":
            extents = rng.integers(1, 2**31 - 1, p.ndim)
            ctx[pm.slot + 1:pm.slot + 1 + p.ndim] = extents
            expected[i] = [int(x) for x in extents]
        else:
            value = p.dtype.np_dtype.type(rng.integers(-100, 100) * 1.25 if p.dtype.is_float else
                                          rng.integers(np.iinfo(p.dtype.np_dtype).min, np.iinfo(p.dtype.np_dtype).max,
                                                       dtype=p.dtype.np_dtype, endpoint=True))
            ctx[pm.slot] = _ctx_word(value, p.dtype)
            expected[i] = value
    if random:
        ctx[meta.random_slot:meta.random_slot + 2] = [0x1122334455667788, 0x99AABBCCDDEEFF00]

    words = ArgsPlan(meta).pack(ctx)
    offsets = arg_words(kir_params)  # the compiler's, as lowering.py reads them
    for i, p in enumerate(kir_params):
        first = offsets[i]
        if p.kind == "ndarray":
            assert words[first:first + p.ndim].tolist() == expected[i], p.name
            continue
        count = 2 if p.dtype.bits == 64 else 1
        raw = words[first:first + count].astype("<u4").tobytes()
        assert np.frombuffer(raw[:p.dtype.nbytes], p.dtype.np_dtype)[0] == expected[i], p.name
        if p.dtype in (T.i8, T.i16):  # sign-extended to the whole word
            assert int(words[first].view(np.int32)) == int(expected[i]), p.name
        elif count == 1 and p.dtype.bits < 32:
            assert int(words[first]) >> p.dtype.bits == 0, p.name
    if random:
        first = offsets[-1]
        assert words[first:first + 4].tolist() == [0x55667788, 0x11223344, 0xDDEEFF00, 0x99AABBCC]
        assert len(words) == first + 4
    else:
        assert len(words) == offsets[-1]


def test_the_layout_reads_parameters_of_either_side():
    """The compiler hands ir.Params (DataType dtypes), the devices ParamMetas (dtype names)."""
    k = kernel_of(echo)
    compiled = compile_kernel(k.fn, k.params_for(Options()), Options(arch="vulkan"), arch="vulkan")
    from_ir, from_meta = ArgsLayout(compiled.ir.params), ArgsLayout(compiled.meta.params)
    assert from_ir.words == from_meta.words and from_ir.first == from_meta.first
    # 8 scalars of up to 32 bits and 3 of 64 bits, then 3 f64 and 4 i64 elements, then 2 extents + 3 outputs' 1 each
    assert from_ir.random_first == 8 + 2 * 3 + 2 * 3 + 2 * 4 + 2 + 3


# ---- on a Vulkan device: a kernel reads back every argument ----------------------------------

@pytest.fixture
def vulkan(session_cache_dir):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    yield
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


def test_a_vulkan_kernel_reads_every_argument_where_the_device_put_it(vulkan):
    scalars, vector, matrix = _arguments()
    ints, uints, floats = np.zeros(10, np.int64), np.zeros(4, np.uint64), np.zeros(6, np.float64)
    arr = np.zeros(SHAPE, np.float32)
    echo(*scalars, vector, matrix, arr, ints, uints, floats)
    want = _expected_scalars()
    assert ints[:4].tolist() == [int(want[n]) for n in ("i8", "i16", "i32", "i64")]
    assert uints.tolist() == [int(want[n]) for n in ("u8", "u16", "u32", "u64")]
    assert floats[:3].tolist() == [float(want[n]) for n in ("f16", "f32", "f64")]
    assert floats[3:].tolist() == VECTOR.tolist()
    assert ints[4:8].tolist() == MATRIX.ravel().tolist()
    assert ints[8:].tolist() == list(SHAPE)


def test_a_vulkan_kernel_reads_its_arguments_and_the_random_state_after_them(vulkan):
    ints, floats = np.zeros(1, np.int64), np.zeros(2, np.float64)
    draws = []
    for _ in range(2):
        echo_with_random(SCALARS["i64"], SCALARS["f64"], ints, floats)
        assert ints[0] == SCALARS["i64"] and floats[0] == SCALARS["f64"]
        assert 0.0 <= floats[1] < 1.0
        draws.append(floats[1])
    assert draws[0] != draws[1]  # the launch counter's words were read: each launch draws anew
