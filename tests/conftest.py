import os

import numpy as np
import pytest

import qdc as qd

os.environ["QDC_VERIFY_IR"] = "1"  # verify the IR between passes for every kernel the suite compiles


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory):
    """A cache private to this test session: every kernel is really compiled (and its IR verified)
    once, and the user's ~/.cache/qdc is neither read nor written."""
    return str(tmp_path_factory.mktemp("qdc-cache"))


@pytest.fixture(autouse=True)
def fresh_runtime(session_cache_dir):
    """Every test starts from a freshly initialised CPU runtime with default options."""
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng()
