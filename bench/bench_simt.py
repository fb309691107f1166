"""Block-level code against references, side by side in one process (docs/benchmarks.md):
- a block reduction: per block of 256 threads the sum of its elements (qd.simt.block.reduce_add),
  against torch's `x.view(-1, 256).sum(1)` where torch runs on the same GPU, and against a
  qdc kernel whose threads add their block's elements one by one from global memory;
- a radix sort of 2^log2n u32 keys (qd.algorithms.sort, 4 passes of 8 bits) against
  `torch.sort` where torch runs on the same GPU, and Quadrants' `qd.algorithms.sort` where
  `import quadrants` works on this arch.
Every time is the best of `--rounds` rounds, each a launch and a synchronisation (the first
launch, which compiles, untimed). Results are checked against numpy.
Run: python3 bench/bench_simt.py --arch cuda [--log2n 24] [--without-quadrants]
     python3 bench/bench_simt.py --arch vulkan --log2n 16   # lavapipe: a smaller size"""
import argparse
import time

import numpy as np

import qdc as qd

B = 256
DEPTH = 4  # log256_max_n: counts up to 2^32


def simt_kernels(lib):
    """The benchmark's kernels written against `lib` (qdc, or Quadrants for the reference): both
    spell the block-level API and `algorithms.sort` the same way."""
    qd = lib

    @qd.kernel
    def block_sums(x: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
        qd.loop_config(block_dim=B)
        for i in range(x.shape[0]):
            total = qd.simt.block.reduce_add(x[i], B, qd.f32)
            if qd.simt.block.thread_idx() == 0:
                out[i // B] = total

    @qd.kernel
    def block_sums_serial(x: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
        for b in range(out.shape[0]):
            total = 0.0
            for k in range(B):
                total += x[b * B + k]
            out[b] = total

    @qd.kernel(graph=True)
    def radix_sort(keys: qd.types.ndarray(qd.u32, ndim=1), tmp: qd.types.ndarray(qd.u32, ndim=1),
                   scratch: qd.types.ndarray(qd.u32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
        qd.algorithms.sort(keys, tmp, keys, tmp, scratch, n, key_dtype=qd.u32, has_values=False, end_bit=32,
                           log256_max_n=DEPTH)

    @qd.kernel
    def copy_keys(src: qd.types.ndarray(qd.u32, ndim=1), dst: qd.types.ndarray(qd.u32, ndim=1)):
        for i in src:
            dst[i] = src[i]

    return block_sums, block_sums_serial, radix_sort, copy_keys


def best(run, rounds: int, sync) -> float:
    run()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def torch_device(arch: str):
    try:
        import torch
    except ImportError:
        return None, None
    if arch == "cuda" and torch.cuda.is_available():
        return torch, "cuda"
    return None, None


def measure(lib, arch: str, x, keys, rounds: int) -> dict:
    """Times of one library's kernels (seconds), its results checked against numpy."""
    lib.init(arch=getattr(lib, arch))
    block_sums, block_sums_serial, radix_sort, copy_keys = simt_kernels(lib)
    n = x.size
    times = {}
    xs, out = lib.ndarray(lib.f32, shape=(n,)), lib.ndarray(lib.f32, shape=(n // B,))
    xs.from_numpy(x)
    times["block"] = best(lambda: block_sums(xs, out), rounds, lib.sync)
    assert np.array_equal(out.to_numpy(), x.reshape(-1, B).sum(1))
    times["serial"] = best(lambda: block_sums_serial(xs, out), rounds, lib.sync)

    ks, tmp, original = (lib.ndarray(lib.u32, shape=(n,)) for _ in range(3))
    scratch = lib.ndarray(lib.u32, shape=(lib.algorithms.sort_scratch_slots(n, DEPTH),))
    count = lib.ndarray(lib.i32, shape=())
    count.from_numpy(np.array(n, np.int32))
    original.from_numpy(keys)

    def sort_once():
        copy_keys(original, ks)  # the unsorted keys again, on the device
        radix_sort(ks, tmp, scratch, count)
    times["copy"] = best(lambda: copy_keys(original, ks), rounds, lib.sync)
    times["sort"] = best(sort_once, rounds, lib.sync) - times["copy"]
    assert np.array_equal(ks.to_numpy(), np.sort(keys))
    return times


def quadrants_times(arch: str, x, keys, rounds: int):
    """Quadrants' times for the same kernels in this process, or why there are none."""
    try:
        import quadrants
    except ImportError:
        return "not installed"
    try:
        return measure(quadrants, arch, x, keys, rounds)
    except Exception as error:  # a reference that cannot run this arch is reported, not fatal
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cuda", choices=("cuda", "vulkan", "amdgpu", "metal"))
    parser.add_argument("--log2n", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--without-quadrants", action="store_true")
    args = parser.parse_args()
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, n).astype(np.float32)
    keys = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    torch, device = torch_device(args.arch)

    ours = measure(qd, args.arch, x, keys, args.rounds)
    theirs = "not asked for" if args.without_quadrants else quadrants_times(args.arch, x, keys, args.rounds)
    print(f"block reduction of 2^{args.log2n} f32 in blocks of {B}: qd.simt {ours['block'] * 1e3:.3f} ms "
          f"({4 * n / ours['block'] / 1e9:.0f} GB/s), a thread per block {ours['serial'] * 1e3:.3f} ms")
    print(f"radix sort of 2^{args.log2n} u32 keys: qdc {ours['sort'] * 1e3:.2f} ms (a device copy of the keys, "
          f"{ours['copy'] * 1e3:.3f} ms, subtracted)")
    if isinstance(theirs, dict):
        print(f"  Quadrants: block reduction {theirs['block'] * 1e3:.3f} ms (qdc / Quadrants = "
              f"{ours['block'] / theirs['block']:.2f}), a thread per block {theirs['serial'] * 1e3:.3f} ms, "
              f"sort {theirs['sort'] * 1e3:.2f} ms (qdc / Quadrants = {ours['sort'] / theirs['sort']:.2f})")
    else:
        print(f"  Quadrants: {theirs}")
    if torch is not None:
        tx = torch.from_numpy(x).to(device)
        t_torch = best(lambda: tx.view(-1, B).sum(1), args.rounds, torch.cuda.synchronize)
        print(f"  torch block sums {t_torch * 1e3:.3f} ms: qdc / torch = {ours['block'] / t_torch:.2f}")
        tk = torch.from_numpy(keys.astype(np.int64)).to(device)  # torch has no uint32 sort on CUDA
        t_torch = best(lambda: torch.sort(tk), args.rounds, torch.cuda.synchronize)
        print(f"  torch.sort {t_torch * 1e3:.2f} ms: qdc / torch = {ours['sort'] / t_torch:.2f}")


if __name__ == "__main__":
    main()
