"""print and assert in kernels, and the debug-mode overflow checks (docs/api.md): output on the
host's stdout at sync in launch order, AssertionError naming kernel and file:line, overflow
reported with Quadrants' messages against Python's exact integers, and nothing of it in the
code of a kernel compiled without debug."""
import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit
from qdc.compiler.targets.spirv import tools as spirv_tools
from qdc.runtime.contract.print_buffer import DEFAULT_RECORDS
from qdc.runtime.loader import load


def line_of(marker: str) -> str:
    """`file:line` of the line of this file holding `marker`."""
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if marker in text and "line_of" not in text:
                return f"{__file__}:{number}:"
    raise AssertionError(marker)


def debug_on(arch, session_cache_dir):
    qd.init(arch=arch, cache_dir=session_cache_dir, debug=True)


def test_print_scalars_vectors_and_fstrings(arch, capfd, rng):
    a, b = int(rng.integers(-1000, 1000)), float(rng.uniform(-10, 10))

    @qd.kernel
    def show(a: qd.i32, b: qd.f32):
        v = qd.math.vec3(b, 2.0 * b, a)
        m = qd.math.mat2([[a, a + 1], [a + 2, a + 3]])
        print("a =", a, "v =", v)
        print(f"b={b:.3f} v={v:.2f}", m, sep="; ")
        print(a, a * 2, end="|\n")

    show(a, b)
    qd.sync()
    b32 = np.float32(b)
    v = [b32, np.float32(2 * b32), np.float32(a)]
    assert capfd.readouterr().out.splitlines() == [
        f"a = {a} v = [{str(v[0])}, {str(v[1])}, {str(v[2])}]",
        f"b={b32.item():.3f} v=[{v[0].item():.2f}, {v[1].item():.2f}, {v[2].item():.2f}]; "
        "[[{}, {}], [{}, {}]]".format(*(np.float32(a + k) for k in range(4))),
        f"{a} {2 * a}|"]


def test_str_format_and_percent_formatting(arch, capfd, rng, session_cache_dir):
    """`"...".format(...)` (automatic, numbered and keyword fields, specs) and printf-style
    `"..." % (...)` in print and in an assert's message, as Python formats the same values."""
    debug_on(arch, session_cache_dir)
    a, b = int(rng.integers(-1000, 1000)), float(np.float32(rng.uniform(-10, 10)))

    @qd.kernel
    def show(a: qd.i32, b: qd.f32):
        v = qd.math.vec2(b, 2.0 * b)
        print("v = {0} b = {1:.3f} a = {a:>6d} {1:e}".format(v, b, a=a))
        print("{} and {:+.1f}".format(a, b))
        print("a = %d, b = %.2f, %8.3e, %x, 100%%" % (a, b, b, a + 4096))
        print("just %5d" % a)
        assert a > 5000, "a is %d" % a

    with pytest.raises(AssertionError, match=f"a is {a}"):
        show(a, b)
        qd.sync()
    v = [np.float32(b), np.float32(2.0) * np.float32(b)]  # printed as the shortest f32 text
    assert capfd.readouterr().out.splitlines() == [
        "v = {0} b = {1:.3f} a = {a:>6d} {1:e}".format(f"[{str(v[0])}, {str(v[1])}]", b, a=a),
        "{} and {:+.1f}".format(a, b),
        "a = %d, b = %.2f, %8.3e, %x, 100%%" % (a, b, b, a + 4096),
        "just %5d" % a]


def test_output_follows_launch_order(arch, capfd, rng):
    values = rng.integers(-(1 << 40), 1 << 40, 6)

    @qd.kernel
    def first(x: qd.i64):
        print("first", x)

    @qd.kernel
    def second(x: qd.i64):
        print("second", x)

    expected = []
    for i, x in enumerate(values):
        (first if i % 2 == 0 else second)(int(x))
        expected.append(f"{'first' if i % 2 == 0 else 'second'} {int(x)}")
    qd.sync()
    assert capfd.readouterr().out.splitlines() == expected


