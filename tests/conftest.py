import os

import numpy as np
import pytest

import qdc as qd

os.environ["QDC_VERIFY_IR"] = "1"  # verify the IR between passes for every kernel the suite compiles


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Every test starts from a freshly initialised CPU runtime with default options."""
    qd.init(arch=qd.cpu)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng()
