"""SPIR-V adstacks: the float and int heaps, their layout record and meta words,
sizing for the invocations really dispatched, growth, overflow, the u32 index check. The
compile-side tests need no GPU; the end-to-end ones run on lavapipe (or any Vulkan device)
and skip cleanly without one, comparing gradients with the CPU backend and with float64
central differences."""
import dataclasses

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets import get as get_target
from qdc.compiler.targets.spirv import tools
from qdc.runtime import adstack, context
from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.contract.errors import QdcCompileError
from autodiff_util import run_grad

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time",
                                        "ignore:.*default_ad_stack_size")


def compile_grad(kernel, target=None, opts=None):
    k = kernel._primal
    if target is None:
        return K.compile_kernel(k.fn, k.params, opts or Options(), arch="vulkan", variant="grad")
    from qdc.compiler import targets
    module = __import__(targets.TARGETS["vulkan"], fromlist=["TARGET"])
    original, module.TARGET = module.TARGET, target
    try:
        return K.compile_kernel(k.fn, k.params, opts or Options(), arch="vulkan", variant="grad")
    finally:
        module.TARGET = original


def vulkan_or_skip(**options):
    try:
        qd.init(arch=qd.vulkan, **options)
        context.current().device
    except Exception as e:  # no loader, no driver, no device: the GPU-less tests still ran
        pytest.skip(f"no Vulkan device: {e}")


def mixed_kernel():
    """An f32 and an i32 loop-carried variable in one dynamic loop."""
    x = qd.field(qd.f32, shape=6, needs_grad=True)
    trips = qd.field(qd.i32, shape=6)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def mixed():
        for i in x:
            v = x[i]
            k = 1
            for _ in range(trips[i]):
                v = qd.sin(v) * (0.9 + 0.01 * qd.cast(k, qd.f32))
                k = (k * 3) % 7
            y[None] += v

    return mixed, x, trips, y


def mixed_reference(xs, trips):
    out = []
    for x0, n in zip(xs, trips):
        v, k = x0, 1
        for _ in range(n):
            v, k = np.sin(v) * (0.9 + 0.01 * k), (k * 3) % 7
        out.append(v)
    return np.sum(out)


def many_loops_kernel():
    """Six sibling dynamic loops, each with a data-dependent if: a dozen i32/u1 stacks."""
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    trips = qd.field(qd.i32, shape=4)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def many():
        for i in x:
            v = x[i]
            for loop in qd.static(range(6)):
                c = 0
                up = v > 0.5
                for _ in range(trips[i]):
                    if v > 0.1 * (loop + 1):
                        v = qd.sin(v) * (1.0 + 0.01 * qd.cast(c, qd.f32))
                        c += 1
                    else:
                        v = v * 1.01
                    up = v > 0.5
                v = v + 0.001 * qd.cast(c, qd.f32) + qd.select(up, 0.001, 0.0)
            y[None] += v

    return many, x, trips, y


# ---- compile side: no GPU ----------------------------------------------------------------------

def test_type_the_heaps_cannot_hold_is_a_compile_error_at_its_line():
    x = qd.field(qd.f32, shape=4, needs_grad=True)
    y = qd.field(qd.f32, shape=4, needs_grad=True)
    trips = qd.field(qd.i32, shape=4)

    @qd.kernel
    def unsigned():
        for i in x:
            v = x[i]
            k = qd.cast(1, qd.u32)
            for _ in range(trips[i]):
                v = qd.sin(v) * qd.cast(k, qd.f32)
                k = k * 3 % 7
            y[i] = v

    with pytest.raises(QdcCompileError) as info:
        compile_grad(unsigned)
    text = str(info.value)
    assert "'k'" in text and "u32" in text and "'vulkan'" in text and "f32, f64, i32, i64, u1" in text
    assert info.value.line is not None and "test_spirv_adstack.py" in text


