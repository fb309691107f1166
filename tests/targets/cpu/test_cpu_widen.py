"""The CPU's width-W lowering of parallel tasks (compiler/targets/cpu/widen.py) against the
scalar code of the same kernels (QDC_CPU_WIDEN=0 forces it): bit for bit where the arithmetic is
exact (random programs of + - * /, min, max, comparisons, varying ifs, while loops, loops with
per-lane trip counts, break and continue, gathers, scatters and integer atomics), lane counts and
range ends that leave a masked remainder, at every x86-64 ISA level (W = 4, 8, 16 f32 lanes);
within the documented ulps where the math functions differ (the scalar code's loop-carried
chains call the C library); and the same random gradients as tests/autodiff's generator.
"""
from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import uuid
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.targets.cpu.widen_plan import SCALAR_SWITCH
from qdc.runtime.adstack import describe_launch
from qdc.runtime.devices.cpu.device import host_features
from test_random_gradients import _kernel_source, _program_body

LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


def _host_runs(level: str) -> bool:
    from qdc.compiler.targets.cpu.isa_levels import level_by_name
    found = level_by_name(level)
    return found is not None and set(found[1].requires) <= set(host_features())


class _ExactProgram:
    """Random kernel text whose every operation is exactly rounded, so that lanes and the scalar
    loop must agree bit for bit."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def expr(self, depth: int) -> str:
        if depth == 0 or self.rng.random() < 0.25:
            return self.pick(["v", "w", "kf", f"{self.rng.uniform(-2, 2):.3f}"])
        a, b = self.expr(depth - 1), self.expr(depth - 1)
        return self.pick([f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} / (2.0 + qd.abs({b})))",
                          f"qd.min({a}, {b})", f"qd.max({a}, {b})", f"({a} * 0.75)"])

    def statements(self, count: int) -> list[str]:
        e = self.expr
        forms = [
            lambda: [f"v = {e(2)}"],
            lambda: [f"w = {e(2)}"],
            lambda: [f"if {self.pick(['v > w', 'ki % 3 == 0', 'm > 2', 'v < 0.5'])}:", f"    v = {e(2)}",
                     "else:", f"    w = {e(2)}"],
            lambda: ["j = 0", "while j < ki % 4:", f"    v = {e(2)}", "    j += 1"],
            lambda: ["for t in range(ki % 3):", f"    w = {e(2)}"],
            lambda: ["for t in range(m):", f"    v = {e(2)}", "    if v > 3.0:", "        break"],
            lambda: ["for t in range(m):", "    if (ki + t) % 2 == 0:", "        continue", f"    w = {e(2)}"],
            lambda: ["for t in range(ki % 4):", "    if m > 2:", "        break", "    else:", f"        w = {e(2)}",
                     f"    v = {e(1)}"],
            lambda: ["t = 0", "while True:", "    t += 1", f"    v = v * 0.5 + {e(1)}",
                     "    if t > ki % 5 or v > 8.0:", "        break"],
            lambda: [f"v = v + a[(i * 3 + ki) % a.shape[0]] * {self.rng.uniform(-1, 1):.3f}"],
            lambda: ["if ki > 4:", "    counts[ki % 5] += 1"],
        ]
        lines = []
        for _ in range(count):
            lines += self.pick(forms)()
        # an inner loop, what makes a task run W iterations at a time; last, so that what it
        # computes reaches the stores (an earlier one can be dead code, leaving no inner loop)
        return lines + self.pick(forms[3:9])()

    def source(self, dtype: str) -> str:
        body = self.statements(int(self.rng.integers(3, 7)))
        lines = ["import qdc as qd", "", f"nf = qd.types.ndarray(dtype=qd.{dtype}, ndim=1)",
                 "ni = qd.types.ndarray(dtype=qd.i32, ndim=1)", "", "@qd.kernel",
                 "def program(a: nf, b: nf, k: ni, out: nf, out2: nf, counts: ni, total: ni, m: qd.i32):",
                 "    for i in range(a.shape[0]):", "        v, w, ki = a[i], b[i], k[i]",
                 f"        kf = qd.cast(ki, qd.{dtype}) * 0.25"]
        lines += ["        " + line for line in body]
        lines += ["        out[i] = v", "        out2[(i * 7) % out2.shape[0]] = w", "        total[0] += ki", ""]
        return "\n".join(lines)


def _import(tmp_path, monkeypatch, source: str, stem: str):
    path = tmp_path / f"{stem}_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(path.stem), source


def _run_both(monkeypatch, tmp_path, run, **init):
    """run() once with the scalar code and once with the width-W code, each in a fresh runtime
    (and cache); their results."""
    results = {}
    for widen in ("0", "1"):
        monkeypatch.setenv(SCALAR_SWITCH, widen)
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / f"cache-{widen}"), **init)
        results[widen] = run()
    return results["0"], results["1"]


def _same_bits(scalar, widened, what):
    for s, w in zip(scalar, widened):
        nan = np.isnan(s) if s.dtype.kind == "f" else np.zeros(s.shape, bool)
        np.testing.assert_array_equal(np.isnan(w) if w.dtype.kind == "f" else nan, nan, err_msg=what)
        unsigned = {4: np.uint32, 8: np.uint64}[s.dtype.itemsize]
        np.testing.assert_array_equal(np.where(nan, 0, s).view(unsigned), np.where(nan, 0, w).view(unsigned),
                                      err_msg=what)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_random_exact_programs_match_the_scalar_code_bit_for_bit(rng, tmp_path, monkeypatch, level, dtype):
    if not _host_runs(level):
        pytest.skip(f"this CPU cannot run {level} code")
    for case in range(4):
        gen = _ExactProgram(rng)
        module, source = _import(tmp_path, monkeypatch, gen.source(dtype), f"exact_{dtype}")
        out2_size = 211  # prime: i * 7 mod 211 never repeats below 211, so no two iterations store alike
        # (past it two iterations would store into one element, in an order threads and lanes choose)
        n = int(rng.integers(1, out2_size + 1))  # most sizes leave a remainder of a vector
        npt = np.float32 if dtype == "f32" else np.float64
        a, b = rng.uniform(-2, 2, n).astype(npt), rng.uniform(-2, 2, n).astype(npt)
        k, m = rng.integers(0, 10, n).astype(np.int32), int(rng.integers(1, 5))

        def run():
            arrays = (np.zeros(n, npt), np.zeros(out2_size, npt), np.zeros(5, np.int32), np.zeros(1, np.int32))
            module.program(a, b, k, *arrays, m)
            return arrays, kernel_of(module.program).compile((a, b, k, *arrays, m)).meta.tasks[0].launch

        # 16 threads whatever the host: chunks shorter than a vector of lanes, masked at both ends
        (scalar, scalar_launch), (widened, launch) = _run_both(monkeypatch, tmp_path, run, cpu_target=level,
                                                               cpu_max_num_threads=16)
        assert "lanes" not in scalar_launch and launch.get("lanes", 0) >= 2, (launch, source)
        _same_bits(scalar, widened, source)


def test_elementwise_math_matches_the_scalar_code_bit_for_bit(rng, tmp_path, monkeypatch):
    """Both run the inline math (no loop-carried chain): the W-lane variants compute each lane's
    bits exactly as the scalar functions do; f32 pow goes lane by lane."""
    source = "\n".join(["import qdc as qd", ""] + [
        line for dtype in ("f32", "f64") for line in (
            f"n{dtype} = qd.types.ndarray(dtype=qd.{dtype}, ndim=1)",
            f"o{dtype} = qd.types.ndarray(dtype=qd.{dtype}, ndim=2)",
            "@qd.kernel",
            f"def math_{dtype}(x: n{dtype}, y: n{dtype}, out: o{dtype}, reps: qd.i32):",
            "    for i in range(x.shape[0]):",
            "        v, u = x[i], y[i]",
            "        for _ in range(reps):  # an inner loop, so that the task runs W iterations at a time",
            *[f"            out[{j}, i] = qd.{op}(v)" for j, op in enumerate(
                ("sin", "cos", "tan", "exp", "log", "tanh", "asin", "acos", "atan", "sqrt", "floor"))],
            "            out[11, i] = qd.pow(qd.abs(v), u)",
            "            out[12, i] = qd.atan2(v, u)", "")])
    module, _ = _import(tmp_path, monkeypatch, source, "elementwise_math")
    below = np.nextafter(np.float32(0.78), np.float32(0))  # the largest argument of f32 trig's small path
    for (dtype, npt), spread in itertools.product((("f32", np.float32), ("f64", np.float64)), ("wide", "small")):
        n = 1000 + int(rng.integers(0, 16))
        if spread == "wide":
            x = np.concatenate([rng.uniform(-4, 4, n - 8), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30, 900.5]])
        else:  # every lane of every step below pi/4: f32 trig's quadrant-0 path (inline_math_vector.py)
            x = np.concatenate([rng.uniform(-0.78, 0.78, n - 8), [0.0, -0.0, below, -below, 1e-30, -1e-38, 0.5, -0.25]])
        x, y = x.astype(npt), rng.uniform(-3, 3, n).astype(npt)

        def run():
            out = np.zeros((13, n), npt)
            kernel = getattr(module, f"math_{dtype}")
            kernel(x, y, out, 1)
            return (out,), kernel_of(kernel).compile((x, y, out, 1)).meta.tasks[0].launch

        (scalar, _), (widened, launch) = _run_both(monkeypatch, tmp_path, run)
        assert launch.get("lanes", 0) >= 2, launch
        _same_bits(scalar, widened, f"{dtype}, {spread} arguments")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_random_gradients_match_the_scalar_code(rng, tmp_path, monkeypatch, dtype):
    """tests/autodiff's random differentiable programs (a dynamic loop of adstack pushes, math
    functions, conditions, a `+=` into the loss) on 37 elements: loss and gradients of the
    width-W code against the scalar code's, within what the libm calls of the scalar code's
    chains (1 ulp for f64, <= 3 ulp for f32) and the loss's summation order allow."""
    rtol = 1e-9 if dtype == "f64" else 2e-3
    widened_tasks = 0
    for case in range(4):
        body = _program_body(rng)
        source = _kernel_source(body, dtype).replace("shape=8", "shape=37")
        module, _ = _import(tmp_path, monkeypatch, source, f"grad_{dtype}")
        npt = np.float32 if dtype == "f32" else np.float64
        p, q = rng.uniform(-1.5, 1.5, 37).astype(npt), rng.uniform(-1.5, 1.5, 37).astype(npt)
        ci, trips = rng.integers(0, 5, 37).astype(np.int32), int(rng.integers(3, 12))

        def run():
            module.x.from_numpy(p)
            module.w.from_numpy(q)
            module.c.from_numpy(ci)
            module.n[None] = trips
            with qd.ad.Tape(loss=module.loss):
                module.program()
            meta = module.program.grad.compile().meta
            return (np.array([module.loss[None]]), module.x.grad.to_numpy(), module.w.grad.to_numpy()), meta

        (scalar, _), (widened, meta) = _run_both(monkeypatch, tmp_path, run)
        widened_tasks += sum("lanes" in t.launch for t in meta.tasks)
        for s, w, name in zip(scalar, widened, ("loss", "d/dx", "d/dw")):
            scale = np.abs(s).max(initial=1.0)
            np.testing.assert_allclose(w, s, rtol=rtol, atol=rtol * scale, err_msg=f"{name} of\n{source}")
    assert widened_tasks > 0  # some gradient ran W iterations at a time (a push under a per-lane `if` stays scalar)


