"""64-bit adstacks on SPIR-V: f64 and i64 values kept in the int heap as two u32 words (an f64
with its adjoint as four), next to f32/i32/u1 stacks. Compile-side checks (layout, record,
meta words, spirv-val, Metal's refusal) need no GPU; the end-to-end cases run on every selected
arch (cpu, and vulkan on lavapipe or a GPU) and compare the gradients of dynamic loops, whose
trip counts are read from a field at launch, with float64 references and with the CPU."""
import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.metal import msl
from qdc.compiler.targets.spirv import tools
from qdc.runtime import adstack
from qdc.runtime.contract import adstack_layout as layout
from autodiff_util import run_grad

pytestmark = pytest.mark.filterwarnings("ignore:.*trip count is only known at run time",
                                        "ignore:.*default_ad_stack_size")

LCG_MULTIPLIER, LCG_INCREMENT, LCG_MASK = 25214903917, 11, (1 << 48) - 1  # a 48-bit LCG: its state needs i64
HIGH_BIT = 47  # tested by the branch: lives in the high word of the i64


def damped_sin(size):
    """The dynamic-loop kernel of the README in f64: v = sin(v) * 0.95 + 0.01, n[None] times."""
    x = qd.field(qd.f64, shape=size, needs_grad=True)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def damped():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v

    return damped, x, n, y


def damped_reference(xs, trips):
    """(each element's final value, its analytic derivative), in float64."""
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for _ in range(trips):
        d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
    return v, d


def lcg_branch(size):
    """An i64 loop-carried state whose high bit picks which update (and so which derivative) v takes."""
    x = qd.field(qd.f64, shape=size, needs_grad=True)
    seed = qd.field(qd.i64, shape=size)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def branchy():
        for i in x:
            v = x[i]
            k = seed[i]
            for _ in range(n[None]):
                k = (k * LCG_MULTIPLIER + LCG_INCREMENT) & LCG_MASK
                if (k >> HIGH_BIT) & 1 == 1:
                    v = qd.sin(v) * 0.9 + 0.05
                else:
                    v = v * 1.05 - 0.1 * v * v
            y[None] += v

    return branchy, x, seed, n, y


def lcg_branch_reference(xs, seeds, trips):
    v, d = xs.astype(np.float64), np.ones(len(xs))
    for i, k in enumerate(int(s) for s in seeds):
        for _ in range(trips):
            k = (k * LCG_MULTIPLIER + LCG_INCREMENT) & LCG_MASK
            if (k >> HIGH_BIT) & 1:
                d[i], v[i] = d[i] * np.cos(v[i]) * 0.9, np.sin(v[i]) * 0.9 + 0.05
            else:
                d[i], v[i] = d[i] * (1.05 - 0.2 * v[i]), v[i] * 1.05 - 0.1 * v[i] * v[i]
    return v, d


def mixed_widths(size):
    """f64, f32, i32, i64 and u1 loop-carried values in one dynamic loop (one stack each)."""
    x64 = qd.field(qd.f64, shape=size, needs_grad=True)
    x32 = qd.field(qd.f32, shape=size, needs_grad=True)
    seed = qd.field(qd.i64, shape=size)
    n = qd.field(qd.i32, shape=())
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def mixed():
        for i in x64:
            v = x64[i]
            w = x32[i]
            c = 0
            k = seed[i]
            odd = (k & 1) == 1
            for _ in range(n[None]):
                if odd:
                    v = qd.sin(v) * 0.9 + 0.05 * qd.cast(w, qd.f64)
                else:
                    v = v * (0.97 + 0.01 * qd.cast(c, qd.f64))
                w = qd.cos(w) * 0.8 + 0.1 * qd.cast(c % 3, qd.f32) * w
                k = (k * LCG_MULTIPLIER + LCG_INCREMENT) & LCG_MASK
                if (k >> HIGH_BIT) & 1 == 1:
                    c += 1
                odd = ((k >> 20) & 1) == 1
            y[None] += v * qd.cast(w, qd.f64)

    return mixed, x64, x32, seed, n, y


def compile_grad(kernel, target=None):
    k = kernel._primal
    if target is None:
        return K.compile_kernel(k.fn, k.params, Options(), arch="vulkan", variant="grad")
    from qdc.compiler import targets
    module = __import__(targets.TARGETS["vulkan"], fromlist=["TARGET"])
    original, module.TARGET = module.TARGET, target
    try:
        return K.compile_kernel(k.fn, k.params, Options(), arch="vulkan", variant="grad")
    finally:
        module.TARGET = original


