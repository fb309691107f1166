"""Vulkan launches at any size: the grid cap (a launch dispatches at most a few waves of what the
device runs at once; the shader's grid-stride loop covers the rest), adstack heaps that hold the
invocations in flight (lowered further until one binding spans them), and no wrapped product in
the sizes the runtime checks: every case gives the right gradient or a clear error, never a wrong
one. On lavapipe (or any Vulkan device); skipped cleanly without one."""
import dataclasses

import numpy as np
import pytest

import qdc as qd
from qdc.runtime import adstack, context
from qdc.runtime.contract import adstack_layout as layout
from qdc.runtime.devices.vulkan import pipelines
from autodiff_util import run_grad

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time",
                                        "ignore:.*default_ad_stack_size")


def vulkan_device(**options):
    try:
        qd.init(arch=qd.vulkan, **options)
        return context.current().device
    except Exception as e:  # no loader, no driver, no device
        pytest.skip(f"no Vulkan device: {e}")


def readme_kernel(size: int):
    """README's dynamic-loop kernel: its gradient needs an f32 adstack of n + 1 entries."""
    x = qd.field(qd.f32, shape=size, needs_grad=True)
    y = qd.field(qd.f32, shape=(), needs_grad=True)
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def loop():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v

    return loop, x, y, n


def readme_gradient(xs: np.ndarray, trips: int) -> np.ndarray:
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for _ in range(trips):
        d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
    return d


def gradient_on(arch, xs, trips, cache_dir, **options):
    qd.init(arch=arch, cache_dir=cache_dir, **options)
    loop, x, y, n = readme_kernel(len(xs))
    x.from_numpy(xs)
    n[None] = trips
    return run_grad(loop, x, y)


def with_capabilities(dev, monkeypatch, **changes):
    monkeypatch.setattr(dev, "capabilities", dataclasses.replace(dev.capabilities, **changes))


def test_task_slices_are_capped_at_a_few_waves_of_resident_invocations(session_cache_dir, monkeypatch):
    dev = vulkan_device(cache_dir=session_cache_dir)
    launch = {"policy": "grid", "block_dim": 128}
    with_capabilities(dev, monkeypatch, resident_invocations=132 * 64 * 32)  # an H100's SMs x warps x 32
    cap = dev.grid_cap(128) * 128
    assert cap == 132 * 64 * 32 // 128 * 4 * 128
    assert dev.task_slices(launch, 1 << 24) == cap and dev.task_slices(launch, None) == cap
    assert dev.task_slices(launch, 1000) == 1000 and dev.task_slices(launch, 0) == 0
    with_capabilities(dev, monkeypatch, resident_invocations=0)  # the driver does not say
    assert dev.task_slices(launch, 1 << 30) == dev.grid_cap(128) * 128 < 1 << 30