def test_inspect_says_which_tasks_run_lanes_and_why_others_do_not(tmp_path, monkeypatch):
    source = "\n".join([
        "import qdc as qd", "nd = qd.types.ndarray(dtype=qd.f32, ndim=1)", "",
        "ni = qd.types.ndarray(dtype=qd.i32, ndim=1)", "@qd.kernel", "def both(x: nd, y: nd, c: ni):",
        "    for i in range(x.shape[0]):", "        for k in range(c[i] % 3 + 1):", "            y[i] += x[i]",
        "    for i in range(x.shape[0]):", "        y[i] += qd.random(qd.f32)",
        "    for i in range(x.shape[0]):", "        c[i] = qd.atomic_add(c[40], 1)", ""])
    module, _ = _import(tmp_path, monkeypatch, source, "inspected")
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "cache"))
    x, y, c = np.ones(40, np.float32), np.zeros(40, np.float32), np.zeros(41, np.int32)
    module.both(x, y, c)
    assert np.all(y >= 1.0) and np.all(y < 2.0) and len(set(y)) > 30  # a random number per iteration
    assert sorted(c[:40]) == list(range(40)) and c[40] == 40
    first, second, third = kernel_of(module.both).compile((x, y, c)).meta.tasks
    assert "SIMD lanes" in describe_launch(first.launch) and first.launch["lanes"] >= 2
    assert "scalar code: no inner loop" in describe_launch(second.launch)
    assert "scalar code: an atomic whose old value is used (line 13)" in describe_launch(third.launch)
    monkeypatch.setenv(SCALAR_SWITCH, "0")
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "cache"))
    assert "off" in kernel_of(module.both).compile((x, y, c)).meta.tasks[0].launch["scalar"]


