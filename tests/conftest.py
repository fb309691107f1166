import os
import shutil
import tempfile

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver.options import CACHE_DIR_VARIABLE

os.environ["QDC_VERIFY_IR"] = "1"  # verify the IR between passes for every kernel the suite compiles

# Set before any test module is even imported, so that a `qd.init()` without cache_dir, in a test,
# at collection or in a subprocess (which inherits the environment), uses the session's cache.
USER_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "qdc")
SESSION_CACHE = tempfile.mkdtemp(prefix="qdc-test-cache-")
os.environ[CACHE_DIR_VARIABLE] = SESSION_CACHE


def _listing(folder: str) -> dict:
    """relative path -> (mtime in ns, size) of everything under `folder` ({} if it is absent)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:  # removed while we looked: the comparison reports it
                continue
            out[os.path.relpath(path, folder)] = (st.st_mtime_ns, st.st_size)
    return out


_USER_CACHE_BEFORE = _listing(USER_CACHE)


@pytest.fixture(scope="session", autouse=True)
def user_cache_untouched():
    """The suite fails (an error at the last test's teardown) if ~/.cache/qdc changed while it ran."""
    yield
    after = _listing(USER_CACHE)
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)
    if after != _USER_CACHE_BEFORE:
        changed = sorted(p for p in set(after) | set(_USER_CACHE_BEFORE) if after.get(p) != _USER_CACHE_BEFORE.get(p))
        pytest.fail(f"the test session changed the user's cache {USER_CACHE} ({len(changed)} paths, e.g. "
                    f"{', '.join(changed[:5])}): every test must use the session cache", pytrace=False)


@pytest.fixture(scope="session")
def session_cache_dir():
    """A cache private to this test session: every kernel is really compiled (and its IR verified)
    once, and the user's ~/.cache/qdc is neither read nor written (QDC_CACHE_DIR points here too)."""
    return SESSION_CACHE


@pytest.fixture(autouse=True)
def fresh_runtime(session_cache_dir):
    """Every test starts from a freshly initialised CPU runtime with default options."""
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng()
