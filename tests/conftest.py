import numpy as np
import pytest

import qdc as qd


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Every test starts from a freshly initialised CPU runtime with default options."""
    qd.init(arch=qd.cpu)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng()
