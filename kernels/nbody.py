"""Gravitational n-body: all-pairs accelerations (softened), then a symplectic Euler step."""
import qdc as qd

N = 256
G = 1.0
SOFTENING = 1e-2

pos = qd.field(qd.f32, shape=(N, 3))
vel = qd.field(qd.f32, shape=(N, 3))
mass = qd.field(qd.f32, shape=N)


@qd.func
def pull(i, j):
    """Acceleration of body i due to body j."""
    dx = pos[j, 0] - pos[i, 0]
    dy = pos[j, 1] - pos[i, 1]
    dz = pos[j, 2] - pos[i, 2]
    r2 = dx * dx + dy * dy + dz * dz + SOFTENING * SOFTENING
    s = G * mass[j] / (r2 * qd.sqrt(r2))
    return dx * s, dy * s, dz * s


@qd.kernel
def kick(dt: qd.f32):
    for i in range(N):
        ax, ay, az = 0.0, 0.0, 0.0
        for j in range(N):
            if j != i:
                px, py, pz = pull(i, j)
                ax += px
                ay += py
                az += pz
        vel[i, 0] += dt * ax
        vel[i, 1] += dt * ay
        vel[i, 2] += dt * az


@qd.kernel
def drift(dt: qd.f32):
    for i, k in pos:
        pos[i, k] += dt * vel[i, k]
