import functools
import hashlib
import os
import shutil
import site
import sys
import tempfile

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver.options import CACHE_DIR_VARIABLE

# The tests live in folders that mirror the code (language/, targets/spirv/, devices/vulkan/, ...)
# and the shared helpers (backend_util.py, autodiff_util.py, ...) here. Every folder is on sys.path,
# so modules import each other by their base name, as pytest's default import mode names them,
# whichever folders a run collects. Base names are therefore unique across the folders.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
for _folder, _subfolders, _ in os.walk(TESTS_DIR):
    _subfolders[:] = sorted(d for d in _subfolders if d != "__pycache__" and not d.startswith("."))
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

os.environ["QDC_VERIFY_IR"] = "1"  # verify the IR between passes for every kernel the suite compiles

# The suite runs in a home folder of its own, set before any test module is even imported and
# inherited by every process a test starts: whatever a test or a qdc process it runs writes under
# ~ (the direct-mode default ~/.cache/qdc, a remote store's read-through cache) lands there, never
# in the user's home, and other processes using qdc meanwhile cannot make the suite fail. The
# device drivers' own caches (Mesa's shader cache, CUDA's JIT cache) and user-installed packages
# stay where they were: the suite is no slower for it, and its subprocesses import what it does.
_USER_HOME = os.path.expanduser("~")
_USER_CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or os.path.join(_USER_HOME, ".cache")
os.environ.setdefault("PYTHONUSERBASE", site.getuserbase())
os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(_USER_CACHE_HOME, "mesa_shader_cache"))
os.environ.setdefault("CUDA_CACHE_PATH", os.path.join(_USER_HOME, ".nv", "ComputeCache"))
SESSION_HOME = tempfile.mkdtemp(prefix="qdc-test-home-")
os.environ["HOME"] = SESSION_HOME
os.environ["XDG_CACHE_HOME"] = os.path.join(SESSION_HOME, ".cache")
# What a qdc process falling back to the user's cache would write (a test that forgets its
# cache_dir, a subprocess that drops QDC_CACHE_DIR): it must stay absent.
USER_CACHE = os.path.join(SESSION_HOME, ".cache", "qdc")
# Direct mode's cache for the whole session: a `qd.init()` without cache_dir, in a test, at
# collection or in a subprocess, uses it.
SESSION_CACHE = os.path.join(SESSION_HOME, "qdc-cache")
os.environ[CACHE_DIR_VARIABLE] = SESSION_CACHE


def _paths_under(folder: str) -> list:
    """Every path under `folder`, relative to it ([] if it is absent)."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, dirs, files in os.walk(folder) for name in dirs + files)


@pytest.fixture(scope="session", autouse=True)
def user_cache_untouched():
    """The suite fails (an error at the last test's teardown) if one of its own processes wrote the
    user's cache, which here is the session home's ~/.cache/qdc."""
    yield
    written = _paths_under(USER_CACHE)
    shutil.rmtree(SESSION_HOME, ignore_errors=True)
    if written:
        pytest.fail(f"the test session changed the user's cache ~/.cache/qdc ({len(written)} paths, e.g. "
                    f"{', '.join(written[:5])}): every test must use the session cache", pytrace=False)


@pytest.fixture(scope="session")
def session_cache_dir():
    """A cache private to this test session: every kernel is really compiled (and its IR verified)
    once (QDC_CACHE_DIR points here too)."""
    return SESSION_CACHE


@pytest.fixture(autouse=True)
def fresh_runtime(session_cache_dir):
    """Every test starts from a freshly initialised CPU runtime with default options."""
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    yield


# ---- reproducible randomness --------------------------------------------------------------
# Every test draws its inputs from `rng`, seeded by the base seed (0; `--seed N` or QDC_TEST_SEED=N
# choose another) and the test's node id: a run is repeatable, one test's draws do not depend on
# which other tests ran, and a failure's report says how to replay it.

SEED_VARIABLE = "QDC_TEST_SEED"


def base_seed(config) -> int:
    return config.getoption("--seed")


def seed_of_test(base: int, nodeid: str) -> int:
    """A 64-bit seed for the test `nodeid` (sha256, not hash(): Python salts that per process)."""
    digest = hashlib.sha256(f"{base}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the base seed and this test's node id."""
    seed = seed_of_test(base_seed(request.config), request.node.nodeid)
    request.node.stash[_SEED_KEY] = seed
    request.node.user_properties.append(("rng_seed", seed))  # in --junitxml reports too
    return np.random.default_rng(seed)


def pytest_report_header(config):
    return f"random inputs: base seed {base_seed(config)} (--seed N or {SEED_VARIABLE}=N draws others)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = item.stash.get(_SEED_KEY, None)
    if report.failed and seed is not None:
        base = base_seed(item.config)
        test = os.path.relpath(item.path, item.config.invocation_params.dir) + item.nodeid[item.nodeid.index("::"):]
        report.sections.append(("random seed", f"rng seeded with {seed} (base seed {base}); replay with "
                                               f"{SEED_VARIABLE}={base} python3 -m pytest '{test}'"))


# ---- the suite by arch ----------------------------------------------------------------------
# A test that takes the `arch` fixture runs once per selected arch (`--archs=cpu,vulkan`; by
# default the CPU, plus vulkan when a Vulkan device starts here), in a fresh runtime of that
# arch. `@pytest.mark.skip_arch("vulkan", reason=...)` skips one arch's case, saying why (what
# that target refuses today): never a silent pass.

def pytest_addoption(parser):
    parser.addoption("--archs", default=None,
                     help="comma-separated archs the arch-parametrised tests run on (default: cpu, plus "
                          "vulkan when a Vulkan device exists here)")
    parser.addoption("--seed", type=int, default=_seed_from_environment(),
                     help=f"base seed of every test's random inputs (default: ${SEED_VARIABLE}, else 0)")
    parser.addoption("--cpu-target", default=None,
                     help="direct mode's default cpu_target for the whole run, e.g. x86-64-v2: the suite "
                          "against the code of one ISA level (vector width) rather than the host's")


def _seed_from_environment() -> int:
    value = os.environ.get(SEED_VARIABLE, "0")
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"{SEED_VARIABLE}={value!r} is not an integer seed") from None


