"""Acceptance tests of docs/api.md (configuration, the qdc command, a few kernel-language corners),
written from the page alone:
the `qdc` command end to end in subprocesses on temporary folders (`build` of a folder and of one
file, its summary, cache hits, `-v`, `--force`, `-j`, a failing kernel or module, usage errors;
`ls`, `inspect`, `clean`), `qdc.yaml` / `[tool.qdc]` and their precedence, integer semantics,
control flow, math builtins and atomics in direct mode. Deployment (`verify`, `pack`, loading
without the compiler): test_acceptance_deploy.py."""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import qdc as qd
from acceptance_util import compile_error_checker
from qdc.runtime import load

HEAT = '''
import qdc as qd

n = qd.field(qd.i32, shape=())
x = qd.field(qd.f32, shape=16, needs_grad=True)
y = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.func
def step(v):
    return qd.sin(v) * 0.95 + 0.01


@qd.kernel
def compute():
    for i in x:
        v = x[i]
        for _ in range(n[None]):
            v = step(v)
        y[None] += v


@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
    for i in range(a.shape[0]):
        a[i] = a[i] * s


@qd.kernel
def power_sum(f: qd.template(), p: qd.template()) -> qd.f32:
    s = 0.0
    for i in f:
        s += f[i] ** p
    return s


cube_x = qd.aot.instantiate(power_sum, f=x, p=3)
'''

OTHER = '''
import qdc as qd

z = qd.field(qd.i32, shape=8)


@qd.kernel
def fill(k: qd.i32):
    for i in z:
        z[i] = i * k
'''

# heat: compute, compute.grad, scale, cube_x, cube_x.grad (power_sum only through cube_x); other: fill
HEAT_VARIANTS = ["heat.compute", "heat.compute.grad", "heat.scale", "heat.cube_x", "heat.cube_x.grad"]
ALL_VARIANTS = HEAT_VARIANTS + ["other.fill"]

BROKEN = '''
import qdc as qd

a = qd.field(qd.f32, shape=4)


@qd.kernel
def good():
    for i in a:
        a[i] = i * 2.0


@qd.kernel
def bad():
    for i in a:
        a[i] = open("nothing.txt")


@qd.kernel
def also_good():
    for i in a:
        a[i] += 1.0
'''

# A module whose only kernel stores literal arithmetic into an f64 field: default_fp decides
# whether the locals holding `0.1` and `1 / 3` are f32 or f64.
LITERALS = '''
import qdc as qd

out = qd.field(qd.f64, shape=2)


@qd.kernel
def literals():
    v = 0.1  # a local takes the type of its first value: default_fp
    out[0] = v * 3
    w = 1 / 3
    out[1] = w
'''

SUMMARY = re.compile(r"(\d+) built, (\d+) cached, (\d+) failed")


def qdc_cmd(*args, cwd=None):
    """`qdc ARGS` in a subprocess: (exit code, stdout + stderr)."""
    exe = shutil.which("qdc")
    assert exe, "the `qdc` console script is not installed (docs/api.md, Installing)"
    r = subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def summary(out: str) -> tuple:
    """(built, cached, failed) from a build's summary line."""
    found = SUMMARY.findall(out)
    assert len(found) == 1, out
    return tuple(int(v) for v in found[0])


def build_ok(*args, cwd=None) -> str:
    rc, out = qdc_cmd("build", *args, cwd=cwd)
    assert rc == 0, out
    assert "Traceback" not in out, out
    return out