def stack_dtypes(compiled) -> list:
    return sorted(s["dtype"] for s in compiled.meta.adstack["stacks"])


def central_differences(reference, xs, h=1e-5):
    """d reference(xs)[i] / d xs[i] for each element (the elements are independent), float64."""
    up, _ = reference(xs + h)
    down, _ = reference(xs - h)
    return (up - down) / (2 * h)


# ---- compile side: no GPU ----------------------------------------------------------------------

def test_layout_puts_64_bit_values_in_the_int_heap_as_two_words():
    heap = layout.SPIRV_HEAP_64
    assert heap.heap_of("f64") == heap.heap_of("i64") == heap.heap_of("i32") == 1 and heap.heap_of("f32") == 0
    assert heap.entry_bytes("f64", True) == 16 and heap.entry_bytes("f64", False) == 8
    assert heap.entry_bytes("i64", False) == 8 and heap.adjoint_offset("f64") == 8
    with pytest.raises(ValueError, match="u64"):
        heap.element_bytes("u64")
    record = heap.record()
    assert record["element_bytes"]["f64"] == 8 and record["heap_of"]["i64"] == "adstack_int"
    assert layout.layout_of_record(record, "k") is heap


def test_a_record_of_the_32_bit_only_layout_is_refused():
    """Entries compiled before 64-bit stacks existed recorded every element as 4 bytes."""
    old = layout.SPIRV_HEAP_64.record()
    old["element_bytes"] = {"f32": 4, "i32": 4, "u1": 4}
    del old["heap_of"], old["wide_values"]
    with pytest.raises(ValueError, match="kernel 'k' was compiled for another adstack heap layout.*Recompile"):
        layout.check_record(old, "k")


def test_meta_words_count_two_words_per_64_bit_value():
    from qdc.runtime.devices.spirv_abi import adstack_meta_words
    heap = layout.SPIRV_HEAP_64

    class Meta:  # f64 with adjoint (int heap), f32 with adjoint (float heap), i64 (int heap)
        name, adstack_slot, adstack_threads_slot = "k", 10, 19
        adstack = {"layout": heap.record(), "stacks": [{"dtype": "f64", "adjoint": True},
                                                        {"dtype": "f32", "adjoint": True},
                                                        {"dtype": "i64", "adjoint": False}]}
    ctx = np.zeros(20, np.uint64)
    ctx[13:19] = [0, 5, 0, 7, 80, 3]  # offsets in bytes, capacities in entries
    ctx[19] = 6
    words = adstack_meta_words(Meta, ctx, "k")
    # float heap: 7 entries x 2 words; int heap: 80 bytes + 3 entries x 2 words = 26 words
    assert list(words) == [14, 26, 6, 0, 5, 0, 7, 20, 3]


@pytest.mark.parametrize("make", [damped_sin, lcg_branch, mixed_widths])
def test_64_bit_stacks_compile_for_vulkan_and_pass_spirv_val(make):
    compiled = compile_grad(make(4)[0])
    wanted = {damped_sin: {"f64"}, lcg_branch: {"f64", "i64"}, mixed_widths: {"f64", "f32", "i32", "i64", "u1"}}[make]
    assert wanted <= set(stack_dtypes(compiled))
    assert compiled.meta.adstack["layout"] == layout.SPIRV_HEAP_64.record()
    if not tools.have_validator():
        pytest.skip("spirv-val not installed: the modules compiled but were not validated")
    for i in range(len(compiled.meta.tasks)):
        assert tools.validate(compiled.artifacts[f"spirv_t{i}"]) is None


def test_metal_build_of_an_f64_stack_is_a_clear_compile_error(tmp_path):
    if msl.spirv_cross_path() is None:
        pytest.skip(f"spirv-cross not installed ({msl.INSTALL_HINT}): no Metal build")
    source = tmp_path / "wide_loop.py"
    source.write_text('''import qdc as qd

x = qd.field(qd.f64, shape=8, needs_grad=True)
n = qd.field(qd.i32, shape=())
y = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def damped():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.95 + 0.01
        y[None] += v
''', encoding="utf-8")
    result = CliRunner().invoke(cli, ["build", str(source), "--arch", "metal", "--cache", str(tmp_path / "cache"),
                                      "-j", "1"])
    assert result.exit_code == 1, result.output
    assert "wide_loop.py" in result.output and "error: kernel 'damped': the f64 value of 'v' must be kept on an " \
                                              "adstack" in result.output, result.output
    assert "target 'metal' stores only f32, i32, u1 there" in result.output


