"""The DiffMPM workload (kernels/diffmpm.py): its loss and its gradient with respect to the initial
velocities against a float64 numpy reimplementation of the same simulation and float64 central
differences of it; in direct mode on every arch (recorded on a Tape), and built ahead of time and
loaded without the compiler (the backward pass driven by the loaded kernels' .grad)."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from backend_util import need_every_arch_toolchain

from conftest import REPO_ROOT as ROOT
SOURCE = os.path.join(ROOT, "kernels", "diffmpm.py")


@pytest.fixture(scope="module")
def mpm():
    spec = importlib.util.spec_from_file_location("diffmpm", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simulate(m, x0, v0) -> float:
    """kernels/diffmpm.py's forward pass in float64 numpy; returns the loss."""
    n, g, dx, inv_dx, dt = m.n_particles, m.n_grid, m.dx, m.inv_dx, m.dt
    eye = np.eye(2)
    x, v = x0.astype(np.float64), v0.astype(np.float64)
    C, F = np.zeros((n, 2, 2)), np.broadcast_to(eye, (n, 2, 2)).copy()
    node_i, node_j = np.indices((g, g))
    for _ in range(m.steps):
        base = np.floor(x * inv_dx - 0.5).astype(int)
        fx = x * inv_dx - base
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
        F = (eye + dt * C) @ F
        J = np.linalg.det(F)
        tau = m.mu * (F @ F.transpose(0, 2, 1) - eye) + m.la * np.log(J)[:, None, None] * eye
        affine = -(dt * m.p_vol * 4 * inv_dx * inv_dx) * tau + m.p_mass * C
        gv, gm = np.zeros((g, g, 2)), np.zeros((g, g))
        for i in range(3):
            for j in range(3):
                dpos = (np.array([i, j]) - fx) * dx
                weight = w[i][:, 0] * w[j][:, 1]
                at = (base[:, 0] + i, base[:, 1] + j)
                np.add.at(gv, at, weight[:, None] * (m.p_mass * v + np.einsum("pab,pb->pa", affine, dpos)))
                np.add.at(gm, at, weight * m.p_mass)
        vout = gv / (gm + 1e-10)[..., None]
        vout[..., 1] -= dt * m.gravity
        for mask in ((node_i < m.bound) & (vout[..., 0] < 0), (node_i > g - m.bound) & (vout[..., 0] > 0),
                     (node_j < m.bound) & (vout[..., 1] < 0), (node_j > g - m.bound) & (vout[..., 1] > 0)):
            vout[mask] = 0
        v, C = np.zeros((n, 2)), np.zeros((n, 2, 2))
        for i in range(3):
            for j in range(3):
                dpos = np.array([i, j]) - fx
                weight = w[i][:, 0] * w[j][:, 1]
                g_v = vout[base[:, 0] + i, base[:, 1] + j]
                v += weight[:, None] * g_v
                C += 4 * inv_dx * weight[:, None, None] * g_v[:, :, None] * dpos[:, None, :]
        x = x + dt * v
    return x.sum(1).mean()


def reference(m, x0, v0, h=1e-6):
    """(loss, d loss / d v0) of the float64 reimplementation, by central differences."""
    grad = np.zeros(v0.shape)
    for idx in np.ndindex(*v0.shape):
        d = np.zeros(v0.shape)
        d[idx] = h
        grad[idx] = (simulate(m, x0, v0 + d) - simulate(m, x0, v0 - d)) / (2 * h)
    return simulate(m, x0, v0), grad


def initial_velocity(m, seed):
    rng = np.random.default_rng(seed)
    return ((rng.random((m.n_particles, 2)) - 0.5) * 2).astype(np.float32)


def check(m, loss, grad, x0, v0):
    want_loss, want_grad = reference(m, x0, v0)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    # The gradient is of f32 arithmetic, the reference of f64: agreement to f32 accumulation error,
    # and well beyond the trivial dt * steps / n_particles every particle would have without stresses.
    np.testing.assert_allclose(grad, want_grad, rtol=2e-3, atol=2e-3 * np.abs(want_grad).max())
    trivial = m.dt * m.steps / m.n_particles
    assert np.abs(want_grad - trivial).max() > 0.05 * trivial


def test_gradient_matches_float64_central_differences(arch, mpm):
    v0 = initial_velocity(mpm, 1)
    mpm.clear_grid()
    for f in (mpm.x, mpm.v, mpm.C, mpm.F):
        f.fill(0)
    loss, grad = mpm.run(v0)
    check(mpm, loss, grad, mpm.x.to_numpy()[0], v0)


AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = load(cache, "diffmpm")
steps, n = m.x.shape[0] - 1, m.x.shape[1]
rng = np.random.default_rng(seed)
v0 = ((rng.random((n, 2)) - 0.5) * 2).astype(np.float32)
m.init_particles()
vel = m.v.to_numpy()
vel[0] = v0
m.v.from_numpy(vel)
m.clear_grid()
for s in range(steps):
    m.p2g(s)
    m.grid_op(s)
    m.g2p(s)
m.compute_loss()
for f in (m.x, m.v, m.C, m.F, m.grid_v_in, m.grid_m_in, m.grid_v_out, m.loss):
    f.grad.fill(0)
m.loss.grad[None] = 1.0
m.compute_loss.grad()
for s in reversed(range(steps)):
    m.g2p.grad(s)
    m.grid_op.grad(s)
    m.p2g.grad(s)
assert "qdc.compiler" not in sys.modules and "llvmlite" not in sys.modules, "the compiler was imported"
np.savez(out, loss=m.loss[None], grad=m.v.grad.to_numpy()[0], x0=m.x.to_numpy()[0], v0=v0)
'''


def test_built_ahead_of_time_and_loaded_without_the_compiler(tmp_path, mpm):
    cache = tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", SOURCE, "--cache", str(cache)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    script, out = tmp_path / "run.py", tmp_path / "result.npz"
    script.write_text(AOT_RUN, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script), str(cache), "2", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    got = np.load(out)
    np.testing.assert_array_equal(got["v0"], initial_velocity(mpm, 2))
    check(mpm, float(got["loss"]), got["grad"], got["x0"], got["v0"])


def test_builds_for_every_arch(tmp_path):
    """Vectors are scalars past the front end: every backend compiles the workload and its gradients."""
    need_every_arch_toolchain()
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", SOURCE, "--arch", "all",
                        "--cache", str(tmp_path / "cache")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    assert " 0 failed" in r.stdout.splitlines()[-1], r.stdout
