"""Differentiable 2-D MLS-MPM, in the manner of Taichi's diffmpm.py: an elastic block of
particles (position x, velocity v, affine velocity C, deformation gradient F: vector and matrix
fields, one slice per step), a grid of vector fields, and per step P2G, a grid update and G2P.
The block starts just above the floor, whose sticky boundary (as in diffmpm.py) makes the
motion depend on the stresses; the loss is the sum of the coordinates of the final centre of
mass. Recorded on a `qd.ad.Tape`, the steps give its gradient with respect to the initial
velocities (`v.grad[0]`).

The grid has one slice per step, so that no step overwrites what the backward pass of another
needs (Taichi's diffmpm clears one grid each step instead). The material is Neo-Hookean, whose
Kirchhoff stress mu (F F^T - I) + lambda log(J) I needs no polar decomposition.

Runs unchanged under Quadrants with `import quadrants as qd` (bench/bench_diffmpm.py does).
"""
import qdc as qd

dim = 2
side = 8                      # particles per side of the block
n_particles = side * side
n_grid = 16
dx = 1.0 / n_grid
inv_dx = float(n_grid)
steps = 12
dt = 5e-4
p_vol = (dx * 0.5) ** 2
p_mass = p_vol * 1.0
E, nu = 400.0, 0.2
mu = E / (2 * (1 + nu))
la = E * nu / ((1 + nu) * (1 - 2 * nu))
gravity = 9.8
bound = 3

x = qd.Vector.field(dim, qd.f32, shape=(steps + 1, n_particles), needs_grad=True)
v = qd.Vector.field(dim, qd.f32, shape=(steps + 1, n_particles), needs_grad=True)
C = qd.Matrix.field(dim, dim, qd.f32, shape=(steps + 1, n_particles), needs_grad=True)
F = qd.Matrix.field(dim, dim, qd.f32, shape=(steps + 1, n_particles), needs_grad=True)
grid_v_in = qd.Vector.field(dim, qd.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
grid_m_in = qd.field(qd.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
grid_v_out = qd.Vector.field(dim, qd.f32, shape=(steps, n_grid, n_grid), needs_grad=True)
loss = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def init_particles():
    """The block at rest (F = I, C = 0) on a regular lattice; velocities are the caller's."""
    for p in range(n_particles):
        x[0, p] = qd.Vector([0.4 + (p // side) * dx * 0.5, 0.2 + (p % side) * dx * 0.5])
        F[0, p] = qd.Matrix([[1.0, 0.0], [0.0, 1.0]])
        C[0, p] = qd.Matrix([[0.0, 0.0], [0.0, 0.0]])


@qd.kernel
def clear_grid():
    for s, i, j in grid_m_in:
        grid_v_in[s, i, j] = qd.Vector([0.0, 0.0])
        grid_m_in[s, i, j] = 0.0
        grid_v_out[s, i, j] = qd.Vector([0.0, 0.0])


@qd.kernel
def p2g(f: qd.i32):
    for p in range(n_particles):
        base = qd.cast(x[f, p] * inv_dx - 0.5, qd.i32)
        fx = x[f, p] * inv_dx - qd.cast(base, qd.f32)
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
        identity = qd.Matrix([[1.0, 0.0], [0.0, 1.0]])
        new_F = (identity + dt * C[f, p]) @ F[f, p]
        F[f + 1, p] = new_F
        J = new_F.determinant()
        kirchhoff = mu * (new_F @ new_F.transpose() - identity) + la * qd.log(J) * identity
        stress = -(dt * p_vol * 4 * inv_dx * inv_dx) * kirchhoff
        affine = stress + p_mass * C[f, p]
        for i in qd.static(range(3)):
            for j in qd.static(range(3)):
                offset = qd.Vector([i, j])
                dpos = (qd.cast(offset, qd.f32) - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v_in[f, base + offset] += weight * (p_mass * v[f, p] + affine @ dpos)
                grid_m_in[f, base + offset] += weight * p_mass


@qd.kernel
def grid_op(f: qd.i32):
    for i, j in qd.ndrange(n_grid, n_grid):
        inv_m = 1.0 / (grid_m_in[f, i, j] + 1e-10)
        v_out = inv_m * grid_v_in[f, i, j]
        v_out[1] -= dt * gravity
        if i < bound and v_out[0] < 0:  # sticky walls
            v_out = qd.Vector([0.0, 0.0])
        if i > n_grid - bound and v_out[0] > 0:
            v_out = qd.Vector([0.0, 0.0])
        if j < bound and v_out[1] < 0:
            v_out[0] = 0.0
            v_out[1] = 0.0
        if j > n_grid - bound and v_out[1] > 0:
            v_out[0] = 0.0
            v_out[1] = 0.0
        grid_v_out[f, i, j] = v_out


@qd.kernel
def g2p(f: qd.i32):
    for p in range(n_particles):
        base = qd.cast(x[f, p] * inv_dx - 0.5, qd.i32)
        fx = x[f, p] * inv_dx - qd.cast(base, qd.f32)
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
        new_v = qd.Vector([0.0, 0.0])
        new_C = qd.Matrix([[0.0, 0.0], [0.0, 0.0]])
        for i in qd.static(range(3)):
            for j in qd.static(range(3)):
                dpos = qd.cast(qd.Vector([i, j]), qd.f32) - fx
                g_v = grid_v_out[f, base[0] + i, base[1] + j]
                weight = w[i][0] * w[j][1]
                new_v += weight * g_v
                new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
        v[f + 1, p] = new_v
        x[f + 1, p] = x[f, p] + dt * new_v
        C[f + 1, p] = new_C


@qd.kernel
def compute_loss():
    for p in range(n_particles):
        loss[None] += x[steps, p].sum() * (1.0 / n_particles)


def forward():
    """Every step, then the loss (record it on a qd.ad.Tape for gradients)."""
    for s in range(steps):
        p2g(s)
        grid_op(s)
        g2p(s)
    compute_loss()


def run(initial_velocity):
    """Loss and d loss / d initial velocity for `initial_velocity` of shape (n_particles, 2)."""
    import numpy as np
    init_particles()
    vel = v.to_numpy()
    vel[0] = initial_velocity
    v.from_numpy(vel)
    clear_grid()
    with qd.ad.Tape(loss=loss):
        forward()
    return float(loss[None]), np.array(v.grad.to_numpy()[0])