@pytest.mark.parametrize("int64", [True, False])
def test_adstack_modules_pass_spirv_val_with_64_and_32_bit_indices(int64):
    target = get_target("vulkan")
    if not int64:
        target = type(target)()
        target.capabilities = dataclasses.replace(target.capabilities, int64=False)
    for make in (mixed_kernel, many_loops_kernel):
        kernel = make()[0]
        compiled = compile_grad(kernel, target)
        assert compiled.meta.adstack["layout"] == layout.spirv_heap(int64).record()
        for i, task in enumerate(compiled.meta.tasks):
            assert tools.validate(compiled.artifacts[f"spirv_t{i}"]) is None
        resources = {b[2] for t in compiled.meta.tasks for b in t.bindings}
        assert {"adstack_meta", "adstack_float"} <= resources
        assert "adstack_int" in resources


def test_many_sibling_loops_give_a_dozen_int_stacks():
    compiled = compile_grad(many_loops_kernel()[0])
    stacks = compiled.meta.adstack["stacks"]
    ints = [s for s in stacks if s["dtype"] in ("i32", "u1")]
    assert len(ints) >= 12 and all(s["dtype"] in layout.SPIRV_ELEMENT for s in stacks)


def test_spirv_layout_record_and_meta_words():
    from qdc.runtime.devices.vulkan.pipelines import adstack_meta_words
    heap = layout.SPIRV_HEAP_64
    assert heap.entry_bytes("f32", True) == 8 and heap.entry_bytes("u1", False) == 4
    assert heap.heap_of("u1") == heap.heap_of("i32") == 1 and heap.heap_of("f32") == 0
    with pytest.raises(ValueError, match="u64"):
        heap.element_bytes("u64")
    assert layout.layout_of_record(heap.record(), "k") is heap
    assert layout.layout_of_record(None, "k") is layout.LLVM_HEAP

    class Meta:  # three stacks: f32 with adjoint, i32, f32 with adjoint, at ctx words from 10
        name, adstack_slot, adstack_threads_slot = "k", 10, 19
        adstack = {"layout": heap.record(), "stacks": [{"dtype": "f32", "adjoint": True},
                                                        {"dtype": "i32", "adjoint": False},
                                                        {"dtype": "f32", "adjoint": True}]}
    ctx = np.zeros(20, np.uint64)
    ctx[13:19] = [0, 5, 0, 7, 40, 3]  # offsets in bytes, capacities in entries
    ctx[19] = 6
    words = adstack_meta_words(Meta, ctx, "k")
    assert list(words) == [16, 7, 6, 0, 5, 0, 7, 10, 3]


def test_heap_growth_doubles_then_retries_at_required_then_explains(monkeypatch):
    heaps = adstack.heap_for(context.current(), layout.SPIRV_HEAP_64)
    heap = heaps.heaps[0]
    heap.ensure(1000, "k")
    real, asked = heap.device.allocate, []

    def allocate(nbytes):
        asked.append(nbytes)
        if nbytes > 1500:
            raise MemoryError
        return real(nbytes)

    monkeypatch.setattr(heap.device, "allocate", allocate)
    assert heap.ensure(1200, "k") and asked == [2000, 1200] and heap.nbytes == 1200
    with pytest.raises(MemoryError, match=r"cannot allocate 5000 bytes.*invocations x capacity.*ad_stack_size"):
        heap.ensure(5000, "k", lambda: "invocations x capacity x element bytes x stacks = 10 x (50 x 8)")
    assert heap.nbytes == 1200


# ---- end to end on Vulkan (lavapipe in CI) ------------------------------------------------------

def gradients_on(arch, make, xs, trips, **options):
    qd.init(arch=arch, **options)
    kernel, x, t, y = make()
    x.from_numpy(xs)
    t.from_numpy(trips)
    return run_grad(kernel, x, y)


def central_differences(f, xs, h=1e-4):
    xs = xs.astype(np.float64)
    out = []
    for i in range(len(xs)):
        up, down = xs.copy(), xs.copy()
        up[i] += h
        down[i] -= h
        out.append((f(up) - f(down)) / (2 * h))
    return np.array(out)


