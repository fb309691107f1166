"""One explicit step of 2D heat diffusion on an N x N plate with fixed (Dirichlet) edges."""
import qdc as qd

N = 128
T = qd.field(qd.f32, shape=(N, N))       # temperature now
T_next = qd.field(qd.f32, shape=(N, N))  # temperature after the step


@qd.kernel
def step(alpha: qd.f32):
    for i, j in T:
        if i > 0 and i < N - 1 and j > 0 and j < N - 1:
            laplacian = T[i - 1, j] + T[i + 1, j] + T[i, j - 1] + T[i, j + 1] - 4.0 * T[i, j]
            T_next[i, j] = T[i, j] + alpha * laplacian
        else:
            T_next[i, j] = T[i, j]


@qd.kernel
def commit():
    for i, j in T:
        T[i, j] = T_next[i, j]