RANGES_SOURCE = """
import qdc as qd
nd2 = qd.types.ndarray(dtype=qd.f32, ndim=2)
nd3 = qd.types.ndarray(dtype=qd.i32, ndim=3)

@qd.kernel
def rows(a: nd2, out: nd2, lo: qd.i32):
    for i, j in qd.ndrange((lo, a.shape[0]), a.shape[1]):  # an offset axis, rows shorter or longer than W
        z, k = a[i, j], 0
        while qd.abs(z) < 4.0 and k < (i * 3 + j) % 23:  # lanes leave at different iterations
            z = z * z - 0.5 + qd.cast(j, qd.f32) * 0.125
            k += 1
        out[i, j] = z + qd.cast(k, qd.f32)

@qd.kernel
def cells(c: nd3):
    for i, j, k in c:
        total = 0
        for m in range((i + 2 * j + 3 * k) % 5):
            total += m * i - j + k
        c[i, j, k] = total
"""


@pytest.mark.parametrize("level", LEVELS)
def test_multi_dimensional_ranges_run_lanes_bit_for_bit(rng, tmp_path, monkeypatch, level):
    """qd.ndrange (with an offset axis) and a 3-D struct-for with inner loops: each lane's
    coordinates are divided out of its flat index, so the lanes of one step may span rows; the
    same bits as the scalar code, which walks rows."""
    if not _host_runs(level):
        pytest.skip(f"this CPU cannot run {level} code")
    module, _ = _import(tmp_path, monkeypatch, RANGES_SOURCE, "ranges")
    shape2 = (int(rng.integers(3, 40)), int(rng.integers(1, 150)))
    shape3 = tuple(int(v) for v in rng.integers(1, 12, 3))
    a = rng.uniform(-1.5, 1.5, shape2).astype(np.float32)
    lo = int(rng.integers(0, 3))

    def run():
        out, c = np.full(shape2, -7.0, np.float32), np.zeros(shape3, np.int32)
        module.rows(a, out, lo)
        module.cells(c)
        launches = [kernel_of(module.rows).compile((a, out, lo)).meta.tasks[-1].launch,
                    kernel_of(module.cells).compile((c,)).meta.tasks[-1].launch]
        return (out, c), launches

    (scalar, _), (widened, launches) = _run_both(monkeypatch, tmp_path, run, cpu_target=level,
                                                 cpu_max_num_threads=16)
    assert all(launch.get("lanes", 0) >= 2 for launch in launches), launches
    assert np.all(scalar[0][:lo] == -7.0) and np.all(scalar[0][lo:] != -7.0)
    _same_bits(scalar, widened, f"{shape2} {shape3} lo={lo}")


