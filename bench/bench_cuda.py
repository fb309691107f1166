"""CUDA device benchmarks on a GPU, side by side in one run (README figures):
- saxpy over 2^26 f32 (a qdc kernel on qd.ndarrays) against cuMemcpyDtoD of the same bytes
  (bytes moved: saxpy reads 2 and writes 1 array, the copy reads 1 and writes 1);
- launch overhead: an empty qdc kernel against a raw cuLaunchKernel of its own PTX from Python.
Run: python3 bench/bench_cuda.py"""
import ctypes
import time

import numpy as np

import qdc as qd
from qdc.runtime import context

N = 1 << 26


@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = a * x[i] + y[i]


@qd.kernel
def empty(a: qd.types.ndarray(qd.f32, ndim=1)):
    for i in range(1):
        a[i] = 1.0


def best_of(run, repeats=5, inner=20):
    dev = context.current().device
    times = []
    for _ in range(repeats):
        dev.wait()
        t = time.perf_counter()
        for _ in range(inner):
            run()
        dev.wait()
        times.append((time.perf_counter() - t) / inner)
    return min(times)


def main():
    qd.init(arch="cuda")
    dev = context.current().device
    cu = dev.cu
    x, y = qd.ndarray(qd.f32, shape=(N,)), qd.ndarray(qd.f32, shape=(N,))
    x.from_numpy(np.ones(N, np.float32))
    saxpy(2.0, x, y)
    t_saxpy = best_of(lambda: saxpy(2.0, x, y))
    src, dst = dev.allocate(4 * N), dev.allocate(4 * N)
    t_copy = best_of(lambda: cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, 4 * N, dev.stream))
    gbs_saxpy, gbs_copy = 12 * N / t_saxpy / 1e9, 8 * N / t_copy / 1e9
    print(f"{dev.name}")
    print(f"saxpy 2^26 f32: {t_saxpy * 1e3:.3f} ms, {gbs_saxpy:.0f} GB/s; cuMemcpyDtoD: {t_copy * 1e3:.3f} ms, "
          f"{gbs_copy:.0f} GB/s; ratio {gbs_saxpy / gbs_copy:.2f} (goal >= 0.9)")

    one = qd.ndarray(qd.f32, shape=(1,))
    empty(one)
    loaded = next(iter(k for k in _loaded_kernels(dev, "empty")))
    fn, params = loaded.tasks[0].function, next(iter(loaded.ctx_copies.values())).params
    addr = ctypes.addressof(params)
    launch, stream = cu.cuLaunchKernel, dev.stream
    t_raw = best_of(lambda: launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, addr, 0), inner=2000)
    t_qdc = best_of(lambda: empty(one), inner=2000)
    print(f"empty kernel launch: qdc {t_qdc * 1e6:.2f} us, raw cuLaunchKernel {t_raw * 1e6:.2f} us, "
          f"ratio {t_qdc / t_raw:.2f} (goal <= 1.5)")


def _loaded_kernels(dev, name):
    import gc
    from qdc.runtime.devices.cuda.device import CudaKernel
    return [o for o in gc.get_objects() if isinstance(o, CudaKernel) and o.meta.name == name]


if __name__ == "__main__":
    main()
