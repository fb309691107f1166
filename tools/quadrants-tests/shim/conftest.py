import gc
import pytest
import quadrants as qd


@pytest.fixture(autouse=True)
def wanted_arch(request, req_arch, req_options):
    if req_arch is not None:
        qd.init(arch=req_arch, **(req_options or {}))
    yield
    gc.collect()


def pytest_generate_tests(metafunc):
    if not getattr(metafunc.function, "__qd_test__", False):
        metafunc.parametrize("req_arch,req_options", [(None, None)], ids=["none"])
