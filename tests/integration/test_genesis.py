"""Genesis (genesis-world, a physics engine written in Quadrants' language) runs unchanged on qdc:
a plane+box and the Franka arm, in Genesis's field and ndarray modes, positions after 100 steps
within 1e-5 of Quadrants' in the same environment; and on qdc's Vulkan arch (Genesis's CPU
configuration, its kernels on Vulkan: bench/genesis_scene.py --arch vulkan) within 1e-4 of the CPU
run. Skipped where genesis-world, torch or quadrants is not installed (CI does not install them:
Genesis and its dependencies take GBs), the Vulkan case also without a Vulkan device; run it with
`python -m pytest tests/integration` in an environment that has them."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("genesis", reason="genesis-world is not installed")
pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("quadrants", reason="Quadrants (the reference) is not installed")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))
from bench_genesis import run_scene  # noqa: E402
from conftest import vulkan_unavailable_reason  # noqa: E402

STEPS = 100


@pytest.mark.parametrize("mode", ["field", "ndarray"])
@pytest.mark.parametrize("scene", ["box", "franka"])
def test_genesis_scene_matches_quadrants(scene, mode, tmp_path):
    reference = run_scene(scene, STEPS, False, mode, str(tmp_path / "quadrants"))
    ours = run_scene(scene, STEPS, True, mode, str(tmp_path / "qdc"))
    np.testing.assert_allclose(np.asarray(ours["pos"]), np.asarray(reference["pos"]), atol=1e-5, rtol=0)
    again = run_scene(scene, STEPS, True, mode, str(tmp_path / "qdc"))
    assert again["compiles"] == 0  # a second process of the same scene compiles nothing


@pytest.mark.parametrize("scene", ["box", "franka"])
def test_genesis_scene_on_vulkan_matches_the_cpu(scene, tmp_path):
    if vulkan_unavailable_reason() is not None:
        pytest.skip(f"no Vulkan device: {vulkan_unavailable_reason()}")
    cpu = run_scene(scene, STEPS, True, "ndarray", str(tmp_path / "cpu"))
    vulkan = run_scene(scene, STEPS, True, "ndarray", str(tmp_path / "vulkan"), arch="vulkan")
    np.testing.assert_allclose(np.asarray(vulkan["pos"]), np.asarray(cpu["pos"]), atol=1e-4, rtol=0)