def pytest_configure(config):
    if config.getoption("--cpu-target"):
        _default_cpu_target(config.getoption("--cpu-target"))
    config.addinivalue_line("markers", "skip_arch(arch, reason): skip this test's case on `arch`, for `reason`")
    config.addinivalue_line("markers", "xfail_arch(arch, reason, strict=True, device=None): a known wrong result on "
                                       "`arch` (on devices whose name contains `device`, if given; strict: the case "
                                       "fails once it is fixed, so the mark goes)")


def _default_cpu_target(target: str) -> None:
    """Every `qd.init` of the run without a cpu_target of its own gets `target`."""
    plain = qd.init

    @functools.wraps(plain)
    def init(arch=None, **options):
        options.setdefault("cpu_target", target)
        return plain(arch, **options)
    qd.init = init


_VULKAN_PROBE: list = []
_VULKAN_NAME: list = []  # the probed Vulkan device's name (lavapipe: "llvmpipe ...")


def on_vulkan_device(substring: str) -> bool:
    """Whether the Vulkan device the tests run on has `substring` in its name."""
    return vulkan_unavailable_reason() is None and substring in _VULKAN_NAME[0]


def vulkan_unavailable_reason() -> str | None:
    """None when a Vulkan device starts here (probed once per session), else why not."""
    if not _VULKAN_PROBE:
        try:
            from qdc.runtime.devices.vulkan.device import VulkanDevice
            device = VulkanDevice()
            _VULKAN_NAME.append(device.capabilities.name)
            device.close()
            _VULKAN_PROBE.append(None)
        except Exception as e:  # noqa: BLE001 (no binding, no loader, no device: all mean "skip")
            _VULKAN_PROBE.append(f"{type(e).__name__}: {e}")
    return _VULKAN_PROBE[0]


def selected_archs(config) -> list:
    from qdc.runtime.contract.arches import ARCHES
    value = config.getoption("--archs")
    if value is None:
        return ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    archs = [a.strip() for a in value.split(",") if a.strip()]
    unknown = [a for a in archs if a not in ARCHES]
    if unknown or not archs:
        raise pytest.UsageError(f"--archs: unknown arch {', '.join(unknown) or '(none given)'} "
                                f"(choose from {', '.join(ARCHES)})")
    return archs


def pytest_generate_tests(metafunc):
    if "arch" in metafunc.fixturenames:
        metafunc.parametrize("arch", selected_archs(metafunc.config), indirect=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        arch = getattr(getattr(item, "callspec", None), "params", {}).get("arch")
        for mark in item.iter_markers("skip_arch"):
            if arch is not None and arch in mark.args:
                item.add_marker(pytest.mark.skip(reason=f"{arch}: {mark.kwargs.get('reason', 'not supported')}"))
        for mark in item.iter_markers("xfail_arch"):
            only_on = mark.kwargs.get("device")  # a driver's bug, e.g. device="llvmpipe"
            if only_on and not (arch == "vulkan" and on_vulkan_device(only_on)):
                continue
            if arch is not None and arch in mark.args:
                item.add_marker(pytest.mark.xfail(reason=f"{arch}: {mark.kwargs['reason']}",
                                                  strict=mark.kwargs.get("strict", True)))


@pytest.fixture
def vulkan_runtime(session_cache_dir, fresh_runtime):
    """The runtime on the Vulkan device (its VulkanDevice yielded), skipped without one; the CPU
    runtime again afterwards."""
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    qd.init(arch=qd.vulkan, cache_dir=session_cache_dir)
    from qdc.runtime import context
    yield context.current().device
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


@pytest.fixture
def arch(request, session_cache_dir, fresh_runtime):
    """The arch this case runs on, initialised (default options); the CPU again afterwards, so
    that a device error still pending is raised by this test, not the next one."""
    name = request.param
    if name == "vulkan" and vulkan_unavailable_reason() is not None:
        pytest.skip(f"vulkan: no Vulkan device ({vulkan_unavailable_reason()})")
    qd.init(arch=name, cache_dir=session_cache_dir)
    yield name
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)


@pytest.fixture
def same_as_cpu(arch, session_cache_dir):
    """`same_as_cpu(run)`: `run()` (which declares, fills, launches and returns numpy arrays)
    on this case's arch, then on the CPU; asserts the two agree and returns this arch's result."""
    def check(run, rtol=1e-5, atol=1e-6):
        got = run()
        if arch == "cpu":
            return got
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
        want = run()
        qd.init(arch=arch, cache_dir=session_cache_dir)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{arch} differs from cpu")
        return got
    return check