# ---- end to end: every selected arch -----------------------------------------------------------

def test_f64_dynamic_loop_forward_and_gradient(arch, rng, session_cache_dir):
    size, trips = 64, 48
    xs = rng.uniform(-1.5, 1.5, size)
    damped, x, n, y = damped_sin(size)
    x.from_numpy(xs)
    n[None] = trips
    got = run_grad(damped, x, y)
    want_v, want_d = damped_reference(xs, trips)
    np.testing.assert_allclose(y[None], want_v.sum(), rtol=1e-13)
    np.testing.assert_allclose(got, want_d, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(got, central_differences(lambda v: damped_reference(v, trips), xs), rtol=1e-7)
    if arch == "vulkan":
        assert adstack.adstack_heap_bytes("adstack_float") == 0  # the f64 stack is in the int heap
        # an f64 primal per entry, two words (its adjoint is a local of the reverse sweep)
        assert adstack.adstack_heap_bytes("adstack_int") >= size * (trips + 1) * 8
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
        damped, x, n, y = damped_sin(size)
        x.from_numpy(xs)
        n[None] = trips
        np.testing.assert_allclose(got, run_grad(damped, x, y), rtol=1e-12)


def test_i64_state_selects_the_derivative_path(arch, rng, session_cache_dir):
    size, trips = 32, 32
    xs = rng.uniform(0.1, 0.9, size)
    seeds = rng.integers(0, LCG_MASK, size, dtype=np.int64)

    def gradient():
        branchy, x, seed, n, y = lcg_branch(size)
        x.from_numpy(xs)
        seed.from_numpy(seeds)
        n[None] = trips
        return run_grad(branchy, x, y), y[None]

    got, total = gradient()
    want_v, want_d = lcg_branch_reference(xs, seeds, trips)
    np.testing.assert_allclose(total, want_v.sum(), rtol=1e-13)
    np.testing.assert_allclose(got, want_d, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(got, central_differences(lambda v: lcg_branch_reference(v, seeds, trips), xs),
                               rtol=1e-6)
    if arch == "vulkan":
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
        np.testing.assert_allclose(got, gradient()[0], rtol=1e-12)


def test_mixed_width_stacks_in_one_kernel_match_the_cpu(arch, rng, session_cache_dir):
    size, trips = 16, 24
    x64s, x32s = rng.uniform(0.1, 0.9, size), rng.uniform(0.1, 0.9, size).astype(np.float32)
    seeds = rng.integers(0, LCG_MASK, size, dtype=np.int64)

    def gradients():
        mixed, x64, x32, seed, n, y = mixed_widths(size)
        x64.from_numpy(x64s)
        x32.from_numpy(x32s)
        seed.from_numpy(seeds)
        n[None] = trips
        y[None] = 0
        mixed()
        x64.grad.fill(0)
        x32.grad.fill(0)
        y.grad[None] = 1
        mixed.grad()
        qd.sync()
        return x64.grad.to_numpy(), x32.grad.to_numpy(), y[None]

    got = gradients()
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    want = gradients()
    # the f32 stack's values differ in their last bits between backends (cos), and flow into v
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6)


def test_f64_stack_overflow_is_reported_and_the_next_launch_works(arch, rng, session_cache_dir):
    capacity = 16
    qd.init(arch=arch, cache_dir=session_cache_dir, default_ad_stack_size=capacity)
    x = qd.field(qd.f64, shape=4, needs_grad=True)
    trips = qd.field(qd.i32, shape=4)
    y = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def opaque():
        for i in x:
            v = x[i]
            for _ in range(qd.cast(qd.cast(trips[i], qd.f32), qd.i32)):  # no symbolic bound: the default capacity
                v = qd.sin(v) * 0.95 + 0.01
            y[None] += v

    xs = rng.uniform(0.2, 0.8, 4)
    x.from_numpy(xs)
    trips.from_numpy(np.array([capacity - 1, capacity, capacity - 1, 3], np.int32))
    with pytest.raises(qd.AdStackOverflowError) as info:
        run_grad(opaque, x, y)
    e = info.value
    assert (e.kernel, e.allocated, e.required) == ("opaque", capacity, capacity + 1) and e.task in str(e)
    trips.fill(capacity - 1)
    np.testing.assert_allclose(run_grad(opaque, x, y), damped_reference(xs, capacity - 1)[1], rtol=1e-12)