def test_rows_known_to_be_short_keep_the_scalar_code():
    f = qd.field(qd.f32, shape=(64, 3))
    n = qd.field(qd.i32, shape=())

    @qd.kernel
    def k():
        for i, j in f:
            for _ in range(n[None]):
                f[i, j] += 1.0 + j
    n[None] = 3
    k()
    np.testing.assert_array_equal(f.to_numpy(), np.tile(3.0 * np.arange(1, 4, dtype=np.float32), (64, 1)))
    launch = kernel_of(k).compile(()).meta.tasks[-1].launch
    assert "scalar code: rows of 3 elements, fewer than a vector's lanes" in describe_launch(launch)


GRID_GRAD_SOURCE = """
import qdc as qd
x = qd.field(qd.f32, shape=(SHAPE), needs_grad=True)
n = qd.field(qd.i32, shape=())
loss = qd.field(qd.f32, shape=(), needs_grad=True)

@qd.kernel
def program():
    for i, j in x:
        v = x[i, j]
        for _ in range(n[None] + (i + j) % 3):  # per-lane trip counts: adstack counts per lane
            v = qd.sin(v) * 0.9 + 0.05 * qd.cast(j, qd.f32)
        loss[None] += v
"""


def test_gradients_of_a_multi_dimensional_range_match_the_scalar_code(rng, tmp_path, monkeypatch):
    """Reverse mode through a dynamic loop in a 2-D struct-for: lanes in rows, per-lane adstacks."""
    shape = (int(rng.integers(2, 9)), int(rng.integers(1, 90)))
    module, _ = _import(tmp_path, monkeypatch, GRID_GRAD_SOURCE.replace("SHAPE", f"{shape[0]}, {shape[1]}"),
                        "grid_grad")
    x0, trips = rng.uniform(-1, 1, shape).astype(np.float32), int(rng.integers(2, 9))

    def run():
        module.x.from_numpy(x0)
        module.n[None] = trips
        with qd.ad.Tape(loss=module.loss):
            module.program()
        launch = module.program.grad.compile().meta.tasks[-1].launch
        return (np.array([module.loss[None]]), module.x.grad.to_numpy()), launch

    (scalar, _), (widened, launch) = _run_both(monkeypatch, tmp_path, run)
    assert launch.get("lanes", 0) >= 2, launch
    np.testing.assert_allclose(widened[0], scalar[0], rtol=1e-5)  # the loss sums in another order
    np.testing.assert_allclose(widened[1], scalar[1], rtol=1e-4, atol=1e-6)  # libm sin vs the inline one per step


