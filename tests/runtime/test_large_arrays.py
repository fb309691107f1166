"""Arrays past 2**31 elements (runtime/contract/extents.py): on cpu (and cuda, amdgpu) shapes
and element indices are 64-bit, checked on sparse memmaps that take no real memory (only the
pages a kernel touches exist) and on a numpy array faked to 2**40 elements; vulkan and metal
refuse an array their 32-bit extents cannot index, at bind, naming kernel and parameter. On an
NVIDIA GPU a real 2**31 + 1 element array is walked whole (skipped without one)."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.amdgpu import linker
from qdc.compiler.targets.spirv import tools as spirv_tools
from qdc.runtime.contract import extents


PAST_I32 = 2**31 + 1
PAST_U32 = 2**32 + 8  # as an i32 this shape reads 8: a[a.shape[0] - 1] would write a[7]
TAIL = 4


def sparse_memmap(tmp_path, dtype, shape) -> np.memmap:
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return np.memmap(path, dtype, "r+", shape=shape)


def fake_array(n: int) -> np.ndarray:
    """A C-contiguous float32 array of `n` elements over 4 real bytes: only its shape may be used."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(n,), strides=(4,))


@qd.kernel
def write_tail(a: qd.types.ndarray(dtype=qd.f32, ndim=1), last: qd.f32, base: qd.f32):
    a[a.shape[0] - 1] = last
    for i in range(a.shape[0] - TAIL, a.shape[0] - 1):
        a[i] = base + qd.f32(i - (a.shape[0] - TAIL))


