"""Exact gradients of block-level code: subgroup exchanges (xor, up, down, broadcast, arbitrary
source lanes, and the reductions and scans built from them) and block-shared arrays with
barriers, in reverse mode (kernel.grad) and forward mode (qd.ad.FwdMode), checked against
float64 central differences of a numpy model of the same kernel, on every GPU arch the suite
runs (lavapipe's Vulkan by default: subgroups of 8 lanes)."""
import numpy as np
import pytest

import qdc as qd

from test_simt import subgroup_size

pytestmark = pytest.mark.skip_arch("cpu", reason="the CPU runs no blocks of threads: qd.simt is refused there")

B = 64
N = 2 * B


@qd.kernel
def exchanges(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        lane = qd.simt.subgroup.invocation_id()
        g = qd.simt.subgroup.group_size()
        v = qd.sin(x[i])
        a = qd.simt.subgroup.shuffle_xor(v, 1)
        b = qd.simt.subgroup.shuffle_up(v * v, 1)
        c = qd.simt.subgroup.shuffle_down(v, 2)
        d = qd.simt.subgroup.broadcast(v, qd.u32(3))
        e = qd.simt.subgroup.shuffle(v, qd.u32((lane * 3 + 1) % g))
        s = qd.simt.subgroup.reduce_all_add(v * a)
        p = qd.simt.subgroup.inclusive_add(v)
        r = qd.simt.subgroup.reduce_add(v)
        m = qd.simt.subgroup.reduce_all_max(v)
        out = a * b + c * d + e * e + s + p * v + m
        if lane == 0:
            out += r * r
        y[i] = out


def exchanges_model(x: np.ndarray, g: int) -> np.ndarray:
    """`exchanges` in float64, subgroup by subgroup."""
    y = np.empty_like(x)
    lanes = np.arange(g)
    for start in range(0, len(x), g):
        v = np.sin(x[start:start + g])
        a = v[lanes ^ 1]
        b = np.where(lanes >= 1, (v * v)[np.maximum(lanes - 1, 0)], v * v)
        c = np.where(lanes + 2 < g, v[np.minimum(lanes + 2, g - 1)], v)
        d = np.full(g, v[3])
        e = v[(lanes * 3 + 1) % g]
        out = a * b + c * d + e * e + np.sum(v * a) + np.cumsum(v) * v + np.max(v)
        out[0] += np.sum(v) ** 2
        y[start:start + g] = out
    return y


@qd.kernel
def shared_stages(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        tile = qd.simt.block.SharedArray((B,), qd.f32)
        pairs = qd.simt.block.SharedArray((2, B // 2), qd.f32)
        t = qd.simt.block.thread_idx()
        tile[t] = x[i] * x[i]
        pairs[t % 2, t // 2] = x[i]
        qd.simt.block.sync()
        a = tile[(t + 1) % B] * tile[B - 1 - t] + pairs[(t + 1) % 2, t // 2]
        qd.simt.block.sync()  # every read of the first values before they are overwritten
        tile[t] = qd.cos(a)
        qd.simt.block.sync()
        total = qd.simt.block.reduce_add(tile[t], B, qd.f32)
        out = tile[(t * 5) % B]
        if t == 0:
            out += total
        y[i] = out


def shared_stages_model(x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    t = np.arange(B)
    for start in range(0, len(x), B):
        xs = x[start:start + B]
        tile = xs * xs
        pairs = np.empty((2, B // 2))
        pairs[t % 2, t // 2] = xs
        a = tile[(t + 1) % B] * tile[B - 1 - t] + pairs[(t + 1) % 2, t // 2]
        tile = np.cos(a)
        out = tile[(t * 5) % B]
        out[0] += tile.sum()
        y[start:start + B] = out
    return y


@qd.kernel
def relax(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1),
          steps: qd.types.ndarray(qd.i32, ndim=0)):
    """Exchanges in a loop whose trip count is known only at launch (its values on adstacks), and
    a vector SharedArray."""
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        points = qd.simt.block.SharedArray(B, qd.math.vec2)
        t = qd.simt.block.thread_idx()
        v = x[i]
        for _ in range(steps[()]):
            v = qd.tanh(v + 0.5 * qd.simt.subgroup.shuffle_down(v, 1) - 0.25 * qd.simt.subgroup.shuffle_up(v, 3))
        points[t] = qd.math.vec2(v, v * v)
        qd.simt.block.sync()
        p = points[(t + 7) % B]
        y[i] = p.x * p.y + p.dot(points[t])


def relax_model(x: np.ndarray, g: int, steps: int) -> np.ndarray:
    lanes = np.arange(g)
    v = x.copy()
    for _ in range(steps):
        v = v.reshape(-1, g)
        down = np.where(lanes + 1 < g, v[:, np.minimum(lanes + 1, g - 1)], v)
        up = np.where(lanes >= 3, v[:, np.maximum(lanes - 3, 0)], v)
        v = np.tanh(v + 0.5 * down - 0.25 * up).reshape(-1)
    y = np.empty_like(x)
    t = np.arange(B)
    for start in range(0, len(x), B):
        vs = v[start:start + B]
        px, py = vs[(t + 7) % B], vs[(t + 7) % B] ** 2
        y[start:start + B] = px * py + px * vs + py * vs * vs
    return y


def central_difference_gradient(model, x: np.ndarray, w: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d(sum(w * model(x)))/dx in float64, one coordinate at a time."""
    grad = np.empty_like(x)
    for k in range(len(x)):
        up, down = x.copy(), x.copy()
        up[k] += h
        down[k] -= h
        grad[k] = np.dot(w, model(up) - model(down)) / (2 * h)
    return grad


def gradient_on_device(kernel, x: np.ndarray, w: np.ndarray, *more) -> tuple:
    xs = qd.ndarray(qd.f32, shape=x.shape, needs_grad=True)
    ys = qd.ndarray(qd.f32, shape=x.shape, needs_grad=True)
    xs.from_numpy(x.astype(np.float32))
    kernel(xs, ys, *more)
    ys.grad.from_numpy(w.astype(np.float32))
    xs.grad.fill(0.0)
    kernel.grad(xs, ys, *more)
    return ys.to_numpy(), xs.grad.to_numpy()


def test_gradients_of_subgroup_exchanges(arch, rng):
    g = subgroup_size()
    x = rng.uniform(-1.5, 1.5, N)
    w = rng.standard_normal(N)
    y, grad = gradient_on_device(exchanges, x, w)
    model = lambda v: exchanges_model(v, g)  # noqa: E731
    np.testing.assert_allclose(y, model(x), rtol=1e-4, atol=1e-4 * g)
    expected = central_difference_gradient(model, x, w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


def test_gradients_through_shared_arrays_and_barriers(arch, rng):
    x = rng.uniform(-1.0, 1.0, N)
    w = rng.standard_normal(N)
    y, grad = gradient_on_device(shared_stages, x, w)
    np.testing.assert_allclose(y, shared_stages_model(x), rtol=1e-4, atol=1e-4 * B)
    expected = central_difference_gradient(shared_stages_model, x, w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


def test_gradients_of_exchanges_in_a_dynamic_loop_and_of_vector_shared_arrays(arch, rng):
    g, steps = subgroup_size(), 5
    x = rng.uniform(-1.0, 1.0, N)
    w = rng.standard_normal(N)
    y, grad = gradient_on_device(relax, x, w, np.array(steps, np.int32))
    model = lambda v: relax_model(v, g, steps)  # noqa: E731
    np.testing.assert_allclose(y, model(x), rtol=1e-4, atol=1e-5)
    expected = central_difference_gradient(model, x, w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


@pytest.mark.parametrize("name", ["exchanges", "shared_stages"])
def test_forward_mode_jacobian_vector_products(arch, rng, name):
    """qd.ad.FwdMode through exchanges and SharedArrays: the tangents travel as the values do."""
    g = subgroup_size()
    kernel, model = {"exchanges": (exchanges, lambda v: exchanges_model(v, g)),
                     "shared_stages": (shared_stages, shared_stages_model)}[name]
    x0, seed = rng.uniform(-1.0, 1.0, N), rng.standard_normal(N)
    xs, ys = qd.ndarray(qd.f32, (N,), needs_dual=True), qd.ndarray(qd.f32, (N,), needs_dual=True)
    xs.from_numpy(x0.astype(np.float32))
    with qd.ad.FwdMode(loss=ys, param=xs, seed=seed):
        kernel(xs, ys)
    want = (model(x0 + 1e-6 * seed) - model(x0 - 1e-6 * seed)) / 2e-6
    np.testing.assert_allclose(ys.dual.to_numpy(), want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


@qd.kernel
def scaled_by_a_shared_sum(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    """A kernel-scope sum over a SharedArray crosses tasks: the gradient kernel replays its task."""
    total = 0.0
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        tile = qd.simt.block.SharedArray((B,), qd.f32)
        t = qd.simt.block.thread_idx()
        tile[t] = x[i]
        qd.simt.block.sync()
        total += tile[(t + 1) % B] * tile[t]
    for i in range(x.shape[0]):
        y[i] = total * x[i]


def scaled_by_a_shared_sum_model(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, B)
    return np.sum(blocks * np.roll(blocks, -1, axis=1)) * x


def test_gradient_through_a_replayed_task_with_a_shared_array(arch, rng):
    x, w = rng.uniform(-1.0, 1.0, N), rng.standard_normal(N)
    y, grad = gradient_on_device(scaled_by_a_shared_sum, x, w)
    np.testing.assert_allclose(y, scaled_by_a_shared_sum_model(x), rtol=1e-4, atol=1e-4)
    expected = central_difference_gradient(scaled_by_a_shared_sum_model, x, w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())

T = 32   # threads per block, as Genesis's block-level solvers
M = 12   # matrix size: fewer rows than threads, so some threads idle in every step


@qd.kernel
def cholesky_solve(a: qd.types.ndarray(qd.f32, ndim=3), b: qd.types.ndarray(qd.f32, ndim=2),
                   x: qd.types.ndarray(qd.f32, ndim=2)):
    """x = A⁻¹ b with A the symmetric matrix of a's lower triangle, one block per matrix: a
    right-looking Cholesky factor in shared memory, then the two triangular solves by thread 0."""
    qd.loop_config(block_dim=T)
    for i in range(a.shape[0] * T):
        tid = i % T
        env = i // T
        L = qd.simt.block.SharedArray((M, M + 1), qd.f32)
        y = qd.simt.block.SharedArray((M,), qd.f32)
        z = qd.simt.block.SharedArray((M,), qd.f32)
        for k in range(tid, M * M, T):
            L[k // M, k % M] = a[env, k // M, k % M]
        qd.simt.block.sync()
        for j in range(M):
            if tid == 0:
                L[j, j] = qd.sqrt(L[j, j])
            qd.simt.block.sync()
            for r in range(j + 1 + tid, M, T):
                L[r, j] = L[r, j] / L[j, j]
            qd.simt.block.sync()
            m = M - j - 1
            for k in range(tid, m * m, T):
                r = j + 1 + k // m
                c = j + 1 + k % m
                if c <= r:
                    L[r, c] = L[r, c] - L[r, j] * L[c, j]
            qd.simt.block.sync()
        if tid == 0:
            for r in range(M):
                s = b[env, r]
                for c in range(r):
                    s -= L[r, c] * y[c]
                y[r] = s / L[r, r]
            for rr in range(M):
                r = M - 1 - rr
                s = y[r]
                for c in range(r + 1, M):
                    s -= L[c, r] * z[c]
                z[r] = s / L[r, r]
        qd.simt.block.sync()
        if tid < M:
            x[env, tid] = z[tid]


def cholesky_solve_model(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lower = np.tril(a)
    return np.linalg.solve(lower + np.tril(a, -1).transpose(0, 2, 1), b[..., None])[..., 0]


def test_gradient_of_a_tiled_cholesky_solve(arch, rng):
    envs = 2
    m = rng.standard_normal((envs, M, M))
    a, b, w = m @ m.transpose(0, 2, 1) + M * np.eye(M), rng.standard_normal((envs, M)), rng.standard_normal((envs, M))
    arrays = [qd.ndarray(qd.f32, shape=v.shape, needs_grad=True) for v in (a, b, b)]
    for array, value in zip(arrays, (a, b, b * 0)):
        array.from_numpy(value.astype(np.float32))
        array.grad.fill(0.0)
    cholesky_solve(*arrays)
    np.testing.assert_allclose(arrays[2].to_numpy(), cholesky_solve_model(a, b), rtol=1e-4, atol=1e-5)
    arrays[2].grad.from_numpy(w.astype(np.float32))
    cholesky_solve.grad(*arrays)
    for which, value in ((0, a), (1, b)):
        expected = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            up, down = value.copy(), value.copy()
            up[idx] += 1e-6
            down[idx] -= 1e-6
            inputs_up = (up, b) if which == 0 else (a, up)
            inputs_down = (down, b) if which == 0 else (a, down)
            expected[idx] = np.sum(w * (cholesky_solve_model(*inputs_up) - cholesky_solve_model(*inputs_down))) / 2e-6
        np.testing.assert_allclose(arrays[which].grad.to_numpy(), expected, rtol=1e-3,
                                   atol=1e-4 * np.abs(expected).max())