GATHER_SOURCE = """
import qdc as qd
nd = qd.types.ndarray(dtype=qd.f32, ndim=1)
grid = qd.types.ndarray(dtype=qd.f32, ndim=2)

@qd.kernel
def gather(pos: nd, g: grid, out: nd):
    for p in range(pos.shape[0]):  # a G2P: cells computed from positions, no inner loop
        base = qd.cast(pos[p] * 16.0 - 0.5, qd.i32)
        fx = pos[p] * 16.0 - qd.cast(base, qd.f32)
        acc = 0.0
        for i in qd.static(range(3)):
            w = 0.5 * (1.5 - fx) ** 2 if i == 0 else (0.75 - (fx - 1.0) ** 2 if i == 1 else 0.5 * (fx - 0.5) ** 2)
            acc += w * g[base + i, p % 4] - qd.min(g[base + i, 0], fx)
        out[p] = acc

@qd.kernel
def scatter(pos: nd, g: grid):
    for p in range(pos.shape[0]):  # its P2G: atomics at those cells
        base = qd.cast(pos[p] * 16.0 - 0.5, qd.i32)
        g[base + 1, p % 4] += pos[p]
"""


def test_tasks_gathering_from_computed_addresses_run_lanes(rng, tmp_path, monkeypatch):
    """A task without an inner loop that reads data-dependent addresses runs W iterations at a
    time (LLVM's vectoriser leaves it scalar), bit for bit the scalar code; one that scatters
    atomics to such addresses keeps the scalar code, saying why."""
    module, _ = _import(tmp_path, monkeypatch, GATHER_SOURCE, "gathers")
    n = 1000 + int(rng.integers(0, 64))
    pos = rng.uniform(0.1, 0.9, n).astype(np.float32)
    g = rng.uniform(-1, 1, (20, 4)).astype(np.float32)

    def run():
        out, scattered = np.zeros(n, np.float32), g.copy()
        module.gather(pos, g, out)
        module.scatter(pos, scattered)
        launches = [kernel_of(module.gather).compile((pos, g, out)).meta.tasks[0].launch,
                    kernel_of(module.scatter).compile((pos, scattered)).meta.tasks[0].launch]
        return (out, scattered), launches

    (scalar, _), (widened, (gather_launch, scatter_launch)) = _run_both(monkeypatch, tmp_path, run,
                                                                        cpu_max_num_threads=1)
    from qdc.compiler.targets.cpu.platforms import cpu_levels
    from qdc.compiler.targets.cpu.widen_codegen import has_gathers
    if has_gathers(cpu_levels("native")[0]):
        assert gather_launch.get("lanes", 0) >= 2, gather_launch
    else:  # lanes would load one by one: the scalar code (widen_codegen.TaskChoice)
        assert "no gather instructions" in describe_launch(gather_launch)
    assert "atomics at data-dependent addresses" in describe_launch(scatter_launch)
    _same_bits(scalar, widened, "gathers")