@qd.kernel
def length(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.i64:
    return a.shape[0]


@pytest.mark.parametrize("n", [PAST_I32, PAST_U32])
def test_last_elements_past_2_31_and_2_32_are_written_where_numpy_says(tmp_path, rng, n):
    a = sparse_memmap(tmp_path, np.float32, (n,))
    last, base = (float(v) for v in rng.uniform(1, 100, 2).astype(np.float32))
    write_tail(a, last, base)
    expected = np.zeros(TAIL + 4, np.float32)
    expected[-TAIL:] = [base, base + 1, base + 2, last]
    np.testing.assert_array_equal(a[-(TAIL + 4):], expected)
    assert not a[:16].any(), "an index wrapped to the array's start"


@pytest.mark.parametrize("n", [PAST_I32, PAST_U32])
def test_a_shape_past_2_32_is_read_exactly(tmp_path, n):
    total = qd.field(qd.i64, shape=())

    @qd.kernel
    def store_length(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        total[None] = a.shape[0]

    a = sparse_memmap(tmp_path, np.float32, (n,))
    assert length(a) == n
    store_length(a)
    assert total[None] == n


def test_two_dimensional_indices_past_2_32(tmp_path, rng):
    """Rows of 2**30 + 1 elements: the last row starts past 2**31 and ends past 2**32 + 2**30."""
    @qd.kernel
    def corner(a: qd.types.ndarray(dtype=qd.f32, ndim=2), value: qd.f32):
        for i, j in qd.ndrange((a.shape[0] - 2, a.shape[0]), (a.shape[1] - 3, a.shape[1])):
            a[i, j] = value + qd.f32(10 * (a.shape[0] - 1 - i) + (a.shape[1] - 1 - j))

    rows, cols = 5, 2**30 + 1
    a = sparse_memmap(tmp_path, np.float32, (rows, cols))
    value = float(np.float32(rng.uniform(1, 100)))
    corner(a, value)
    expected = np.zeros((3, 4), np.float32)
    expected[1:, 1:] = value + np.array([[12, 11, 10], [2, 1, 0]], np.float32)
    np.testing.assert_array_equal(a[-3:, -4:], expected)


def test_a_field_past_2_31_elements_takes_constant_and_loop_indices():
    n = PAST_I32
    x = qd.field(qd.u8, shape=n)  # 2 GiB of zeroed pages that are never touched but the last

    @qd.kernel
    def tail():
        x[x.shape[0] - 1] = 200  # a constant index past i32: an i64, not an error
        for i in range(x.shape[0] - TAIL, x.shape[0] - 1):
            x[i] = qd.u8(i - (x.shape[0] - TAIL) + 1)

    tail()
    assert [x[i] for i in range(n - TAIL - 1, n)] == [0, 1, 2, 3, 200]


def test_an_array_faked_to_2_40_elements_has_its_shape_on_cpu_and_is_refused_on_gpus(arch):
    """cpu binds the array where it is; a GPU without the memory for a copy (or that cannot index
    it) refuses it, naming kernel and argument."""
    fake = fake_array(2**40)
    if arch == "cpu":
        assert length(fake) == 2**40
        return
    if extents.max_elements(arch) >= 2**40:  # 4 TB: more than any GPU holds
        with pytest.raises(MemoryError, match=r"kernel 'length', argument 'a': the \w+ device has no room"):
            length(fake)
        return
    with pytest.raises(ValueError, match=r"kernel 'length', argument 'a': an array of shape \(1099511627776,\)"):
        length(fake)


def test_vulkan_refuses_past_its_32_bit_extents_and_its_largest_binding(vulkan_runtime, tmp_path):
    """Before any device memory is allocated for a copy (not a MemoryError without names)."""
    with pytest.raises(ValueError, match=r"kernel 'write_tail', argument 'a': .*2147483649 elements.*"
                                         r"can index \(2147483647 elements"):
        write_tail(sparse_memmap(tmp_path, np.float32, (PAST_I32,)), 1.0, 2.0)
    with pytest.raises(ValueError, match=r"kernel 'length', argument 'a': .* takes 4294967296 bytes, more than "
                                         r"the vulkan device binds at once"):
        length(fake_array(2**30))  # fits 32-bit extents, not lavapipe's (or any) maxStorageBufferRange
    assert length(np.zeros(7, np.float32)) == 7  # and the kernel still launches


def _task_index_types(kernel, arch: str) -> list:
    compiled = K.compile_kernel(kernel._primal.fn, kernel._primal.params, Options(), arch=arch)
    return [t.index.type.name for t in compiled.ir.tasks]


small_field = qd.field(qd.f32, shape=(1024, 8))
huge_field = qd.field(qd.u8, shape=(2, 2**30 + 1))


@qd.kernel
def three_loops(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in a:
        a[i] = 1.0
    for i, j in small_field:
        small_field[i, j] = 2.0
    for i, j in huge_field:
        huge_field[i, j] = 3


@pytest.mark.parametrize("target, ndarray_index", [("cpu", "i64"), ("cuda", "i64"), ("amdgpu", "i64"),
                                                   ("vulkan", "i32")])
def test_loop_indices_are_32_bit_where_the_range_is_known_to_fit(target, ndarray_index):
    """An ndarray's extent is known only at launch: its loop index has the target's index width.
    A field's is known: 32 bits unless the field has 2**31 elements or more."""
    if target == "amdgpu" and not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ ({linker.INSTALL_HINT}): no AMDGPU build")
    assert _task_index_types(three_loops, target) == [ndarray_index, "i32", "i64"]


def test_spirv_indexes_a_field_past_2_31_elements_in_64_bits():
    """Even with 32-bit indices (constants): the linear index of huge_field[1, 2**30] is 2**31 + 1."""
    @qd.kernel
    def corner():
        huge_field[1, 2**30] = 7

    compiled = K.compile_kernel(corner._primal.fn, corner._primal.params, Options(), arch="vulkan")
    module = compiled.artifacts["spirv_t0"]
    assert spirv_tools.validate(module) is None, spirv_tools.validate(module)
    text = spirv_tools.disassemble(module)
    assert "OpTypeInt 64 1" in text and "1073741825" in text  # the row length, as an i64


def _cuda_or_skip():
    from qdc.runtime.devices.cuda import driver
    try:
        from qdc.runtime.devices.cuda.device import CudaDevice
        CudaDevice().close()
    except driver.CudaUnavailableError as e:
        pytest.skip(f"no CUDA GPU: {e}")


def test_cuda_walks_a_real_array_of_2_31_plus_1_elements(session_cache_dir, rng):
    _cuda_or_skip()
    qd.init(arch="cuda", cache_dir=session_cache_dir)

    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.u8, ndim=1)):
        for i in a:
            a[i] = qd.u8(i % 251)

    @qd.kernel
    def count_nonzero(a: qd.types.ndarray(dtype=qd.u8, ndim=1)) -> qd.i64:
        total = qd.i64(0)
        for i in range(a.shape[0]):
            total += qd.i64(a[i] != 0)
        return total

    a = qd.ndarray(qd.u8, shape=(PAST_I32,))
    fill(a)
    assert count_nonzero(a) == PAST_I32 - (PAST_I32 - 1) // 251 - 1
    host = a.to_numpy()
    probes = np.concatenate([[0, 250, 251, 2**31 - 1, 2**31, PAST_I32 - 1], rng.integers(0, PAST_I32, 64)])
    np.testing.assert_array_equal(host[probes], (probes % 251).astype(np.uint8))
