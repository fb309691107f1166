"""The benchmark kernels, written once against the shared kernel syntax of qdc and Quadrants.

`make_kernels(qd)` defines them with whichever module it is given (`qdc` or `quadrants`),
so both compile literally the same source.
"""


def make_kernels(qd):
    f32_1d = qd.types.ndarray(dtype=qd.f32, ndim=1)
    f32_2d = qd.types.ndarray(dtype=qd.f32, ndim=2)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def empty0():
        pass

    @qd.kernel
    def empty4(a: f32_1d, s: qd.f32, n: qd.i32, t: qd.f32):
        pass

    @qd.kernel
    def saxpy(y: f32_1d, x: f32_1d, alpha: qd.f32):
        for i in range(y.shape[0]):
            y[i] = alpha * x[i] + y[i]

    @qd.kernel
    def stencil(out: f32_2d, a: f32_2d):
        for i, j in qd.ndrange((1, a.shape[0] - 1), (1, a.shape[1] - 1)):
            out[i, j] = 0.2 * (a[i, j] + a[i - 1, j] + a[i + 1, j] + a[i, j - 1] + a[i, j + 1])

    @qd.kernel
    def reduce_sum(x: f32_1d):
        for i in range(x.shape[0]):
            total[None] += x[i]

    def array_sum(x):
        total[None] = 0.0
        reduce_sum(x)
        return total[None]

    return {"empty0": empty0, "empty4": empty4, "saxpy": saxpy, "stencil": stencil, "sum": array_sum}