def test_f32_and_i32_stacks_in_one_kernel_match_cpu_and_differences(session_cache_dir):
    vulkan_or_skip(cache_dir=session_cache_dir)
    xs = np.linspace(0.1, 0.9, 6).astype(np.float32)
    trips = np.array([0, 1, 2, 3, 5, 8], np.int32)
    got = gradients_on(qd.vulkan, mixed_kernel, xs, trips, cache_dir=session_cache_dir)
    assert adstack.adstack_heap_bytes("adstack_float") > 0 and adstack.adstack_heap_bytes("adstack_int") > 0
    cpu = gradients_on(qd.cpu, mixed_kernel, xs, trips, cache_dir=session_cache_dir)
    np.testing.assert_allclose(got, cpu, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got, central_differences(lambda v: mixed_reference(v, trips), xs), rtol=1e-3)


def test_six_sibling_loops_with_ifs_match_cpu(session_cache_dir):
    vulkan_or_skip(cache_dir=session_cache_dir)
    xs = np.array([0.05, 0.3, 0.6, 0.9], np.float32)
    trips = np.array([1, 3, 4, 6], np.int32)
    got = gradients_on(qd.vulkan, many_loops_kernel, xs, trips, cache_dir=session_cache_dir)
    cpu = gradients_on(qd.cpu, many_loops_kernel, xs, trips, cache_dir=session_cache_dir)
    np.testing.assert_allclose(got, cpu, rtol=1e-4, atol=1e-6)


def sin_chain(size=4, opaque=False):
    """`opaque`: a trip count the compiler cannot bound symbolically (default_ad_stack_size)."""
    x = qd.field(qd.f32, shape=size, needs_grad=True)
    trips = qd.field(qd.i32, shape=size)
    y = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            n = qd.cast(qd.cast(trips[i], qd.f32), qd.i32) if qd.static(opaque) else trips[i]
            for _ in range(n):
                v = qd.sin(v) * 0.9 + 0.05
            y[None] += v

    return chain, x, trips, y


def sin_chain_grad(xs, n):
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for _ in range(n):
        d, v = d * np.cos(v) * 0.9, np.sin(v) * 0.9 + 0.05
    return d


def test_capacity_4096_with_one_loop_carried_variable(session_cache_dir):
    vulkan_or_skip(cache_dir=session_cache_dir, ad_stack_size=4096)
    chain, x, trips, y = sin_chain()
    xs = np.linspace(0.2, 0.8, 4).astype(np.float32)
    x.from_numpy(xs)
    trips.fill(4000)
    np.testing.assert_allclose(run_grad(chain, x, y), sin_chain_grad(xs, 4000), rtol=1e-3, atol=1e-6)
    # four invocations x 4096 entries x 4 bytes (the primal; the adjoint is a local of the reverse
    # sweep: compiler/autodiff/register_adjoints.py)
    assert adstack.adstack_heap_bytes("adstack_float") == 4 * 4096 * 4


def test_ndrange_over_ndarray_shape_sizes_the_heap_for_the_real_count(session_cache_dir):
    vulkan_or_skip(cache_dir=session_cache_dir, ad_stack_size=16)

    @qd.kernel
    def shaped(a: qd.types.ndarray(qd.f32, 2), out: qd.types.ndarray(qd.f32, 2), n: qd.i32):
        for i, j in qd.ndrange(a.shape[0], a.shape[1]):
            v = a[i, j]
            for _ in range(n):
                v = qd.sin(v)
            out[i, j] = v

    a = qd.ndarray(qd.f32, (2, 3), needs_grad=True)
    out = qd.ndarray(qd.f32, (2, 3), needs_grad=True)
    xs = np.linspace(0.1, 0.6, 6).astype(np.float32).reshape(2, 3)
    a.from_numpy(xs)
    shaped(a, out, 5)
    out.grad.from_numpy(np.ones((2, 3), np.float32))
    shaped.grad(a, out, 5)
    qd.sync()
    assert adstack.adstack_heap_bytes("adstack_float") == 6 * 16 * 4  # 6 invocations, not a grid's worth
    want = np.ones(6)
    v = xs.reshape(-1).astype(np.float64)
    for _ in range(5):
        want, v = want * np.cos(v), np.sin(v)
    np.testing.assert_allclose(a.grad.to_numpy().reshape(-1), want, rtol=1e-4)