def write_modules(folder, **modules) -> str:
    os.makedirs(folder, exist_ok=True)
    for name, text in modules.items():
        with open(os.path.join(folder, f"{name}.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
    return str(folder)


def files_under(folder) -> dict:
    """relative posix path -> size of every file under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
    return out


def run_fill(cache, k=7) -> np.ndarray:
    mod = load(cache, "other", arch="cpu")
    mod.fill(k)
    return mod.z.to_numpy()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """kernels/ (heat.py, other.py) built for the CPU into cache/ with `-j 2`; the build's output."""
    root = tmp_path_factory.mktemp("project")
    write_modules(root / "kernels", heat=HEAT, other=OTHER)
    out = build_ok("kernels", "--arch", "cpu", "--cache", "cache", "-j", "2", cwd=root)
    return root, out


# ---- build ----------------------------------------------------------------------------------

def test_build_names_every_variant_and_prints_a_summary(project):
    root, out = project
    for variant in ALL_VARIANTS:
        assert re.search(re.escape(variant) + r"\b", out), (variant, out)
    assert "power_sum" not in out.replace("cube_x", ""), out  # a template kernel: only its instantiation
    assert summary(out) == (len(ALL_VARIANTS), 0, 0), out


def test_rebuild_is_all_cache_hits_and_verbose_names_each_hit(project):
    root, _ = project
    quiet = build_ok("kernels", "--arch", "cpu", "--cache", "cache", cwd=root)
    assert summary(quiet) == (0, len(ALL_VARIANTS), 0), quiet
    assert "heat.compute" not in quiet, quiet  # without -v a hit is not named
    verbose = build_ok("kernels", "--arch", "cpu", "--cache", "cache", "-v", cwd=root)
    assert summary(verbose) == (0, len(ALL_VARIANTS), 0), verbose
    for variant in ALL_VARIANTS:
        assert re.search(re.escape(variant) + r"\b", verbose), (variant, verbose)


def test_force_recompiles_everything_and_the_result_still_runs(project, tmp_path):
    root, _ = project
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    out = build_ok(root / "kernels", "--cache", cache, "--force", "-j", "2")
    assert summary(out) == (len(ALL_VARIANTS), 0, 0), out
    np.testing.assert_array_equal(run_fill(str(cache), 5), np.arange(8) * 5)


def test_single_file_build_and_ls(project, tmp_path):
    root, _ = project
    out = build_ok(root / "kernels" / "other.py", "--cache", tmp_path / "single")
    assert summary(out) == (1, 0, 0), out
    rc, listing = qdc_cmd("ls", "--cache", tmp_path / "single")
    assert rc == 0 and "other" in listing and "fill" in listing and "heat" not in listing, listing

    rc, listing = qdc_cmd("ls", "--cache", root / "cache")
    assert rc == 0, listing
    for name in ("heat", "other", "compute", "scale", "cube_x", "fill", "cpu"):
        assert name in listing, (name, listing)
    assert re.search(r"\d+(\.\d+)? ?(B|KiB|KB|K|MiB|MB)\b", listing), listing  # sizes
    assert re.search(r"20\d\d-\d\d-\d\d", listing), listing  # build dates


def test_a_failing_kernel_fails_alone_with_exit_1(tmp_path):
    kernels = write_modules(tmp_path / "kernels", broken=BROKEN, other=OTHER)
    cache = tmp_path / "cache"
    rc, out = qdc_cmd("build", kernels, "--cache", cache, "-j", "2")
    assert rc == 1, out
    assert "Traceback" not in out, out
    assert summary(out) == (3, 0, 1), out  # good, also_good and other.fill still built
    bad_line = BROKEN.splitlines().index('        a[i] = open("nothing.txt")') + 1
    path = os.path.join(kernels, "broken.py")
    assert re.search(re.escape(path) + rf":{bad_line}:\d+: error: ", out), out
    assert 'a[i] = open("nothing.txt")' in out, out  # the source line, as a C compiler prints it
    assert "broken.good" in out and "broken.also_good" in out, out
    np.testing.assert_array_equal(run_fill(str(cache), 3), np.arange(8) * 3)

    # the kernels that compiled were stored: once `bad` is fixed only it is compiled
    fixed = BROKEN.replace('open("nothing.txt")', "a[i] * 0.5")
    write_modules(kernels, broken=fixed)
    out = build_ok(kernels, "--cache", cache)
    assert summary(out) == (1, 3, 0), out


def test_a_module_that_cannot_be_imported_fails_alone_with_exit_1(tmp_path):
    kernels = write_modules(tmp_path / "kernels", other=OTHER,
                            explodes='import qdc as qd\n\nraise RuntimeError("no kernels today")\n',
                            unparsable="import qdc as qd\n\n\ndef f(:\n    pass\n")
    rc, out = qdc_cmd("build", kernels, "--cache", tmp_path / "cache")
    assert rc == 1 and "Traceback" not in out, out
    assert re.search(re.escape(os.path.join(kernels, "explodes.py")) + r":3\b", out), out
    assert "no kernels today" in out, out
    assert re.search(re.escape(os.path.join(kernels, "unparsable.py")) + r":4\b", out), out
    assert summary(out)[0] == 1, out
    np.testing.assert_array_equal(run_fill(str(tmp_path / "cache"), 4), np.arange(8) * 4)


@pytest.mark.parametrize("target, package", [("metal", "spirv-cross"), ("amdgpu", "lld")])
def test_a_missing_build_tool_is_a_clear_error_naming_its_package(tmp_path, target, package):
    """Only the interpreter's folder and a linker on PATH: the system tool the arch needs is gone."""
    script = os.path.join(os.path.dirname(sys.executable), "qdc")
    if not os.path.isfile(script):
        pytest.skip("the qdc script is not installed beside the interpreter")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "bash", "ld", "cc"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bare / tool)
    write_modules(tmp_path / "kernels", other=OTHER)
    env = dict(os.environ, PATH=f"{bare}{os.pathsep}{os.path.dirname(sys.executable)}")
    r = subprocess.run([script, "build", "kernels", "--arch", target, "--cache", "c"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if r.returncode == 0:
        pytest.skip(f"{target}'s tool was found without PATH")
    assert r.returncode == 1 and package in out and "Traceback" not in out, out


@pytest.mark.parametrize("args", [
    ["build"],
    ["build", "no_such_folder"],
    ["build", "{k}", "--arch", "nonsense"],
    ["build", "{k}", "--opt-level", "7"],
    ["build", "{k}", "-j", "0"],
    ["build", "{k}", "--no-such-flag"],
    ["build", "{k}", "--cpu-target", "pentium9000"],
    ["inspect"],
    ["inspect", "no_dot_here", "--cache", "{c}"],
    ["pack", "--cache", "{c}"],
    ["clean", "--cache", "{c}", "--max-size", "banana"],
    ["frobnicate"],
], ids=lambda a: " ".join(a))
def test_usage_errors_exit_2(project, args):
    root, _ = project
    args = [a.format(k=root / "kernels", c=root / "cache") for a in args]
    rc, out = qdc_cmd(*args, cwd=root)
    assert rc == 2, (args, rc, out)
    assert "Traceback" not in out, out


# ---- inspect --------------------------------------------------------------------------------

def test_inspect_views(project):
    root, _ = project
    cache = root / "cache"
    rc, meta = qdc_cmd("inspect", "heat.compute", "--cache", cache)
    assert rc == 0 and "compute" in meta, meta
    rc, ir = qdc_cmd("inspect", "heat.compute", "--cache", cache, "--ir")
    assert rc == 0 and "compute" in ir and ir.strip() != meta.strip(), ir
    rc, llvm = qdc_cmd("inspect", "heat.compute", "--cache", cache, "--llvm")
    assert rc == 0 and "define " in llvm, llvm
    rc, ir_inst = qdc_cmd("inspect", "heat.cube_x", "--cache", cache, "--ir")
    assert rc == 0 and ir_inst.strip(), ir_inst
    # the reverse-mode variant's adstack is sized by the trip count n[None]
    rc, sizes = qdc_cmd("inspect", "heat.compute.grad", "--cache", cache, "--size-expr")
    assert rc == 0 and re.search(r"\bn\b", sizes), sizes
    rc, missing = qdc_cmd("inspect", "heat.no_such_kernel", "--cache", cache)
    assert rc != 0 and "no_such_kernel" in missing and "Traceback" not in missing, missing
    rc, wrong_view = qdc_cmd("inspect", "heat.compute", "--cache", cache, "--spirv")
    assert rc != 0 and "Traceback" not in wrong_view, wrong_view  # a CPU build has no SPIR-V


def test_inspect_size_expr_of_a_kernel_names_its_gradients_adstacks(project):
    root, _ = project
    rc, sizes = qdc_cmd("inspect", "heat.compute", "--cache", root / "cache", "--size-expr")
    assert rc == 0 and re.search(r"\bn\b", sizes), sizes


def test_build_for_vulkan_without_a_gpu_and_inspect_spirv(project, tmp_path):
    root, _ = project
    cache = tmp_path / "cache"
    out = build_ok(root / "kernels" / "other.py", "--arch", "cpu,vulkan", "--cache", cache)
    assert summary(out) == (2, 0, 0), out
    rc, listing = qdc_cmd("ls", "--cache", cache)
    assert rc == 0 and "vulkan" in listing and "cpu" in listing, listing
    if shutil.which("spirv-dis") is None:
        pytest.skip("spirv-dis is not installed")
    rc, spirv = qdc_cmd("inspect", "other.fill", "--arch", "vulkan", "--cache", cache, "--spirv")
    assert rc == 0 and "OpEntryPoint" in spirv and "OpCapability" in spirv, spirv


# ---- clean ----------------------------------------------------------------------------------

def test_clean_max_size_above_the_cache_keeps_everything_and_all_empties_it(project, tmp_path):
    root, _ = project
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    rc, out = qdc_cmd("clean", "--cache", cache, "--max-size", "1G")
    assert rc == 0, out
    np.testing.assert_array_equal(run_fill(str(cache), 2), np.arange(8) * 2)
    rc, out = qdc_cmd("verify", "--cache", cache)
    assert rc == 0, out

    rc, out = qdc_cmd("clean", "--cache", cache, "--all")
    assert rc == 0, out
    rc, listing = qdc_cmd("ls", "--cache", cache)
    assert "fill" not in listing and "compute" not in listing, listing
    with pytest.raises(Exception, match="other"):
        run_fill(str(cache))
    out = build_ok(root / "kernels", "--cache", cache)
    assert summary(out) == (len(ALL_VARIANTS), 0, 0), out  # nothing was left to hit


def _counter_module(name: str) -> str:
    return f'''
import qdc as qd

f_{name} = qd.field(qd.f32, shape=8)


@qd.kernel
def bump():
    for i in f_{name}:
        f_{name}[i] += 1.0
'''


def test_clean_max_size_evicts_the_least_recently_used_first(tmp_path):
    """a, b, c of the same size; a and b are used (cache hits) after c was built, so a limit that
    holds two of them evicts c."""
    kernels = tmp_path / "kernels"
    for name in "abc":
        write_modules(kernels, **{f"lru_{name}": _counter_module(name)})
    cache = tmp_path / "cache"
    build_ok(kernels / "lru_a.py", "--cache", cache)
    one_module = sum(files_under(cache).values())
    build_ok(kernels / "lru_b.py", "--cache", cache)
    build_ok(kernels / "lru_c.py", "--cache", cache)
    for name in "ab":
        time.sleep(0.05)
        assert summary(build_ok(kernels / f"lru_{name}.py", "--cache", cache)) == (0, 1, 0)
    rc, out = qdc_cmd("clean", "--cache", cache, "--max-size", str(int(one_module * 2.5)))
    assert rc == 0, out
    assert sum(files_under(cache).values()) <= one_module * 2.5
    for name in "ab":
        mod = load(str(cache), f"lru_{name}", arch="cpu")
        mod.bump()
        np.testing.assert_array_equal(getattr(mod, f"f_{name}").to_numpy(), np.ones(8, np.float32))
    with pytest.raises(Exception, match="lru_c"):
        load(str(cache), "lru_c", arch="cpu").bump()


# ---- configuration (§5) ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def config_project(tmp_path_factory):
    """A folder holding kernels/other.py."""
    root = tmp_path_factory.mktemp("config")
    write_modules(root / "kernels", other=OTHER)
    return root


@pytest.fixture
def config_file(config_project):
    """`write(kind, text)` puts qdc.yaml or pyproject.toml into the config project; both are
    removed afterwards."""
    paths = {"yaml": config_project / "qdc.yaml", "pyproject": config_project / "pyproject.toml"}

    def write(kind, text):
        for p in paths.values():
            p.unlink(missing_ok=True)
        paths[kind].write_text(textwrap.dedent(text), encoding="utf-8")
    yield write
    for p in paths.values():
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("kind, text, flag", [
    ("yaml", "opt_level: 0\n", ["--opt-level", "3"]),
    ("pyproject", "[tool.qdc]\nopt_level = 1\n", ["--opt-level", "3"]),
    ("yaml", "fast_math: true\n", ["--no-fast-math"]),
    ("pyproject", "[project]\nname = 'p'\n\n[tool.qdc]\nfast_math = true\n", ["--no-fast-math"]),
    ("yaml", "default_fp: f64\n", ["--default-fp", "f32"]),
    ("pyproject", '[tool.qdc]\ndefault_fp = "f64"\n', ["--default-fp", "f32"]),
    ("yaml", "debug: true\n", ["--no-debug"]),
    ("yaml", "cpu_target: native\n", ["--cpu-target", "portable"]),
])
def test_code_options_from_the_file_make_new_entries_and_flags_win(config_project, config_file, tmp_path,
                                                                   kind, text, flag):
    cache = tmp_path / "cache"
    assert summary(build_ok("kernels", "--cache", cache, cwd=config_project)) == (1, 0, 0)
    config_file(kind, text)
    assert summary(build_ok("kernels", "--cache", cache, cwd=config_project)) == (1, 0, 0)  # a new entry
    assert summary(build_ok("kernels", "--cache", cache, cwd=config_project)) == (0, 1, 0)
    # the flag restores the default, whose entry was built first
    assert summary(build_ok("kernels", "--cache", cache, *flag, cwd=config_project)) == (0, 1, 0)


def test_default_fp_from_the_file_changes_results_and_the_flag_wins(tmp_path):
    write_modules(tmp_path / "kernels", literals=LITERALS)
    f32_third = float(np.float32(1) / np.float32(3))
    f32_point3 = float(np.float32(0.1) * np.float32(3))

    def values(cache):
        mod = load(str(cache), "literals", arch="cpu")
        mod.literals()
        return mod.out.to_numpy().tolist()

    build_ok("kernels", "--cache", "default", cwd=tmp_path)
    assert values(tmp_path / "default") == [f32_point3, f32_third]
    (tmp_path / "qdc.yaml").write_text("default_fp: f64\n", encoding="utf-8")
    build_ok("kernels", "--cache", "from_file", cwd=tmp_path)
    assert values(tmp_path / "from_file") == [0.1 * 3, 1 / 3]
    build_ok("kernels", "--cache", "flag", "--default-fp", "f32", cwd=tmp_path)
    assert values(tmp_path / "flag") == [f32_point3, f32_third]


def test_arch_from_pyproject_and_the_flag_wins(tmp_path):
    write_modules(tmp_path / "kernels", other=OTHER)
    (tmp_path / "pyproject.toml").write_text('[tool.qdc]\narch = "vulkan"\ncache_dir = "fromfile"\n', encoding="utf-8")
    build_ok("kernels", cwd=tmp_path)
    rc, listing = qdc_cmd("ls", "--cache", tmp_path / "fromfile")
    assert rc == 0 and "vulkan" in listing and "cpu" not in listing, listing
    build_ok("kernels", "--arch", "cpu", cwd=tmp_path)
    rc, listing = qdc_cmd("ls", "--cache", tmp_path / "fromfile")
    assert rc == 0 and "cpu" in listing, listing


@pytest.mark.parametrize("text, word", [
    ("opt_level: 9\n", "opt_level"),
    ("cpu_target: pentium9000\n", "pentium9000"),
    ("no_such_option: 1\n", "no_such_option"),
    ("default_fp: i32\n", "default_fp"),
])
def test_bad_values_in_qdc_yaml_are_usage_errors_naming_them(config_project, config_file, text, word):
    config_file("yaml", text)
    rc, out = qdc_cmd("build", "kernels", cwd=config_project)
    assert rc == 2 and word in out and "Traceback" not in out, out


# ---- §2 corners -----------------------------------------------------------------------------

def test_compile_error_shows_the_source_line(tmp_path):
    path = write_modules(tmp_path, located=textwrap.dedent('''
        import qdc as qd

        v = qd.field(qd.f32, shape=4)


        @qd.kernel
        def k():
            for i in v:
                v[i] = id(v)  # offending
    '''))
    sys.path.insert(0, path)
    try:
        import located
    finally:
        sys.path.remove(path)
    msg = compile_error_checker(os.path.join(path, "located.py"))(located.k, "offending")
    assert "v[i] = id(v)" in msg, msg


def test_integer_semantics_and_control_flow_follow_python(rng):
    n = 64
    a = rng.integers(-1000, 1000, n).astype(np.int32)
    b = rng.integers(1, 50, n).astype(np.int32) * rng.choice([-1, 1], n).astype(np.int32)
    out = np.zeros((n, 6), np.int32)

    @qd.kernel
    def ints(a: qd.types.ndarray(dtype=qd.i32, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1),
             out: qd.types.ndarray(dtype=qd.i32, ndim=2)):
        for i in range(a.shape[0]):
            out[i, 0] = a[i] // b[i]
            out[i, 1] = a[i] % b[i]
            p, q = a[i], b[i]
            p, q = q, p + q
            out[i, 2] = p * 10000 + q
            steps = 0
            k = a[i]
            while True:  # collatz-like walk with break and continue
                if k == 1 or steps >= 20:
                    break
                steps += 1
                if k % 2 == 0:
                    k = k // 2
                    continue
                k = 3 * k + 1
            out[i, 3] = steps
            s = 0
            for j in range(3, 40, 7):
                s += j * (a[i] & 15)
            out[i, 4] = s
            out[i, 5] = (a[i] ^ b[i]) | (a[i] << 2) >> 1

    ints(a, b, out)

    def walk(k):
        steps = 0
        while not (k == 1 or steps >= 20):
            steps += 1
            k = k // 2 if k % 2 == 0 else 3 * k + 1
        return steps

    np.testing.assert_array_equal(out[:, 0], a // b)
    np.testing.assert_array_equal(out[:, 1], a % b)
    np.testing.assert_array_equal(out[:, 2], b * 10000 + (a + b))
    np.testing.assert_array_equal(out[:, 3], [walk(int(k)) for k in a])
    np.testing.assert_array_equal(out[:, 4], sum(range(3, 40, 7)) * (a & 15))
    np.testing.assert_array_equal(out[:, 5], (a ^ b) | ((a << 2) >> 1))


def test_ndrange_with_begin_end_pairs_and_u1(rng):
    grid = qd.field(qd.i32, shape=(6, 7))
    flags = qd.field(qd.u1, shape=(6, 7))
    vals = rng.integers(-5, 5, (6, 7)).astype(np.int32)
    grid.from_numpy(vals)

    @qd.kernel
    def mark():
        for i, j in qd.ndrange((1, 5), 7):
            flags[i, j] = grid[i, j] > 0

    mark()
    want = np.zeros((6, 7), bool)
    want[1:5, :] = vals[1:5, :] > 0
    np.testing.assert_array_equal(flags.to_numpy().astype(bool), want)


@pytest.mark.parametrize("dtype, np_dtype, rtol", [(qd.f32, np.float32, 2e-6), (qd.f64, np.float64, 1e-14)])
def test_scalar_math_builtins_match_numpy(rng, dtype, np_dtype, rtol):
    n = 257
    a = rng.uniform(-0.99, 0.99, n).astype(np_dtype)
    b = rng.uniform(0.1, 3.0, n).astype(np_dtype)
    out = np.zeros((n, 16), np_dtype)

    @qd.kernel
    def math(a: qd.types.ndarray(dtype=dtype, ndim=1), b: qd.types.ndarray(dtype=dtype, ndim=1),
             out: qd.types.ndarray(dtype=dtype, ndim=2)):
        for i in range(a.shape[0]):
            x, y = a[i], b[i]
            out[i, 0] = qd.sin(x) + qd.cos(y)
            out[i, 1] = qd.tan(x)
            out[i, 2] = qd.asin(x) - qd.acos(x)
            out[i, 3] = qd.atan2(x, y)
            out[i, 4] = qd.tanh(y) * qd.exp(x)
            out[i, 5] = qd.log(y) + qd.sqrt(y)
            out[i, 6] = qd.rsqrt(y)
            out[i, 7] = qd.floor(x * 10) + qd.ceil(y * 10)
            out[i, 8] = qd.pow(y, x)
            out[i, 9] = qd.select(x > 0, x, y)
            out[i, 10] = qd.cast(y * 7, qd.i32)
            out[i, 11] = int(y * 5) + float(qd.cast(x * 100, qd.i32))
            out[i, 12] = abs(x) + qd.abs(-y)
            out[i, 13] = min(x, y, 0.25) + qd.max(x, y, -0.5)
            out[i, 14] = x ** 2 + y ** 0.5
            out[i, 15] = -x / y

    math(a, b, out)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.stack([
        np.sin(a64) + np.cos(b64), np.tan(a64), np.arcsin(a64) - np.arccos(a64), np.arctan2(a64, b64),
        np.tanh(b64) * np.exp(a64), np.log(b64) + np.sqrt(b64), 1 / np.sqrt(b64),
        np.floor(a * np_dtype(10)) + np.ceil(b * np_dtype(10)), b64 ** a64, np.where(a > 0, a64, b64),
        np.trunc(b * np_dtype(7)), np.trunc(b * np_dtype(5)) + np.trunc(a * np_dtype(100)),
        np.abs(a64) + b64, np.minimum(np.minimum(a64, b64), 0.25) + np.maximum(np.maximum(a64, b64), -0.5),
        a64 ** 2 + np.sqrt(b64), -a64 / b64], axis=1)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)


def test_scalar_atomics_return_old_values(rng):
    n = 1000
    vals = rng.integers(0, 1 << 20, n).astype(np.int32)
    counter = qd.field(qd.i32, shape=())
    order = qd.field(qd.i32, shape=n)
    lo, hi = qd.field(qd.i32, shape=()), qd.field(qd.i32, shape=())
    bits_and, bits_or, bits_xor = (qd.field(qd.i32, shape=()) for _ in range(3))
    lo[None], hi[None], bits_and[None] = 1 << 30, -1, -1

    @qd.kernel
    def tickets(v: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(v.shape[0]):
            slot = qd.atomic_add(counter[None], 1)  # the old value: every i gets its own slot
            order[slot] = i
            qd.atomic_min(lo[None], v[i])
            qd.atomic_max(hi[None], v[i])
            qd.atomic_and(bits_and[None], v[i])
            qd.atomic_or(bits_or[None], v[i])
            qd.atomic_xor(bits_xor[None], v[i])

    tickets(vals)
    assert counter[None] == n
    np.testing.assert_array_equal(np.sort(order.to_numpy()), np.arange(n))
    assert (lo[None], hi[None]) == (int(vals.min()), int(vals.max()))
    assert bits_and[None] == int(np.bitwise_and.reduce(vals))
    assert bits_or[None] == int(np.bitwise_or.reduce(vals))
    assert bits_xor[None] == int(np.bitwise_xor.reduce(vals))