def test_every_iteration_of_a_parallel_loop_prints_once(arch, capfd, rng):
    n = int(rng.integers(100, 300))
    data = rng.integers(-50, 50, n).astype(np.int32)
    a = qd.ndarray(qd.i32, shape=(n,))
    a.from_numpy(data)

    @qd.kernel
    def each(a: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            print(f"{i}:{a[i]}")

    each(a)
    qd.sync()
    assert sorted(capfd.readouterr().out.splitlines()) == sorted(f"{i}:{x}" for i, x in enumerate(data))


def test_lines_past_the_buffer_are_dropped_and_counted(arch, capfd, rng):
    extra = int(rng.integers(1, 500))

    @qd.kernel
    def flood(n: qd.i32):
        for i in range(n):
            print(i)

    flood(DEFAULT_RECORDS + extra)
    qd.sync()
    lines = capfd.readouterr().out.splitlines()
    assert lines[-1].startswith(f"[qdc] {extra} lines dropped")
    assert len(set(lines[:-1])) == DEFAULT_RECORDS
    flood(3)  # the buffer starts empty again after a sync
    qd.sync()
    assert sorted(capfd.readouterr().out.splitlines()) == ["0", "1", "2"]


def test_failed_assert_raises_at_sync_with_kernel_line_and_values(arch, capfd, rng, session_cache_dir):
    debug_on(arch, session_cache_dir)
    limit = int(rng.integers(3, 100))

    @qd.kernel
    def check(x: qd.i32, limit: qd.i32):
        print("checking", x)
        assert x < limit, f"x={x} is not below {limit}"  # <- the assert

    check(limit - 1, limit)
    qd.sync()
    with pytest.raises(AssertionError) as e:
        check(limit + 7, limit)
        qd.sync()
    assert f"{line_of('<- the assert')}9: kernel 'check': x={limit + 7} is not below {limit}" in str(e.value)
    assert capfd.readouterr().out.splitlines() == [f"checking {limit - 1}", f"checking {limit + 7}"]
    check(0, limit)  # the next launch runs clean
    qd.sync()


def test_assert_compiles_away_without_debug(arch):
    @qd.kernel
    def never_checked(x: qd.i32) -> qd.i32:
        assert x < 0, "never raised without debug"
        return x + 1

    assert never_checked(5) == 6
    qd.sync()


EXACT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "shl": lambda a, b: a << b}


def overflows(op: str, a: int, b: int, bits: int, signed: bool) -> bool:
    exact = EXACT[op](a, b)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return not lo <= exact <= hi


def draw(rng, lo: int, hi: int) -> int:
    """A random Python int in [lo, hi), whatever its width."""
    return lo + int.from_bytes(rng.bytes(16), "little") % (hi - lo)


def operands(rng, op: str, bits: int, signed: bool, n: int):
    """Random operands, about half of them overflowing, with the edge cases of signed mul."""
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    a, b = [], []
    for _ in range(n):
        if op == "shl":
            a.append(draw(rng, lo, hi) >> draw(rng, 0, bits))
            b.append(draw(rng, 0, bits))
        elif op == "mul":  # magnitudes whose widths add up to about `bits`
            width = draw(rng, 1, bits)
            x, y = draw(rng, 0, 1 << width), draw(rng, 0, min(1 << (bits - width + 1), hi))
            sign = draw(rng, 0, 2) * 2 - 1 if signed else 1
            a.append(x * sign)
            b.append(y)
        else:
            a.append(draw(rng, lo, hi))
            b.append(draw(rng, lo, hi))
    if signed and op == "mul":
        a[:4], b[:4] = [-1, 0, lo, -1], [lo, lo, -1, hi - 1]
    return a, b


@pytest.mark.parametrize("op", ["add", "sub", "mul", "shl"])
@pytest.mark.parametrize("dtype", ["i32", "i64", "u32"])
def test_integer_overflow_is_reported_exactly(arch, capfd, rng, session_cache_dir, op, dtype):
    debug_on(arch, session_cache_dir)
    t = getattr(qd, dtype)
    bits, signed = int(dtype[1:]), dtype[0] == "i"
    n = 64
    a_values, b_values = operands(rng, op, bits, signed, n)
    np_type = {"i32": np.int32, "i64": np.int64, "u32": np.uint32}[dtype]
    a, b, out = (qd.ndarray(t, shape=(n,)) for _ in range(3))
    a.from_numpy(np.array(a_values, dtype=object).astype(np_type))
    b.from_numpy(np.array(b_values, dtype=object).astype(np_type))

    @qd.kernel
    def apply(a: qd.types.ndarray(dtype=t, ndim=1), b: qd.types.ndarray(dtype=t, ndim=1),
              out: qd.types.ndarray(dtype=t, ndim=1)):
        for i in range(a.shape[0]):
            x, y = a[i], b[i]
            if qd.static(op == "add"):
                out[i] = x + y
            elif qd.static(op == "sub"):
                out[i] = x - y
            elif qd.static(op == "mul"):
                out[i] = x * y
            else:
                out[i] = x << y

    apply(a, b, out)
    qd.sync()
    message = {"add": "Addition", "sub": "Subtraction", "mul": "Multiplication", "shl": "Shift left"}[op]
    reports = [line for line in capfd.readouterr().out.splitlines() if "overflow detected" in line]
    expected = sum(overflows(op, x, y, bits, signed) for x, y in zip(a_values, b_values))
    assert 0 < expected < n
    assert len(reports) == expected
    assert all(line.startswith(f"{message} overflow detected in kernel 'apply' at {__file__}:") for line in reports)
    wrapped = [EXACT[op](x, y) % (1 << bits) for x, y in zip(a_values, b_values)]  # execution went on
    np.testing.assert_array_equal(out.to_numpy(), np.array(wrapped, dtype=np.uint64).astype(np_type))