def test_an_overflowing_lane_raises_naming_the_kernel(tmp_path, monkeypatch, rng):
    """The per-lane adstacks check their capacity as the scalar ones do: a launch that needs one
    entry more than allocated raises AdStackOverflowError (kernel, allocated, required), and the
    next launch works."""
    source = "\n".join([
        "import qdc as qd", "x = qd.field(qd.f32, shape=50, needs_grad=True)", "n = qd.field(qd.i32, shape=())",
        "y = qd.field(qd.f32, shape=(), needs_grad=True)", "", "@qd.kernel", "def chain():",
        "    for i in x:", "        v = x[i]", "        for _ in range(n[None] & 1023):", "            v = qd.sin(v)",
        "        y[None] += v", ""])
    module, _ = _import(tmp_path, monkeypatch, source, "overflowing")
    qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "cache"), ad_stack_size=16)
    module.x.from_numpy(rng.uniform(0, 1, 50).astype(np.float32))
    module.n[None] = 15
    with warnings.catch_warnings():  # `&` is beyond SizeExpr: the capacity is ad_stack_size
        warnings.simplefilter("ignore")
        module.chain.grad()
    assert module.chain.grad.compile().meta.tasks[0].launch.get("lanes", 0) >= 2
    module.n[None] = 16
    with pytest.raises(qd.AdStackOverflowError) as info:
        module.chain.grad()
    assert (info.value.kernel, info.value.allocated, info.value.required) == ("chain", 16, 17)
    module.n[None] = 3
    module.x.grad.fill(0)
    module.y.grad[None] = 1
    module.chain.grad()
    v = module.x.to_numpy().astype(np.float64)
    d = np.ones_like(v)
    for _ in range(3):
        d, v = d * np.cos(v), np.sin(v)
    np.testing.assert_allclose(module.x.grad.to_numpy(), d, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_per_lane_trip_counts_keep_a_count_per_lane(rng, tmp_path, monkeypatch, dtype):
    """Each iteration pushes as often as its own trip count (and more under a per-lane `if`):
    the stacks count per lane, and the gradient matches the scalar code's."""
    source = "\n".join([
        "import qdc as qd", f"x = qd.field(qd.{dtype}, shape=45, needs_grad=True)", "t = qd.field(qd.i32, shape=45)",
        f"y = qd.field(qd.{dtype}, shape=(), needs_grad=True)", "", "@qd.kernel", "def chain():",
        "    for i in x:", "        v = x[i]", "        for k in range(t[i]):", "            v = qd.sin(v) * 0.9 + 0.05",
        "            if (k + i) % 3 == 0:", "                v = v * v * 0.5 + 0.1", "        y[None] += v", ""])
    module, _ = _import(tmp_path, monkeypatch, source, "per_lane")
    npt = np.float32 if dtype == "f32" else np.float64
    xs, trips = rng.uniform(0, 1, 45).astype(npt), rng.integers(0, 20, 45).astype(np.int32)

    def run():
        module.x.from_numpy(xs)
        module.t.from_numpy(trips)
        with qd.ad.Tape(loss=module.y):
            module.chain()
        return (module.x.grad.to_numpy(),), module.chain.grad.compile().meta.tasks[0].launch

    (scalar,), (widened,) = [r[0] for r in _run_both(monkeypatch, tmp_path, run)]
    assert run()[1].get("lanes", 0) >= 2
    np.testing.assert_allclose(widened, scalar, rtol=1e-5 if dtype == "f32" else 1e-12, atol=1e-7)
    v, d = xs.astype(np.float64), np.ones(45)
    for k in range(int(trips.max())):
        live = k < trips
        d, v = np.where(live, d * np.cos(v) * 0.9, d), np.where(live, np.sin(v) * 0.9 + 0.05, v)
        square = live & ((k + np.arange(45)) % 3 == 0)
        d, v = np.where(square, d * v, d), np.where(square, v * v * 0.5 + 0.1, v)
    np.testing.assert_allclose(widened, d, rtol=1e-4 if dtype == "f32" else 1e-10)


# ---- a portable library's widened code on a CPU without AVX-512: qemu-x86_64 -cpu max (AVX2) ------

CHAIN_SRC = '''
import qdc as qd

x = qd.field(qd.f32, shape=203, needs_grad=True)
n = qd.field(qd.i32, shape=())
y = qd.field(qd.f32, shape=(), needs_grad=True)

@qd.kernel
def chain():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = qd.sin(v) * 0.95 + 0.01
        y[None] += v
'''
QEMU_SCRIPT = '''
import sys
import numpy as np
from qdc.runtime import load
from qdc.runtime.devices.cpu import device as cpu
mod = load(sys.argv[1], "chain")
xs = np.linspace(-3, 3, 203).astype(np.float32)
mod.x.from_numpy(xs)
mod.n[None] = 9
mod.chain()
mod.x.grad.fill(0)
mod.y.grad[None] = 1
mod.chain.grad()
v, d = xs.astype(np.float64), np.ones(203)
for _ in range(9):
    d, v = d * np.cos(v) * 0.95, np.sin(v) * 0.95 + 0.01
meta = mod._kernels["chain"]._entry.meta
print("level", cpu.select_library(meta.cpu_libraries, "chain")["target"], "lanes", meta.tasks[0].launch.get("lanes"))
print("ok", bool(np.allclose(mod.y[None], v.sum(), rtol=1e-5)), bool(np.allclose(mod.x.grad.to_numpy(), d, rtol=1e-4,
                                                                              atol=1e-6)))
'''


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-x86_64 is not installed (apt-get install qemu-user)")
def test_a_portable_widened_gradient_runs_on_an_emulated_cpu_without_avx512(tmp_path):
    """The portable library holds the chain's chunk at 16, 32 and 64 lanes (x86-64-v2/v3/v4);
    under qemu's `-cpu max` (AVX2, no AVX-512) the loader picks v3 and its 32-lane code must
    give the float64 reference's values and gradients. (The v4 code runs on this host when it
    has AVX-512: the bit-for-bit tests above.)"""
    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver.options import resolve
    src = tmp_path / "chain.py"
    src.write_text(CHAIN_SRC, encoding="utf-8")
    cache = str(tmp_path / "cache")
    report = build_mod.build([str(src)], ["cpu"], resolve({"cpu_target": "portable"}, {}), cache, jobs=1,
                             log=lambda text: None)
    assert report.ok, report.errors
    script = tmp_path / "deploy.py"
    script.write_text(QEMU_SCRIPT, encoding="utf-8")
    r = subprocess.run([shutil.which("qemu-x86_64"), "-cpu", "max", sys.executable, str(script), cache],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok True True" in r.stdout and "level x86-64-v3 lanes 64" in r.stdout, r.stdout  # 64: v4's, the most