def test_readme_gradient_at_2_20_equals_the_cpu_gradient(session_cache_dir, rng):
    """2^20 iterations: on lavapipe more than the grid cap, so each invocation runs several
    iterations, its adstack slice reused from one to the next."""
    vulkan_device(cache_dir=session_cache_dir)
    xs = rng.uniform(-1.0, 1.0, 1 << 20).astype(np.float32)
    vk = gradient_on(qd.vulkan, xs, 64, session_cache_dir)
    dev = context.current().device
    held = adstack.adstack_heap_bytes("adstack_float")
    assert 0 < held <= dev.task_slices({"policy": "grid", "block_dim": 0}, None) * 65 * 4
    cpu = gradient_on(qd.cpu, xs, 64, session_cache_dir)
    np.testing.assert_allclose(vk, cpu, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(vk[:4096], readme_gradient(xs[:4096], 64), rtol=1e-4, atol=1e-7)


def test_heaps_hold_fewer_invocations_when_a_binding_cannot_span_them(session_cache_dir, monkeypatch, rng):
    """A device whose maxStorageBufferRange holds only three invocations' stacks: the launch still
    runs every iteration, on those three."""
    dev = vulkan_device(cache_dir=session_cache_dir, ad_stack_size=64)
    per_invocation = 64 * 4  # 64 entries x 4 bytes (the primal: the adjoint is a local)
    monkeypatch.setattr(dev, "max_binding_bytes", lambda: 3 * per_invocation + 5)
    xs = rng.uniform(-1.0, 1.0, 1000).astype(np.float32)
    loop, x, y, n = readme_kernel(len(xs))
    x.from_numpy(xs)
    n[None] = 40
    np.testing.assert_allclose(run_grad(loop, x, y), readme_gradient(xs, 40), rtol=1e-4, atol=1e-7)
    assert adstack.adstack_heap_bytes("adstack_float") == 3 * per_invocation


def test_one_invocation_too_large_for_a_binding_is_a_clear_error(session_cache_dir, monkeypatch):
    dev = vulkan_device(cache_dir=session_cache_dir, ad_stack_size=64)
    monkeypatch.setattr(dev, "max_binding_bytes", lambda: 64 * 4 - 4)  # one invocation's 64 f32 entries: 256
    loop, x, y, n = readme_kernel(8)
    x.from_numpy(np.linspace(0.1, 0.8, 8).astype(np.float32))
    n[None] = 10
    loop()
    with pytest.raises(ValueError, match=r"kernel 'loop'.*256 bytes.*252 bytes.*ad_stack_size"):
        loop.grad()


def test_a_device_without_int64_lowers_the_invocations_to_what_u32_indices_reach(session_cache_dir, monkeypatch):
    """32-bit heap indices: the invocations a heap holds are lowered until stride x invocations
    fits a u32 (the limit shrunk here so that four invocations do not fit)."""
    from qdc.compiler import targets
    module = __import__(targets.TARGETS["vulkan"], fromlist=["TARGET"])
    narrow = type(module.TARGET)()
    narrow.capabilities = dataclasses.replace(narrow.capabilities, int64=False)
    monkeypatch.setattr(module, "TARGET", narrow)
    vulkan_device(cache_dir=session_cache_dir, ad_stack_size=8)
    loop, x, y, n = readme_kernel(4)
    xs = np.array([0.5, -0.25, 0.75, 0.1], np.float32)
    x.from_numpy(xs)
    n[None] = 3
    monkeypatch.setattr(layout, "U32_INDEX_LIMIT", 4 * 8 - 1)  # one element short of 4 x 8 entries
    np.testing.assert_allclose(run_grad(loop, x, y), readme_gradient(xs, 3), rtol=1e-5)
    assert adstack.adstack_heap_bytes("adstack_float") == 3 * 8 * 4


class _Meta:
    """Just what adstack_meta_words and _heap_range read of a kernel's metadata."""
    name = "k"
    adstack_slot = 10
    adstack_threads_slot = 15
    adstack = {"layout": layout.SPIRV_HEAP_64.record(), "stacks": [{"dtype": "f32", "adjoint": True}]}


def test_the_binding_check_multiplies_without_wrapping(monkeypatch):
    """Stride x invocations past 2^32 bytes is refused, never wrapped into a small number that
    passes (u32 words multiplied as numpy u32 did: 130 x 2^25 x 4 bytes wraps to 2^31)."""
    class Dev:
        def max_binding_bytes(self):
            return (1 << 32) - 1

    class Tp:
        name = "kernel 'k' (task 0, k_t0)"

    class Alloc:
        nbytes = 1 << 33

    monkeypatch.setattr(pipelines, "HEAP_WORDS", {"adstack_float": 0})
    ctx = np.zeros(16, np.uint64)
    ctx[13], ctx[14] = 0, 65  # one stack: offset 0, 65 entries of 8 bytes: 130 words an invocation
    for invocations, fits in (((1 << 32) - 1) // 520, True), (1 << 25, False):
        ctx[15] = invocations
        binding = type("P", (), {"resource": "adstack_float"})()
        words = pipelines.adstack_meta_words(_Meta, ctx, Tp.name)
        if fits:
            assert pipelines._heap_range(Dev(), Tp(), binding, Alloc(), words) == (1 << 32) - 1
        else:
            with pytest.raises(ValueError, match=f"needs {520 << 25} bytes"):
                pipelines._heap_range(Dev(), Tp(), binding, Alloc(), words)
