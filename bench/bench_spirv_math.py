"""The cost of qdc's own f64 math on the SPIR-V target (compiler/targets/spirv/math64.py)
against the driver's f32 GLSL.std.450 functions: `y[i] = f(x[i])` over 2^N elements, and the
same with 8 calls chained per element (so that compute, not memory, dominates), f32 and f64
launches interleaved. Also the SPIR-V instructions one f64 call site adds.

Usage: python3 bench/bench_spirv_math.py [--log2n N] [--repeat N] [--function sin]. Figures
are the minimum and the median over the launches (a shared machine's noise inflates medians).
"""
import argparse
import statistics
import time

import numpy as np

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.spirv import tools


def make_kernel(dtype, function, chained: int):
    nd = qd.types.ndarray(dtype=dtype, ndim=1)
    binary = function in (qd.pow, qd.atan2)

    @qd.kernel
    def apply(x: nd, y: nd):
        for i in range(x.shape[0]):
            v = x[i]
            for _ in qd.static(range(chained)):
                if qd.static(binary):
                    v = function(abs(v) + 0.5, 0.75) * 3.0
                else:
                    v = function(v) * 3.0
            y[i] = v
    return apply


def instructions(kernel) -> int:
    """Result-producing instructions of the kernel's module, constants and types left out."""
    primal = kernel._primal
    module = K.compile_kernel(primal.fn, primal.params, Options(), arch="vulkan").artifacts["spirv_t0"]
    return sum(1 for line in tools.disassemble(module).splitlines()
               if " = Op" in line and "OpConstant" not in line and "OpType" not in line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log2n", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--function", default="sin")
    args = parser.parse_args()
    qd.init(arch=qd.vulkan)
    function = getattr(qd, args.function)
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    for chained in (1, 8):
        runs = {}
        for dtype in (qd.f32, qd.f64):
            x, y = qd.ndarray(dtype, shape=n), qd.ndarray(dtype, shape=n)
            x.from_numpy(rng.uniform(-100, 100, n).astype(dtype.np_dtype))
            kernel = make_kernel(dtype, function, chained)
            kernel(x, y)
            qd.sync()
            runs[dtype.name] = (kernel, x, y, [])
        for _ in range(args.repeat):
            for kernel, x, y, times in runs.values():
                start = time.perf_counter()
                kernel(x, y)
                qd.sync()
                times.append(time.perf_counter() - start)
        line = ", ".join(f"{name} min {min(t) * 1e3:.2f} ms median {statistics.median(t) * 1e3:.2f} ms"
                         for name, (_, _, _, t) in runs.items())
        ratio = min(runs["f64"][3]) / min(runs["f32"][3])
        print(f"2^{args.log2n} x {chained} {args.function}: {line}; f64/f32 (min) {ratio:.2f}x")
    sizes = {dtype.name: instructions(make_kernel(dtype, function, 1)) for dtype in (qd.f32, qd.f64)}
    print(f"one f64 {args.function} call site: {sizes['f64'] - sizes['f32']} SPIR-V instructions more than f32's")


if __name__ == "__main__":
    main()