@pytest.mark.parametrize("overflow", [False, True])
def test_exactly_at_capacity_succeeds_and_one_more_push_raises(session_cache_dir, overflow):
    capacity = 32
    vulkan_or_skip(cache_dir=session_cache_dir, default_ad_stack_size=capacity)
    chain, x, trips, y = sin_chain(opaque=True)
    xs = np.linspace(0.2, 0.8, 4).astype(np.float32)
    x.from_numpy(xs)
    trips.fill(capacity - 1)  # the first store, then one push per iteration: exactly full
    if overflow:
        trips[2] = capacity
        with pytest.raises(qd.AdStackOverflowError) as info:
            run_grad(chain, x, y)
        e = info.value
        assert (e.kernel, e.allocated, e.required) == ("chain", capacity, capacity + 1) and e.task in str(e)
        trips[2] = capacity - 1  # the word was cleared: the next launch runs normally
    np.testing.assert_allclose(run_grad(chain, x, y), sin_chain_grad(xs, capacity - 1), rtol=1e-4)


def test_allocation_failure_on_growth_is_retried_at_required(session_cache_dir, monkeypatch):
    vulkan_or_skip(cache_dir=session_cache_dir)
    chain, x, trips, y = sin_chain(size=64)
    x.from_numpy(np.full(64, 0.5, np.float32))
    trips.fill(2)
    run_grad(chain, x, y)
    heap = adstack.heap_for(context.current(), layout.SPIRV_HEAP_64).heaps[0]
    before = heap.nbytes
    real, asked = heap.device.allocate, []

    def allocate(nbytes):
        asked.append(nbytes)
        if nbytes == 2 * before:
            raise MemoryError("injected")
        return real(nbytes)

    monkeypatch.setattr(heap.device, "allocate", allocate)
    trips.fill(3)  # a bound read from a field: the capacity follows it, to less than twice the heap
    got = run_grad(chain, x, y)
    assert asked[:2] == [2 * before, heap.nbytes] and before < heap.nbytes < 2 * before
    np.testing.assert_allclose(got, sin_chain_grad(np.full(64, 0.5), 3), rtol=1e-3, atol=1e-6)


# ---- debug bounds checks on Vulkan ---------------------------------------------------------------

def bounds_messages(arch, session_cache_dir):
    qd.init(arch=arch, debug=True, cache_dir=session_cache_dir)
    f = qd.field(qd.f32, shape=(4, 3))

    @qd.kernel
    def poke(a: qd.types.ndarray(qd.f32, 1), i: qd.i32, j: qd.i32):
        f[i, j] = 1.0
        a[j] += 2.0

    a = qd.ndarray(qd.f32, (3,))
    messages = []
    for i, j in ((1, 2), (1, 3), (-1, 0), (2, 1)):
        try:
            poke(a, i, j)
            qd.sync()
            messages.append(None)
        except IndexError as e:
            messages.append(str(e))
    return messages, f.to_numpy(), a.to_numpy()


def test_debug_bounds_checks_report_as_on_the_cpu(session_cache_dir):
    vulkan_or_skip(cache_dir=session_cache_dir)
    got = bounds_messages(qd.vulkan, session_cache_dir)
    want = bounds_messages(qd.cpu, session_cache_dir)
    assert got[0] == want[0] and got[0][0] is None and "index 3 out of range on axis 1" in got[0][1]
    assert "index -1 out of range on axis 0" in got[0][2] and got[0][3] is None
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