def test_negative_integer_power_raises(arch, rng, session_cache_dir):
    debug_on(arch, session_cache_dir)

    @qd.kernel
    def power(a: qd.i32, b: qd.i32) -> qd.i32:
        return a ** b  # <- the power

    base, exponent = int(rng.integers(-5, 6)), int(rng.integers(0, 8))
    assert power(base, exponent) == base ** exponent
    with pytest.raises(AssertionError) as e:
        power(base, -int(rng.integers(1, 5)))
        qd.sync()
    assert "Negative exponent in pow(int, int) is not allowed." in str(e.value)
    assert f"{line_of('<- the power')}" in str(e.value)


AOT_MODULE = '''import qdc as qd

@qd.kernel
def bounded(x: qd.i32):
    print("got", x)
    assert x < 10, f"x={x}"
'''


def test_ahead_of_time_build_with_debug_prints_and_asserts(tmp_path, capfd, rng):
    src = tmp_path / "k"
    src.mkdir()
    (src / "checks.py").write_text(AOT_MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = CliRunner().invoke(cli, ["build", str(src), "--cache", cache, "-j", "1", "--debug"])
    assert r.exit_code == 0, r.output
    checks = load(cache, "checks")
    good, bad = int(rng.integers(0, 10)), int(rng.integers(10, 1000))
    checks.bounded(good)
    with pytest.raises(AssertionError) as e:
        checks.bounded(bad)
    assert f"checks.py:6:5: kernel 'bounded': x={bad}" in str(e.value)
    assert capfd.readouterr().out.splitlines() == [f"got {good}", f"got {bad}"]


def arithmetic_kernels():
    @qd.kernel
    def plain_kernel(a: qd.types.ndarray(dtype=qd.i32, ndim=1), s: qd.i32):
        for i in range(a.shape[0]):
            a[i] = (a[i] + s) * (a[i] - s) << 2

    @qd.kernel
    def with_assert1(a: qd.types.ndarray(dtype=qd.i32, ndim=1), s: qd.i32):
        for i in range(a.shape[0]):
            assert a[i] > s, "compiled away"
            a[i] = (a[i] + s) * (a[i] - s) << 2
    return plain_kernel._primal, with_assert1._primal


CODE_ARTIFACTS = {"cpu": "ll", "vulkan": "spirv_t0", "cuda": "ptx"}


@pytest.mark.parametrize("target", sorted(CODE_ARTIFACTS))
def test_without_debug_the_code_has_no_trace_of_checks(target):
    plain, with_assert = arithmetic_kernels()
    key = CODE_ARTIFACTS[target]
    code = [K.compile_kernel(k.fn, k.params, Options(arch=target), arch=target).artifacts[key] for k in (plain, with_assert)]
    # the kernels differ only in their names (of one length), which the code spells in symbols
    assert code[0].replace(b"plain_kernel", b"with_assert1") == code[1]
    debug = K.compile_kernel(plain.fn, plain.params, Options(arch=target, debug=True), arch=target)
    assert debug.artifacts[key] != code[0] and len(debug.meta.messages) == 4


def printing_kernel():
    @qd.kernel
    def everything(a: qd.types.ndarray(dtype=qd.i64, ndim=1), h: qd.f16, d: qd.f64, u: qd.u8, flag: qd.i32):
        for i in range(a.shape[0]):
            print(f"{i}: {a[i] * 3} {h} {d:.4f} {u}", flag > 0)
            assert a[i] ** 2 >= 0, f"a[{i}]={a[i]}"
    return everything._primal


def test_spirv_of_messages_passes_validation():
    k = printing_kernel()
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="vulkan", debug=True), arch="vulkan")
    for name, module in compiled.artifacts.items():
        if name.startswith("spirv_"):
            assert spirv_tools.validate(module) is None


def test_ptx_of_messages_assembles():
    k = printing_kernel()
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="cuda", debug=True), arch="cuda")
    ptx = compiled.artifacts["ptx"].decode()
    assert "atom.global.add.u32" in ptx or "atom.add.u32" in ptx
    if toolkit.ptxas_path() is None:
        pytest.skip(f"ptxas not installed (pip install {toolkit.PACKAGE}): PTX generated but not assembled")
    toolkit.assemble(ptx, "sm_90")


def test_amdgpu_code_objects_of_messages_build():
    from qdc.compiler.targets.amdgpu import linker
    if not linker.find_lld():
        pytest.skip(f"no ld.lld {linker.MIN_LLD}+ ({linker.INSTALL_HINT}): no AMDGPU build")
    k = printing_kernel()
    compiled = K.compile_kernel(k.fn, k.params, Options(arch="amdgpu", debug=True), arch="amdgpu")
    assert any(name.startswith("hsaco_") and blob for name, blob in compiled.artifacts.items())
